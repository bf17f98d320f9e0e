"""What one linker step did (shim.linker.container), filled as it works: a recipe is written from
it alone (stepmemo.StepMemo.keep), so every write, link, bind and hook change goes through it."""
import os
import stat

from .._native import ffi, lib
from ..ldconfig.engine import Root
from .stepleft import identify, places_of


class StepResult:
    """The step's outcome. OBSERVE: a memo will keep it, so what the links change is noted
    before they change it (the identities a new container shows), and the Roots opened during
    the step are observed (engine.Root.observers, for the paths they look at)."""

    def __init__(self, log, config, observe=False):
        self.log, self.observe = log, observe
        self.original = self.config = config    # the config.json the step was given; then the one it returns
        self.started = lib.cds_memo_clock_ns() if observe else 0
        self.links = []         # [(target, link)] made in the root, in order
        self.files = {}         # bundle path -> (data, mode), written
        self.root_files = []    # [(path in the root, data, mode)] written into the root, in order
        self.overlay = None     # a read-only root's /etc overlay, as etcfiles.etc_overlay takes it
        self.binds = []         # [(destination, bundle path)] bound, in order
        self.moved = []         # the destinations of the mounts our binds hook makes (filebinds.py)
        self.replaced = {}      # {(stage, index): the hook that takes the original's place}
        self.plans = []         # the paths each plan looked at (plan.Plan.looked), or None
        self.sources = []       # [(mount index, host source)] of the directory mounts the cache reads
        self.warnings = []      # what it warned of (such a step is not kept)
        self.refused = ""       # why this step cannot be kept
        self.roots = []         # the Roots opened during the step (observed)
        # What the step's own links change, as it was before (what a new container shows):
        # memo entry -> identity (the links' paths and every directory above them), and a
        # directory's (device, inode) -> its identity (the same directory, reached by another path).
        self.before, self.directories = {}, {}
        # ... and each entry's place in the root (its kind and engine.Root.canonical) -> its
        # identity: another spelling of it (merged /usr's /lib/x86_64-linux-gnu/..., the planner's)
        # is the same path, whatever the links did to it (overlayfs gives a directory a new inode).
        self.places = {}
        # Identities our last step left in this root (stepleft.trusted): ours, however young.
        self.trusted = {}
        self.changed = []       # every entry its links, writes and mount points change (stepleft.left)

    def __enter__(self):
        if self.observe:
            Root.observers = self.roots
        return self

    def __exit__(self, *exc):
        if self.observe:
            Root.observers = None

    def warn(self, message):
        self.warnings.append(message)
        self.log.warning(message)

    def fail(self, message):
        self.warnings.append(message)
        self.log.error(message)

    def refuse(self, why):
        self.refused = self.refused or why

    def wrote(self, path, data, mode):
        self.files[path] = (data, mode)

    def bound(self, destination, source):
        self.binds.append((destination, source))

    def linking(self, rootfs, links):
        """LINKS (target, path) are about to be made in ROOTFS: note what they change, as it is now."""
        if not self.observe:
            return
        entries = []
        for _, link in links:
            path = os.path.normpath(link)
            while path not in ("/", ""):
                for kind in (b"n", b"f"):
                    entry = kind + os.fsencode(path)
                    if entry not in self.before and entry not in entries and b"\0" not in entry:
                        entries.append(entry)
                path = os.path.dirname(path)
        if not entries:
            return
        self.changed += [entry for entry in entries if entry not in self.changed]
        identities = identify(rootfs, entries, self.started, self.trusted)
        if identities is None:
            self.refuse("a path its links change is too new")
            return
        size = ffi.sizeof("struct cds_identity")
        for index, entry in enumerate(entries):
            identity = identities[index]
            self.before[entry] = bytes(ffi.buffer(identities + index, size))
            if identity.err == 0 and stat.S_ISDIR(identity.mode):
                self.directories.setdefault((identity.dev, identity.ino), self.before[entry])
        for place, entry in places_of(rootfs, entries):
            self.places.setdefault(place, self.before[entry])

    def linked(self, links):
        self.links += links

    def change_hooks(self, config, drop=()):
        """CONFIG with the original's hooks less those at the positions DROP ((stage, index)) and
        with self.replaced in place; a stage a drop leaves empty goes."""
        hooks = self.original.get("hooks")
        if not isinstance(hooks, dict):
            return config
        changed = {}
        for stage, entries in hooks.items():
            if not isinstance(entries, list):    # (a stage that is not a list: left as it is)
                changed[stage] = entries
                continue
            kept = [self.replaced.get((stage, at), entry) for at, entry in enumerate(entries)
                    if (stage, at) not in drop]
            if kept or not drop:
                changed[stage] = kept
        return dict(config, hooks=changed)

    def put_first(self, config, stage, hook, removed=()):
        """CONFIG with HOOK first in STAGE and the hooks at the positions REMOVED of that stage
        as it is now (indices into its list) taken out."""
        hooks = config.get("hooks")
        if hooks is not None and not isinstance(hooks, dict):
            return config
        entries = (hooks or {}).get(stage)
        entries = entries if isinstance(entries, list) else ()
        return dict(config, hooks=dict(hooks or {}, **{stage: [hook] + [entry for at, entry in enumerate(entries)
                                                                      if at not in removed]}))

    def sources_of(self, config, providers):
        """Note the host sources of the directory mounts that provide folders of the cache
        (plan.Plan.providers): a replay needs the same source in the same mount of its config."""
        if providers is None:
            self.refuse("a folder's mount is not known")
            return
        mounts = config.get("mounts") or []
        for _, destination, source in providers:
            at = [index for index, mount in enumerate(mounts) if isinstance(mount, dict)
                  and isinstance(mount.get("destination"), str)
                  and os.path.normpath(mount["destination"]) == destination and mount.get("source") == source]
            if not at:
                self.refuse("a folder's mount is not in config.json as written")
                return
            if (at[-1], source) not in self.sources:
                self.sources.append((at[-1], source))
