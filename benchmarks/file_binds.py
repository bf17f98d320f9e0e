"""What N file binds cost runc, and what the same binds cost our binds hook (cdi-shim-nshook
binds, shim/linker/filebinds.py): the figures behind its threshold (MIN_BINDS).

Four sides, each a runc `create` (then `delete`) of the same busybox container on a fresh
overlay of the library image, taking turns at going first:
- plain: no file bind;
- runc: N gcc-built driver libraries bound by runc (config.json mounts, the toolkit's options
  ro, nosuid, nodev, rbind, rprivate);
- hook: the same N binds made by `cdi-shim-nshook binds` as a createContainer hook;
- true: a createContainer hook of /bin/true alone (what any hook costs under runc).
Each side's median paired difference against plain, with a 95 % bootstrap interval, and the
hook's own part measured apart: the binds in a private mount namespace, timed inside one
process (create the mount points, bind, remount), as the kernel sees them.

    .venv/bin/python benchmarks/file_binds.py [--runs 60] [--binds 30] [--dir /dev/shm]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from common import timed
from run_with_libraries import (FOLDER, bundle, bundle_dir, cleanup, fresh_rootfs, interval, make_driver,
                                make_image)

BIN = os.path.dirname(sys.executable)
OPTIONS = ["ro", "nosuid", "nodev", "rbind", "rprivate"]


def configs(bundles, root, libraries):
    """{side: (bundle, rootfs)} with each side's config.json."""
    nshook = os.path.join(BIN, "cdi-shim-nshook")
    sides = {}
    for name in ("plain", "runc", "hook", "true"):
        rootfs = os.path.join(root, f"rootfs-{name}")
        path = bundle(bundles, name, rootfs)
        with open(os.path.join(path, "config.json")) as src:
            config = json.load(src)
        binds = [(path_, f"{FOLDER}/{os.path.basename(path_)}") for path_ in libraries]
        if name == "runc":
            config["mounts"] += [{"destination": dest, "type": "bind", "source": source, "options": list(OPTIONS)}
                                 for source, dest in binds]
        elif name == "hook":
            args = ["cdi-shim-nshook", "binds", "--rootfs", rootfs]
            for source, dest in binds:
                args += ["--bind", source, dest, ",".join(OPTIONS)]
            config["hooks"] = {"createContainer": [{"path": nshook, "args": args, "env": ["PATH=/bin"]}]}
        elif name == "true":
            config["hooks"] = {"createContainer": [{"path": "/bin/true", "args": ["true"], "env": ["PATH=/bin"]}]}
        with open(os.path.join(path, "config.json"), "w") as out:
            json.dump(config, out)
        sides[name] = (path, rootfs)
    return sides


KERNEL_PART = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
root, sources = sys.argv[1], sys.argv[2:]
MS_BIND, MS_REC, MS_REMOUNT, MS_RDONLY, MS_NOSUID, MS_NODEV, MS_PRIVATE = 4096, 16384, 32, 1, 2, 4, 1 << 18
times = [0.0, 0.0, 0.0]
for source in sources:
    target = f"{root}{FOLDER}/{os.path.basename(source)}"
    steps = [lambda: os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o755)),
             lambda: libc.mount(source.encode(), target.encode(), None, MS_BIND | MS_REC, None),
             lambda: libc.mount(None, target.encode(), None, MS_PRIVATE | MS_REC, None)
                     + libc.mount(None, target.encode(), None,
                                  MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None)]
    for at, step in enumerate(steps):
        start = time.perf_counter()
        if step():
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), target)
        times[at] += (time.perf_counter() - start) * 1000
print(" ".join(f"{t:.3f}" for t in times))
""".replace("{FOLDER}", FOLDER)


def kernel_part(image, root, libraries):
    """ms to make the mount points, bind, set propagation and remount, in a private mount namespace."""
    rootfs = os.path.join(root, "rootfs-kernel")
    script = os.path.join(root, "kernel_part.py")
    with open(script, "w") as out:
        out.write(KERNEL_PART)
    fresh_rootfs(image, rootfs)
    line = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, script, rootfs, *libraries],
                          check=True, capture_output=True, text=True).stdout.split()
    subprocess.run(["umount", rootfs], check=False)
    return dict(zip(("create_mount_points_ms", "bind_ms", "propagation_and_remount_ms"), map(float, line)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--binds", type=int, default=30)
    parser.add_argument("--dir", default="/dev/shm", help="where the image and its overlays live")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="cdi-shim-binds-bench.", dir=args.dir)
    try:
        image = os.path.join(root, "rootfs")
        make_image(image)
        libraries = make_driver(os.path.join(root, "driver"), args.binds)
        sides = configs(bundle_dir(root), root, libraries)
        state = os.path.join(root, "state")
        names = list(sides)
        times = {name: [] for name in names}
        for index in range(args.runs + 1):
            for name in names:
                fresh_rootfs(image, sides[name][1])
            for name in names[index % 4:] + names[:index % 4]:
                took = timed(["runc", "--root", state, "create", "--bundle", sides[name][0], f"{name}{index}"])
                subprocess.run(["runc", "--root", state, "delete", "--force", f"{name}{index}"], check=True)
                if index:   # (the first round warms the page cache)
                    times[name].append(took)
        med = statistics.median
        result = {"binds": args.binds, "runs": args.runs, "dir": args.dir,
                  "runc_create_plain_ms": round(med(times["plain"]), 2)}
        for name in ("runc", "hook", "true"):
            diffs = [a - b for a, b in zip(times[name], times["plain"])]
            result[f"{name}_over_plain_ms"] = round(med(diffs), 2)
            result[f"{name}_over_plain_95pct_ms"] = interval(diffs)
        saved = [a - b for a, b in zip(times["runc"], times["hook"])]
        result["hook_saves_ms"] = round(med(saved), 2)
        result["hook_saves_95pct_ms"] = interval(saved)
        result["kernel_part"] = kernel_part(image, root, libraries)
        print(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(os.path.join(root, "state"), ignore_errors=True)
        cleanup(root)


if __name__ == "__main__":
    main()
