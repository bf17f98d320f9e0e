"""`cdi-shim runtime configure`, `cdi-shim runtimeclass` and `cdi-shim bench pods`: the node side."""
import sys

import click


def _fail(message):
    raise click.ClickException(message)


@click.group()
def runtime():
    """Register cdi-shim-runtime with a container engine; run its resident process."""


@runtime.command()
@click.option("--runtime", "engine", type=click.Choice(["containerd"]), default="containerd", show_default=True,
              help="The container engine to configure.")
@click.option("--config", "config_path", default="/etc/containerd/config.toml", show_default=True,
              metavar="PATH", help="containerd's config file (created when missing).")
@click.option("--runtime-name", default="nvidia", show_default=True,
              help="Name of the CRI runtime (the RuntimeClass handler).")
@click.option("--set-as-default", type=click.BOOL, is_flag=False, flag_value=True, default=False,
              show_default=True, metavar="[true|false]",
              help="Also make it containerd's default_runtime_name (every pod then goes through it).")
@click.option("--config-version", type=click.Choice(["auto", "2", "3"]), default="auto", show_default=True,
              help="Config version to write: auto reads the file's `version` (or, for a missing file, the "
                   "installed containerd's version).")
@click.option("--drop-in", "drop_in", metavar="DIR",
              help="Write the entry to DIR/99-cdi-shim.toml and make the main file import it.")
@click.option("--dry-run", is_flag=True, help="Print the diff; change nothing.")
@click.option("--restart", is_flag=True, help="Restart containerd (systemd) after a change.")
@click.option("--runtime-binary", metavar="PATH",
              help="BinaryName to register (default: cdi-shim-runtime beside this interpreter, else on PATH).")
@click.option("--containerd-binary", default="containerd", show_default=True, metavar="PATH",
              help="containerd executable used to tell the version and to check the new config.")
def configure(engine, config_path, runtime_name, set_as_default, config_version, drop_in, dry_run, restart,
              runtime_binary, containerd_binary):
    """Add (or update) the cdi-shim runtime in containerd's config.toml.

    Comments, order and unrelated settings are kept; a second run changes nothing. The new file
    is written beside the old one, loaded by the installed containerd (`containerd --config NEW
    config dump`) and checked, and only then renamed over it, after a backup (FILE.bak-DATE).
    The entry allows the configured CDI annotation prefixes as container_annotations (never
    pod_annotations, which would let any pod request any device).
    """
    from . import containerd_config as cc
    from .cli import _config

    prefixes = _config().annotation_prefixes
    try:
        plan = cc.plan_configure(config_path, runtime_name=runtime_name, binary=runtime_binary,
                                 annotation_prefixes=prefixes, set_as_default=set_as_default,
                                 config_version=config_version, drop_in=drop_in, containerd=containerd_binary)
    except cc.ContainerdConfigError as err:
        _fail(str(err))
    for note in plan.notes:
        click.echo(f"cdi-shim: {note}", err=True)
    for warning in plan.warnings:
        click.echo(f"cdi-shim: warning: {warning}", err=True)
    if dry_run:
        diff = plan.diff()
        click.echo(diff, nl=False)
        if not diff:
            click.echo(f"cdi-shim: {plan.path} already has runtime \"{runtime_name}\" as configured; "
                       "nothing to change", err=True)
        return
    if not plan.changed:
        click.echo(f"cdi-shim: {plan.path} already has runtime \"{runtime_name}\" as configured; nothing changed",
                   err=True)
        return
    try:
        written, backups, checked = cc.write_plan(plan, containerd=containerd_binary)
    except (cc.ContainerdConfigError, OSError) as err:
        _fail(str(err))
    for path in backups:
        click.echo(f"cdi-shim: backup: {path}", err=True)
    click.echo(f"cdi-shim: wrote {', '.join(written)}"
               + (" (loaded and checked by the installed containerd)" if checked
                  else " (not checked: containerd is not installed here)"), err=True)
    if restart:
        try:
            click.echo(f"cdi-shim: {cc.restart_containerd()}", err=True)
        except cc.ContainerdConfigError as err:
            _fail(str(err))
    else:
        click.echo("cdi-shim: restart containerd to apply it (or pass --restart)", err=True)


@runtime.command()
@click.option("--socket", "socket_path", metavar="PATH",
              help="Where to listen (default: the config's resident-socket, /run/cdi-shim/runtime.sock).")
@click.option("--workers", type=click.IntRange(1, 64), default=2, show_default=True,
              help="Worker processes; each prepares one container at a time.")
def serve(socket_path, workers):
    """Run the resident process that prepares containers for cdi-shim-runtime.

    With it running, `create`/`run` of a container that requests devices is prepared by one of
    its warm workers instead of a new interpreter (~15 ms less per GPU container). Without it,
    cdi-shim-runtime starts the interpreter itself: same result, only slower. Each request runs
    with the caller's environment, working directory, umask and stderr. Runs in the foreground
    until SIGTERM; meant for a systemd unit (contrib/cdi-shim-resident.service).
    """
    from .config import ConfigError, load_config
    from .resident import ResidentError, serve as serve_forever

    if not socket_path:
        try:
            socket_path = load_config().resident_socket
        except ConfigError as err:
            _fail(str(err))
        if not socket_path:
            _fail('resident-socket is "" in the cdi-shim config: the resident process is turned off')
    try:
        serve_forever(socket_path, workers=workers, ready=lambda path: click.echo(f"cdi-shim: serving on {path}", err=True))
    except (OSError, ResidentError) as err:
        _fail(f"cannot serve on {socket_path}: {err}")


@click.command()
@click.option("--name", default="nvidia", show_default=True, help="metadata.name of the RuntimeClass.")
@click.option("--handler", default="nvidia", show_default=True,
              help="The containerd runtime name (`runtime configure --runtime-name`).")
@click.option("--example-pod", is_flag=True, help="Also print an example Pod that uses it with a GPU limit.")
@click.option("--config", "containerd_config", metavar="PATH",
              help="containerd config to check the handler against (its imports included).")
def runtimeclass(name, handler, example_pod, containerd_config):
    """Print a RuntimeClass (node.k8s.io/v1) selecting the cdi-shim runtime.

    With --config, a handler that names no configured runtime is refused with the error every pod
    using it would meet: no runtime for "<handler>" is configured.
    """
    from .runtimeclass import RuntimeClassError, check_handler, check_names, render

    try:
        check_names(name, handler)
        if containerd_config:
            check_handler(handler, containerd_config)
    except RuntimeClassError as err:
        _fail(str(err))
    click.echo(render(name, handler, with_example_pod=example_pod), nl=False)


@click.group()
def bench():
    """Benchmarks that need real parts (a private containerd)."""


@bench.command()
@click.option("-n", "--pairs", default=20, show_default=True, help="Measured pod pairs per scenario.")
@click.option("--warmup", default=2, show_default=True, help="Unmeasured pairs per scenario first.")
@click.option("--scenario", "scenarios", multiple=True,
              type=click.Choice(["no-device", "one-device", "device-30-libs", "device-30-libs-vs-cri"]),
              help="Scenarios to run (default: all).")
@click.option("--plot", metavar="FILE.png", help="Draw the distributions (needs matplotlib).")
@click.option("--json", "json_path", metavar="FILE", help="Write every measurement as JSON.")
@click.option("--workdir", metavar="DIR", help="Parent of the private containerd's temp dir (default: $TMPDIR).")
@click.option("--resident/--no-resident", default=True, show_default=True,
              help="Run the runtime's resident process (cdi-shim runtime serve) as a node would; "
                   "--no-resident measures an interpreter start per create instead.")
def pods(pairs, warmup, scenarios, plot, json_path, workdir, resident):
    """Pod start-up through a private containerd: the cdi-shim handler against plain runc.

    Each pod: RunPodSandbox, CreateContainer, StartContainer, wait for exit, StopPodSandbox,
    RemovePodSandbox. Pairs alternate the handlers (and which goes first). Prints medians, paired
    ratios and the runtime's per-phase breakdown from its debug log. Needs root, containerd 1.6+,
    runc, busybox-static and gcc, and grpcio + grpcio-tools (pip install 'cdi-shim[bench]').
    """
    try:
        from . import podbench
    except ImportError as err:  # grpcio missing
        _fail(f"{err}: pip install 'cdi-shim[bench]'")
    try:
        result = podbench.run(pairs=pairs, warmup=warmup, scenarios=scenarios or None, workdir=workdir,
                              log=lambda text: click.echo(text, err=True), resident=resident)
    except podbench.BenchError as err:
        _fail(str(err))
    click.echo(podbench.report(result))
    if json_path:
        podbench.write_json(result, json_path)
    if plot:
        try:
            podbench.plot(result, plot)
        except ImportError:
            _fail("--plot needs matplotlib: pip install matplotlib")
        click.echo(f"plot: {plot}", err=True)
    sys.stdout.flush()
