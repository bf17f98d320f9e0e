"""`cdi-shim cdi validate | list | inject`: CDI spec tooling."""
import json
import os
import sys

import click

from cdi.errors import CDIError, q
from cdi.parser import check_device_argument
from cdi.registry import Registry
from cdi.spec import read_spec
from cdi.spec_dirs import is_spec_file_name, placement_problem

from .common import spec_dirs as spec_dirs_or_configured


@click.group()
def cdi():
    """Validate, list and inject CDI spec devices."""


def _searched(dirs):
    """"searched /etc/cdi (does not exist), /var/run/cdi": for a search that found nothing."""
    return "searched " + ", ".join(d if os.path.isdir(d) else f"{d} (does not exist)" if not os.path.exists(d)
                                   else f"{d} (not a directory)" for d in dirs)


def _warning_line(where, message):
    """`<file>: <error>` for a registry error about WHERE (a spec file or directory): the
    registry's texts (the CDI library's, "failed to load CDI Spec invalid CDI Spec "<file>": ...")
    name the file in the middle; a reader looks for it first."""
    message = message.removeprefix("failed to load CDI Spec ")
    quoted = f' {q(where)}: '
    if quoted in message:
        head, _, tail = message.partition(quoted)
        message = f"{head}: {tail}"
    return f"{where}: {message}"


def _validate_file(path, spec_dirs, problems, check_placement=True):
    if check_placement:
        problem = placement_problem(path, spec_dirs)
        if problem:
            problems.append(("warning", problem))
    try:
        spec = read_spec(path)
    except CDIError as err:
        problems.append(("error", str(err)))
        return None
    from ..driver_version import check_spec

    stale = check_spec(spec.doc, path)   # made for another driver than the loaded one
    if stale:
        problems.append(stale)
    return spec


@cdi.command()
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("--spec-dir", "spec_dirs", multiple=True, metavar="DIR",
              help="Spec directories for placement checks (rising priority; default: the configured ones).")
def validate(paths, spec_dirs):
    """Validate CDI spec files or directories (default: the spec directories).

    Prints one line per problem, "error: ..." or "warning: ..." (a warning says why a file
    will be ignored: wrong extension, sub-directory, outside the spec directories). A host
    file a spec needs that is not there (a bind-mount source, a device node whose numbers come
    from the host) is an error naming the file and its device, at any driver version; a spec
    generated for another driver version than the loaded one (/proc/driver/nvidia/version) is
    stale: a warning. Exits 1 if there is any error.
    """
    spec_dirs = spec_dirs_or_configured(spec_dirs)
    problems, checked = [], 0
    for path in paths or spec_dirs:
        if os.path.isdir(path):
            if not paths and not os.path.exists(path):
                continue
            entries = sorted(os.listdir(path))
            for name in entries:
                full = os.path.join(path, name)
                if os.path.isdir(full) and not os.path.islink(full):
                    if any(is_spec_file_name(n) or n.endswith(".yml") for n in os.listdir(full)):
                        problems.append(("warning", f'"{full}" is a sub-directory; specs in it are not read'))
                    continue
                if name.endswith(".yml"):
                    problems.append(("warning", placement_problem(full, spec_dirs)))
                    continue
                if is_spec_file_name(name):
                    checked += 1
                    _validate_file(full, spec_dirs, problems, check_placement=bool(paths))
            # Conflicts between files of the same directory make their devices unresolvable.
            registry = Registry([path], cache_dir=None).refresh()
            for messages in registry.errors().values():
                for message in messages:
                    if message.startswith("conflicting device"):
                        problems.append(("error", message))
        elif os.path.exists(path) or paths:
            checked += 1
            _validate_file(path, spec_dirs, problems)
    for level, message in dict.fromkeys(problems):
        click.echo(f"{level}: {message}")
    errors = sum(1 for level, _ in dict.fromkeys(problems) if level == "error")
    if not checked:
        click.echo(f"no CDI spec files found; {_searched(paths or spec_dirs)}", err=True)
    click.echo(f"{checked} spec file(s) checked, {errors} error(s)", err=True)
    sys.exit(1 if errors else 0)


@cdi.command(name="list")
@click.option("--spec-dir", "spec_dirs", multiple=True, metavar="DIR",
              help="Spec directory (repeatable, rising priority; default: the configured ones).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of {name, kind, spec}.")
def list_devices(spec_dirs, as_json):
    """List the qualified names of every resolvable CDI device, one a line.

    Spec files that fail to load (and devices defined twice in one directory) are reported on
    stderr, their devices not listed; the others are still listed, and the exit status is 1.
    """
    spec_dirs = spec_dirs_or_configured(spec_dirs)
    registry = Registry(spec_dirs).refresh()
    names = registry.device_names()
    if as_json:
        rows = []
        for name in names:
            spec, _ = registry.lookup(name)
            rows.append({"name": name, "kind": spec.kind, "spec": spec.path})
        click.echo(json.dumps(rows, indent=2))
    else:
        for name in names:
            click.echo(name)
    errors = registry.errors()
    for where, messages in errors.items():
        for message in messages:
            click.echo(f"error: {_warning_line(where, message)}", err=True)
    if not names:
        found = registry.spec_paths() or errors
        click.echo(f"no CDI devices found{'' if found else ' (no spec files)'}; {_searched(spec_dirs)}", err=True)
    if errors:  # a script must not take a partial list for the node's devices
        sys.exit(1)


def _device_arguments(ctx, param, values):
    for value in values:
        try:
            check_device_argument(value)
        except CDIError as err:
            raise click.BadParameter(str(err)) from None
    return values


@cdi.command()
@click.option("--device", "devices", multiple=True, required=True, callback=_device_arguments,
              metavar="NAME", help="Qualified device name, vendor.com/class=name (repeatable, in order).")
@click.option("--spec-dir", "spec_dirs", multiple=True, metavar="DIR",
              help="Spec directory (repeatable, rising priority; default: the configured ones).")
@click.argument("config_json", type=click.Path(dir_okay=False, allow_dash=True))
def inject(devices, spec_dirs, config_json):
    """Print CONFIG_JSON (an OCI config.json; - for stdin) with the devices' edits applied.

    Nothing is written: the input file is left untouched.
    """
    try:
        with click.open_file(config_json, "rb") as stream:
            config = json.loads(stream.read())
    except (OSError, ValueError) as err:
        raise click.ClickException(f"cannot read OCI config {config_json}: {err}") from None
    if not isinstance(config, dict):
        raise click.ClickException(f"OCI config {config_json}: the document is not a JSON object")
    try:
        edited = Registry(spec_dirs_or_configured(spec_dirs)).inject(config, list(devices))
    except CDIError as err:
        raise click.ClickException(str(err)) from None
    click.echo(json.dumps(edited, indent=2))


@cdi.command()
@click.option("--output", default=None, metavar="PATH",
              help="Where to write the spec (default /var/run/cdi/nvidia.yaml; replaced atomically, mode 0644); "
                   "- writes it to stdout, as `nvidia-ctk cdi generate` does without --output.")
@click.option("--format", "fmt", type=click.Choice(["yaml", "json"]), default=None,
              help="Spec format of an output without extension (default yaml); an output's .yaml or .json "
                   "extension decides, a --format disagreeing with it is a warning (as nvidia-ctk).")
@click.option("--vendor", default="nvidia.com", show_default=True, help="The vendor part of the kind.")
@click.option("--class", "cls", default="gpu", show_default=True, help="The class part of the kind.")
@click.option("--device-name-strategy", "strategies", multiple=True,
              type=click.Choice(["index", "uuid", "type-index"]),
              help="How devices are named (repeatable; default: index and uuid): index 0 and 0:1 (MIG), "
                   "uuid GPU-… and MIG-…, type-index gpu0 and mig0:1. \"all\" is always there.")
@click.option("--driver-root", default="/", show_default=True, metavar="DIR",
              help="The root of the driver's files (a driver container's root, e.g. /run/nvidia/driver).")
@click.option("--dev-root", default=None, metavar="DIR",
              help="The root of the device nodes (default: the driver root).")
@click.option("--hook-program", default=None, metavar="PATH",
              help="The hook program the spec names (default: the cdi-shim-hook installed beside this "
                   "interpreter; /usr/bin/nvidia-cdi-hook for the toolkit's).")
@click.option("--spec-version", default=None, metavar="V",
              help="cdiVersion to write (default: the minimum the content needs); refused if too old for it.")
@click.option("--layout", type=click.Choice(["files", "one-mount"]), default="files", show_default=True,
              help="files: one bind a driver file, as nvidia-ctk. one-mount: the driver's libraries and tools in "
                   "one host directory (--driver-dir) bound at /usr/local/nvidia/lib64 and /usr/local/nvidia/bin, "
                   "with an update-ldcache hook for it (docs/one-mount.md).")
@click.option("--driver-dir", default=None, metavar="DIR",
              help="With --layout one-mount: where the host directories are made (default /var/lib/cdi-shim/driver).")
@click.option("--dry-run", is_flag=True, help="Print the spec instead of writing it (nothing is made).")
@click.option("--watch", is_flag=True,
              help="Keep running: regenerate on a driver install or upgrade and on MIG changes (validated "
                   "before it replaces the spec; failures retried with back-off; one line per event on stderr).")
@click.option("--once", is_flag=True,
              help="With --watch: one attempt, then exit 0 (written or up to date), 75 (not ready: retry later) "
                   "or 1 (the spec does not validate).")
@click.option("--interval", type=click.FloatRange(min=0.05), default=5.0, show_default=True, metavar="S",
              help="With --watch: seconds between cheap polls of the driver's files.")
@click.option("--nvml-interval", type=click.FloatRange(min=0.05), default=60.0, show_default=True, metavar="S",
              help="With --watch: seconds between full generations (NVML: MIG devices).")
@click.option("--max-backoff", type=click.FloatRange(min=0.05), default=300.0, show_default=True, metavar="S",
              help="With --watch: the longest wait between retries after failures.")
@click.option("--timings", is_flag=True, hidden=True, help="Print where the time went, on stderr.")
@click.option("--proc-root", default="/proc", hidden=True, help="Where /proc is (tests).")
@click.option("--sysfs-root", default="/sys", hidden=True, help="Where /sys is (tests).")
def generate(output, fmt, vendor, cls, strategies, driver_root, dev_root, hook_program, spec_version, layout,
             driver_dir, dry_run,
             watch, once, interval, nvml_interval, max_backoff, timings, proc_root, sysfs_root):
    """Generate a CDI spec for this node's NVIDIA GPUs, from NVML.

    NVML is the driver root's own libnvidia-ml.so.1 (found through the root's ld.so.cache);
    the driver's libraries, binaries, GSP firmware, IPC sockets and graphics files (Xorg
    modules, ICD and configuration files) are found in the driver root, the device nodes
    (each GPU's DRM nodes too) under the dev root. The spec is validated before it replaces the
    old one. Warnings (an expected library missing, ...) go to stderr.
    """
    from ..generate import GenerateError, Options, generate as make_spec
    from ..generate.spec import DEFAULT_OUTPUT, write

    to_stdout = output == "-"
    if to_stdout and (watch or dry_run):
        raise click.UsageError(f"--output - prints the spec once; {'--watch' if watch else '--dry-run'} does not go "
                               "with it")
    if to_stdout:   # the name gives the format only (nothing is written there)
        output = "-." + (fmt or "yaml")
    options = Options(output=output or DEFAULT_OUTPUT, fmt=fmt, vendor=vendor, cls=cls, strategies=strategies,
                      driver_root=driver_root, dev_root=dev_root, hook_program=hook_program,
                      spec_version=spec_version, proc=proc_root, sysfs=sysfs_root, layout=layout,
                      driver_dir=driver_dir, make_dir=not dry_run)
    if driver_dir is not None and layout != "one-mount":
        raise click.UsageError("--driver-dir goes with --layout one-mount")
    if once and not watch:
        raise click.UsageError("--once goes with --watch")
    if watch:
        if dry_run:
            raise click.UsageError("--watch writes the spec; --dry-run does not go with it")
        _watch(options, once, interval, nvml_interval, max_backoff)
        return
    try:
        result = make_spec(options)
        for warning in result.warnings:
            click.echo(f"warning: {warning}", err=True)
        what = (f"{len(result.doc['devices'])} devices ({len(result.nvml.gpus)} GPU(s), driver "
                f"{result.nvml.driver_version}), cdiVersion {result.doc['cdiVersion']}")
        if dry_run or to_stdout:
            click.echo(result.text, nl=False)
            if to_stdout:
                click.echo(f"wrote the spec to stdout: {what}", err=True)
        else:
            path = write(result)
            click.echo(f"wrote {path}: {what}", err=True)
            if output is None:
                note = _stdout_note(path)
                if note:
                    click.echo(note, err=True)
    except GenerateError as err:
        raise click.ClickException(str(err)) from None
    except OSError as err:
        raise click.ClickException(f"cannot write {options.output}: {err.strerror}") from None
    if timings:
        click.echo(" ".join(f"{k}={v * 1000:.2f}ms" for k, v in result.timings.items()), err=True)


def _stdout_note(path):
    """When stdout is not a terminal (`cdi generate > FILE`, a pipe): where the spec went instead,
    since `nvidia-ctk cdi generate` prints it there; None on a terminal."""
    import stat

    try:
        if os.isatty(1):
            return None
        info = os.fstat(1)
    except OSError:    # stdout closed
        return None
    empty = ""
    if stat.S_ISREG(info.st_mode) and info.st_size == 0:
        try:
            empty = f"; stdout is {os.readlink('/proc/self/fd/1')}, left empty: remove it"
        except OSError:
            pass
    return (f"note: the spec is in {path}, not on stdout (`nvidia-ctk cdi generate` prints it there): "
            f"`--output -` prints it{empty}")


def _watch(options, once, interval, nvml_interval, max_backoff):
    from ..generate.spec import output_path
    from ..generate.watch import Watcher
    from cdi import parser
    from cdi.version import normalize_version

    # A user's errors stop the watcher before it starts (the rest it retries).
    try:
        parser.validate_vendor_name(options.vendor)
        parser.validate_class_name(options.cls)
    except CDIError as err:
        raise click.UsageError(str(err)) from None
    warnings = []
    options.output = output_path(options.output, options.fmt, warnings)
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    if options.spec_version is not None and normalize_version(options.spec_version) is None:
        raise click.UsageError(f"--spec-version {options.spec_version}: not a CDI version (known: 0.3.0 ... 1.1.0)")
    watcher = Watcher(options, interval=interval, nvml_interval=nvml_interval, max_backoff=max_backoff)
    if once:
        sys.exit(watcher.once())
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))   # systemd's stop: unwind (no temp file left)
    watcher.say(f"watching the driver in {options.driver_root} for {options.output} (every {interval:g} s; "
                f"NVML every {nvml_interval:g} s)")
    try:
        watcher.run()
    except KeyboardInterrupt:
        pass
