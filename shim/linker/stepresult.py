"""What one linker step did (shim.linker.container): the step fills it as it works and returns
it, and the step memo keeps a step from it alone (stepmemo.keep). Every write, link, bind and
hook change of the step goes through it; a write it is not told of would make a replay wrong,
so the step has no other way to do them (container.py takes it as an argument everywhere)."""
import os
import stat

from .._native import ffi, lib


class StepResult:
    """The step's outcome. OBSERVE: a memo will keep it, so what the links change is noted
    before they change it (the identities a new container shows), and the Roots opened during
    the step are observed (engine.Root.observers, for the paths they look at)."""

    def __init__(self, log, config, observe=False):
        self.log = log
        self.original = config  # the config.json the step was given (its hooks' positions)
        self.config = config    # the config.json the step returns
        self.observe = observe
        self.started = lib.cds_memo_clock_ns() if observe else 0
        self.links = []         # [(target, link)] made in the root, in order
        self.files = {}         # bundle path -> (data, mode), written
        self.root_files = []    # [(path in the root, data, mode)] written into the root, in order
        self.overlay = None     # a read-only root's /etc overlay, as etcfiles.etc_overlay takes it
        self.binds = []         # [(destination, bundle path)] bound, in order
        self.moved = []         # the destinations of the mounts our binds hook makes (filebinds.py)
        # The hooks of the result by position: {stage: [index into the original's stage | a new
        # hook]}; None while they are the original's own.
        self.hooks = None
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
        # Identities a kept step of this key left in its root (stepmemo.trusted): a path that
        # shows one is ours as we left it, not too new however young (a root reused run after run).
        self.trusted = {}
        self.changed = []       # every entry its links, writes and mount points change (stepmemo.left)

    def __enter__(self):
        from ..ldconfig.engine import Root

        if self.observe:
            Root.observers = self.roots
        return self

    def __exit__(self, *exc):
        from ..ldconfig.engine import Root

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
        """CONFIG with the original's hooks less those at the positions DROP and with
        self.replaced in place (noted in self.hooks)."""
        layout = self._layout()
        if layout is None:
            return config
        self.hooks = {}
        for stage, entries in layout.items():
            if entries is None:     # (a stage that is not a list: left as it is)
                self.hooks[stage] = None
                continue
            kept = [self.replaced.get((stage, entry), entry) if isinstance(entry, int) else entry
                    for entry in entries if not (isinstance(entry, int) and (stage, entry) in drop)]
            if kept or not drop:    # (as a drop leaves them: no empty stage)
                self.hooks[stage] = kept
        return dict(config, hooks=self._materialize())

    def put_first(self, config, stage, hook, removed=()):
        """CONFIG with HOOK first in STAGE and the hooks at the positions REMOVED of that stage
        as it is now (indices into its list) taken out (noted in self.hooks)."""
        layout = self._layout()
        if layout is None:
            return config
        layout[stage] = [hook] + [entry for at, entry in enumerate(layout.get(stage) or ()) if at not in removed]
        self.hooks = layout
        return dict(config, hooks=self._materialize())

    def _layout(self):
        """A copy of self.hooks, or the original's hooks as positions (None for a stage that is
        not a list); None when the hooks are not a mapping."""
        if self.hooks is not None:
            return {stage: None if entries is None else list(entries) for stage, entries in self.hooks.items()}
        hooks = self.original.get("hooks")
        if hooks is None:
            return {}
        if not isinstance(hooks, dict):
            return None
        return {stage: list(range(len(entries))) if isinstance(entries, list) else None
                for stage, entries in hooks.items()}

    def _materialize(self):
        hooks = self.original.get("hooks") or {}
        return {stage: hooks[stage] if entries is None else
                [hooks[stage][entry] if isinstance(entry, int) else entry for entry in entries]
                for stage, entries in self.hooks.items()}

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


def places_of(rootfs, entries):
    """[((kind, place), entry)] of memo ENTRIES (a kind byte and a path) in ROOTFS: the path with
    its folders' links followed (engine.Root.canonical), the last name as written (what the links
    of a step change is that name, never the folders above it), looked up without being observed."""
    from ..ldconfig.engine import LdcacheError, Root

    if not entries:
        return []
    try:
        root = Root(rootfs, observed=False)
    except LdcacheError:
        return []
    with root:
        return [((entry[:1], root.canonical(os.fsdecode(entry[1:]))), entry) for entry in entries]


def identify(rootfs, entries, started=None, trusted=None):
    """The identities (struct cds_identity[]) of memo ENTRIES in ROOTFS, or None when one of
    them changed within the settle time before STARTED (unless None), or the root cannot be
    opened. TRUSTED ({entry: identity bytes}, stepmemo.trusted): an entry showing that identity
    is exempt from the settle time (our own step left it so)."""
    identities = _identify(rootfs, entries, started if not trusted else None)
    if identities is None or not trusted or started is None:
        return identities
    size = ffi.sizeof("struct cds_identity")
    shown = {entry: bytes(ffi.buffer(identities + index, size)) for index, entry in enumerate(entries)}
    young = [entry for entry in entries if trusted.get(entry) != shown[entry]]
    if young:
        # (our own writes, noted as the mounts spell them, read under another spelling: merged /usr)
        ours = {place: trusted[entry] for place, entry in places_of(rootfs, list(trusted))}
        young = [entry for place, entry in places_of(rootfs, young) if ours.get(place) != shown[entry]]
    return identities if not young or _identify(rootfs, young, started) is not None else None


def _identify(rootfs, entries, started):
    paths = b"\0".join(entries) + b"\0"
    identities = ffi.new("struct cds_identity[]", max(1, len(entries)))
    try:
        rootfd = os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        unsettled = lib.cds_memo_identify(rootfd, paths, len(paths), len(entries), started or 0, identities)
    finally:
        os.close(rootfd)
    return identities if unsettled == 0 or (started is None and unsettled > 0) else None
