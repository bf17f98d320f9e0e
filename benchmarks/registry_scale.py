"""Registry at scale: 1,000 spec files x 8 devices, cold load vs warm resolve in a fresh process.

Every figure is a median of fresh-process runs, alternated with a `python -c pass` baseline of
the same interpreter and flags, so the difference is what our code costs beyond start-up.

    .venv/bin/python benchmarks/registry_scale.py [--files 1000] [--devices 8] [--runs 15]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from common import timed

RESOLVE = (
    "import sys\n"
    "from cdi.registry import Registry\n"
    "r = Registry(sys.argv[2:]).refresh()\n"
    "assert r.lookup(sys.argv[1]) is not None\n"
)


def write_corpus(root, files, devices):
    spec_dir = os.path.join(root, "specs")
    os.makedirs(spec_dir)
    for index in range(files):
        lines = ['cdiVersion: "0.5.0"', f"kind: vendor{index:04d}.example.com/gpu",
                 "containerEdits:", "  env: [VENDOR_LIBS=1]",
                 "  mounts:", f"    - {{hostPath: /usr/lib/vendor{index}/libdrv.so.1, "
                 f"containerPath: /usr/lib/libdrv.so.1, options: [ro, nosuid, nodev, bind]}}",
                 "devices:"]
        for dev in range(devices):
            lines += [f"  - name: dev{dev}", "    containerEdits:", "      deviceNodes:",
                      f"        - {{path: /dev/vendor{dev}, type: c, major: 195, minor: {dev}}}",
                      f"      env: [VENDOR_VISIBLE=dev{dev}]"]
        with open(os.path.join(spec_dir, f"vendor{index:04d}.yaml"), "w") as out:
            out.write("\n".join(lines) + "\n")
    # Let the files age past the registry's racy window (2 s: a file changed more recently is
    # verified by content on every use), as specs written when the node booted would be.
    # utime cannot help: it sets the mtime but makes the ctime "now".
    time.sleep(2.2)
    return spec_dir



def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    python = sys.executable
    with tempfile.TemporaryDirectory() as root:
        spec_dir = write_corpus(root, args.files, args.devices)
        cache = os.path.join(root, "cache")
        env = dict(os.environ, CDI_SHIM_CACHE_DIR=cache)
        target = f"vendor{args.files // 2:04d}.example.com/gpu=dev{min(3, args.devices - 1)}"
        resolve = [python, "-c", RESOLVE, target, spec_dir]
        baseline = [python, "-c", "pass"]

        cold = []
        for _ in range(3):
            for name in os.listdir(cache) if os.path.isdir(cache) else ():
                os.unlink(os.path.join(cache, name))
            cold.append(timed(resolve, env))
        timed(resolve, env)  # leave a settled cache behind

        warm, base = [], []
        for _ in range(args.runs):
            base.append(timed(baseline, env))
            warm.append(timed(resolve, env))

        config = os.path.join(root, "config.json")
        with open(config, "w") as out:
            json.dump({"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin"]}, "linux": {}}, out)
        cli = os.path.join(os.path.dirname(python), "cdi-shim")
        inject = [cli, "cdi", "inject", "--spec-dir", spec_dir,
                  "--device", target, config]
        inj, base2 = [], []
        for _ in range(args.runs):
            base2.append(timed(baseline, env))
            inj.append(timed(inject, env))

    med = statistics.median
    result = {
        "files": args.files, "devices_per_file": args.devices,
        "python_c_pass_ms": round(med(base), 1),
        "cold_load_and_resolve_ms": round(med(cold), 1),
        "warm_resolve_ms": round(med(warm), 1),
        "warm_resolve_beyond_startup_ms": round(med(w - b for w, b in zip(warm, base)), 1),
        "cdi_inject_cli_ms": round(med(inj), 1),
        "cdi_inject_cli_beyond_startup_ms": round(med(i - b for i, b in zip(inj, base2)), 1),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
