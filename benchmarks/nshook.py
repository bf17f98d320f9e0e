"""The hooks the runtime leaves to runc on a GPU node, as runc runs them: cdi-shim-nshook (C)
against the Python hook program it replaced, and /bin/true (a process start) as the floor.

- `symlinks`: the toolkit's /dev/dri/by-path links (two), made in the container's mount
  namespace: `cdi-shim-nshook symlinks --rootfs DIR` (as the runtime writes it) against
  `cdi-shim-hook create-symlinks` (what ran before);
- `symlinks-from-state`: the same without --rootfs, the rootfs read from the OCI state and the
  bundle's config.json (a generated spec's hook, as podman or plain runc run it).
- `bind-params`: the params bind of disable-device-node-modification (the Python hook it
  replaced no longer exists; its start alone is what `cdi-shim-hook --version` costs).

Each run is a whole process with the OCI state on stdin, in a private mount namespace (the
script re-runs itself under `unshare -m`), alternated: C, Python, true, C, ... Runs as root.

    .venv/bin/python benchmarks/nshook.py [--runs 40] [--nshook PATH]

--nshook times another build of the C hook (a before/after pair: run the script once a build).
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

BIN = os.path.dirname(sys.executable)


def timed(argv, state):
    start = time.perf_counter()
    subprocess.run(argv, input=state, check=True, stdout=subprocess.DEVNULL)
    return (time.perf_counter() - start) * 1000


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--nshook", default=os.path.join(BIN, "cdi-shim-nshook"), help="the C hook to time")
    args = parser.parse_args()
    if os.environ.get("CDI_SHIM_BENCH_UNSHARED") != "1":
        env = dict(os.environ, CDI_SHIM_BENCH_UNSHARED="1")
        sys.exit(subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, *sys.argv],
                                env=env).returncode)
    work = tempfile.mkdtemp(prefix="cdi-shim-nshook.", dir="/dev/shm")
    try:
        bundle, rootfs = os.path.join(work, "bundle"), os.path.join(work, "bundle", "rootfs")
        os.makedirs(rootfs + "/proc/driver/nvidia")
        os.makedirs(rootfs + "/dev")
        with open(rootfs + "/proc/driver/nvidia/params", "w") as out:
            out.write("ModifyDeviceFiles: 1\n")
        with open(os.path.join(bundle, "config.json"), "w") as out:
            json.dump({"ociVersion": "1.0.2", "root": {"path": "rootfs"}}, out)
        source = os.path.join(work, "params")
        with open(source, "w") as out:
            out.write("ModifyDeviceFiles: 0\n")
        state = json.dumps({"ociVersion": "1.0.2", "id": "bench", "status": "creating", "pid": os.getpid(),
                            "bundle": bundle}).encode()
        bus = "0000:3b:00.0"
        links = [f"../card1::/dev/dri/by-path/pci-{bus}-card", f"../renderD128::/dev/dri/by-path/pci-{bus}-render"]
        link_args = [a for link in links for a in ("--link", link)]
        nshook, hook = os.path.abspath(args.nshook), os.path.join(BIN, "cdi-shim-hook")
        cases = {
            "symlinks": ([nshook, "symlinks", "--rootfs", rootfs, *link_args],
                         [hook, "create-symlinks", *link_args]),
            "symlinks-from-state": ([nshook, "symlinks", *link_args], [hook, "create-symlinks", *link_args]),
            "bind-params": ([nshook, "bind-params", "--rootfs", rootfs, "--source", source],
                            [hook, "--version"]),
        }
        result = {"runs": args.runs}
        for name, (ours, python) in cases.items():
            times = {"c": [], "python": [], "true": []}
            for index in range(args.runs + 1):
                shutil.rmtree(rootfs + "/dev/dri", ignore_errors=True)
                c = timed(ours, state)
                shutil.rmtree(rootfs + "/dev/dri", ignore_errors=True)
                p = timed(python, state)
                t = timed(["/bin/true"], state)
                if index:
                    times["c"].append(c)
                    times["python"].append(p)
                    times["true"].append(t)
            if name == "bind-params":
                with open(rootfs + "/proc/driver/nvidia/params") as bound:
                    assert bound.read() == "ModifyDeviceFiles: 0\n"   # the bind took (many times over)
            else:
                assert os.readlink(rootfs + f"/dev/dri/by-path/pci-{bus}-card") == "../card1"
            med = statistics.median
            result[name] = {"nshook_ms": round(med(times["c"]), 2), "python_hook_ms": round(med(times["python"]), 2),
                            "bin_true_ms": round(med(times["true"]), 2),
                            "python_over_c": round(med(p / c for p, c in zip(times["python"], times["c"])), 1)}
        print(json.dumps(result, indent=2))
    finally:
        # every bind-params run stacked one more mount on the params file: take them all off
        params = os.path.join(work, "bundle", "rootfs", "proc", "driver", "nvidia", "params")
        while subprocess.run(["umount", params], stderr=subprocess.DEVNULL).returncode == 0:
            pass
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
