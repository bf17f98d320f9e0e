"""`cdi-shim-runtime` (Python part): inject CDI devices on create/run, then exec runc.

The native front end (csrc/frontend/) execs runc itself for every other command and for
containers that cannot be asking for a device; it hands create/run over to `main` here. The
work is a plain function of (argv, bundle, config), `prepare`, so a resident process can call
it too.
"""
import os
import sys
import time

from cdi import __version__
from cdi.errors import CDIError

from .. import fastjson
from ..bundle import BundleError, read_config, write_config
from ..config import ConfigError, load_config
from .requests import collect_requests, drop_legacy_hook
from .runc_args import ArgvError, parse_runc_argv
from .runlog import RunLog


class RuntimeFailure(Exception):
    pass


class Abandoned(Exception):
    """The caller took the create back before its first write (a resident worker that stalled
    past the front end's bound): nothing was written, and the caller does the work itself."""


def _always():
    return True


class _Writes:
    """The create's writes into the bundle: COMMIT() is asked before the first (False: Abandoned),
    and on a failure the bundle files of ours ("cdi-shim.*") that were not there before are
    removed, so a failed create leaves the bundle as it found it (config.json is replaced
    atomically, or not at all)."""

    def __init__(self, bundle, commit):
        self.bundle, self.commit, self.before = bundle, commit, None

    def begin(self):
        if self.before is not None:
            return
        if not self.commit():
            raise Abandoned()
        self.before = _our_files(self.bundle)

    def undo(self):
        if self.before is None:
            return
        for name in _our_files(self.bundle) - self.before:
            path = os.path.join(self.bundle, name)
            try:
                os.unlink(path)
            except IsADirectoryError:      # a read-only root's /etc overlay (shim/linker/etcfiles.py)
                import shutil

                shutil.rmtree(path, ignore_errors=True)     # (links in it are removed, not followed)
            except OSError:
                pass


def _our_files(bundle):
    try:
        return {name for name in os.listdir(bundle) if name.startswith("cdi-shim.")}
    except OSError:
        return set()


def find_runtime(name):
    """The low-level runtime: an absolute path, or a name looked up on PATH.

    (shutil.which would do, but importing shutil is a cost this path avoids.)
    """
    if "/" in name:
        if not os.access(name, os.X_OK):
            raise RuntimeFailure(f"low-level runtime {name} is not executable")
        return name
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    raise RuntimeFailure(f'low-level runtime "{name}" not found on PATH (install runc or set '
                         '"runtime" in /etc/cdi-shim/config.toml)')


class _Phases:
    def __init__(self, log):
        self.log, self.last, self.times = log, time.perf_counter(), []

    def done(self, name):
        now = time.perf_counter()
        self.times.append((name, (now - self.last) * 1000))
        self.last = now

    def report(self):
        if self.log.debug_enabled:
            for name, ms in self.times:
                self.log.debug(f"phase={name} took={ms:.2f}ms")


class Create:
    """One create (or run), from its parsed command line to config.json written: what each part
    of `prepare` reads and what it leaves for the next.

    Given: ARGS (parse_runc_argv's; the bundle is ARGS.bundle), SETTINGS, LOG, WRITES (_Writes),
    MEMOS (the resident worker's ldcache.Memos, or None: not a worker, no step is kept), and the
    phases' timings (PHASES). Read: config.json as CONFIG (without Docker's legacy hook,
    LEGACY_HOOK says whether it had one), its bytes RAW and its stat INFO; the DEVICES requested;
    STEPS, where a resident worker keeps its steps' recipes (None: nowhere). Injected: the
    specs' edit BLOCKS, MERGED, and the config with them applied, EDITED. Stepped: RECORDED (the
    injection for the front end to replay, requestmemo's) or WHY it is not kept."""

    __slots__ = ("args", "settings", "log", "writes", "memos", "phases", "config", "raw", "info", "legacy_hook",
                 "devices", "steps", "blocks", "merged", "edited", "recorded", "why")

    def __init__(self, args, settings, log, writes, memos=None):
        self.args, self.settings, self.log, self.writes, self.memos = args, settings, log, writes, memos
        self.phases = _Phases(log)
        self.config = self.raw = self.info = None
        self.legacy_hook = False
        self.devices = []
        self.steps = self.blocks = self.merged = self.edited = None
        self.recorded = self.why = None

    @property
    def bundle(self):
        return self.args.bundle

    @property
    def container(self):
        """The container's id as messages name it ("?": none given)."""
        return self.args.container_id or "?"


def check_freshness(blocks, origins, container, log):
    """Fail the create when a host file the requested devices need is gone (a mount source, a
    device node: cdi/host_files.py), naming the spec, the device and the file, whatever driver
    the spec was made for (runc would fail on it, obscurely, inside its own error); warn of a
    generated spec made for another driver than the loaded one (shim/driver_version.py).
    One stat a needed file.

    BLOCKS and ORIGINS are Registry.resolve's: a spec's own edits come just before its first
    requested device's, so each spec's blocks are known without loading it again. The version
    a spec records is read from its own edits (the libnvidia-ml.so.<version> mount every
    generated spec has); /proc/driver/nvidia/version is read (one small read) only when one
    does."""
    from ..driver_version import check_spec

    per_spec, at = {}, 0
    for name, path in origins:
        if path not in per_spec:
            per_spec[path] = ([], [blocks[at]])
            at += 1
        names, edits = per_spec[path]
        names.append(name)
        edits.append(blocks[at])
        at += 1
    for path, (names, edits) in per_spec.items():
        problem = check_spec({"containerEdits": edits[0]}, path, edits, [", ".join(names)] + names)
        if problem is None:
            continue
        level, message = problem
        if level == "error":
            raise RuntimeFailure(f"container {container}: cannot inject {', '.join(names)}: {message}")
        log.warning(f"container {container}: {message} (its files are still there: the container may run "
                    "with the old driver's libraries)")


def prepare(args, settings, log, commit=_always, memos=None):
    """Do the create/run work for parsed runc args; returns the devices injected.

    On any failure raises RuntimeFailure and leaves config.json exactly as it was, and the
    bundle without files of ours it did not have. COMMIT() is asked before the first write:
    when it says False, raises Abandoned with nothing written. MEMOS: a resident worker's (see
    Create).
    """
    create = Create(args, settings, log, _Writes(args.bundle, commit), memos)
    try:
        return _prepare(create)
    except Exception:
        create.writes.undo()
        raise


def _prepare(create):
    phases = create.phases
    try:
        config, create.raw, create.info = read_config(create.bundle)
    except BundleError as err:
        raise RuntimeFailure(str(err)) from None
    phases.done("config")
    create.config, create.legacy_hook = drop_legacy_hook(config)
    try:
        create.devices = collect_requests(create.config, create.settings, create.args.devices,
                                          warn=create.log.warning, legacy_hook=create.legacy_hook)
    except CDIError as err:
        raise RuntimeFailure(str(err)) from None
    phases.done("requests")
    if not create.devices and create.legacy_hook:
        create.writes.begin()
        _write(create, create.config)  # docker --gpus with no device (count 0): the hook goes all the same
    if not create.devices:
        # Injected by someone else (containerd's own CDI, podman): the hooks' work is ours all the same.
        _prepare_injected(create)
        phases.report()
        return []
    create.steps = _steps_dir(create)
    started = _clock_ns() if create.steps else None     # (a request's recipe: the settle window's reference)
    _inject(create)
    _refuse_rootless_devices(create.edited, create.args)
    create.writes.begin()
    _step(create)
    if create.recorded and not create.log.warnings:
        from . import requestmemo

        create.why = requestmemo.export(create.recorded, create.settings, create.blocks, create.devices,
                                        create.steps, started)
    if create.why:
        create.log.debug(f"container {create.container}: the injection is not kept for the front end: {create.why}")
    if create.steps:
        phases.done("recipe")
    phases.report()
    create.log.info(f"container {create.container}: injected {', '.join(create.devices)}")
    return create.devices


def _inject(create):
    """CREATE's specs' edit BLOCKS, MERGED, and its CONFIG with them applied (EDITED), for its
    DEVICES, each spec's host files checked (check_freshness)."""
    from cdi.container_edits import apply_edits, merge_edits
    from cdi.registry import Registry

    registry = Registry(create.settings.spec_dirs).refresh()
    if registry.cache_problem:
        create.log.warning(registry.cache_problem)
    try:
        create.blocks, origins = registry.resolve(create.devices)
    except CDIError as err:
        raise RuntimeFailure(f"container {create.container}: {err}") from None
    create.phases.done("resolve")
    check_freshness(create.blocks, origins, create.container, create.log)
    create.phases.done("freshness")
    create.merged = merge_edits(create.blocks)
    try:
        edited = apply_edits(create.config, create.merged)
    except CDIError as err:
        specs = ", ".join(sorted({path for _, path in origins}))
        raise RuntimeFailure(f"container {create.container}: failed to inject devices "
                             f"{', '.join(create.devices)} (from {specs}): {err}") from None
    create.edited = once(create.config, edited)
    create.phases.done("apply")


def _recordable(create):
    """Whether the injection is recorded for the front end (requestmemo.py, injected.py): only when it can be
    replayed as it was done (no warning, no Docker hook)."""
    return create.steps and not create.log.warnings and not create.legacy_hook


def _step(create):
    """The linker step of CREATE's injected config (EDITED), and config.json written: replayed
    from a kept step's recipe (in STEPS) when one applies, else done (and its recipe written).
    Sets RECORDED to the injection to record when it is recordable (_recordable) and the front
    end could replay it all, and WHY when not and it knows why. The step of a recordable
    injection is keyed by the text the front end's apply gives, so that the front end finds the
    step's recipe after its own apply; one that has nothing to do is recorded as the config.json
    it leaves, with no step."""
    from ..linker.container import needs_step

    recordable = _recordable(create)
    if recordable:
        from . import injected
    edited = create.edited
    found = why = None
    stepped = needs_step(edited)
    if recordable and stepped:
        found, why = injected.record(create.raw, create.args.devices, create.config, edited, create.merged,
                                           create.settings, stepped)
    create.recorded, create.why = found, why
    text = found.text if found else fastjson.dumpb(edited)
    memo = _memo(create)
    if memo and stepped and _replayed(create, memo, text):
        return
    final = _linker(create, edited, f"cannot inject {', '.join(create.devices)}: ", raw=text, memo=memo)
    create.phases.done("linker")
    _write(create, final)
    create.phases.done("write")
    kept = memo and final is not edited and memo.why == ""
    if recordable and not stepped:
        create.recorded, create.why = injected.record(create.raw, create.args.devices, create.config, final,
                                                            create.merged, create.settings, stepped)
    elif not kept:
        create.recorded = None


def once(original, edited):
    """EDITED without the hooks and device cgroup rules that apply_edits appended although
    ORIGINAL already had them: a device injected before us (containerd's own CDI, podman) and
    requested again by an annotation we read is injected once. (Device nodes, mounts and env
    are replaced by path, destination and name already; hooks and rules are appended.)"""
    def trimmed(before, after):
        if not isinstance(before, list) or not isinstance(after, list) or len(after) <= len(before):
            return after
        kept, seen = list(after[:len(before)]), list(before)
        for entry in after[len(before):]:
            if entry in seen:
                seen.remove(entry)  # as many as ORIGINAL had, no more
            else:
                kept.append(entry)
        return kept

    hooks = edited.get("hooks")
    if isinstance(hooks, dict) and isinstance(original.get("hooks"), dict):
        edited = dict(edited, hooks={stage: trimmed(original["hooks"].get(stage), entries)
                                     for stage, entries in hooks.items()})
    rules = ((edited.get("linux") or {}).get("resources") or {}).get("devices")
    before = ((original.get("linux") or {}).get("resources") or {}).get("devices")
    if rules is not None and before:
        linux = edited["linux"]
        edited = dict(edited, linux=dict(linux, resources=dict(linux["resources"], devices=trimmed(before, rules))))
    return edited


def _linker(create, config, what="", raw=None, memo=None):
    """CONFIG after CREATE's linker step (prepare_linker): our hooks' work done, they dropped; the
    step kept by MEMO (a worker's stepmemo.StepMemo) as a recipe when it can be."""
    from ..linker.container import LinkerLimitError, NoPlaceForCache, isolate_hooks, prepare_linker
    from ..linker.toolkit_hooks import HookFailure

    try:
        # (a per-create interpreter that keeps its step: a plan memo of its own says what plans looked at)
        with _plans(create, memo):
            return isolate_hooks(prepare_linker(config, create.bundle, create.log,
                                                file_binds=create.settings.file_binds == "hook", raw=raw, memo=memo))
    except NoPlaceForCache as err:
        raise RuntimeFailure(f"container {create.container}: {what}{err}") from None
    except (LinkerLimitError, HookFailure) as err:
        raise RuntimeFailure(f"container {create.container}: {err}") from None


def _plans(create, memo):
    """The plan memo a step MEMO keeps needs in use: a worker's is (its memos'); else a new one."""
    import contextlib

    from ..ldconfig.ldcache import PlanMemo

    return PlanMemo().using() if memo is not None and create.memos is None else contextlib.nullcontext()


def _write(create, config):
    """CONFIG as CREATE's config.json, with the mode it had."""
    try:
        write_config(create.bundle, config, create.info.st_mode)
    except OSError as err:
        raise RuntimeFailure(f"cannot write {create.bundle}/config.json: {err.strerror}") from None


def _prepare_injected(create):
    """A config with no request but with hooks whose work we do: do it, drop them. In a
    resident worker, a step kept before is replayed from its recipe (as the front end does),
    and a step done is kept as a recipe beside the socket for the front end to replay the next
    time (shim/linker/stepmemo.py)."""
    from ..linker.container import has_known_hooks

    config = create.config
    _refuse_rootless_devices(config, create.args)
    if not has_known_hooks(config):
        return
    create.writes.begin()
    memo = _memo(create)
    if memo and not create.legacy_hook and _replayed(create, memo, create.raw):   # (RAW: config.json as it is)
        return
    edited = _linker(create, config, raw=create.raw, memo=memo)
    create.phases.done("linker")
    if edited is not config:
        _write(create, edited)
        create.phases.done("write")
        create.log.debug(f"container {create.container}: the work of the injected spec's hooks done natively")


def _memo(create):
    """The worker's memo of steps (stepmemo.StepMemo: the recipes in CREATE's steps folder), or None."""
    from ..linker.stepmemo import StepMemo

    steps = create.steps or _steps_dir(create)
    return StepMemo(steps) if steps else None


def _steps_dir(create):
    """Where CREATE keeps its steps' and injection's recipes: the steps folder beside the configured
    resident socket; a resident worker's (CREATE has memos), or, for a per-create interpreter (a
    direct `--device` run without the resident process), when that folder is safely ours
    (_own_folder), so that the front end replays the next run. None: no socket configured, or runc
    binds the files (a recipe replays only what the hook mode gives)."""
    settings = create.settings
    if not settings.resident_socket or settings.file_binds != "hook":
        return None
    steps = os.path.join(os.path.dirname(settings.resident_socket), "steps")
    return steps if create.memos is not None or _own_folder(steps) else None


def _own_folder(path):
    """Whether PATH is a folder no one but us may write (it and its parent made 0700 if missing):
    owned by us, not a link, no folder on its way writable by others (cdi.safeio's rule)."""
    import stat

    from cdi.safeio import private_dir_problem

    try:
        if private_dir_problem(path, must_exist=False):
            return False
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        os.makedirs(path, mode=0o700, exist_ok=True)
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o022 \
        and private_dir_problem(path) is None


def _replayed(create, memo, text):
    """True when the step kept for the config TEXT (as read, or as injected from a request) was
    replayed from its recipe by the C replay the front end runs (csrc/engine/replay.c, through
    MEMO), config.json written; False: the step is to be done."""
    if not memo.replay(text, create.bundle, create.info.st_mode):
        return False
    create.phases.done("replay")
    create.log.debug(f"container {create.container}: the linker step of an earlier container of these files and "
                     "spec, replayed from its recipe")
    return True


def _clock_ns():
    from .._native import lib

    return lib.cds_memo_clock_ns()


def _refuse_rootless_devices(config, args):
    from .rootless import check

    problem = check(config, args.container_id or "?")
    if problem:
        raise RuntimeFailure(problem)


def decide(argv, where="", commit=_always, memos=None):
    """Everything `cdi-shim-runtime` does before it execs runc, for one command line.

    Returns (status, exec_argv): exec_argv is the runtime and its arguments to exec when the
    status is 0; otherwise the reason has been reported and the process should exit with
    the status. Status None: COMMIT (see prepare) said False, nothing was written or reported.
    MEMOS: the resident worker's (ldcache.Memos; None: not a worker).
    Reads the config, PATH and the bundle through the current environment and working
    directory, so the resident process runs it in a child that has the caller's (and says so in
    WHERE, for the debug log).
    """
    start = time.perf_counter()
    try:
        args = parse_runc_argv(argv)
    except ArgvError as err:
        sys.stderr.write(f"cdi-shim: {err}\n")
        return 2, None
    try:
        settings = load_config()
    except ConfigError as err:
        RunLog(args.log_file, args.log_format).error(str(err))
        return 1, None
    log = RunLog(args.log_file, args.log_format, settings.log_file,
                 debug=settings.log_level == "debug", debug_to_stderr=args.debug)
    try:
        runc = find_runtime(settings.runtime)
        if args.help:
            pass  # runc prints help (the front end printed ours first)
        elif args.command in ("create", "run"):
            prepare(args, settings, log, commit, memos)
        elif args.devices and args.command:
            log.warning(f"--device is ignored for the {args.command} command")
    except Abandoned:
        return None, None
    except RuntimeFailure as err:
        log.error(str(err))
        log.debug(f"phase=total took={(time.perf_counter() - start) * 1000:.2f}ms{where}; failed")
        return 1, None
    except Exception as err:  # noqa: BLE001 - containerd must see why, not a bare exit status
        log.error(f"internal error while preparing {args.command}: {type(err).__name__}: {err} "
                   "(config.json was not changed)")
        raise
    if not args.command and any(arg in ("--version", "-v") for arg in args.runc_argv):
        sys.stdout.write(f"cdi-shim-runtime version {__version__}\n")
        sys.stdout.flush()
    log.debug(f"phase=total took={(time.perf_counter() - start) * 1000:.2f}ms{where}; exec {runc}")
    return 0, [runc] + args.runc_argv


def main(argv=None):
    status, exec_argv = decide(list(sys.argv[1:] if argv is None else argv))
    if status:
        return status
    os.execv(exec_argv[0], exec_argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
