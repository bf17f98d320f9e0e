"""The one-mount layout (docs/one-mount.md) against plain runc: a container's whole life
(create, start, delete of /bin/true, or one `run`: --lifecycle) with a GPU of the fake driver.

The driver is the tests' fake one (tests/generate/fakedriver.py: 30 gcc-built libraries with
their real names and SONAMEs, the fake NVML, 5 tools, firmware, ICD and config files, device
nodes), its spec made by `cdi-shim cdi generate` twice: --layout files (nvidia-ctk's shape)
and --layout one-mount. The image is the ldcache tests' library-rich glibc root (545 cache
entries) plus busybox; each container gets a fresh overlay of it, as containerd's snapshotter
gives. Sides, taking turns at going first, each round:

- runc: plain runc, no device;
- runc+folders: plain runc given the layout's two directory binds alone (no device node);
- runc+nodes: plain runc given the spec's device nodes alone (linux.devices and their device
  cgroup rules; no mount): what any runtime that hands runc this GPU pays at least;
- runc+edits: plain runc given the one-mount spec's edits (`cdi-shim cdi inject`, its hooks
  left out: two directory binds, the device nodes, the ICD/config/firmware/socket binds);
- runc+edits+hook: the same plus one createContainer hook, /bin/true: what runc pays to run
  any hook process, the least the spec's /dev/dri/by-path links cost when a hook makes them
  (they can only be made after runc mounts /dev: by cdi-shim-nshook, run by runc, or, for a
  create with --pid-file, by the front end once runc's create returns);
- one-mount: cdi-shim-runtime with the device requested by annotation, the one-mount spec;
- one-mount-hook: the same, its create without --pid-file (with --lifecycle create): the front
  end leaves the /dev/dri/by-path links to the hook, which runc runs (as before 2026-12-06
  evening, and as with --lifecycle run);
- one-mount-injected: cdi-shim-runtime given the config with the spec's edits already in it,
  hooks and all, as containerd's own CDI (1.7+) or podman hand it over (no request: the
  update-ldcache hook done natively, replayed by the front end once its step is known);
- files: the same with the files spec (one bind a library).

cdi-shim-runtime runs with its resident process (`cdi-shim runtime serve`), as on a node.
Reported: each side's median, and the median of the per-round ratios to runc (and of ours to
runc+edits and runc+edits+hook: our part alone), to 2 decimals as its 95 % bootstrap interval.

    .venv/bin/python benchmarks/one_mount.py [--runs 40] [--dir /run] [--image rich|small] [--writable-root]
                                             [--lifecycle create|run]
    (as root)

--lifecycle create (the default): each container's life as containerd and Docker's shims drive
it, `create --pid-file`, `start`, `delete --force` (the container has run /bin/true by then);
--lifecycle run: one `run`, as measured before 2026-12-06 evening. Only with create does the
front end make the spec's /dev/dri/by-path links itself (csrc/frontend/after_create.c); with
run, runc runs the hook that makes them.

--image small: a small glibc image instead (busybox, this host's libc, libm and loader, its
own ld.so.cache), closer to a CUDA base image's few system libraries. --writable-root:
`root.readonly` false, as a pod's root is unless it asks otherwise (the container's ld.so.cache
is then written into the rootfs's upper layer; with a read-only root, into an overlay of /etc
that the bundle holds: one more mount).
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
from run_with_libraries import bundle, bundle_dir, cleanup, fresh_rootfs, interval, make_image, settle

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "generate"))
import fakedriver  # noqa: E402

BIN = os.path.dirname(sys.executable)
SIDES = ("runc", "runc+folders", "runc+nodes", "runc+edits", "runc+edits+hook", "one-mount", "one-mount-hook",
         "one-mount-injected", "files")


def make_small_image(rootfs):
    """busybox and this host's libc, libm and loader, with ld.so.conf and a cache."""
    libdir = rootfs + "/usr/lib/x86_64-linux-gnu"
    for sub in ("/bin", "/etc", "/lib64", "/usr/lib/x86_64-linux-gnu"):
        os.makedirs(rootfs + sub, exist_ok=True)
    shutil.copy("/bin/busybox", rootfs + "/bin/busybox")
    os.symlink("busybox", rootfs + "/bin/true")
    for name in ("libc.so.6", "libm.so.6"):
        shutil.copy2(os.path.realpath(f"/lib/x86_64-linux-gnu/{name}"), f"{libdir}/{name}")
    shutil.copy2(os.path.realpath("/lib64/ld-linux-x86-64.so.2"), rootfs + "/lib64/ld-linux-x86-64.so.2")
    with open(rootfs + "/etc/ld.so.conf", "w") as out:
        out.write("/usr/lib/x86_64-linux-gnu\n")
    subprocess.run(["ldconfig", "-r", rootfs], check=True)


def generate(driver, spec_dir, layout, driver_dir, env):
    argv = [os.path.join(BIN, "cdi-shim"), "cdi", "generate", "--driver-root", driver.root, "--dev-root",
            driver.dev_root, "--sysfs-root", driver.sysfs, "--proc-root", driver.proc, "--layout", layout,
            "--output", os.path.join(spec_dir, "nvidia.yaml")]
    if layout == "one-mount":
        argv += ["--driver-dir", driver_dir]
    subprocess.run(argv, check=True, env=env, capture_output=True)


def injected(spec_dir, config_path, env, hooks=False, true_hook=False):
    """config.json with the spec's edits applied, its hooks left out (what runc is given) or
    kept (what containerd's own CDI hands the runtime); TRUE_HOOK: one createContainer hook of
    /bin/true in their place."""
    done = subprocess.run([os.path.join(BIN, "cdi-shim"), "cdi", "inject", "--device", "nvidia.com/gpu=0",
                           "--spec-dir", spec_dir, config_path], check=True, env=env, capture_output=True)
    config = json.loads(done.stdout)
    if not hooks:
        config.pop("hooks", None)
    if true_hook:
        config["hooks"] = {"createContainer": [{"path": "/bin/true", "args": ["true"]}]}
    with open(config_path, "w") as out:
        json.dump(config, out)


def part_only(spec_dir, config_path, env, part):
    """config.json with one part of the one-mount spec's edits added, nothing else: "folders"
    (its two directory binds) or "nodes" (its device nodes and their device cgroup rules)."""
    with open(config_path) as stream:
        config = json.load(stream)
    injected(spec_dir, config_path, env)
    with open(config_path) as stream:
        edited = json.load(stream)
    if part == "folders":
        config["mounts"] += [m for m in edited["mounts"]
                             if m["destination"] in ("/usr/local/nvidia/lib64", "/usr/local/nvidia/bin")]
    else:
        config["linux"]["devices"] = edited["linux"]["devices"]
        config["linux"].setdefault("resources", {})["devices"] = edited["linux"]["resources"]["devices"]
    with open(config_path, "w") as out:
        json.dump(config, out)


def life(argv, state, bundle, container, env, lifecycle, pid_file=True):
    """One container's life in ms: `run`, or create (--pid-file unless told), start and delete --force."""
    if lifecycle == "run":
        return timed(argv + ["--root", state, "run", "--bundle", bundle, container], env)
    runc = ["runc", "--root", state]
    pid = ["--pid-file", os.path.join(bundle, "init.pid")] if pid_file else []
    start = time.perf_counter()
    for command in (argv + ["--root", state, "create", *pid, "--bundle", bundle, container],
                    runc + ["start", container], runc + ["delete", "--force", container]):
        subprocess.run(command, env=env, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    return (time.perf_counter() - start) * 1000


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--dir", default="/run", help="where the image, the driver and the overlays live")
    parser.add_argument("--image", choices=("rich", "small"), default="rich")
    parser.add_argument("--writable-root", action="store_true", help="root.readonly false")
    parser.add_argument("--lifecycle", choices=("create", "run"), default="create",
                        help="create --pid-file, start, delete (default), or one run")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="cdi-shim-one-mount-bench.", dir=args.dir)
    driver = None
    server = None
    try:
        image = os.path.join(root, "rootfs")
        if args.image == "rich":
            make_image(image)
        else:
            make_small_image(image)
        driver = fakedriver.FakeDriver(os.path.join(root, "fake"), gpus=1)
        env = dict(os.environ)
        env.pop("XDG_DATA_DIRS", None)
        specs, envs = {}, {}
        for layout in ("one-mount", "files"):
            spec_dir = os.path.join(root, f"specs-{layout}")
            os.makedirs(spec_dir)
            generate(driver, spec_dir, layout, os.path.join(root, "driver-dirs"), env)
            specs[layout] = spec_dir
            settings = os.path.join(root, f"{layout}.toml")
            with open(settings, "w") as out:
                out.write(f'spec-dirs = ["{spec_dir}"]\nresident-socket = "{root}/run/runtime.sock"\n')
            envs[layout] = dict(env, CDI_SHIM_CONFIG=settings, CDI_SHIM_CACHE_DIR=os.path.join(root, "cache"))
        server = start_resident(f"{root}/run/runtime.sock", envs["one-mount"])
        bundles = bundle_dir(root)
        sides = {}
        for name in SIDES:
            rootfs = os.path.join(root, f"rootfs-{name.replace('+', '-')}")
            annotations = {"cdi.k8s.io/gpu": "nvidia.com/gpu=0"} if name in ("one-mount", "one-mount-hook", "files") \
                else None
            path = bundle(bundles, name.replace("+", "-"), rootfs, annotations)
            if args.writable_root:
                with open(os.path.join(path, "config.json")) as stream:
                    config = json.load(stream)
                config["root"]["readonly"] = False
                with open(os.path.join(path, "config.json"), "w") as out:
                    json.dump(config, out)
            if name in ("runc+folders", "runc+nodes"):
                part_only(specs["one-mount"], os.path.join(path, "config.json"), env, name.split("+")[1])
            elif name in ("runc+edits", "runc+edits+hook"):
                injected(specs["one-mount"], os.path.join(path, "config.json"), env,
                         true_hook=name == "runc+edits+hook")
            elif name == "one-mount-injected":
                injected(specs["one-mount"], os.path.join(path, "config.json"), env, hooks=True)
            with open(os.path.join(path, "config.json"), "rb") as stream:
                sides[name] = (path, rootfs, stream.read())
        settle()
        shim = os.path.join(BIN, "cdi-shim-runtime")
        state = os.path.join(root, "state")
        times = {name: [] for name in SIDES}
        for index in range(args.runs + 1):
            order = SIDES[index % len(SIDES):] + SIDES[:index % len(SIDES)]
            for name in SIDES:
                path, rootfs, pristine = sides[name]
                fresh_rootfs(image, rootfs)
                with open(os.path.join(path, "config.json"), "wb") as out:
                    out.write(pristine)
            for name in order:
                path = sides[name][0]
                if name.startswith("runc"):
                    argv, side_env = ["runc"], env
                else:
                    argv, side_env = [shim], envs["files" if name == "files" else "one-mount"]
                took = life(argv, state, path, f"{name.replace('+', '-')}{index}", side_env, args.lifecycle,
                            pid_file=name != "one-mount-hook")
                if index:   # (the first round warms the caches, as a node's first GPU pod does)
                    times[name].append(took)
        med = statistics.median
        (host_dir,) = os.listdir(os.path.join(root, "driver-dirs"))
        result = {"runs": args.runs, "dir": args.dir, "image": args.image, "gpus": 1, "lifecycle": args.lifecycle,
                  "readonly_root": not args.writable_root,
                  "entries_in_host_lib64": len(os.listdir(os.path.join(root, "driver-dirs", host_dir, "lib64"))),
                  "median_ms": {name: round(med(times[name]), 1) for name in SIDES}}
        ratios = {}
        for name in SIDES[1:]:
            per_round = [a / b for a, b in zip(times[name], times["runc"])]
            ratios[f"{name}/runc"] = round(med(per_round), 2)
            ratios[f"{name}/runc 95pct"] = interval(per_round)
        for name in ("one-mount", "one-mount-injected"):
            for floor in ("runc+edits", "runc+edits+hook", "one-mount-hook"):
                ours = [a / b for a, b in zip(times[name], times[floor])]
                ratios[f"{name}/{floor}"] = round(med(ours), 2)
                ratios[f"{name}/{floor} 95pct"] = interval(ours)
        result["median_paired_ratio"] = ratios
        print(json.dumps(result, indent=2))
    finally:
        if server is not None:
            server.terminate()
            server.wait()
        if driver is not None:
            driver.close()
        cleanup(root)


if __name__ == "__main__":
    main()
