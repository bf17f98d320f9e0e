"""The memo of whole linker steps, for the resident workers.

A node starts containers of the same few images with the same spec, and each create of a
config that someone else injected (containerd's own CDI) does the same linker step again: the
hooks parsed, the image looked at, links made, files written into the bundle, config.json
edited -- ~1.5 ms of scattered small work in a worker that wakes with cold caches, after the
plan memo (plan.py) has already kept the plan itself.

A step is kept under a key made of what it read from config.json (its hooks, its mounts'
destinations and the library mounts' sources) and from the host (the application profile the
devices give, the params file's new bytes), with the identity of every path it looked at in
the root: those of the Roots opened during the step (engine.Root.observers) and the plan's,
from the plan memo's own record. What the step did is kept as a recipe: the links it made, in
order, the bundle files it wrote, the mounts it bound, and the hooks it dropped or changed
(with the rootfs and bundle paths left as blanks). A later step with the same key whose paths
all have the same identities in its own root (one C call) replays the recipe into its own
rootfs and bundle; the result is what the step itself would have given (tests/linker/
test_step_memo.py). A step that warned, failed, ran chmod, kept a hook for a reason of the
host's, or looked at a file changed within the settle time is not kept; a recipe that cannot be
replayed (a write fails) gives way to the whole step, which does everything again.
"""
import os

from .._native import ffi, lib
from .engine import Root

_MAX_STEPS = 64     # a node's images times its specs
_PER_KEY = 4        # roots tried for one key (each try stats every path)
_MAX_PATHS = 320    # the plan's (at most plan._MAX_PATHS) and the step's own
_ROOTFS = object()  # the blank for the container's rootfs in a changed hook's arguments

_steps = None       # {key: [_Recipe, newest first]} while remembering


def remember_steps(enabled=True):
    """Keep whole linker steps and replay them (see above): for long-lived processes, the
    resident worker. Off by default; turning it on or off forgets every step kept. Returns the
    previous setting."""
    global _steps
    previous = _steps is not None
    _steps = {} if enabled else None
    return previous


def enabled():
    return _steps is not None


class _Recipe:
    __slots__ = ("paths", "count", "identities", "links", "files", "binds", "hooks")

    def __init__(self, paths, count, identities, links, files, binds, hooks):
        self.paths, self.count, self.identities = paths, count, identities
        self.links, self.files, self.binds, self.hooks = links, files, binds, hooks


class Recorder:
    """What one linker step does, noted as it goes (by shim.linker.container)."""

    def __init__(self, config):
        self.started = lib.cds_memo_clock_ns()
        self.roots = []
        self.links = []         # [(target, link)] in the order made
        self.files = {}         # bundle path -> (data, mode)
        self.binds = []         # [(destination, bundle path)] in the order bound
        self.changed = {}       # id(hook) -> the hook as changed in place
        self.plans = []         # the plan memo's records (plan.Plan.kept), or None for a plan not kept
        self.refused = ""       # why this step cannot be kept
        self.positions = {id(hook): (stage, index) for stage, entries in _stages(config)
                          for index, hook in enumerate(entries)}

    def __enter__(self):
        Root.observers = self.roots
        return self

    def __exit__(self, *exc):
        Root.observers = None

    def refuse(self, why):
        self.refused = self.refused or why


def _stages(config):
    hooks = config.get("hooks")
    if not isinstance(hooks, dict):
        return
    for stage, entries in hooks.items():
        if isinstance(entries, list):
            yield stage, entries


def key(config, calls, is_library, profile, params):
    """The key of a step for CONFIG (what the step reads of it and of the host), or None when
    it cannot have one. CALLS: its parsed hooks; IS_LIBRARY: whether a mount destination names
    a library; PROFILE and PARAMS: callables giving the host-side bytes (run only when a hook
    asks for them)."""
    commands = {call.command for call in calls}
    mounts = []
    for mount in config.get("mounts") or ():
        if not isinstance(mount, dict):
            mounts.append(None)
            continue
        destination = mount.get("destination")
        library = isinstance(destination, str) and is_library(destination)
        mounts.append((destination, mount.get("source") if library else None))
    try:
        hooks = repr(config.get("hooks"))
    except RecursionError:
        return None
    return (hooks, tuple(mounts),
            profile() if "update-application-profile" in commands else None,
            params() if "disable-device-node-modification" in commands else None)


def replay(step_key, config, bundle, rootfs, make_links, write_file, bind):
    """CONFIG as a kept step for STEP_KEY makes it in ROOTFS and BUNDLE, or None (no such
    step, its paths changed, or a write failed: the caller does the whole step). MAKE_LINKS,
    WRITE_FILE and BIND are the step's own (shim.linker.container)."""
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
    except OSError:
        return None
    if hooks is not _UNCHANGED:
        config = dict(config, hooks=hooks)
    for destination, name in found.binds:
        config = bind(config, destination, os.path.join(bundle, name))
    return config


_UNCHANGED = object()


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


def keep(step_key, recorder, original, result, rootfs, bundle):
    """Keep the step RECORDER saw (ORIGINAL config in, RESULT out) when it can be replayed."""
    if step_key is None or recorder.refused or None in recorder.plans:
        return
    bundle = os.path.abspath(bundle)
    prefix = bundle + "/"

    def in_bundle(path):
        return path[len(prefix):] if path.startswith(prefix) and "/" not in path[len(prefix):] else None

    files = []
    for path, (data, mode) in recorder.files.items():
        if in_bundle(path) is None:
            return
        files.append((in_bundle(path), (data, mode)))
    binds = []
    for destination, source in recorder.binds:
        if in_bundle(source) is None or source not in recorder.files:
            return
        binds.append((destination, in_bundle(source)))
    layout = _layout(recorder, original, result, rootfs, in_bundle)
    if layout is False:
        return
    entries = []
    for root in recorder.roots:
        entries += [(b"f" if follow else b"n") + os.fsencode(path) for path, follow in root.seen or ()]
    entries = list(dict.fromkeys(entries))
    planned = sum(plan.count for plan in recorder.plans)
    if len(entries) + planned > _MAX_PATHS or any(b"\0" in entry for entry in entries):
        return
    own = b"\0".join(entries) + b"\0" if entries else b""
    identities = ffi.new("struct cds_identity[]", max(1, len(entries) + planned))
    if entries:
        try:
            rootfd = os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return
        try:
            if lib.cds_memo_identify(rootfd, own, len(own), len(entries), recorder.started, identities) != 0:
                return      # changed too recently to be trusted
        finally:
            os.close(rootfd)
    paths, at = own, len(entries)
    for plan in recorder.plans:     # as the plan memo identified them, before the links made after it
        ffi.memmove(identities + at, plan.identities, plan.count * ffi.sizeof("struct cds_identity"))
        paths += plan.paths
        at += plan.count
    if sum(len(recipes) for recipes in _steps.values()) >= _MAX_STEPS:
        _steps.clear()
    candidates = _steps.setdefault(step_key, [])
    candidates.insert(0, _Recipe(paths, at, identities, list(recorder.links), files, binds, layout))
    del candidates[_PER_KEY:]


def _layout(recorder, original, result, rootfs, in_bundle):
    """RESULT's hooks as indices into ORIGINAL's and changed hooks with blanks ({stage: [...]}),
    None when they are ORIGINAL's unchanged, False when they cannot be told."""
    if result.get("hooks") is original.get("hooks") and not recorder.changed:
        return None
    layout = {}
    for stage, entries in _stages(result):
        made = []
        for hook in entries:
            if id(hook) in recorder.changed:
                if not isinstance(hook.get("args"), list):
                    return False
                args = [_ROOTFS if arg == rootfs else ("bundle", in_bundle(arg))
                        if isinstance(arg, str) and arg in recorder.files else arg
                        for arg in hook["args"]]
                # (name, value) in the hook's own order, its arguments with the blanks
                made.append(tuple((name, args if name == "args" else value) for name, value in hook.items()))
            elif id(hook) in recorder.positions and recorder.positions[id(hook)][0] == stage:
                made.append(recorder.positions[id(hook)][1])
            else:
                return False
        layout[stage] = made
    if not isinstance(result.get("hooks"), dict) or len(layout) != len(result["hooks"]):
        return False
    return layout
