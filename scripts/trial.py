"""Try cdi-shim without a GPU: a fake NVIDIA driver, the CDI spec `cdi-shim cdi generate` writes
for it, and pods on a private containerd 2.x (Debian's, beside the system's) that get
nvidia.com/gpu=0 through the cdi-shim handler. docs/trial.md walks through each step.

    .venv/bin/python scripts/trial.py DIR                  everything: driver, spec, containerd, pods
    .venv/bin/python scripts/trial.py DIR --nri            the same with `cdi-shim nri` on containerd's NRI
                                                           socket, pods on the stock runc handler
    .venv/bin/python scripts/trial.py DIR --driver-only    only the fake driver (to use with your own engine)

Run as root from a checkout after scripts/setup.sh (scripts/trial.sh does both and installs the
CRI client's grpcio). DIR must be new or empty; the fake driver stays in DIR/fake-driver, the
containerd lab (its root, state, logs) in DIR/containerd until you delete DIR.
"""
import argparse
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tests.generate.fakedriver import FakeDriver  # noqa: E402

# What the pod prints: the GPU's nodes, the driver's files the spec mounts, the linker cache
# entries the runtime prepared natively, and the driver's nvidia-smi (a script that echoes).
POD_SCRIPT = ("echo '== devices'; ls /dev | grep nvidia; "
              "echo '== libraries'; ls /usr/lib/x86_64-linux-gnu | grep -c nvidia; "
              "echo '== linker cache'; grep -o 'libnvidia-ml.so.1' /etc/ld.so.cache | head -1; "
              "echo '== nvidia-smi'; /usr/bin/nvidia-smi; "
              "echo '== env'; env | grep NVIDIA || true")


def step(text):
    print(f"\n== {text}", flush=True)


def build_driver(directory, gpus):
    step(f"a fake driver in {directory}: gcc-built libraries with the real sonames, a fake NVML, "
         f"nvidia-smi, and {gpus} GPUs' device nodes (char 195, no kernel driver behind them)")
    os.makedirs(directory, exist_ok=True)
    driver = FakeDriver(directory, gpus=gpus)
    driver.close()
    print(f"driver root {driver.root}\ndev root    {driver.dev_root}\nsysfs root  {driver.sysfs}\n"
          f"proc root   {driver.proc}\nNVML        {driver.nvml} (its GPUs: {driver.libdir}/fake-nvml.conf)")
    return driver


def generate_argv(cli, driver, output):
    # (--hook-program: this checkout's, named on purpose; a node names its stable path)
    return [cli, "cdi", "generate", "--driver-root", driver.root, "--dev-root", driver.dev_root,
            "--sysfs-root", driver.sysfs, "--proc-root", driver.proc, "--output", output,
            "--hook-program", os.path.join(os.path.dirname(cli), "cdi-shim-hook")]


def run(argv, env):
    print("$ " + " ".join(argv), flush=True)
    done = subprocess.run(argv, env=env, text=True, capture_output=True)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    if done.returncode:
        raise SystemExit(f"trial: {argv[1]} {argv[2]} failed (exit {done.returncode})")


# The pods of each way: (how, handler (None: cdi-shim's), the device names asked for, run_pod arguments).
RUNTIME_PODS = (
    ("the CRI CDIDevices field (containerd injects; cdi-shim does the spec's hooks natively)", None,
     ["nvidia.com/gpu=0"], {"cdi_devices": ["nvidia.com/gpu=0"]}),
    ("a CDI annotation (cdi-shim injects)", None, ["nvidia.com/gpu=1"],
     {"annotations": {"cdi.k8s.io/trial": "nvidia.com/gpu=1"}}))
NRI_PODS = (
    ("a CDI pod annotation, on the stock runc handler (the NRI plugin injects; its native hook does the spec's "
     "hooks)", "runc", ["nvidia.com/gpu=0"], {"pod_annotations": {"cdi.k8s.io/trial": "nvidia.com/gpu=0"}}),
    ("the toolkit plugin's key nvidia.cdi.k8s.io/container.main, on the stock runc handler", "runc",
     ["nvidia.com/gpu=1"], {"pod_annotations": {"nvidia.cdi.k8s.io/container.main": "1"}}))


def pod_section(lines, title):
    """The lines of the pod output's '== TITLE' section."""
    found, inside = [], False
    for line in lines:
        if line.startswith("== "):
            inside = line == f"== {title}"
        elif inside:
            found.append(line)
    return found


def run_pods(base, driver, containerd, nri=False):
    from cdi_shim_lab.lab import Lab, LabError
    from cdi_shim_lab.nrilab import NRILab

    if nri:
        step(f"containerd {containerd} from Debian's archive, unpacked privately (the system's stays), with NRI "
             "on and `cdi-shim nri` on its NRI socket: pods on the stock runc handler, no RuntimeClass")
    else:
        step(f"containerd {containerd} from Debian's archive, unpacked privately (the system's stays), "
             "with native CDI on and cdi-shim registered as the `cdi-shim` handler")
    lab = (NRILab if nri else Lab)(os.path.join(base, "containerd"), containerd=containerd, native_cdi=True)
    summary = []
    try:
        lab.setup()
        print(f"containerd {lab.containerd}\nits config {lab.config}\nits socket {lab.socket}\n"
              f"cdi-shim's config {lab.shim_config}")
        os.unlink(os.path.join(lab.spec_dir, "nvidia-gpu.yaml"))   # the lab's one-node stand-in GPU
        step("the CDI spec for the fake driver, where containerd and cdi-shim read specs")
        run(generate_argv(lab.cli, driver, os.path.join(lab.spec_dir, "nvidia.yaml")), lab.env())
        run([lab.cli, "cdi", "list"], lab.env())
        if nri:
            step("cdi-shim nri, serving the namespace 'default'")
            lab.start_plugin()
            print(f"$ {' '.join(lab.plugin.args)}\nits log {lab.plugin_log}:\n{lab.plugin_log_text().strip()}")
        for how, handler, names, request in NRI_PODS if nri else RUNTIME_PODS:
            step(f"a pod asking for a GPU by {how}")
            pod = lab.run_pod(handler or lab.runtime_name, ["sh", "-c", POD_SCRIPT], **request)
            print("\n".join(pod.output))
            print(f"(exit status {pod.status.exit_code}; pod start-up {pod.times['startup'] * 1000:.0f} ms)")
            if pod.status.exit_code != 0:
                raise SystemExit("trial: the pod failed; containerd's log: " + lab.containerd_log)
            nodes = [f"/dev/{name}" for name in pod_section(pod.output, "devices")]
            summary.append(f"handler {handler or lab.runtime_name}, devices {', '.join(names)} "
                           f"({', '.join(nodes) or 'no /dev/nvidia*'}), start-up {pod.times['startup'] * 1000:.0f} ms")
        step("pods")
        for index, line in enumerate(summary, 1):
            print(f"pod {index}: {line}")
    except LabError as err:
        raise SystemExit(f"trial: {err}") from None
    finally:
        lab.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("dir", help="a new or empty directory for the fake driver and the lab")
    parser.add_argument("--gpus", type=int, default=2, help="fake GPUs (default: 2)")
    parser.add_argument("--containerd", default="2.1", help="the containerd to run: 2.1 (forky) or 1.7 (trixie)")
    parser.add_argument("--driver-only", action="store_true", help="build the fake driver, print how to "
                        "generate its spec, and stop")
    parser.add_argument("--nri", action="store_true", help="run the pods on the stock runc handler with "
                        "`cdi-shim nri` on containerd's NRI socket (docs/nri.md) instead of the cdi-shim handler")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("trial: run as root (device nodes are made with mknod; pods need root)")
    base = os.path.abspath(args.dir)
    if os.path.exists(base) and (not os.path.isdir(base) or os.listdir(base)):
        raise SystemExit(f"trial: {base} is not a new or empty directory")
    if args.gpus < 2:
        raise SystemExit("trial: --gpus must be 2 or more (the pods ask for GPUs 0 and 1)")
    driver = build_driver(os.path.join(base, "fake-driver"), args.gpus)
    if args.driver_only:
        cli = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "cdi-shim")
        step("next: its spec, where your engine reads specs")
        print("$ " + " ".join(generate_argv(cli, driver, "/etc/cdi/nvidia.yaml")))
        return
    try:
        import grpc  # noqa: F401
    except ImportError:
        raise SystemExit("trial: the pods need the CRI client: .venv/bin/pip install grpcio grpcio-tools "
                         "(scripts/trial.sh does it)") from None
    run_pods(base, driver, args.containerd, nri=args.nri)
    step(f"done: the fake driver is in {driver.base}; delete {base} when finished")


if __name__ == "__main__":
    main()
