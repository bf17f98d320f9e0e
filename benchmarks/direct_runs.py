"""Repeated direct runs on one plain-folder bundle (issue 47): `cdi-shim-runtime --device
nvidia.com/gpu=0 run --bundle B ID`, the same bundle run after run, against `runc run` of the
same config with the spec's mounts already in it (a second bundle, its own copy of the image),
interleaved, resident process on (two workers, the real settle window), or with --no-resident
off: each create is the per-create interpreter's, which keeps its recipes in the steps folder
beside the configured socket, made by the runtime (0700).

The spec is run_with_libraries.py's: 30 gcc-built driver libraries bind-mounted into the
library folder and the toolkit's update-ldcache hook. --image small: busybox alone (no
ld.so.cache); --image libraries: run_with_libraries.py's ~540-library glibc tree (on a reused
root its library folder is rescanned past the plan's path bound: no step is kept, see
docs/fast.md). The first WARMUP pairs are left out (the first runs step; the replay starts from
the 3rd: tests/runtime/test_direct_runs.py).

    .venv/bin/python benchmarks/direct_runs.py [--runs 30] [--image small|libraries] [--no-resident]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

import run_with_libraries as rw
from common import start_resident, timed

WARMUP = 5


def image(rootfs, kind):
    if kind == "libraries":
        rw.make_image(rootfs)
        return
    os.makedirs(rootfs + "/bin")
    os.makedirs(rootfs + "/etc")
    shutil.copy("/bin/busybox", rootfs + "/bin/busybox")
    os.symlink("busybox", rootfs + "/bin/true")


def bundle(path, kind, mounts=()):
    os.makedirs(path)
    image(os.path.join(path, "rootfs"), kind)
    subprocess.run(["runc", "spec", "--bundle", path], check=True)
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    config["root"] = {"path": "rootfs", "readonly": False}
    config["process"]["terminal"] = False
    config["process"]["args"] = ["/bin/true"]
    config["mounts"] += list(mounts)
    with open(os.path.join(path, "config.json"), "w") as out:
        json.dump(config, out)
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--image", choices=("small", "libraries"), default="small")
    parser.add_argument("--dir", default="/run")
    parser.add_argument("--no-resident", action="store_true",
                        help="no resident process: the per-create interpreter steps and keeps the recipes")
    parser.add_argument("--debug-log", metavar="FILE", help="log each create's phases (log-level debug) into FILE")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="cdi-shim-direct.", dir=args.dir)
    server = None
    try:
        libraries = rw.make_driver(os.path.join(root, "driver"), 30)
        node = os.path.join(root, "nvidia0")
        os.mknod(node, 0o666 | 0o020000, os.makedev(195, 0))
        spec = os.path.join(root, "specs")
        os.makedirs(spec)
        rw.write_spec(spec, libraries, node)
        settings = os.path.join(root, "settings.toml")
        with open(settings, "w") as out:
            out.write(f'spec-dirs = ["{spec}"]\nresident-socket = "{root}/run/runtime.sock"\n')
            if args.debug_log:  # (replayed or stepped, and why a step was not kept)
                out.write(f'log-level = "debug"\nlog-file = "{os.path.abspath(args.debug_log)}"\n')
        env = dict(os.environ, CDI_SHIM_CONFIG=settings, CDI_SHIM_CACHE_DIR=os.path.join(root, "cache"))
        if not args.no_resident:
            server = start_resident(f"{root}/run/runtime.sock", env)
        ours = bundle(os.path.join(root, "ours"), args.image)
        mounts = [{"destination": f"{rw.FOLDER}/{os.path.basename(path)}", "type": "bind", "source": path,
                   "options": ["ro", "nosuid", "nodev", "bind"]} for path in libraries]
        plain = bundle(os.path.join(root, "plain"), args.image, mounts)
        rw.settle()
        shim = os.path.join(os.path.dirname(sys.executable), "cdi-shim-runtime")
        state = os.path.join(root, "state")
        base, mine = [], []
        for index in range(args.runs + WARMUP):
            pair = [lambda: timed(["runc", "--root", state, "run", "--bundle", plain, f"p{index}"], env),
                    lambda: timed([shim, "--root", state, "--device", "nvidia.com/gpu=0", "run", "--bundle", ours,
                                   f"g{index}"], env)]
            first = index % 2     # (the two take turns at going first)
            times = [None, None]
            times[first] = pair[first]()
            times[1 - first] = pair[1 - first]()
            if index >= WARMUP:
                base.append(times[0])
                mine.append(times[1])
        med = statistics.median
        print(json.dumps({"image": args.image, "resident": not args.no_resident, "runs": args.runs,
                          "driver_libraries": 30,
                          "runc_run_ms": round(med(base), 1), "direct_device_run_ms": round(med(mine), 1),
                          "median_paired_ratio": round(med(o / b for o, b in zip(mine, base)), 3),
                          "interval": rw.interval([o / b for o, b in zip(mine, base)])}, indent=2))
    finally:
        if server is not None:
            server.terminate()
            server.wait()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
