"""How long `cdi-shim cdi generate` takes for 8 GPUs, and how much of it is NVML.

The fake driver of the generate tests (tests/generate/fakedriver.py: gcc-built libraries with
real SONAMEs, the root's ld.so.cache from `ldconfig -r`, mknod'ed nodes, the fake NVML in C
read by the real pynvml) with 8 GPUs. Each run is a whole `cdi-shim cdi generate` process
(sys.executable, never a pyenv shim) writing the spec; its phases come from the hidden
`--timings` option. `cdi-shim cdi --help` (interpreter, site, click) is timed alternately, as
the floor of any `cdi-shim` command. Runs as root (mknod).

    sudo .venv/bin/python benchmarks/generate_spec.py [--runs 20] [--gpus 8]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "generate"))
import fakedriver  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--gpus", type=int, default=8)
    args = parser.parse_args()
    cli = os.path.join(os.path.dirname(sys.executable), "cdi-shim")
    with tempfile.TemporaryDirectory(prefix="gen-bench-") as base:
        driver = fakedriver.FakeDriver(base, gpus=args.gpus)
        env = dict(os.environ, FAKE_NVML_CONFIG="")
        generate = [sys.executable, cli, "cdi", "generate", "--driver-root", driver.root, "--dev-root",
                    driver.dev_root, "--sysfs-root", driver.sysfs, "--output", os.path.join(base, "cdi", "nvidia.yaml"),
                    "--timings"]
        floor = [sys.executable, cli, "cdi", "--help"]
        walls, floors, phases = [], [], []
        for run in range(args.runs + 1):
            start = time.perf_counter()
            done = subprocess.run(generate, capture_output=True, text=True, env=env)
            wall = time.perf_counter() - start
            if done.returncode:
                raise SystemExit(done.stderr)
            start = time.perf_counter()
            subprocess.run(floor, capture_output=True, check=True)
            help_wall = time.perf_counter() - start
            if run == 0:
                continue   # first run: page cache and bytecode
            walls.append(wall * 1000)
            floors.append(help_wall * 1000)
            phases.append({k: float(v) for k, v in re.findall(r"(\S+)=([\d.]+)ms", done.stderr)})
        driver.close()
    med = statistics.median
    phase = {k: med(p[k] for p in phases) for k in phases[0]}
    print(f"{args.gpus} GPUs, {args.runs} runs, medians")
    print(f"whole process: {med(walls):.1f} ms; `cdi-shim cdi --help` {med(floors):.1f} ms "
          f"(generate beyond it: {med(walls) - med(floors):.1f} ms)")
    for key, value in phase.items():
        print(f"  {key:12} {value:8.2f} ms")
    total = phase["total"]
    print(f"NVML calls {phase['nvml-calls']:.2f} ms = {100 * phase['nvml-calls'] / total:.1f} % of the "
          f"in-process {total:.1f} ms (dlopen {phase['nvml-load']:.2f} ms, import pynvml "
          f"{phase['nvml-import']:.1f} ms = {100 * phase['nvml-import'] / total:.0f} %)")


if __name__ == "__main__":
    main()
