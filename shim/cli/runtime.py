"""`cdi-shim runtime configure | serve`: register the runtime with containerd; run its resident process."""
import contextlib
import os
import shlex
import shutil
import sys

import click

from .common import fail as _fail, settings


@click.group()
def runtime():
    """Register cdi-shim-runtime with a container engine; run its resident process."""


def _runtimeclass_hint(config_path, runtime_name):
    """The next step, as a command to paste: the RuntimeClass for this handler, checked against the
    containerd config just written (the one the user named, imports included)."""
    program = sys.argv[0] if os.path.basename(sys.argv[0]) == "cdi-shim" else "cdi-shim"
    on_path = shutil.which("cdi-shim")
    if on_path and os.path.realpath(on_path) == os.path.realpath(program):
        program = "cdi-shim"  # the user can type it as it is
    words = [program, "runtimeclass"]
    if runtime_name != "nvidia":
        words += ["--name", runtime_name, "--handler", runtime_name]
    words += ["--config", config_path]
    return f"cdi-shim: next, select it with a RuntimeClass: {shlex.join(words)} | kubectl apply -f -"


@runtime.command()
@click.option("--runtime", "engine", type=click.Choice(["containerd", "docker", "podman"]), default="containerd",
              show_default=True, help="The container engine to configure.")
@click.option("--config", "config_path", metavar="PATH",
              help="The engine's config file, created when missing (default: /etc/containerd/config.toml; "
                   "docker: /etc/docker/daemon.json; podman: $CONTAINERS_CONF, else /etc/containers/containers.conf "
                   "for root and $XDG_CONFIG_HOME/containers/containers.conf for a rootless user).")
@click.option("--runtime-name", metavar="NAME",
              help="Name of the runtime (default: nvidia, the RuntimeClass handler; docker and podman: cdi-shim, "
                   "what docker run --runtime= / podman run --runtime names).")
@click.option("--set-as-default", type=click.BOOL, is_flag=False, flag_value=True, default="false",
              show_default=True, metavar="[true|false]",
              help="Also make it the default runtime (containerd's default_runtime_name, docker's "
                   "default-runtime, podman's engine.runtime): every container then goes through it.")
@click.option("--cdi", "docker_cdi", is_flag=True,
              help="docker: turn on dockerd's own CDI injection (features.cdi, Docker 25+), with cdi-spec-dirs "
                   "equal to cdi-shim's spec-dirs.")
@click.option("--dockerd-binary", default="dockerd", show_default=True, metavar="PATH",
              help="docker: dockerd executable used to tell the version and to check the new daemon.json.")
@click.option("--podman-binary", default="podman", show_default=True, metavar="PATH",
              help="podman: podman executable used to tell the version and to load the new containers.conf.")
@click.option("--config-version", type=click.Choice(["auto", "2", "3", "4"]), default="auto", show_default=True,
              help="Config version to write: auto reads the file's `version` (or, for a missing file, the "
                   "installed containerd's: 2 for 1.x, 3 for 2.0-2.2, 4 for 2.3+).")
@click.option("--enable-cdi", "enable_cdi", type=click.BOOL, default=None, metavar="[true|false]",
              help="Set containerd's own CDI injection (1.7+; default: keep the file's). On, containerd injects "
                   "requested devices from cdi_spec_dirs (kept equal to cdi-shim's spec-dirs) and "
                   "cdi-shim-runtime does their hooks; off, cdi-shim-runtime does both.")
@click.option("--migrate", is_flag=True,
              help="A config older than the installed containerd 2.x writes (version 2 under 2.x) is first "
                   "rewritten by that containerd's `config migrate` (a backup kept); without it such a file is "
                   "refused.")
@click.option("--drop-in", "drop_in", metavar="DIR",
              help="Write the entry to DIR/99-cdi-shim.toml and make the main file import it.")
@click.option("--dry-run", is_flag=True, help="Print the diff; change nothing.")
@click.option("--restart", is_flag=True, help="Restart containerd (systemd) after a change.")
@click.option("--runtime-binary", metavar="PATH",
              help="BinaryName to register (default: cdi-shim-runtime beside this interpreter, else on PATH).")
@click.option("--containerd-binary", default="containerd", show_default=True, metavar="PATH",
              help="containerd executable used to tell the version and to check the new config.")
def configure(engine, config_path, runtime_name, set_as_default, docker_cdi, dockerd_binary, podman_binary,
              config_version, enable_cdi, migrate, drop_in, dry_run, restart, runtime_binary, containerd_binary):
    """Add (or update) the cdi-shim runtime in containerd's config.toml (or Docker's daemon.json).

    Comments, order and unrelated settings are kept; a second run changes nothing. The new file
    is written beside the old one, loaded by the installed containerd (`containerd --config NEW
    config dump`) and checked, and only then renamed over it, after a backup (FILE.bak-DATE).
    The entry allows the configured CDI annotation prefixes as container_annotations (never
    pod_annotations, which would let any pod request any device). On containerd 1.7+, whose CRI
    plugin injects CDI devices itself when enable_cdi is on, cdi_spec_dirs is kept equal to
    cdi-shim's spec-dirs (the output says when they differed) and --enable-cdi sets enable_cdi.
    Config versions: 2 (containerd 1.x), 3 (2.0-2.2), 4 (2.3+); one the installed containerd
    cannot load is refused.

    --runtime=docker merges daemon.json: every other key and runtime stays; adds runtimes.cdi-shim
    with the installed cdi-shim-runtime as its path; --cdi turns on features.cdi (Docker 25+;
    refused on older ones) and sets cdi-spec-dirs; says whether dockerd must restart.

    --runtime=podman merges containers.conf: adds [engine.runtimes] cdi-shim = [the installed
    cdi-shim-runtime], keeps every other key and runtime; --set-as-default sets engine.runtime.
    podman has no daemon: the next podman run reads it.
    """
    containerd_only = ((drop_in, "--drop-in"), (enable_cdi is not None, "--enable-cdi"),
                       (config_version != "auto", "--config-version"), (migrate, "--migrate"),
                       (containerd_binary != "containerd", "--containerd-binary"))
    if engine == "podman":
        for given, name in containerd_only + ((docker_cdi, "--cdi"), (dockerd_binary != "dockerd", "--dockerd-binary"),
                                              (restart, "--restart")):
            if given:
                _fail(f"{name} does not apply to podman (it reads containers.conf at each run; podman injects "
                      "--device VENDOR/CLASS=NAME itself)")
        return _configure_podman(config_path, runtime_name or "cdi-shim", set_as_default, dry_run, runtime_binary,
                                 podman_binary)
    if podman_binary != "podman":
        _fail("--podman-binary applies to --runtime=podman only")
    if engine == "docker":
        for given, name in containerd_only:
            if given:
                _fail(f"{name} applies to containerd only; for docker use --cdi")
        return _configure_docker(config_path or "/etc/docker/daemon.json", runtime_name or "cdi-shim",
                                 set_as_default, docker_cdi, dry_run, restart, runtime_binary, dockerd_binary)
    if docker_cdi or dockerd_binary != "dockerd":
        _fail("--cdi and --dockerd-binary apply to --runtime=docker only; for containerd use --enable-cdi")
    config_path = config_path or "/etc/containerd/config.toml"
    runtime_name = runtime_name or "nvidia"
    from ..node import containerd_config as cc
    from ..node.containerd import restart_containerd
    prefixes = settings().annotation_prefixes
    spec_dirs = settings().spec_dirs
    with _config_lock(config_path):
        _configure_locked(cc, restart_containerd, config_path, runtime_name, set_as_default, config_version,
                          drop_in, dry_run, restart, runtime_binary, containerd_binary, prefixes, spec_dirs,
                          enable_cdi, migrate)


@contextlib.contextmanager
def _config_lock(config_path):
    """The configure lock on CONFIG_PATH, from reading the file to renaming the new one (parallel
    runs lose nothing); a failure to take it ends the command."""
    from ..node import containerd_config as cc

    try:
        lock = cc.configure_lock(config_path, wait_note=lambda note: click.echo(f"cdi-shim: {note}", err=True))
        lock.__enter__()
    except cc.ContainerdConfigError as err:
        _fail(str(err))
    try:
        yield
    finally:
        lock.__exit__(None, None, None)


def _configure_docker(config_path, runtime_name, set_as_default, cdi, dry_run, restart, runtime_binary, dockerd):
    """configure --runtime=docker: plan, then write under the same lock as containerd's."""
    from ..node import docker_config as dc

    with _config_lock(config_path):
        try:
            plan = dc.plan_configure(config_path, runtime_name=runtime_name, binary=runtime_binary,
                                     set_as_default=set_as_default, cdi=cdi, spec_dirs=settings().spec_dirs,
                                     dockerd=dockerd)
        except dc.DockerConfigError as err:
            _fail(str(err))
        for note in plan.notes:
            click.echo(f"cdi-shim: {note}", err=True)
        if dry_run:
            click.echo(plan.diff(), nl=False)
            if not plan.changed:
                click.echo(f'cdi-shim: {plan.path} already has runtime "{runtime_name}" as configured; '
                           "nothing to change", err=True)
            return
        if not plan.changed:
            click.echo(f'cdi-shim: {plan.path} already has runtime "{runtime_name}" as configured; nothing changed',
                       err=True)
            return
        try:
            written, backups, checked = dc.write_plan(plan, dockerd=dockerd)
        except (dc.DockerConfigError, OSError) as err:
            _fail(str(err))
        for path in backups:
            click.echo(f"cdi-shim: backup: {path}", err=True)
        click.echo(f"cdi-shim: wrote {', '.join(written)}"
                   + (" (checked by dockerd --validate)" if checked else " (not checked: no dockerd with --validate)"),
                   err=True)
        if restart:
            try:
                click.echo(f"cdi-shim: {dc.restart_docker()}", err=True)
            except dc.DockerConfigError as err:
                _fail(str(err))
        elif plan.needs_restart:
            click.echo(f"cdi-shim: dockerd must restart to apply it ({', '.join(plan.changed_keys)}): "
                       "systemctl restart docker (or pass --restart)", err=True)
        else:
            click.echo("cdi-shim: dockerd applies it on a reload: systemctl reload docker (or kill -HUP "
                       "$(cat /var/run/docker.pid)); a restart works too", err=True)
        click.echo(f"cdi-shim: then: docker run --runtime={runtime_name} -e NVIDIA_VISIBLE_DEVICES=0 IMAGE ...",
                   err=True)


def _configure_podman(config_path, runtime_name, set_as_default, dry_run, runtime_binary, podman):
    """configure --runtime=podman: plan, then write under the same lock as containerd's and docker's."""
    from ..node import podman_config as pc

    config_path = config_path or pc.default_path()
    with _config_lock(config_path):
        try:
            plan = pc.plan_configure(config_path, runtime_name=runtime_name, binary=runtime_binary,
                                     set_as_default=set_as_default, podman=podman)
        except pc.PodmanConfigError as err:
            _fail(str(err))
        for note in plan.notes:
            click.echo(f"cdi-shim: {note}", err=True)
        if dry_run:
            click.echo(plan.diff(), nl=False)
        if not plan.changed or dry_run:
            if not plan.changed:
                click.echo(f'cdi-shim: {plan.path} already has runtime "{runtime_name}" as configured; nothing '
                           + ("to change" if dry_run else "changed"), err=True)
            return
        try:
            written, backups, checked = pc.write_plan(plan, podman=podman)
        except (pc.PodmanConfigError, OSError) as err:
            _fail(str(err))
        for path in backups:
            click.echo(f"cdi-shim: backup: {path}", err=True)
        click.echo(f"cdi-shim: wrote {', '.join(written)}"
                   + (" (loaded by podman)" if checked else " (not checked: podman is not installed here)"), err=True)
        click.echo("cdi-shim: podman needs no restart: the next podman run reads it (only a running "
                   "`podman system service` must restart)", err=True)
        selector = "" if set_as_default else f" --runtime {runtime_name}"
        click.echo(f"cdi-shim: then: podman run{selector} --device nvidia.com/gpu=0 IMAGE ...", err=True)


def _configure_locked(cc, restart_containerd, config_path, runtime_name, set_as_default, config_version,
                      drop_in, dry_run, restart, runtime_binary, containerd_binary, prefixes, spec_dirs, enable_cdi,
                      migrate=False):
    """configure's work, under the lock on the config file (read to rename)."""
    try:
        plan = cc.plan_configure(config_path, runtime_name=runtime_name, binary=runtime_binary,
                                 annotation_prefixes=prefixes, set_as_default=set_as_default,
                                 config_version=config_version, drop_in=drop_in, containerd=containerd_binary,
                                 spec_dirs=spec_dirs, enable_cdi=enable_cdi, migrate=migrate)
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
        click.echo(_runtimeclass_hint(config_path, runtime_name), err=True)
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
            click.echo(f"cdi-shim: {restart_containerd()}", err=True)
        except cc.ContainerdConfigError as err:
            _fail(str(err))
    else:
        click.echo("cdi-shim: restart containerd to apply it (or pass --restart)", err=True)
    click.echo(_runtimeclass_hint(config_path, runtime_name), err=True)


@runtime.command()
@click.option("--socket", "socket_path", metavar="PATH",
              help="Where to listen (default: the config's resident-socket, /run/cdi-shim/runtime.sock).")
@click.option("--workers", type=click.IntRange(1, 64), default=2, show_default=True,
              help="Worker processes; each prepares one container at a time.")
def serve(socket_path, workers):
    """Run the resident process that prepares containers for cdi-shim-runtime.

    With it running, `create`/`run` of a container that requests devices is prepared by one of
    its long-lived, warm workers instead of a new interpreter, so a create pays no interpreter
    start (the figures are in docs/fast.md). Without it, cdi-shim-runtime starts the interpreter
    itself: same result, only slower. Each request runs
    with the caller's environment, working directory, umask and stderr. Runs in the foreground
    until SIGTERM; meant for a systemd unit (contrib/cdi-shim-resident.service).
    """
    from ..runtime.resident import ResidentError, serve as serve_forever

    if not socket_path:
        socket_path = settings().resident_socket
        if not socket_path:
            _fail('resident-socket is "" in the cdi-shim config: the resident process is turned off')
    try:
        serve_forever(socket_path, workers=workers,
                      ready=lambda path: click.echo(f"cdi-shim: serving on {path}", err=True))
    except (OSError, ResidentError) as err:
        _fail(f"cannot serve on {socket_path}: {err}")
