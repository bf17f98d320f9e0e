"""The toolkit's runtime (nvidia-container-runtime 1.20.0, CDI mode) against cdi-shim-runtime:
create + start + delete of `true` with one CDI device asked for by annotation.

The device: /dev/nvidia0 (a fake node), 30 gcc-built driver libraries bound one file each and the
six hooks `nvidia-ctk cdi generate` writes, their program the toolkit's real nvidia-cdi-hook
(benchmarks/toolkit.py builds both programs). The toolkit's runtime injects the spec and runc runs
the hooks; cdi-shim-runtime (resident process on) injects it and does the hooks' work natively.
Sides alternate within one run; config.json is restored before every create (both runtimes edit it).
A third side, plain runc without the device, is the floor. First, one container of each device
side checks the device's work from inside (node, link, cache, profile).

    .venv/bin/python benchmarks/toolkit_runtime.py [--runs 20]     # as root
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

from common import start_resident, timed
from runtime_overhead import BIN, make_bundle
from toolkit import toolkit_programs

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cdi_shim_lab.images import DRIVER_FOLDER, build_driver_libraries, toolkit_hooks  # noqa: E402


CHECK = (f"test -c /dev/nvidia0 && test -L {DRIVER_FOLDER}/libnvidia-bench0.so && "
         "grep -q libnvidia-bench29.so.1 /etc/ld.so.cache && "
         "test -s /etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf && echo ok > /checked")


def write_spec(root, hook):
    specs = os.path.join(root, "specs")
    os.makedirs(specs)
    node = os.path.join(root, "nvidia0")
    os.mknod(node, 0o666 | 0o020000, os.makedev(195, 0))
    libraries = build_driver_libraries(os.path.join(root, "driver"), 30, shutil.which("gcc"))
    mounts = "".join(f"    - hostPath: {path}\n      containerPath: {DRIVER_FOLDER}/{os.path.basename(path)}\n"
                     "      options: [ro, nosuid, nodev, bind]\n" for path in libraries)
    with open(os.path.join(specs, "bench.yaml"), "w") as out:
        out.write('cdiVersion: "0.5.0"\nkind: bench.cdi-shim.dev/gpu\ndevices:\n  - name: "0"\n'
                  f"    containerEdits:\n      deviceNodes:\n        - path: /dev/nvidia0\n          hostPath: {node}\n"
                  "containerEdits:\n  mounts:\n" + mounts + "  hooks:\n" + toolkit_hooks(hook))
    return specs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    programs = toolkit_programs()
    runc = shutil.which("runc")
    root = tempfile.mkdtemp(prefix="cdi-shim-tkrt.", dir="/run")
    server = None
    try:
        specs = write_spec(root, programs["nvidia-cdi-hook"])
        xdg = os.path.join(root, "xdg")
        os.makedirs(os.path.join(xdg, "nvidia-container-runtime"))
        with open(os.path.join(xdg, "nvidia-container-runtime", "config.toml"), "w") as out:
            out.write(f'[nvidia-container-runtime]\nmode = "cdi"\nruntimes = ["{runc}"]\nlog-level = "error"\n'
                      f'[nvidia-container-runtime.modes.cdi]\nspec-dirs = ["{specs}"]\n'
                      'annotation-prefixes = ["cdi.k8s.io/"]\ndefault-kind = "bench.cdi-shim.dev/gpu"\n')
        env = dict(os.environ, XDG_CONFIG_HOME=xdg)
        settings = os.path.join(root, "shim.toml")
        with open(settings, "w") as out:
            out.write(f'spec-dirs = ["{specs}"]\nresident-socket = "{root}/run/runtime.sock"\n')
        shim_env = dict(os.environ, CDI_SHIM_CONFIG=settings, CDI_SHIM_CACHE_DIR=os.path.join(root, "cache"))
        server = start_resident(f"{root}/run/runtime.sock", shim_env)
        bundle = make_bundle(root, "bundle", {"cdi.k8s.io/gpu": "bench.cdi-shim.dev/gpu=0"})
        os.symlink("busybox", os.path.join(bundle, "rootfs", "bin", "true"))
        os.makedirs(os.path.join(bundle, "rootfs", "etc"))
        config_path = os.path.join(bundle, "config.json")
        config = json.load(open(config_path))
        config["process"]["args"] = ["true"]
        pristine = json.dumps(config).encode()
        sides = {"toolkit": (programs["nvidia-container-runtime"], env),
                 "cdi-shim": (os.path.join(BIN, "cdi-shim-runtime"), shim_env),
                 "runc": (runc, os.environ)}   # no device: runc ignores the annotation
        state = os.path.join(root, "state")

        def lifecycle(name, index):
            binary, side_env = sides[name]
            with open(config_path, "wb") as out:
                out.write(pristine)
            cid = f"{name}-{index}"
            g = [binary, "--root", state]
            return (timed(g + ["create", "--bundle", bundle, cid], side_env) + timed(g + ["start", cid], side_env)
                    + timed(g + ["delete", "--force", cid], side_env))

        check = dict(config, process=dict(config["process"], args=["sh", "-c", CHECK]),
                     root=dict(config["root"], readonly=False))
        checked = os.path.join(bundle, "rootfs", "checked")
        for name, (binary, side_env) in sides.items():  # the device's work done, seen from inside
            if name == "runc":
                continue
            with open(config_path, "w") as out:
                json.dump(check, out)
            g = [binary, "--root", state]
            subprocess.run(g + ["create", "--bundle", bundle, f"check-{name}"], env=side_env, check=True)
            subprocess.run(g + ["start", f"check-{name}"], env=side_env, check=True)
            for _ in range(500):
                status = json.loads(subprocess.run([runc, "--root", state, "state", f"check-{name}"],
                                                   capture_output=True, text=True, check=True).stdout)["status"]
                if status == "stopped":
                    break
                time.sleep(0.01)
            subprocess.run(g + ["delete", "--force", f"check-{name}"], env=side_env, check=True)
            if not os.path.exists(checked):
                sys.exit(f"{name}: the device's work is not all there in the container ({CHECK})")
            os.unlink(checked)
            lifecycle(name, "warm")
        times = {name: [] for name in sides}
        for index in range(args.runs):
            shift = index % len(sides)
            order = list(sides)[shift:] + list(sides)[:shift]
            for name in order:
                times[name].append(lifecycle(name, index))
        med = statistics.median
        print(json.dumps({"runs": args.runs, "load": os.getloadavg(),
                          "median_ms": {k: round(med(v), 1) for k, v in times.items()},
                          "paired median ratios": {f"{a} / {b}": round(med(x / y for x, y in
                                                                           zip(times[a], times[b])), 3)
                                                   for a, b in (("toolkit", "cdi-shim"), ("toolkit", "runc"),
                                                                ("cdi-shim", "runc"))}},
                         indent=2))
    finally:
        if server:
            server.terminate()
            server.wait()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
