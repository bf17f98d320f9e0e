"""`cdi-shim bench pods`: GPU pod start-up through a real containerd."""
import os
import sys

import click

from .bench_node import node_options, refuse_node_options, run_node
from .common import fail as _fail

# what scripts/setup.sh runs, with the bench extras
INSTALL_EXTRAS = ".venv/bin/pip install --config-settings editable_mode=compat -e '.[bench,plot]'"


@click.group()
def bench():
    """Benchmarks that need real parts (a private containerd)."""


@bench.command()
@click.option("-n", "--pairs", default=20, show_default=True, help="Measured pod pairs per scenario.")
@click.option("--warmup", default=2, show_default=True, help="Unmeasured pairs per scenario first.")
@click.option("--scenario", "scenarios", multiple=True,
              type=click.Choice(["no-device", "one-device", "device-30-libs", "device-30-libs-vs-cri",
                                 "native-cdi-30-libs", "one-mount", "nri-30-libs"]),
              help="Scenarios to run (default: the first four; native-cdi-30-libs needs --containerd 2.1). "
                   "one-mount: GPU 0 of the tests' fake driver in the one-mount layout (docs/one-mount.md), in "
                   "rounds of three pods on a library-rich image: no device on runc, the spec's edits as CRI "
                   "fields on runc, the device on cdi-shim (CDIDevices where containerd's own CDI is on, 2.1; "
                   "else the annotation, which cdi-shim injects). -n is then the number of rounds. "
                   "nri-30-libs (alone, --containerd 2.1): the NRI plugin, in rounds of five pods "
                   "(cdi_shim_lab/nripods.py): NRI with our native hook, NRI with the real nvidia-cdi-hook "
                   "(--toolkit-hook, default the benchmarks/toolkit.py build; the report says when it is absent), "
                   "our runtime handler, the device without hooks, containerd's own CDI on runc.")
@click.option("--native-cdi", is_flag=True,
              help="Run the native-cdi-30-libs scenario (with any --scenario given, else alone; needs "
                   "--containerd 2.1, enable_cdi on): a device with 30 driver libraries and the toolkit's six "
                   "hooks requested through the CRI CDIDevices field, in rounds of five pods on a library-rich "
                   "image: no device on runc, no device on cdi-shim, the device without its hooks on runc, "
                   "(a) the hooks run by runc through a hook "
                   "program that does the toolkit's work (ldconfig -r on the rootfs) under a name cdi-shim does "
                   "not know, (b) the same spec with the program named nvidia-cdi-hook through cdi-shim, which "
                   "does the work natively and drops the hooks. -n is then the number of rounds.")
@click.option("--plot", metavar="FILE.png", help="Draw the distributions (needs matplotlib).")
@click.option("--json", "json_path", metavar="FILE", help="Write every measurement as JSON.")
@click.option("--workdir", metavar="DIR", help="Parent of the private containerd's temp dir (default: $TMPDIR).")
@click.option("--resident/--no-resident", default=True, show_default=True,
              help="Run the runtime's resident process (cdi-shim runtime serve) as a node would; "
                   "--no-resident measures an interpreter start per create instead.")
@click.option("--containerd", "containerd", type=click.Choice(["1.6", "1.7", "2.1"]), default="1.6",
              show_default=True,
              help="The containerd the lab runs: 1.6 is the system's; 1.7 and 2.1 are Debian's trixie and forky "
                   "packages, fetched once with apt-get download into $CDI_SHIM_TEST_CACHE "
                   "(/var/cache/cdi-shim-tests), each with its default enable_cdi (2.1: on).")
@click.option("--time-runc", is_flag=True,
              help="With --native-cdi or the one-mount scenario: run runc behind a small timer on every side and "
                   "split each pod's StartContainer into runc create, runc start and the rest (containerd, its "
                   "shim, and the runtime in front of runc).")
@click.option("--toolkit-hook", metavar="PATH", type=click.Path(exists=True, dir_okay=False),
              help="With --native-cdi: side (a) runs this program (the toolkit's real nvidia-cdi-hook, e.g. "
                   "from benchmarks/toolkit.py) instead of the lab's stand-in script; its hook processes are "
                   "then not counted, one more pod checks their work.")
@click.option("--state-on-disk", is_flag=True,
              help="Keep containerd's state (the bundles: config.json, the runtime's files) and runc's root on "
                   "the work directory's filesystem; by default each is a tmpfs, as /run/containerd is on a node.")
@node_options
@click.pass_context
def pods(ctx, pairs, warmup, scenarios, native_cdi, plot, json_path, workdir, resident, containerd, time_runc,
         state_on_disk, toolkit_hook, endpoint, **node):
    """Pod start-up through a private containerd: the cdi-shim handler against plain runc; with
    --endpoint, through the node's own containerd: GPU pods against pods without a device.

    Each pod: RunPodSandbox, CreateContainer, StartContainer, wait for exit, StopPodSandbox,
    RemovePodSandbox. Pairs alternate the handlers (and which goes first). Prints medians, paired
    ratios and the runtime's per-phase breakdown from its debug log. Needs root, containerd 1.6+,
    runc, busybox-static and gcc, and the bench extras (grpcio; matplotlib for --plot). In the
    cdi-shim checkout, after scripts/setup.sh:

    \b
        .venv/bin/pip install --config-settings editable_mode=compat -e '.[bench,plot]'

    On a node (no checkout, no lab: pip install 'cdi-shim[bench]'), as root:

    \b
        cdi-shim bench pods --endpoint unix:///run/containerd/containerd.sock --handler nvidia
    """
    if endpoint:
        return run_node(ctx, pairs, warmup, plot, json_path, endpoint, **node)
    refuse_node_options(ctx)
    try:
        from cdi_shim_lab import pods as podbench   # the lab: a checkout's, never in the node's wheel
    except ImportError as err:
        if getattr(err, "name", None) == "cdi_shim_lab":
            _fail("cdi-shim bench pods needs the lab (the cdi_shim_lab package of a cdi-shim checkout), which the "
                  f"wheel does not ship: install the checkout with the bench extras, in it: {INSTALL_EXTRAS}")
        _fail(f"{err}: install the bench extras; in the cdi-shim checkout: {INSTALL_EXTRAS}")
    scenarios = list(scenarios)
    run = podbench.run
    if "nri-30-libs" in scenarios:    # the NRI plugin's scenario: a lab of its own
        from cdi_shim_lab import nripods

        run = nripods.run_as_pods
    if native_cdi:
        if containerd != "2.1":
            _fail("--native-cdi needs --containerd 2.1 (containerd's own CDI with the CDIDevices field)")
        if "native-cdi-30-libs" not in scenarios:
            scenarios.append("native-cdi-30-libs")
    elif toolkit_hook and run is podbench.run:
        _fail("--toolkit-hook needs --native-cdi (side (a) of the native-CDI scenario runs it)")
    try:
        result = run(pairs=pairs, warmup=warmup, scenarios=scenarios or None, workdir=workdir,
                              log=lambda text: click.echo(text, err=True), resident=resident,
                              containerd=containerd, time_runc=time_runc, state_on_disk=state_on_disk,
                              toolkit_hook=toolkit_hook and os.path.abspath(toolkit_hook))
    except podbench.BenchError as err:
        _fail(str(err))
    click.echo(podbench.report(result))
    if json_path:
        podbench.write_json(result, json_path)
    if plot:
        try:
            podbench.plot(result, plot)
        except ImportError:
            _fail(f"--plot needs matplotlib, one of the bench extras; in the cdi-shim checkout: {INSTALL_EXTRAS}")
        click.echo(f"plot: {plot}", err=True)
    sys.stdout.flush()
