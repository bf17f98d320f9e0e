"""`cdi-shim bench pods --endpoint`: the node's own containerd, from the installed package
(shim/bench/node.py), no lab. Its options and its run, apart from the lab's (bench.py)."""
import click

from .common import fail

# options of the lab's run that mean nothing against a node's containerd
LAB_ONLY = ("scenarios", "native_cdi", "workdir", "resident", "containerd", "time_runc", "toolkit_hook",
            "state_on_disk")


def node_options(command):
    """The options of the node run (each also named in the command's help)."""
    options = [
        click.option("--endpoint", metavar="unix:///PATH",
                     help="Measure the containerd serving this CRI socket (e.g. unix:///run/containerd/"
                          "containerd.sock) instead of a private lab: the node's own, from the installed "
                          "package (needs pip install 'cdi-shim[bench]'), as root. GPU pods against pods without "
                          "a device, paired and interleaved; every pod it makes is removed."),
        click.option("--handler", metavar="NAME",
                     help="With --endpoint: the runtime handler of the GPU pods, the one cdi-shim is registered "
                          "under (runtime configure --runtime-name; e.g. nvidia)."),
        click.option("--nri", is_flag=True,
                     help="With --endpoint: the GPU pods run on the default handler (or --handler) and cdi-shim's "
                          "NRI plugin injects the device."),
        click.option("--baseline-handler", default="", metavar="NAME",
                     help="With --endpoint: the handler of the pods without a device (default: containerd's "
                          "default runtime, what a pod without a runtimeClassName gets)."),
        click.option("--device", default="nvidia.com/gpu=0", show_default=True,
                     help="With --endpoint: the CDI device the GPU pods ask for."),
        click.option("--request", type=click.Choice(["annotation", "env", "cdi-devices"]), default="annotation",
                     show_default=True,
                     help="With --endpoint: how the GPU pods ask: a cdi.k8s.io/ container annotation, "
                          "NVIDIA_VISIBLE_DEVICES, or the CRI CDIDevices field (containerd 1.7+ with enable_cdi)."),
        click.option("--image", metavar="REF",
                     help="With --endpoint: an image already on the node (its `true` is run, or --command). "
                          "Default: a built-in image of one tiny program, imported with ctr and removed after."),
        click.option("--command", "pod_command", metavar="ARGV",
                     help="With --endpoint and --image: the container's command line (default: true)."),
        click.option("--namespace", "pod_namespace", default="default", show_default=True,
                     help="With --endpoint: the pods' Kubernetes namespace (the NRI plugin serves only its list)."),
        click.option("--ctr", default="ctr", show_default=True, metavar="PATH",
                     help="With --endpoint: containerd's ctr, to import the built-in image."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


NODE_ONLY = ("handler", "nri", "baseline_handler", "device", "request", "image", "pod_command", "pod_namespace",
             "ctr")


def given(ctx, names):
    return [name for name in names
            if ctx.get_parameter_source(name) not in (None, click.core.ParameterSource.DEFAULT)]


def refuse_node_options(ctx):
    """The lab's run (no --endpoint) takes none of the node options."""
    extra = given(ctx, NODE_ONLY)
    if extra:
        fail(f"--{extra[0].replace('pod_', '').replace('_', '-')} is for the node run: give --endpoint too")


def run_node(ctx, pairs, warmup, plot, json_path, endpoint, handler, nri, baseline_handler, device, request,
             image, pod_command, pod_namespace, ctr):
    import shlex

    from ..bench import BenchError, node

    lab_only = given(ctx, LAB_ONLY)
    if lab_only:
        fail(f"--{lab_only[0].replace('_', '-')} is for the lab's run, not --endpoint (the node's containerd)")
    if pod_command and not image:
        fail("--command needs --image (the built-in image runs its own probe)")
    command = shlex.split(pod_command) if pod_command else (["true"] if image else None)
    try:
        result = node.run(endpoint, handler=handler, baseline_handler=baseline_handler, nri=nri, image=image,
                          command=command, device=device, request=request, pairs=pairs, warmup=warmup, ctr=ctr,
                          namespace=pod_namespace, log=lambda text: click.echo(text, err=True))
    except BenchError as err:
        fail(str(err))
    click.echo(node.report(result))
    if json_path:
        import json

        with open(json_path, "w") as stream:
            json.dump(result, stream, indent=1)
    if plot:
        try:
            node.plot(result, plot)
        except ImportError:
            fail("--plot needs matplotlib (pip install matplotlib)")
        click.echo(f"plot: {plot}", err=True)
