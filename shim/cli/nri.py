"""`cdi-shim nri`: the NRI plugin (shim/nri/)."""
import click

from .common import fail, settings


@click.command("nri")
@click.option("--socket", "socket_path", metavar="PATH", default="/var/run/nri/nri.sock", show_default=True,
              help="containerd's NRI socket.")
@click.option("--namespace", "namespaces", metavar="NAME", multiple=True,
              help="Also serve pods of this namespace (repeatable; on top of the config's nri-namespaces; "
                   "'*' serves every namespace).")
@click.option("--name", default="cdi-shim", show_default=True, help="The plugin's name in the registration.")
@click.option("--index", default="10", show_default=True,
              help="The plugin's index (two digits): plugins are called in rising index order.")
@click.option("--hook-socket", metavar="PATH", default="/run/cdi-shim/nri-hook.sock", show_default=True,
              help="Where the plugin serves its hook (cdi-shim-nshook nri): the linker cache is written by this "
                   "process, not by a program started per container. It must be a path runc's hooks see.")
@click.option("--once", is_flag=True, help="Serve one connection and exit when it ends (no reconnect).")
def nri(socket_path, namespaces, name, index, hook_socket, once):
    """Inject CDI devices into containers as a containerd NRI plugin (containerd 1.7 with NRI
    turned on, 2.x by default): pods need no RuntimeClass, and the node's runtime stays runc.

    On every container creation it reads the pod's and the container's CDI annotations
    (cdi.k8s.io/*) and the toolkit plugin's pod annotation nvidia.cdi.k8s.io/container.<name>,
    resolves the devices from the configured spec folders, and answers with their edits
    (device nodes and cgroup rules, mounts, env, hooks). The toolkit's update-ldcache,
    create-symlinks, chmod and enable-cuda-compat hooks become one native hook
    (cdi-shim-nshook nri), whose linker cache (the compat folder first where the image's
    CUDA compat libcuda is to be used) this process writes (--hook-socket). Pods outside the allowed
    namespaces (config key nri-namespaces, plus --namespace) get nothing, and that is logged; an
    unresolvable device fails the container's creation.

    It runs until stopped, connecting again whenever containerd restarts; contrib/cdi-shim-nri.service
    is its systemd unit.
    """
    from ..linker.container import our_program
    import os

    from ..nri.hookserver import HookServer
    from ..nri.nativehook import ToolkitFiles
    from ..nri.plugin import Plugin
    from ..nri.policy import Policy

    if len(index) != 2 or not index.isdigit():
        fail(f"--index {index!r}: two digits expected (e.g. 10)")
    config = settings()
    allowed = tuple(config.nri_namespaces) + tuple(namespaces)
    plugin = Plugin(None, socket_path, name, index)
    try:
        HookServer(hook_socket, plugin.log, remember=True).start()
    except OSError as err:
        fail(f"cannot serve the hook at {hook_socket}: {err.strerror or err}")
    plugin.policy = Policy(config, allowed, our_program("cdi-shim-nshook"), plugin.log,
                           hook_options=("--socket", hook_socket, "--fallback", our_program("cdi-shim-hook")),
                           files=ToolkitFiles(os.path.join(os.path.dirname(hook_socket), "files")))
    plugin.log("info", f"serving namespaces {', '.join(allowed) or '(none)'} from {', '.join(config.spec_dirs)}")
    try:
        plugin.run(once=once)
    except KeyboardInterrupt:
        pass
    except Exception as err:     # noqa: BLE001 -- one line, as every command fails
        fail(str(err))
