"""`docker run --rm IMAGE true` through cdi-shim as a ratio to runc on the same daemon, for each of
Debian's dockerd 20.10, 26.1 and 28.5 (cdi_shim_lab/dockerlab.py: a private dockerd and containerd,
vfs storage, no network). Sides, in interleaved rounds whose order rotates:

- runc:        docker run (the default runtime, runc), no device;
- shim:        --runtime=cdi-shim, no device (the front end's passthrough scan, then runc);
- shim-env:    --runtime=cdi-shim -e NVIDIA_VISIBLE_DEVICES=0 (cdi-shim injects the fake GPU);
- shim-gpus:   --runtime=cdi-shim --gpus all (the daemon's legacy hook turned into a request);
- runc-cdi:    --device nvidia.com/gpu=0, dockerd's own CDI, runc (26.1 and 28.5);
- shim-cdi:    the same with --runtime=cdi-shim (26.1 and 28.5).

Medians of wall time per side and each median over runc's. The runtime starts its interpreter per
create, or, with --resident, hands the create to its resident process (`cdi-shim runtime serve`),
as on a node. Run as root:

    .venv/bin/python benchmarks/docker_run.py [--runs 15] [--versions 20.10,26.1,28.5] [--resident]
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cdi_shim_lab.dockerlab import IMAGE, DockerLab  # noqa: E402

SIDES = {
    "runc": [],
    "shim": ["--runtime=cdi-shim"],
    "shim-env": ["--runtime=cdi-shim", "-e", "NVIDIA_VISIBLE_DEVICES=0"],
    "shim-gpus": ["--runtime=cdi-shim", "--gpus", "all"],
    "runc-cdi": ["--device", "nvidia.com/gpu=0"],
    "shim-cdi": ["--runtime=cdi-shim", "--device", "nvidia.com/gpu=0"],
}
CDI_SIDES = ("runc-cdi", "shim-cdi")


def one(lab, args):
    import subprocess

    argv = lab.docker_argv("run", "--rm", "--network=none", *args, IMAGE, "true")
    start = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    took = (time.perf_counter() - start) * 1000
    if out.returncode != 0:
        raise RuntimeError(f"docker run {' '.join(args)} on {lab.version}: {out.stderr.strip()}")
    return took


def measure(version, runs, base, resident=False):
    work = tempfile.mkdtemp(prefix=f"docker-{version}.", dir=base)
    lab = DockerLab(work, version, cdi=version != "20.10", resident=resident)
    try:
        lab.setup()
        sides = [name for name in SIDES if version != "20.10" or name not in CDI_SIDES]
        for name in sides:  # warm-up: the image's first layer copy, the interpreter's caches
            one(lab, SIDES[name])
        times = {name: [] for name in sides}
        for round_ in range(runs):
            order = sides[round_ % len(sides):] + sides[:round_ % len(sides)]
            for name in order:
                times[name].append(one(lab, SIDES[name]))
        medians = {name: statistics.median(values) for name, values in times.items()}
        return {"version": version, "runs": runs, "resident": resident, "median_ms": medians,
                "ratio_to_runc": {name: medians[name] / medians["runc"] for name in sides}}
    finally:
        lab.stop()
        shutil.rmtree(work, ignore_errors=True)   # the daemon's data-root (vfs layers): nothing mounted


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--versions", default="20.10,26.1,28.5")
    parser.add_argument("--dir", default="/tmp")
    parser.add_argument("--resident", action="store_true", help="the runtime's resident process runs")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = [measure(version, args.runs, args.dir, args.resident) for version in args.versions.split(",")]
    if args.json:
        print(json.dumps(results, indent=1))
        return
    for result in results:
        print(f"Docker {result['version']} ({result['runs']} interleaved rounds; median ms, ratio to runc"
              + ("; resident process)" if result["resident"] else "; interpreter per create)"))
        for name, ms in result["median_ms"].items():
            command = " ".join(["docker run --rm --network=none"] + SIDES[name] + [IMAGE, "true"])
            print(f"  {name:<10} {ms:8.1f} ms  {result['ratio_to_runc'][name]:5.2f}x   {command}")


if __name__ == "__main__":
    main()
