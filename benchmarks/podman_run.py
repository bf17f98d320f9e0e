"""`podman run --rm --rootfs ROOTFS:O true` with a GPU by --device, podman running the spec's hooks
through runc, against podman with cdi-shim as its runtime, for each of Debian's podman 4.3 and 5.8
(cdi_shim_lab/podmanlab.py: a private podman, vfs storage, no network; the GPU is the tests' fake
driver and its spec the one `cdi-shim cdi generate` writes). Sides, in interleaved rounds whose
order rotates:

- runc:      podman run (runc), no device;
- shim:      --runtime cdi-shim, no device (the front end's passthrough scan, then runc);
- runc-cdi:  --device nvidia.com/gpu=0: podman injects, runc runs the spec's createContainer hooks
             as programs (the toolkit's nvidia-cdi-hook where one is given or found, else
             cdi-shim-hook, cdi-shim's stand-in);
- shim-cdi:  the same with --runtime cdi-shim: podman injects, cdi-shim does the hooks' work natively.

Medians of wall time per side, each over runc's, and shim-cdi over runc-cdi. The runtime starts its
interpreter per create, or, with --resident, hands the create to its resident process (`cdi-shim
runtime serve`), as on a node. Run as root:

    .venv/bin/python benchmarks/podman_run.py [--runs 15] [--versions 4.3,5.8] [--resident] [--hook PATH]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cdi_shim_lab.podmanlab import PodmanLab  # noqa: E402
from tests.generate.fakedriver import FakeDriver  # noqa: E402

SIDES = {
    "runc": [],
    "shim": ["--runtime", "cdi-shim"],
    "runc-cdi": ["--device", "nvidia.com/gpu=0"],
    "shim-cdi": ["--runtime", "cdi-shim", "--device", "nvidia.com/gpu=0"],
}
TOOLKIT_HOOK = os.path.expanduser("~/.cache/cdi-shim/toolkit-v1.20.0/bin/nvidia-cdi-hook")


def one(lab, args):
    argv = lab.run_argv(*args, command=("true",))
    start = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=lab.env())
    took = (time.perf_counter() - start) * 1000
    if out.returncode != 0:
        raise RuntimeError(f"podman run {' '.join(args)} on {lab.version}: {out.stderr.strip()}")
    return took


def measure(version, runs, base, hook, resident=False):
    work = tempfile.mkdtemp(prefix=f"podman-{version}.", dir=base)
    driver = FakeDriver(os.path.join(work, "fake-driver"), gpus=2)
    driver.close()
    lab = PodmanLab(os.path.join(work, "lab"), version, resident=resident)
    try:
        lab.setup()
        out = subprocess.run([lab.cli, "cdi", "generate", "--driver-root", driver.root, "--dev-root", driver.dev_root,
                              "--sysfs-root", driver.sysfs, "--proc-root", driver.proc, "--output",
                              os.path.join(lab.spec_dir, "nvidia.yaml"), "--hook-program", hook or lab.hook_program],
                             capture_output=True, text=True, env=lab.env())
        if out.returncode != 0:
            raise RuntimeError(f"cdi generate: {out.stderr.strip()}")
        for args in SIDES.values():  # warm-up: the interpreter's caches, the first overlay
            one(lab, args)
        times = {name: [] for name in SIDES}
        sides = list(SIDES)
        for round_ in range(runs):
            order = sides[round_ % len(sides):] + sides[:round_ % len(sides)]
            for name in order:
                times[name].append(one(lab, SIDES[name]))
        medians = {name: statistics.median(values) for name, values in times.items()}
        return {"version": version, "runs": runs, "resident": resident, "hook": hook or lab.hook_program,
                "median_ms": medians, "ratio_to_runc": {name: medians[name] / medians["runc"] for name in sides},
                "shim_cdi_over_runc_cdi": medians["shim-cdi"] / medians["runc-cdi"]}
    finally:
        lab.stop()
        shutil.rmtree(work, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--versions", default="4.3,5.8")
    parser.add_argument("--dir", default="/tmp")
    parser.add_argument("--resident", action="store_true", help="the runtime's resident process runs")
    parser.add_argument("--hook", default=TOOLKIT_HOOK if os.access(TOOLKIT_HOOK, os.X_OK) else None,
                        help="the hook program the spec names (default: the toolkit's nvidia-cdi-hook at "
                             f"{TOOLKIT_HOOK} when built, else cdi-shim-hook)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = [measure(v, args.runs, args.dir, args.hook, args.resident) for v in args.versions.split(",")]
    if args.json:
        print(json.dumps(results, indent=1))
        return
    for result in results:
        print(f"podman {result['version']} ({result['runs']} interleaved rounds; median ms, ratio to runc"
              + ("; resident process" if result["resident"] else "; interpreter per create")
              + f"; hooks under runc: {result['hook']})")
        for name, ms in result["median_ms"].items():
            command = " ".join(["podman run --rm --network none"] + SIDES[name] + ["--rootfs ROOTFS:O true"])
            print(f"  {name:<9} {ms:8.1f} ms  {result['ratio_to_runc'][name]:5.2f}x   {command}")
        print(f"  shim-cdi / runc-cdi: {result['shim_cdi_over_runc_cdi']:.2f}x")


if __name__ == "__main__":
    main()
