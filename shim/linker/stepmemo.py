"""The memo of whole linker steps, for the resident workers: recipe files only C writes and applies.

A node starts containers of the same few images with the same spec, and each create of a config
someone else injected does the same linker step again (~1.5 ms of scattered small work). A worker
keeps a step (StepMemo.keep) as a recipe file in the steps folder beside its socket, named by the
front end's key of the config (cds_step_key, csrc/engine/ociconf.c), written by C
(cds_step_recipe_write, csrc/engine/recipe.c) from what the step returned (stepresult.StepResult):
the identity of every path it looked at, as a new container shows it, the params file as it read
it, and all it did. A file holds up to four variants, the newest first (two images of one config
alternate on one key). The one applier is the C replay (csrc/engine/replay.c): the front end's,
and the worker's own first (StepMemo.replay). A step that warned, failed, ran chmod, kept a hook
for a reason of the host's, or looked at a file changed within the settle time is not kept; a
recipe whose write fails gives way to the whole step (docs/fast.md, tests/linker/test_step_memo.py).
"""
import os
import stat

from . import stepleft
from .._native import ffi, lib
from .stepleft import identify as _identify, places_of as _places_of

_MAX_PATHS = 320    # the plan's (at most plan._MAX_PATHS) and the step's own
OURS_PREFIX = "cdi-shim."  # the names of the bundle files a step writes

def step_key_of(raw):
    """The front end's key of the step for config.json's bytes RAW, or None (see ociconf.h)."""
    key, size = ffi.new("uint8_t **"), ffi.new("size_t *")
    if lib.cds_step_key(raw, len(raw), key, size) != 0:
        return None
    try:
        return bytes(ffi.buffer(key[0], size[0]))
    finally:
        lib.cds_step_key_free(key[0])


class StepMemo:
    """A worker's kept steps: recipe files in DIRECTORY (the steps folder beside its socket: 0700,
    each file 0600, none followed through a link); what they left in a root in DIRECTORY/.left."""

    def __init__(self, directory):
        self.directory = directory
        self.left_folder = os.path.join(directory, ".left")
        self.why = None     # why the last step was not kept ("": it was)

    def replay(self, raw, bundle, mode):
        """True when the step kept for config.json's bytes RAW was replayed into BUNDLE by the C
        replay and config.json written (MODE); False: the step is to be done."""
        from cdi import __version__

        return lib.replay_step(os.fsencode(self.directory), os.fsencode(os.path.abspath(bundle)), raw, len(raw),
                               mode & 0o7777, __version__.encode()) == 1

    def keep(self, step_key, done, rootfs, bundle, params, final):
        """Keep the step DONE tells of (stepresult.StepResult) for the config key STEP_KEY, when
        it can be replayed: "", or why not. PARAMS: the params file as the step read it (False:
        no hook reads it, None: absent); FINAL: config.json as the create writes it."""
        self.why = self._keep(step_key, done, rootfs, bundle, params, final)
        return self.why

    def _keep(self, step_key, done, rootfs, bundle, params, final):
        why = step_key is None and "no key" or done.warnings and "it warned" or done.refused \
            or None in done.plans and "a plan past its path bound"   # (checking its paths: what planning costs)
        if why:
            return why
        bundle = os.path.abspath(bundle)
        keep = []      # (the cdata the recipe's pointers point into, alive until it is written)

        def text(value):
            keep.append(ffi.new("char[]", value if isinstance(value, bytes) else os.fsencode(value)))
            return keep[-1]

        def array(kind, rows):
            keep.append(ffi.new(f"struct cds_recipe_{kind}[]", rows))
            return keep[-1], len(rows)

        def files(rows):
            return array("file", [(text(name), text(body), len(body), mode) for name, body, mode in rows])

        written = [(path[len(bundle) + 1:], body, mode) for path, (body, mode) in done.files.items()]
        if any(os.path.dirname(path) != bundle for path in done.files):
            return "a file outside the bundle"
        if any(source not in done.files for _, source in done.binds):
            return "a bind of a file not its own"
        programs = _programs(done, rootfs, bundle)
        if programs is None:
            return "hooks it cannot tell"
        found = self._identities(done, rootfs)
        if isinstance(found, str):
            return found
        paths, count, identities = found
        from .. import fastjson

        mounts = {m.get("destination"): m for m in final.get("mounts") or () if isinstance(m, dict)}
        binds = [(destination, mounts[destination]) for destination, _ in done.binds if destination not in done.moved]
        binds += [(destination, None) for destination in done.moved]
        r = ffi.new("struct cds_step_recipe *")
        from cdi import __version__

        r.version, r.rootfs, r.bundle = text(__version__), text(rootfs), text(bundle)
        r.key, r.key_len = text(step_key), len(step_key)
        r.params_state = 0 if params is False else 1 if params is None else 2
        r.params, r.params_len = text(params or b""), len(params or b"")
        r.paths, r.paths_len, r.count, r.identities = text(paths), len(paths), count, identities
        r.links, r.n_links = array("link", [(text(target), text(os.path.normpath(link)))
                                            for target, link in done.links])
        r.files, r.n_files = files(written)
        r.programs, r.programs_len = text(programs), len(programs)
        r.hooks = text(fastjson.dumpb(final.get("hooks")))
        r.binds, r.n_binds = array("bind", [(text(fastjson.dumpb(destination)),
                                             ffi.NULL if mount is None else text(fastjson.dumpb(mount)))
                                            for destination, mount in binds])
        r.roots, r.n_roots = files(done.root_files)
        if done.overlay is not None:    # (etcfiles.etc_overlay)
            dirs, made, bundle_fs, rootfs_fs, points = done.overlay
            r.bundle_fs, r.rootfs_fs = bundle_fs & 0xFFFFFFFF, rootfs_fs & 0xFFFFFFFF
            r.etc_mount = text(fastjson.dumpb(mounts["/etc"]))
            r.etc_dirs, r.n_etc_dirs = array("dir", [(text(path), uid, gid, mode) for path, uid, gid, mode in dirs])
            r.etc_files, r.n_etc_files = files(made)
            r.etc_points, r.n_etc_points = array("point", [(text(fastjson.dumpb(destination)), folder)
                                                           for destination, folder in points])
        r.sources, r.n_sources = array("source", [(index, text(fastjson.dumpb(source)))
                                                  for index, source in done.sources])
        if lib.cds_step_recipe_write(os.fsencode(self.directory), r) != 0:
            return f"its recipe cannot be written: {os.strerror(ffi.errno)}"
        return ""

    def _identities(self, done, rootfs):
        """(the entries DONE looked at, their count, their identities as a new container shows them), or why not."""
        entries = []
        for root in done.roots:
            entries += [(b"f" if follow else b"n") + os.fsencode(path) for path, follow in root.looked()]
        for looked in done.plans:
            entries += looked.split(b"\0")[:-1]
        entries = list(dict.fromkeys(entries))
        if len(entries) > _MAX_PATHS or any(b"\0" in entry for entry in entries):
            return "past its path bound"
        # Each path as a new container shows it: what the step's links changed as it was before
        # (done.before, under any spelling: done.places), the rest as it is now, past the settle time.
        now = _identify(rootfs, entries)
        if now is None:
            return "the root cannot be opened"
        size = ffi.sizeof("struct cds_identity")
        found, unchanged, changed = [], [], []
        others = [entry for entry in entries if entry not in done.before] if done.places else []
        by_place = {entry: done.places.get(place) for place, entry in _places_of(rootfs, others)}
        for index, entry in enumerate(entries):
            identity = now[index]
            before = done.before.get(entry) or by_place.get(entry)
            if before is None and identity.err == 0 and stat.S_ISDIR(identity.mode):
                before = done.directories.get((identity.dev, identity.ino))
            if before is None:
                before = bytes(ffi.buffer(now + index, size))
                unchanged.append(entry)
            elif before != bytes(ffi.buffer(now + index, size)):
                changed.append(entry)
            found.append(before)
        if unchanged and _identify(rootfs, unchanged, done.started, done.trusted) is None:
            return "a path changed within the settle window"
        if changed and stepleft.only_the_cache(changed, done, rootfs):
            # (the root left as a step there leaves it: a recipe of it as left, replayed next)
            found = [bytes(ffi.buffer(now + index, size)) for index in range(len(entries))]
        identities = ffi.new("struct cds_identity[]", max(1, len(entries)))
        ffi.memmove(identities, b"".join(found), len(entries) * size)
        # What the step left (NOW: after it), for the next step in this root (stepleft.trusted)
        stepleft.left(self.left_folder, done, rootfs,
                      {entry: bytes(ffi.buffer(now + index, size)) for index, entry in enumerate(entries)})
        return b"\0".join(entries) + b"\0", len(entries), identities


def _programs(done, rootfs, bundle):
    """The programs of the hooks the step made or changed (those of its config that its original
    has not), each NUL-terminated; None when one cannot be told: its arguments not a list, or one
    a bundle path other than the rootfs that the step did not write (not this container's)."""
    def hooks(config):
        stages = config.get("hooks")
        return [hook for entries in (stages.values() if isinstance(stages, dict) else ())
                if isinstance(entries, list) for hook in entries]

    original, programs = hooks(done.original), b""
    for hook in hooks(done.config):
        if hook in original:
            continue
        args, path = (hook.get("args"), hook.get("path")) if isinstance(hook, dict) else (None, None)
        if not isinstance(args, list) or not isinstance(path, str) or any(
                isinstance(arg, str) and os.path.dirname(arg) == bundle and arg not in done.files
                and arg != rootfs for arg in args):
            return None
        programs += os.fsencode(path) + b"\0"
    return programs
