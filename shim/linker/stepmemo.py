"""The memo of whole linker steps, for the resident workers, and the recipes the runtime's front
end replays from it.

A node starts containers of the same few images with the same spec, and each create of a
config that someone else injected (containerd's own CDI) does the same linker step again: the
hooks parsed, the image looked at, links made, files written into the bundle, config.json
edited -- ~1.5 ms of scattered small work in a worker that wakes with cold caches.

A step is kept under a key made of what it read from config.json (the front end's key: its
hooks, its mounts whole, the namespaces; see key) and from the host (the application profile the
devices give, the params file's new bytes), with the identity of every path it looked at in
the root: those of the Roots opened during the step (engine.Root.observers) and the plan's
(plan.Plan.looked), each as a new container shows it -- for what the step's own links changed
(the links' paths, the directories above them, by whatever path the step reached them), the
identity from before the change (stepresult.StepResult.linking). What the step did is kept as a
recipe: the links it made, in order, the bundle files it wrote, the files it wrote into the
root (the linker cache and configuration, as the toolkit's hooks leave them) or a read-only
root's /etc overlay (etcfiles.etc_overlay), the mounts it bound, and the hooks it dropped or
changed (with the rootfs and bundle paths left as blanks). A later step with the same key
whose paths all have the same identities in its own root (one C call) replays the recipe into
its own rootfs and bundle; the result is what the step itself would have given
(tests/linker/test_step_memo.py). A step that warned, failed, ran chmod, kept a hook
for a reason of the host's, or looked at a file changed within the settle time is not kept; a
recipe that cannot be replayed (a write fails) gives way to the whole step, which does
everything again.

The worker also writes the recipe of each step into the steps directory beside its socket
(export_recipe), named by the front end's key of the config (cds_step_key,
csrc/engine/ociconf.c), for the C replay (csrc/engine/replay.c): the front end's, without asking,
for a pre-injected config; the worker's own, for the config it injected from a request.
"""
import os
import stat
import struct

from . import stepleft
from .._native import ffi, lib
from .stepresult import identify as _identify, places_of as _places_of

_MAX_STEPS = 64     # a node's images times its specs
_PER_KEY = 4        # roots tried for one key (each try stats every path)
_MAX_PATHS = 320    # the plan's (at most plan._MAX_PATHS) and the step's own
OURS_PREFIX = "cdi-shim."  # the names of the bundle files a step writes
_ROOTFS = object()  # the blank for the container's rootfs in a changed hook's arguments

_steps = None       # {key: [_Recipe, newest first]} while remembering
_left = {}          # {(device, inode) of a root: {entry: identity} as the last step kept there left it}


def remember_steps(enabled=True):
    """Keep whole linker steps and replay them (see above): for long-lived processes, the
    resident worker. Off by default; turning it on or off forgets every step kept. Returns the
    previous setting."""
    global _steps
    previous = _steps is not None
    _steps = {} if enabled else None
    _left.clear()
    return previous


def enabled():
    return _steps is not None


class _Recipe:
    __slots__ = ("paths", "count", "identities", "links", "files", "binds", "moved", "hooks", "params", "exported",
                 "exported_path", "root_files", "overlay", "sources")

    def __init__(self, paths, count, identities, links, files, binds, moved, hooks, root_files=(), overlay=None,
                 sources=()):
        self.paths, self.count, self.identities = paths, count, identities
        self.links, self.files, self.binds, self.moved, self.hooks = links, files, binds, moved, hooks
        self.root_files = list(root_files)     # [(path in the root, data, mode)] in the order written
        self.overlay = overlay      # a read-only root's /etc overlay (etcfiles.etc_overlay), or None
        self.sources = list(sources)    # [(mount index, host source)]: StepResult.sources
        self.params = b"0"      # the host's params file as the last step of it read it (export_recipe)
        self.exported = self.exported_path = None   # where it was last exported to


_last = None        # the recipe the current step replayed or kept (export_recipe)
_last_key = None    # and the config's key it was kept or replayed under


def begin():
    """A new step: forget which recipe the last one had."""
    global _last, _last_key
    _last = _last_key = None


def _took(recipe, host, step_key):
    global _last, _last_key
    _last, _last_key = recipe, step_key[0]
    params = host.get("params", False)
    recipe.params = b"0" if params is False else b"1" if params is None else b"2" + params


def _stages(config):
    hooks = config.get("hooks")
    if not isinstance(hooks, dict):
        return
    for stage, entries in hooks.items():
        if isinstance(entries, list):
            yield stage, entries


def key(text, calls, profile, params):
    """The key of a step for config.json's bytes TEXT (what the step reads of it and of the
    host), or None when it cannot have one. The config's part is the front end's own key
    (cds_step_key, csrc/engine/ociconf.c: one definition for both sides, see ociconf.h for
    what it holds); CALLS: its parsed hooks; PROFILE and PARAMS: callables giving the
    host-side bytes (run only when a hook asks for them)."""
    config_key = step_key_of(text)
    if config_key is None:
        return None
    commands = {call.command for call in calls}
    return (config_key,
            profile() if "update-application-profile" in commands else None,
            params() if "disable-device-node-modification" in commands else None)


def replay(step_key, config, bundle, rootfs, make_links, write_file, bind, host, write_in_root=None,
           etc_overlay=None):
    """CONFIG as a kept step for STEP_KEY makes it in ROOTFS and BUNDLE, or None (no such
    step, its paths changed, or a write failed: the caller does the whole step). MAKE_LINKS,
    WRITE_FILE, BIND, WRITE_IN_ROOT and ETC_OVERLAY are the step's own (shim.linker.container);
    HOST what the key read of the host."""
    candidates = _steps.get(step_key, ()) if step_key is not None else ()
    if not candidates:
        return None
    try:
        rootfd = os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        found = None
        for at, recipe in enumerate(candidates):
            if not _same_sources(recipe.sources, config):
                continue
            if lib.cds_memo_same(rootfd, recipe.paths, len(recipe.paths), recipe.count, recipe.identities) == 1:
                found = recipe
                if at:
                    candidates.insert(0, candidates.pop(at))
                break
    finally:
        os.close(rootfd)
    if found is None:
        return None
    bundle = os.path.abspath(bundle)
    hooks = _hooks(found.hooks, config, rootfs, bundle)
    if hooks is None:
        return None
    try:
        if found.links:
            make_links(rootfs, found.links)
        for name, (data, mode) in found.files:
            write_file(os.path.join(bundle, name), data, mode)
        for path, data, mode in found.root_files:
            if write_in_root is None:
                return None
            write_in_root(rootfs, path, data, mode)
    except OSError:
        return None
    if hooks is not _UNCHANGED:
        config = dict(config, hooks=hooks)
    for destination, name in found.binds:
        config = bind(config, destination, os.path.join(bundle, name))
    if found.moved:     # (each destination appears once: filebinds.plan)
        moved = set(found.moved)
        config = dict(config, mounts=[m for m in config.get("mounts") or ()
                                      if not (isinstance(m, dict) and m.get("destination") in moved)])
    if found.overlay is not None:
        try:
            config = etc_overlay(config, bundle, rootfs, found.overlay)
        except (OSError, TypeError):
            return None
    _took(found, host, step_key)
    return config


_UNCHANGED = object()


def _same_sources(sources, config):
    """Whether CONFIG's mounts have the host SOURCES ([(index, source)]) a recipe's cache read."""
    if not sources:
        return True
    mounts = config.get("mounts")
    if not isinstance(mounts, list):
        return False
    return all(index < len(mounts) and isinstance(mounts[index], dict) and mounts[index].get("source") == source
               for index, source in sources)


def _hooks(layout, config, rootfs, bundle):
    """The hooks of CONFIG as LAYOUT has them ({stage: [index in the stage | changed hook]}), or
    _UNCHANGED; None when a changed hook's program is no longer there."""
    if layout is None:
        return _UNCHANGED
    stages = dict(_stages(config))
    hooks = {}
    for stage, entries in layout.items():
        made = []
        for entry in entries:
            if isinstance(entry, int):
                made.append(stages[stage][entry])
                continue
            path = dict(entry).get("path")
            if not isinstance(path, str) or not os.access(path, os.X_OK):
                return None
            made.append({name: [rootfs if arg is _ROOTFS else os.path.join(bundle, arg[1]) if isinstance(arg, tuple)
                                else arg for arg in value] if name == "args" else
                         list(value) if isinstance(value, list) else value for name, value in entry})
        hooks[stage] = made
    return hooks


def keep(step_key, done, rootfs, bundle, host):
    """Keep the step DONE tells of (stepresult.StepResult: what it did, from what) when it can be
    replayed: "", or why not. Nothing but DONE and the identities of its paths goes in."""
    if step_key is None:
        return "no key"
    if done.warnings:
        return "it warned"
    if done.refused:
        return done.refused
    if None in done.plans:
        return "a plan past its path bound"   # (checking its paths would cost what planning does)
    bundle = os.path.abspath(bundle)
    prefix = bundle + "/"

    def in_bundle(path):
        return path[len(prefix):] if path.startswith(prefix) and "/" not in path[len(prefix):] else None

    files = []
    for path, (data, mode) in done.files.items():
        if in_bundle(path) is None:
            return "a file outside the bundle"
        files.append((in_bundle(path), (data, mode)))
    binds = []
    for destination, source in done.binds:
        if in_bundle(source) is None or source not in done.files:
            return "a bind of a file not its own"
        binds.append((destination, in_bundle(source)))
    layout = _layout(done, rootfs, in_bundle)
    if layout is False:
        return "hooks it cannot tell"
    entries = []
    for root in done.roots:
        entries += [(b"f" if follow else b"n") + os.fsencode(path) for path, follow in root.looked()]
    for looked in done.plans:
        entries += looked.split(b"\0")[:-1]
    entries = list(dict.fromkeys(entries))
    if len(entries) > _MAX_PATHS or any(b"\0" in entry for entry in entries):
        return "past its path bound"
    # Each path as a new container shows it: what the step's links changed, as it was before
    # (done.before); everything else as it is now, which must be older than the settle time.
    now = _identify(rootfs, entries)
    if now is None:
        return "the root cannot be opened"
    size = ffi.sizeof("struct cds_identity")
    found, unchanged = [], []
    # (an entry the links changed under another spelling: the same place, as it was before)
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
        found.append(before)
    if unchanged and _identify(rootfs, unchanged, done.started, done.trusted) is None:
        return "a path changed within the settle window"
    paths = b"\0".join(entries) + b"\0"
    at = len(entries)
    identities = ffi.new("struct cds_identity[]", max(1, at))
    ffi.memmove(identities, b"".join(found), at * size)
    if sum(len(recipes) for recipes in _steps.values()) >= _MAX_STEPS:
        _steps.clear()
    candidates = _steps.setdefault(step_key, [])
    recipe = _Recipe(paths, at, identities, list(done.links), files, binds, list(done.moved), layout,
                     done.root_files, done.overlay, done.sources)
    # What the step left, as it left it: the next step of this key in this root finds its own
    # writes and links young, and trusts them while they show these identities (trusted).
    # (NOW was taken after the step: its writes, links and mount points made)
    _leave(rootfs, {entry: bytes(ffi.buffer(now + index, size)) for index, entry in enumerate(entries)})
    left(done, rootfs)      # (and every path its changes touched, looked at or not)
    candidates.insert(0, recipe)
    del candidates[_PER_KEY:]
    _took(recipe, host, step_key)
    return ""


def left(done, rootfs):
    """Note what an observed step that was not kept left (DONE: stepresult.StepResult): the paths
    its own writes, links and mount points changed, as they are now, for the next step in
    ROOTFS (trusted). A step that was refused for one of them being too new still made them
    so: the next one finds them young, and ours."""
    if _steps is None or not done.changed:
        return
    entries = done.changed
    now = _identify(rootfs, entries)
    if now is None:
        return
    size = ffi.sizeof("struct cds_identity")
    made = dict(trusted(rootfs))
    made.update((entry, bytes(ffi.buffer(now + index, size))) for index, entry in enumerate(entries))
    _leave(rootfs, made)


def _root_id(rootfs):
    try:
        st = os.stat(rootfs)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _leave(rootfs, left):
    root = _root_id(rootfs)
    if root is None or _steps is None:
        return
    if len(_left) >= _MAX_STEPS:
        _left.clear()
    _left[root] = left
    stepleft.write(root, left, rootfs)      # (for the other workers: the next create may be theirs)


def trusted(rootfs):
    """{memo entry: identity} of the paths the last step kept in ROOTFS (this folder, by device
    and inode) left there: the next step in that root (whatever its key: a bundle run directly
    has its config.json rewritten by the first run) finds its own writes, links and mount points
    within the settle window, and takes each as settled while it shows the identity the step
    left (a root reused run after run: a plain-folder bundle). Any other writer's change, even
    of one of those files, gives another identity (a new inode, size or time), which the settle
    window judges as ever. (A change within the clock tick of our own write keeps the identity:
    the trust the file memo gives a settled file, given to our own write.)"""
    if _steps is None:
        return {}
    root = _root_id(rootfs)
    return stepleft.read(root) or _left.get(root) or {} if root is not None else {}


def _layout(done, rootfs, in_bundle):
    """DONE's hooks (by position: stepresult.StepResult.hooks) with the changed hooks' rootfs
    and bundle paths as blanks; None when they are the config's own, False when they cannot be
    told."""
    if done.hooks is None:
        return None
    layout = {}
    for stage, entries in done.hooks.items():
        if entries is None:
            return False
        made = []
        for entry in entries:
            if isinstance(entry, int):
                made.append(entry)
                continue
            if not isinstance(entry.get("args"), list):
                return False
            args = [_ROOTFS if arg == rootfs else ("bundle", in_bundle(arg))
                    if isinstance(arg, str) and arg in done.files else arg
                    for arg in entry["args"]]
            if any(isinstance(arg, str) and in_bundle(arg) is not None for arg in args):
                return False    # (a bundle path not written by the step: not this container's)
            # (name, value) in the hook's own order, its arguments with the blanks
            made.append(tuple((name, args if name == "args" else value) for name, value in entry.items()))
        layout[stage] = made
    return layout


# ---- the recipes replayed in C (csrc/engine/replay.c), by the front end and the worker ----

RECIPE_MAGIC = b"CDSSTEP6"
_MAX_RECIPES = 64       # files in the steps directory; the oldest go first
_ROOTFS_MARK, _BUNDLE_MARK = "\x01", "\x02"


def recipe_name(key):
    """The recipe file's name for a step KEY (cds_step_key): FNV-1a, 64 bits, in hex."""
    return f"{lib.cds_fnv1a(key, len(key)):016x}"


def step_key_of(raw):
    """The front end's key of the step for config.json's bytes RAW, or None (see ociconf.h)."""
    key = ffi.new("uint8_t **")
    size = ffi.new("size_t *")
    if lib.cds_step_key(raw, len(raw), key, size) != 0:
        return None
    try:
        return bytes(ffi.buffer(key[0], size[0]))
    finally:
        lib.cds_step_key_free(key[0])


def export_recipe(final, rootfs, bundle, directory):
    """Write the recipe of the step just replayed or kept (for config.json's bytes as given to
    prepare_linker, which it turned into FINAL) into DIRECTORY, under the key it was kept or
    replayed under, for the front end to replay without us. Nothing when there is no such step
    or it was written before. True when the recipe is there."""
    recipe, key = _last, _last_key
    if recipe is None:
        return False
    if recipe.exported == directory and os.path.exists(recipe.exported_path):
        return True
    from .. import fastjson

    bundle = os.path.abspath(bundle)

    def blanked(value):
        if isinstance(value, str):
            if value == rootfs:
                return _ROOTFS_MARK
            if value.startswith(bundle + "/"):
                return _BUNDLE_MARK + value[len(bundle):]
            return value
        if isinstance(value, list):
            return [blanked(item) for item in value]
        if isinstance(value, dict):
            return {name: blanked(item) for name, item in value.items()}
        return value

    def text(value):    # the marks as raw bytes: JSON text never holds a raw control character
        return fastjson.dumpb(blanked(value)).replace(b"\\u0001", b"\x01").replace(b"\\u0002", b"\x02")

    mounts = {mount.get("destination"): mount for mount in final.get("mounts") or () if isinstance(mount, dict)}
    # A bind's destination and mount; a moved mount's destination and nothing (it is dropped).
    binds = b""
    for destination, _ in recipe.binds:
        if destination not in recipe.moved:
            binds += _block(fastjson.dumpb(destination)) + _block(text(mounts[destination]))
    for destination in recipe.moved:
        binds += _block(fastjson.dumpb(destination)) + _block(b"")
    links = b""
    for target, link in recipe.links:
        parent, name = os.path.split(os.path.normpath(link))
        links += b"".join(os.fsencode(part) + b"\0" for part in (target, parent, name))
    files = b"".join(os.fsencode(name) + b"\0" + struct.pack("<II", mode, len(data)) + data
                     for name, (data, mode) in recipe.files)
    root_files = b"".join(os.fsencode(path) + b"\0" + struct.pack("<II", mode, len(data)) + data
                          for path, data, mode in recipe.root_files)
    etc = b""
    if recipe.overlay is not None:     # its folders, files, filesystems, mount, points (replay_etc.c, cds_etc_make)
        dirs, made, bundle_fs, rootfs_fs, points = recipe.overlay
        etc = (_block(b"".join(os.fsencode(path) + b"\0" + struct.pack("<III", uid, gid, mode)
                               for path, uid, gid, mode in dirs))
               + _block(b"".join(os.fsencode(path) + b"\0" + struct.pack("<II", mode, len(data)) + data
                                 for path, data, mode in made))
               + _block(struct.pack("<II", bundle_fs & 0xFFFFFFFF, rootfs_fs & 0xFFFFFFFF))
               + _block(text(dict(mounts["/etc"], options=[_marked(option, rootfs, bundle)
                                                            for option in mounts["/etc"]["options"]])))
               + _block(b"".join(_block(fastjson.dumpb(destination)) + bytes((directory,))
                                 for destination, directory in points)))
    # (each directory mount's index and its source as JSON text: the front end compares the text)
    sources = b"".join(struct.pack("<I", index) + _block(fastjson.dumpb(source)) for index, source in recipe.sources)
    programs = b"".join(os.fsencode(dict(entry)["path"]) + b"\0" for entries in (recipe.hooks or {}).values()
                        for entry in entries if not isinstance(entry, int))
    from cdi import __version__

    data = RECIPE_MAGIC + b"".join(_block(part) for part in (
        __version__.encode(), key, recipe.params, recipe.paths, struct.pack("<I", recipe.count),
        bytes(ffi.buffer(recipe.identities, recipe.count * ffi.sizeof("struct cds_identity"))),
        links, files, programs, text(final.get("hooks")), binds, root_files, etc, sources))
    data += struct.pack("<Q", lib.cds_fnv1a(data, len(data)))     # (the front end refuses it changed or cut)
    name = recipe_name(key)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        from cdi.safeio import write_file_atomic

        write_file_atomic(os.path.join(directory, name), data, 0o600, temp_name=f".{name}.{os.getpid()}")
        prune(directory)
    except OSError:
        return False    # (the front end then asks us, as before)
    recipe.exported, recipe.exported_path = directory, os.path.join(directory, name)
    return True


def _marked(option, rootfs, bundle):
    """An overlay mount's option NAME=PATH[:PATH...] with the rootfs and bundle paths as blanks
    (neither holds a ':': etcfiles.OVERLAY_UNSAFE)."""
    name, equals, paths = option.partition("=")
    if not equals:
        return option
    marked = []
    for path in paths.split(":"):
        if path.startswith(os.path.abspath(rootfs) + "/"):
            path = _ROOTFS_MARK + path[len(os.path.abspath(rootfs)):]
        elif path.startswith(bundle + "/"):
            path = _BUNDLE_MARK + path[len(bundle):]
        marked.append(path)
    return f"{name}={':'.join(marked)}"


def _block(data):
    return struct.pack("<I", len(data)) + data


def prune(directory):
    """At most _MAX_RECIPES recipes, the newest; and no temp file of a writer that is gone."""
    names = os.listdir(directory)
    for name in names:
        pid = name.rsplit(".", 1)[-1] if name.startswith(".") else ""
        if pid.isdigit() and int(pid) != os.getpid() and not os.path.exists(f"/proc/{pid}"):
            _unlink(os.path.join(directory, name))
    recipes = [name for name in names if not name.startswith(".")]
    if len(recipes) <= _MAX_RECIPES:
        return

    def age(name):
        try:
            return os.stat(os.path.join(directory, name)).st_mtime_ns
        except OSError:
            return 0
    for name in sorted(recipes, key=age)[:len(recipes) - _MAX_RECIPES]:
        _unlink(os.path.join(directory, name))


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass
