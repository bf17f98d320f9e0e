"""`cdi-shim install --node`: the node's whole set-up, idempotent, for a boot to rerun."""
import click

from .common import fail as _fail


@click.command()
@click.option("--node", is_flag=True, required=True,
              help="Install on this node (the only target now; required, so that a later target cannot be "
                   "taken for it).")
@click.option("--drop-in", is_flag=True,
              help="Register the runtime in /etc/containerd/conf.d/99-cdi-shim.toml, imported by the main file, "
                   "instead of editing the main file's CRI section.")
@click.option("--nri", is_flag=True,
              help="GPUs through containerd's NRI (docs/nri.md): install, enable and start the NRI plugin's unit "
                   "(cdi-shim-nri.service) instead of registering the runtime and the resident unit; containerd's "
                   "config is not edited and containerd is not restarted.")
@click.option("--restart", is_flag=True,
              help="Restart containerd (k3s/rke2: their service) when its configuration changed.")
@click.option("--root", default="/", show_default=True, metavar="DIR",
              help="Install into the node tree at DIR (a node image, the tests): every path is resolved inside "
                   "it, and systemctl is not run unless --systemctl is given.")
@click.option("--runtime-name", default="nvidia", show_default=True,
              help="The CRI runtime name (the RuntimeClass handler).")
@click.option("--runtime-binary", metavar="PATH",
              help="BinaryName to register, as the node sees it (default: cdi-shim-runtime beside this "
                   "interpreter, else on PATH).")
@click.option("--cdi-shim-binary", metavar="PATH",
              help="cdi-shim as the node sees it, for the resident unit's ExecStart (default: beside this "
                   "interpreter).")
@click.option("--containerd-binary", default="containerd", show_default=True, metavar="PATH",
              help="containerd executable that tells the config version and loads the new config.")
@click.option("--systemctl", "systemctl", metavar="COMMAND",
              help="How to run systemctl (e.g. `nsenter -t 1 -m -- systemctl`); default: systemctl when ROOT "
                   "is / and PID 1 is systemd, else none.")
@click.option("--driver-root", metavar="DIR", help="The driver's root for the CDI spec (default: ROOT).")
@click.option("--dev-root", metavar="DIR", help="The device nodes' root for the CDI spec (default: the driver root).")
@click.option("--dev-char-only", is_flag=True,
              help="Only make the /dev/char links of the specs' device nodes (what the udev rule runs).")
@click.option("--hook-program", metavar="PATH", hidden=True, help="The hook program the CDI spec names.")
@click.option("--layout", type=click.Choice(["files", "one-mount"]), default="files", show_default=True,
              help="The CDI spec's layout, as `cdi generate --layout`: one-mount keeps the driver's files in "
                   "/var/lib/cdi-shim/driver and binds that folder (docs/one-mount.md); pass it at every run.")
@click.option("--no-spec-refresh", "spec_refresh", is_flag=True, flag_value=False, default=True,
              help="Do not install the spec refresh (cdi-shim-generate.service: `cdi generate --watch`, which "
                   "regenerates the spec after a driver upgrade, as the toolkit's nvidia-cdi-refresh).")
def install(node, drop_in, nri, restart, root, runtime_name, runtime_binary, cdi_shim_binary, containerd_binary,
            systemctl, driver_root, dev_root, dev_char_only, hook_program, layout, spec_refresh):
    """Set up this node for cdi-shim, idempotently: rerun it at every node start.

    Writes /etc/cdi-shim/config.toml when missing, registers the runtime with containerd (a
    drop-in with --drop-in; on k3s/rke2 their config.toml.tmpl), installs, enables and starts
    the resident process's unit, generates /var/run/cdi/nvidia.yaml when a GPU is present, installs,
    enables and starts the spec refresh (cdi-shim-generate.service: `cdi generate --watch`; not
    with --no-spec-refresh), and links the specs' device nodes in /dev/char (with a udev rule for
    nodes made later).
    A second run changes nothing and says so. containerd is restarted only with --restart, and
    only when its configuration changed. With --nri: the NRI plugin's unit instead of the runtime
    entry and the resident unit (containerd 1.7 needs NRI turned on: a note says so).
    """
    from ..node.install import Installer, InstallError, install_node

    try:
        installer = Installer(root=root, drop_in=drop_in, runtime_name=runtime_name, runtime_binary=runtime_binary,
                              cdi_shim=cdi_shim_binary, containerd=containerd_binary, systemctl=systemctl,
                              driver_root=driver_root, dev_root=dev_root, hook_program=hook_program,
                              layout=layout, spec_refresh=spec_refresh)
        install_node(installer, restart=restart, report=lambda line: click.echo(f"cdi-shim: {line}", err=True),
                     dev_char_only=dev_char_only, nri=nri)
    except InstallError as err:
        _fail(str(err))
