"""Full container runs with a GPU's driver libraries: cdi-shim-runtime against plain runc.

The image is a ~540-library glibc root (the generated library tree of the ldcache tests,
tests/linker/libtree.py: 480 gcc-built library files and 417 links, 545 cache entries, with its
own ld.so.cache made by ldconfig) plus busybox. The device's spec, shaped
like `nvidia-ctk cdi generate` output, bind-mounts 30 gcc-built driver libraries (versioned
file names, SONAME .so.1) and carries the toolkit's update-ldcache hook. cdi-shim-runtime
computes the container's cache itself and drops the hook; plain runc runs the same image
without the device. Both sides `run` /bin/true (create, start, wait, delete), alternately; the
shim once with the interpreter started per create and once through its resident process
(`cdi-shim runtime serve`): runc, shim, runc, resident, ...

    .venv/bin/python benchmarks/run_with_libraries.py [--runs 30] [--libs 30]

--preinjected measures instead the `create` of a config someone else injected (containerd's own
CDI, podman; here `cdi-shim cdi inject`): no request, the 30 libraries, /dev/nvidia0 and the six
hooks of a toolkit-generated spec (program /usr/bin/nvidia-cdi-hook, absent), through the
resident process, against runc `create` of the same config without the hooks (runc pays the
mounts either way). A third side, runc `create` of the config as cdi-shim wrote it (its cache
mount; on a GPU host also the params hook it keeps; the library mounts moved to its binds
hook, shim/linker/filebinds.py), splits the difference into the work before runc and what runc
then pays for the result. A fourth, the same config with the binds hook's mounts put back into
config.json, measures what that hook saves over runc making them. A fifth asks for the same
device by annotation (`cdi.k8s.io/gpu`, the legacy request path: the worker resolves and injects
it, then the same step): its ratio to the first side is issue 29's "annotation path vs runc given
the same edits", and its difference to the second what the request costs over the pre-injected
replay. The five sides take turns at going first (the first create after the rootfs set-up is
the slowest).

Each container's rootfs is what containerd's overlayfs snapshotter gives: an overlay mount
with the image as its lower layer and a fresh, empty upper directory (on disk, under --dir).
The bundles (config.json and the files the runtime writes beside it) are on a tmpfs of their
own, as containerd's are (/run/containerd/io.containerd.runtime.v2.task/<ns>/<id>).
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from cdi.safeio import RACY_WINDOW_NS
from common import library_image, start_resident, timed

from cdi_shim_lab.images import build_driver_libraries, toolkit_hooks as lab_toolkit_hooks


BIN = os.path.dirname(sys.executable)
FOLDER = "/usr/lib/x86_64-linux-gnu"
VERSION = "550.54.15"


def make_image(rootfs):
    """The library tree (its own /etc/ld.so.conf.d) plus busybox; the number of library
    files and links in it."""
    library_image(rootfs)
    os.makedirs(rootfs + "/bin")
    shutil.copy("/bin/busybox", rootfs + "/bin/busybox")
    os.symlink("busybox", rootfs + "/bin/true")
    subprocess.run(["ldconfig", "-r", rootfs], check=True)
    return sum(".so" in name for _, _, names in os.walk(rootfs + "/usr/lib") for name in names)


def make_driver(directory, count):
    """COUNT gcc-built driver libraries (libnvidia-bench<N>.so.<VERSION>, SONAME .so.1): the
    pod lab's, so both benchmarks measure the same files."""
    return build_driver_libraries(directory, count, "gcc", VERSION)


def write_spec(spec_dir, libraries, node):
    mounts = "".join(f"    - {{hostPath: {path}, containerPath: {FOLDER}/{os.path.basename(path)}, "
                     f"options: [ro, nosuid, nodev, bind]}}\n" for path in libraries)
    with open(os.path.join(spec_dir, "nvidia.yaml"), "w") as out:
        out.write('cdiVersion: "0.5.0"\nkind: nvidia.com/gpu\ncontainerEdits:\n  mounts:\n' + mounts +
                  "  hooks:\n    - hookName: createContainer\n      path: /usr/bin/nvidia-cdi-hook\n"
                  f"      args: [nvidia-cdi-hook, update-ldcache, --folder, {FOLDER}]\n"
                  f'devices:\n  - name: "0"\n    containerEdits:\n'
                  f'      deviceNodes: [{{path: /dev/nvidia0, hostPath: {node}}}]\n')


def toolkit_hooks():
    """The six createContainer hooks of a spec written by `nvidia-ctk cdi generate` (1.20)."""
    return lab_toolkit_hooks("/usr/bin/nvidia-cdi-hook", FOLDER, VERSION)


def write_toolkit_spec(spec_dir, libraries, node):
    """write_spec's device, with the six hooks of a toolkit-generated spec for its one hook."""
    write_spec(spec_dir, libraries, node)
    path = os.path.join(spec_dir, "nvidia.yaml")
    text = open(path).read()
    with open(path, "w") as out:
        out.write(text[:text.index("  hooks:\n")] + "  hooks:\n" + toolkit_hooks() + text[text.index("devices:\n"):])


def toolkit_world(root, count=30):
    """Under ROOT: the image (ROOT/rootfs), COUNT driver libraries, a device node and the
    toolkit-shaped spec of them (ROOT/specs); (rootfs, spec directory)."""
    rootfs = os.path.join(root, "rootfs")
    make_image(rootfs)
    libraries = make_driver(os.path.join(root, "driver"), count)
    node = os.path.join(root, "nvidia0")
    os.mknod(node, 0o666 | 0o020000, os.makedev(195, 0))
    spec_dir = os.path.join(root, "specs")
    os.makedirs(spec_dir)
    write_toolkit_spec(spec_dir, libraries, node)
    return rootfs, spec_dir


def preinjected(root, rootfs, libraries, node, runs, log_file=None):
    """create of a pre-injected toolkit-shaped config, resident, against runc create without its hooks."""
    spec_dir = os.path.join(root, "specs-toolkit")
    os.makedirs(spec_dir)
    write_toolkit_spec(spec_dir, libraries, node)
    settings = os.path.join(root, "toolkit.toml")
    with open(settings, "w") as out:
        out.write(f'spec-dirs = ["{spec_dir}"]\nresident-socket = "{root}/run-toolkit/runtime.sock"\n')
        if log_file:  # each create's phases with their durations (docs/configuration.md)
            out.write(f'log-level = "debug"\nlog-file = "{os.path.abspath(log_file)}"\n')
    env = dict(os.environ, CDI_SHIM_CONFIG=settings, CDI_SHIM_CACHE_DIR=os.path.join(root, "cache-toolkit"))
    server = start_resident(f"{root}/run-toolkit/runtime.sock", env)
    settle()
    plain_rootfs, gpu_rootfs = os.path.join(root, "rootfs-plain"), os.path.join(root, "rootfs-gpu")
    bundles = bundle_dir(root)
    plain = bundle(bundles, "pre-plain", plain_rootfs)
    gpu = bundle(bundles, "pre-gpu", gpu_rootfs)
    # The fifth side: the same device asked for by annotation (the legacy request path), so the
    # worker resolves and injects it before the step.
    asking_rootfs = os.path.join(root, "rootfs-asking")
    asking = bundle(bundles, "pre-asking", asking_rootfs, {"cdi.k8s.io/gpu": "nvidia.com/gpu=0"})
    asking_pristine = open(os.path.join(asking, "config.json"), "rb").read()
    injected = json.loads(subprocess.run([os.path.join(BIN, "cdi-shim"), "cdi", "inject", "--spec-dir", spec_dir,
                                          "--device", "nvidia.com/gpu=0", os.path.join(gpu, "config.json")],
                                         env=env, check=True, capture_output=True).stdout)
    assert len(injected["hooks"]["createContainer"]) == 6
    pristine = json.dumps(injected).encode()
    injected["root"]["path"] = plain_rootfs
    injected.pop("hooks")
    with open(os.path.join(plain, "config.json"), "w") as out:
        json.dump(injected, out)
    shim = os.path.join(BIN, "cdi-shim-runtime")
    state = os.path.join(root, "state-toolkit")
    # The third side: runc create of the config as cdi-shim left it (its cache mount, and the
    # hook it keeps where the host has /proc/driver/nvidia/params), on a rootfs of its own.
    result_rootfs = os.path.join(root, "rootfs-result")
    result = bundle(bundles, "pre-result", result_rootfs)
    unbatched_rootfs = os.path.join(root, "rootfs-unbatched")
    unbatched = bundle(bundles, "pre-unbatched", unbatched_rootfs)
    base, ours, theirs, back, asked, written = [], [], [], [], [], {}
    try:
        for index in range(runs + 1):
            for copy in (plain_rootfs, gpu_rootfs, result_rootfs, unbatched_rootfs, asking_rootfs):
                fresh_rootfs(rootfs, copy)
            with open(os.path.join(gpu, "config.json"), "wb") as out:
                out.write(pristine)
            with open(os.path.join(asking, "config.json"), "wb") as out:
                out.write(asking_pristine)
            times = {}

            def plain_side():
                times["b"] = timed(["runc", "--root", state, "create", "--bundle", plain, f"p{index}"], env)
                subprocess.run(["runc", "--root", state, "delete", "--force", f"p{index}"], env=env, check=True)

            def shim_side():
                times["o"] = timed([shim, "--root", state, "create", "--bundle", gpu, f"g{index}"], env)
                subprocess.run(["runc", "--root", state, "delete", "--force", f"g{index}"], env=env, check=True)
                with open(os.path.join(gpu, "config.json")) as src:
                    written["config"] = src.read()
                assert "nvidia-cdi-hook" not in written["config"]

            def result_side():     # cdi-shim's config.json (of this run, or of the one before)
                with open(os.path.join(result, "config.json"), "w") as out:
                    out.write(written["config"].replace(gpu_rootfs, result_rootfs))
                times["r"] = timed(["runc", "--root", state, "create", "--bundle", result, f"r{index}"], env)
                subprocess.run(["runc", "--root", state, "delete", "--force", f"r{index}"], env=env, check=True)

            def unbatched_side():  # the same, the binds hook's mounts made by runc again
                with open(os.path.join(unbatched, "config.json"), "w") as out:
                    json.dump(mounts_put_back(json.loads(written["config"].replace(gpu_rootfs, unbatched_rootfs))), out)
                times["u"] = timed(["runc", "--root", state, "create", "--bundle", unbatched, f"u{index}"], env)
                subprocess.run(["runc", "--root", state, "delete", "--force", f"u{index}"], env=env, check=True)

            def asking_side():
                times["a"] = timed([shim, "--root", state, "create", "--bundle", asking, f"a{index}"], env)
                subprocess.run(["runc", "--root", state, "delete", "--force", f"a{index}"], env=env, check=True)
                with open(os.path.join(asking, "config.json")) as src:
                    text = src.read()
                assert "/dev/nvidia0" in text and "nvidia-cdi-hook" not in text, "the annotation was not served"

            # The sides take turns at going first (the first create after the rootfs set-up
            # is the slowest), so no side gains from its place.
            sides = [plain_side, shim_side, result_side, unbatched_side, asking_side]
            for side in sides[index % 5:] + sides[:index % 5]:
                side()
            if index:
                base.append(times["b"])
                ours.append(times["o"])
                theirs.append(times["r"])
                back.append(times["u"])
                asked.append(times["a"])
    finally:
        server.terminate()
        server.wait()
    med = statistics.median
    return {"case": "create, pre-injected toolkit spec (30 libraries, six hooks), resident",
            "runs": runs, "runc_create_without_hooks_ms": round(med(base), 2),
            "shim_create_ms": round(med(ours), 2),
            "median_paired_diff_ms": round(med(o - b for o, b in zip(ours, base)), 2),
            "median_paired_diff_95pct_ms": interval([o - b for o, b in zip(ours, base)]),
            "median_paired_ratio": round(med(o / b for o, b in zip(ours, base)), 3),
            "runc_create_of_the_config_cdi_shim_wrote_ms": round(med(theirs), 2),
            "of_which_before_runc_ms": round(med(o - r for o, r in zip(ours, theirs)), 2),
            "of_which_runc_running_the_result_ms": round(med(r - b for r, b in zip(theirs, base)), 2),
            "that_config_with_runc_making_the_binds_hook_s_mounts_ms": round(med(back), 2),
            "binds_hook_saves_ms": round(med(u - r for u, r in zip(back, theirs)), 2),
            "binds_hook_saves_95pct_ms": interval([u - r for u, r in zip(back, theirs)]),
            "annotation_create_ms": round(med(asked), 2),
            "annotation_median_paired_ratio": round(med(a / b for a, b in zip(asked, base)), 3),
            "annotation_minus_preinjected_ms": round(med(a - o for a, o in zip(asked, ours)), 2),
            "annotation_minus_preinjected_95pct_ms": interval([a - o for a, o in zip(asked, ours)])}


def mounts_put_back(config):
    """CONFIG (as cdi-shim wrote it) with its binds hook's mounts in config.json again, at the
    end (they are the device's and our own, appended last)."""
    hooks = config.get("hooks", {}).get("createContainer", [])
    for hook in hooks:
        args = hook.get("args", [])
        if args[:2] == ["cdi-shim-nshook", "binds"]:
            binds = [args[at + 1:at + 4] for at, arg in enumerate(args) if arg == "--bind"]
            config["mounts"] += [{"destination": dest, "type": "bind", "source": source, "options": options.split(",")}
                                 for source, dest, options in binds]
            hooks.remove(hook)
            break
    else:
        raise AssertionError("cdi-shim's config has no binds hook")
    if not hooks:
        config["hooks"].pop("createContainer")
    return config


def interval(values, rounds=2000):
    """A 95 % bootstrap interval of the median of VALUES (runc create alone swings by ±10 ms
    on these VMs: the median of a paired difference is known to about a millisecond)."""
    draw = random.Random(0)
    medians = sorted(statistics.median(draw.choices(values, k=len(values))) for _ in range(rounds))
    return [round(medians[int(rounds * 0.025)], 2), round(medians[int(rounds * 0.975) - 1], 2)]


def settle():
    """Let the files just made age past the memos' settle window (a file changed within it is
    read again every time), as a node's driver and images have."""
    time.sleep(RACY_WINDOW_NS / 1e9 + 0.1)


def bundle_dir(root):
    """ROOT/bundles on a tmpfs of its own (unmounted by cleanup)."""
    path = os.path.join(root, "bundles")
    os.makedirs(path)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0700,size=256m", "cdi-shim-bench", path], check=True)
    return path


def fresh_rootfs(image, path):
    """PATH: a new overlay of IMAGE with an empty upper layer (PATH.upper, PATH.work)."""
    subprocess.run(["umount", path], stderr=subprocess.DEVNULL)
    for layer in (path, path + ".upper", path + ".work"):
        shutil.rmtree(layer, ignore_errors=True)
        os.makedirs(layer)
    subprocess.run(["mount", "-t", "overlay", "cdi-shim-bench", "-o",
                    f"lowerdir={image},upperdir={path}.upper,workdir={path}.work", path], check=True)


def cleanup(root):
    for name in os.listdir(root):
        if name.startswith("rootfs-") and "." not in name:
            subprocess.run(["umount", os.path.join(root, name)], stderr=subprocess.DEVNULL)
    subprocess.run(["umount", os.path.join(root, "bundles")], stderr=subprocess.DEVNULL)
    shutil.rmtree(root, ignore_errors=True)


def bundle(root, name, rootfs, annotations=None):
    path = os.path.join(root, name)
    os.makedirs(path)
    subprocess.run(["runc", "spec", "--bundle", path], check=True)
    with open(os.path.join(path, "config.json")) as src:
        config = json.load(src)
    config["root"] = {"path": rootfs, "readonly": True}
    config["process"]["terminal"] = False
    config["process"]["args"] = ["/bin/true"]
    if annotations:
        config["annotations"] = annotations
    with open(os.path.join(path, "config.json"), "w") as out:
        json.dump(config, out)
    return path



def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--libs", type=int, default=30)
    parser.add_argument("--dir", default="/run",
                        help="where the image and its copies live (the bundles get a tmpfs of their own)")
    parser.add_argument("--preinjected", action="store_true",
                        help="measure create of a pre-injected toolkit-shaped config instead (see above)")
    parser.add_argument("--debug-log", metavar="FILE",
                        help="--preinjected: log each create's phases (log-level debug) into FILE")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="cdi-shim-run-bench.", dir=args.dir)
    try:
        rootfs = os.path.join(root, "rootfs")
        image_libs = make_image(rootfs)
        libraries = make_driver(os.path.join(root, "driver"), args.libs)
        node = os.path.join(root, "nvidia0")
        os.mknod(node, 0o666 | 0o020000, os.makedev(195, 0))
        if args.preinjected:
            result = preinjected(root, rootfs, libraries, node, args.runs, args.debug_log)
            result.update(image_library_files=image_libs, driver_libraries=args.libs)
            print(json.dumps(result, indent=2))
            return
        spec_dir = os.path.join(root, "specs")
        os.makedirs(spec_dir)
        write_spec(spec_dir, libraries, node)
        envs = {}
        for mode, sock in (("exec", "none.sock"), ("resident", "run/runtime.sock")):
            settings = os.path.join(root, f"{mode}.toml")
            with open(settings, "w") as out:
                out.write(f'spec-dirs = ["{spec_dir}"]\nresident-socket = "{root}/{sock}"\n')
            envs[mode] = dict(os.environ, CDI_SHIM_CONFIG=settings, CDI_SHIM_CACHE_DIR=os.path.join(root, "cache"))
        server = start_resident(f"{root}/run/runtime.sock", envs["resident"])
        settle()
        state = os.path.join(root, "state")
        # Each container gets its own overlay of the image, as a containerd snapshot would
        # give it: runc creates mount points inside the rootfs.
        plain_rootfs, gpu_rootfs = os.path.join(root, "rootfs-plain"), os.path.join(root, "rootfs-gpu")
        bundles = bundle_dir(root)
        plain = bundle(bundles, "plain", plain_rootfs)
        gpu = bundle(bundles, "gpu", gpu_rootfs, {"cdi.k8s.io/gpu": "nvidia.com/gpu=0"})
        pristine = open(os.path.join(gpu, "config.json"), "rb").read()
        shim = os.path.join(BIN, "cdi-shim-runtime")
        times = {"exec": ([], []), "resident": ([], [])}
        try:
            for index in range(args.runs + 1):
                for mode, (base, ours) in times.items():
                    for copy in (plain_rootfs, gpu_rootfs):
                        fresh_rootfs(rootfs, copy)
                    with open(os.path.join(gpu, "config.json"), "wb") as out:
                        out.write(pristine)
                    env = envs[mode]
                    b = timed(["runc", "--root", state, "run", "--bundle", plain, f"p{mode}{index}"], env)
                    o = timed([shim, "--root", state, "run", "--bundle", gpu, f"g{mode}{index}"], env)
                    if index:  # the first pair warms the registry cache, as a node's first GPU pod does
                        base.append(b)
                        ours.append(o)
        finally:
            server.terminate()
            server.wait()
        med = statistics.median
        result = {"image_library_files": image_libs, "driver_libraries": args.libs, "runs": args.runs}
        for mode, (base, ours) in times.items():
            result[mode] = {"runc_run_ms": round(med(base), 1), "shim_run_with_device_ms": round(med(ours), 1),
                            "median_paired_ratio": round(med(o / b for o, b in zip(ours, base)), 3)}
        print(json.dumps(result, indent=2))
    finally:
        cleanup(root)


if __name__ == "__main__":
    main()
