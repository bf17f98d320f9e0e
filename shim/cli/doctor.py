"""`cdi-shim doctor`: why a container sees no GPU, layer by layer (checks in shim.node.doctor)."""
import click

from .common import fail as _fail


@click.command()
@click.option("--config", "containerd_config", default="/etc/containerd/config.toml", show_default=True,
              metavar="PATH", help="containerd's config file (a path on the node, inside --root).")
@click.option("--cdi-dir", "cdi_dirs", multiple=True, metavar="DIR",
              help="CDI spec directory (repeatable; default: the cdi-shim config's spec-dirs).")
@click.option("--runtimeclass", "runtimeclasses", multiple=True, metavar="FILE",
              type=click.Path(dir_okay=False), help="RuntimeClass YAML whose handler to check (repeatable).")
@click.option("--root", default="/", show_default=True, type=click.Path(file_okay=False, exists=True),
              help="Check the node in this directory tree instead of /; links are resolved inside it.")
@click.option("--containerd-binary", metavar="PATH",
              help="containerd executable to ask for its version (default: the first on the node's PATH).")
@click.option("--shim-as-default", is_flag=True,
              help="The shim as containerd's default_runtime_name is intended.")
@click.option("--docker-config", default="/etc/docker/daemon.json", show_default=True, metavar="PATH",
              help="Docker's daemon.json (a path on the node, inside --root); its checks run where Docker is.")
@click.option("--podman-config", default="/etc/containers/containers.conf", show_default=True, metavar="PATH",
              help="root's podman containers.conf (a path on the node, inside --root; with /usr/share's and its .d "
                   "drop-ins); its checks run where podman is.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per check, in a list.")
def doctor(containerd_config, cdi_dirs, runtimeclasses, root, containerd_binary, shim_as_default, docker_config,
           podman_config, as_json):
    """Diagnose why a container gets no GPU: kernel, user-space driver, CDI specs, containerd,
    RuntimeClass, Docker's daemon.json, podman's containers.conf, the runtime. Offline, no GPU needed.

    Prints one line per check: ok, warn or fail, what it saw and the fix. Exits 1 when any
    check fails.
    """
    import json
    import os

    from ..config import ConfigError, DEFAULT_CONFIG_PATH, CONFIG_ENV, load_config
    from ..node.doctor import FAIL, Node, Options, run_checks

    from cdi.safeio import open_problem

    try:
        config_path = os.environ.get(CONFIG_ENV) or Node(root).host(DEFAULT_CONFIG_PATH)
    except OSError as err:  # a link loop on the way, inside ROOT
        _fail(f"cannot read cdi-shim config {os.path.join(root, DEFAULT_CONFIG_PATH.lstrip('/'))}: "
              f"{open_problem(err)}")
    try:
        config = load_config(config_path)
    except ConfigError as err:
        _fail(str(err))
    options = Options(root=root, containerd_config=containerd_config, spec_dirs=cdi_dirs,
                      runtimeclasses=runtimeclasses, containerd_binary=containerd_binary, settings=config,
                      shim_as_default=shim_as_default, docker_config=docker_config,
                      podman_config=podman_config)
    results = run_checks(options)
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in results], indent=1))
    else:
        width = max((len(r.id) for r in results), default=0)
        for r in results:
            line = f"{r.status:<4}  {r.id:<{width}}  {r.brief}"   # long lists capped; --json has them all
            if r.fix and r.status != "ok":
                line += f"  -- fix: {r.fix}"
            click.echo(line)
        failed = sum(r.status == FAIL for r in results)
        warned = sum(r.status == "warn" for r in results)
        click.echo(f"{len(results)} checks: {failed} failed, {warned} warnings", err=True)
    if any(r.status == FAIL for r in results):
        click.get_current_context().exit(1)
