"""What cdi-shim-runtime costs on top of runc, measured on real containers.

Both sides run alternately in one process (A B A B ...), so drift on this shared machine hits
both equally; we report medians of each side, the median paired difference and the median
paired ratio.

  passthrough  `state ID` on a created container (the path of exec probes, kill, delete...)
  create-none  `create` of a bundle that requests no device
  create-1dev  `create` with one CDI device requested by annotation, against runc `create` of
               the same bundle with the device already injected (by `cdi-shim cdi inject`);
               once with the interpreter started per create (which keeps recipes beside the
               configured socket since issue 47: every create after the first is the front
               end's replay), once through the resident process (`cdi-shim runtime serve`)

    .venv/bin/python benchmarks/runtime_overhead.py [--runs 30] [--versus OTHER-cdi-shim-runtime]

--versus adds, in the same run, the front end's own paths (passthrough `state`, `create` of a
bundle without request, `create` of a larger config (~25 KB, 200 env entries) without request)
with another build of cdi-shim-runtime (e.g. the previous commit's) against this one, interleaved:
a change to the front end's scan shows there.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from common import start_resident, timed


BIN = os.path.dirname(sys.executable)


def make_bundle(root, name, annotations=None):
    bundle = os.path.join(root, name)
    os.makedirs(os.path.join(bundle, "rootfs", "bin"))
    shutil.copy("/bin/busybox", os.path.join(bundle, "rootfs", "bin", "busybox"))
    os.symlink("busybox", os.path.join(bundle, "rootfs", "bin", "sh"))
    subprocess.run(["runc", "spec"], cwd=bundle, check=True)
    with open(os.path.join(bundle, "config.json")) as src:
        config = json.load(src)
    config["process"]["terminal"] = False
    config["process"]["args"] = ["sh", "-c", "sleep 1000"]
    if annotations:
        config["annotations"] = annotations
    with open(os.path.join(bundle, "config.json"), "w") as out:
        json.dump(config, out)
    return bundle



def summary(name, base, ours):
    med = statistics.median
    return {"case": name, "runc_ms": round(med(base), 2), "shim_ms": round(med(ours), 2),
            "median_paired_diff_ms": round(med(o - b for o, b in zip(ours, base)), 2),
            "median_paired_ratio": round(med(o / b for o, b in zip(ours, base)), 3)}


def versus(args, g, plain, root, env):
    """The front end's paths: ARGS.versus (before) against this build (after), interleaved."""
    shim = os.path.join(BIN, "cdi-shim-runtime")
    big = make_bundle(root, "big")
    with open(os.path.join(big, "config.json")) as src:
        config = json.load(src)
    config["process"]["env"] += [f"VARIABLE_{i}=" + "v" * 100 for i in range(200)]
    config["annotations"] = {f"example.com/key-{i}": "value" for i in range(20)}
    with open(os.path.join(big, "config.json"), "w") as out:
        json.dump(config, out)
    results = []
    subprocess.run(g("runc") + ["create", "--bundle", plain, "vs-state"], env=env, check=True)
    before, after = [], []
    for _ in range(args.runs):
        before.append(timed(g(args.versus) + ["state", "vs-state"], env))
        after.append(timed(g(shim) + ["state", "vs-state"], env))
    subprocess.run(g("runc") + ["delete", "--force", "vs-state"], env=env, check=True)
    results.append(dict(summary("passthrough (state): before vs after", before, after)))
    big_size = os.path.getsize(os.path.join(big, 'config.json'))
    for name, bundle in (("create, no device", plain), (f"create, no device, {big_size} B config", big)):
        before, after = [], []
        for index in range(args.runs):
            for side, binary in ((before, args.versus), (after, shim)):
                side.append(timed(g(binary) + ["create", "--bundle", bundle, f"vs{index}"], env))
                subprocess.run(g("runc") + ["delete", "--force", f"vs{index}"], env=env, check=True)
        results.append(summary(f"{name}: before vs after", before, after))
    for result in results:
        result["before_ms"], result["after_ms"] = result.pop("runc_ms"), result.pop("shim_ms")
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--dir", default="/run",
                        help="where bundles live; containerd keeps them on tmpfs under /run (default)")
    parser.add_argument("--versus", help="another cdi-shim-runtime binary to compare the front end's paths with")
    args = parser.parse_args()
    runc = shutil.which("runc")
    shim = os.path.join(BIN, "cdi-shim-runtime")
    root = tempfile.mkdtemp(prefix="cdi-shim-bench.", dir=args.dir)
    server = None
    state_root = os.path.join(root, "state")
    try:
        specs = os.path.join(root, "specs")
        os.makedirs(specs)
        host_dev = os.path.join(root, "nvidia0")
        os.mknod(host_dev, 0o666 | 0o020000, os.makedev(195, 0))
        with open(os.path.join(specs, "nvidia.yaml"), "w") as out:
            out.write(f'cdiVersion: "0.5.0"\nkind: nvidia.com/gpu\ndevices:\n  - name: "0"\n'
                      f"    containerEdits:\n      env: [GPU=0]\n"
                      f"      deviceNodes: [{{path: /dev/nvidia0, hostPath: {host_dev}}}]\n")
        settings = os.path.join(root, "config.toml")
        with open(settings, "w") as out:  # nothing listens there: the interpreter does the work
            out.write(f'spec-dirs = ["{specs}"]\nresident-socket = "{root}/none.sock"\n')
        env = dict(os.environ, CDI_SHIM_CONFIG=settings, CDI_SHIM_CACHE_DIR=os.path.join(root, "cache"))
        resident_settings = os.path.join(root, "resident.toml")
        with open(resident_settings, "w") as out:
            out.write(f'spec-dirs = ["{specs}"]\nresident-socket = "{root}/run/runtime.sock"\n')
        resident_env = dict(env, CDI_SHIM_CONFIG=resident_settings)
        server = start_resident(f"{root}/run/runtime.sock", resident_env)

        plain = make_bundle(root, "plain")
        requesting = make_bundle(root, "requesting", {"cdi.k8s.io/gpu": "nvidia.com/gpu=0"})
        injected = make_bundle(root, "injected")
        edited = subprocess.run([os.path.join(BIN, "cdi-shim"), "cdi", "inject", "--spec-dir", specs,
                                 "--device", "nvidia.com/gpu=0", os.path.join(injected, "config.json")],
                                env=env, check=True, capture_output=True).stdout
        with open(os.path.join(injected, "config.json"), "wb") as out:
            out.write(edited)
        pristine = open(os.path.join(requesting, "config.json"), "rb").read()

        def g(binary):
            return [binary, "--root", state_root]

        # passthrough: state of one created container
        subprocess.run(g(runc) + ["create", "--bundle", plain, "bench-state"], env=env, check=True)
        base, ours = [], []
        for _ in range(args.runs):
            base.append(timed(g(runc) + ["state", "bench-state"], env))
            ours.append(timed(g(shim) + ["state", "bench-state"], env))
        subprocess.run(g(runc) + ["delete", "--force", "bench-state"], env=env, check=True)
        results = [summary("passthrough (state)", base, ours)]

        def create_pair(bundle_base, bundle_ours, restore=None, env=env):
            base, ours = [], []
            for index in range(args.runs):
                base.append(timed(g(runc) + ["create", "--bundle", bundle_base, f"b{index}"], env))
                subprocess.run(g(runc) + ["delete", "--force", f"b{index}"], env=env, check=True)
                if restore:
                    with open(os.path.join(bundle_ours, "config.json"), "wb") as out:
                        out.write(restore)
                ours.append(timed(g(shim) + ["create", "--bundle", bundle_ours, f"o{index}"], env))
                subprocess.run(g(runc) + ["delete", "--force", f"o{index}"], env=env, check=True)
            return base, ours

        results.append(summary("create, no device", *create_pair(plain, plain)))
        # warm the registry cache once, as any node would be after its first GPU pod
        subprocess.run(g(shim) + ["create", "--bundle", requesting, "warm"], env=env, check=True)
        subprocess.run(g(runc) + ["delete", "--force", "warm"], env=env, check=True)
        results.append(summary("create, 1 CDI device", *create_pair(injected, requesting, restore=pristine)))
        results.append(summary("create, 1 CDI device, resident process",
                               *create_pair(injected, requesting, restore=pristine, env=resident_env)))
        if args.versus:
            results += versus(args, g, plain, root, env)
        print(json.dumps(results, indent=2))
    finally:
        if server:
            server.terminate()
            server.wait()
        subprocess.run(["runc", "--root", state_root, "list", "-q"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
