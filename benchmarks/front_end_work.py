"""What cdi-shim-runtime does before it execs runc, without runc's noise: the runtime set to
/bin/true (cdi-shim's config key `runtime`), so each side is one `create` that ends in an exec of
/bin/true, against /bin/true run directly.

Sides, shuffled each round, 20 ms apart (as creates come on a node: cold caches):
- passthrough: a config with nothing for us (the front end's byte scan, then the exec);
- trivial: a config with an nvidia-cdi-hook hook we do not know (a round trip to the resident
  worker that finds nothing to do);
- preinjected: the config of benchmarks/run_with_libraries.py --preinjected (30 driver
  libraries, the six hooks of a toolkit spec), on a fresh overlay of the image each round: the
  first through the worker, which keeps the step and writes its recipe; then replayed by the
  front end (csrc/engine/replay.c). `--no-replay` opens the recipes' directory to others
  after the first round, so the front end refuses them and the worker does every step (from its
  memo of whole steps: shim/linker/stepmemo.py);
- annotation: the same device asked for by annotation (`cdi.k8s.io/gpu`) on a fresh overlay of
  its own: the first through the worker, which resolves the request and records its injection;
  then injected and stepped by the front end (csrc/engine/request.c, replay.c);
- device-option: the same, asked for by the runtime's own `--device nvidia.com/gpu=0`;
- go-escaped: passthrough's config with `sh -c "true && true"` as its command, written as
  containerd's Go encoder writes it (`\u0026`): nothing for us all the same;
- preinjected-go-escaped: preinjected's config with an env var holding a URL with a query
  (`&`), Go-escaped, on a fresh overlay of its own;
- preinjected-linked: preinjected's config on an image that already holds the driver files'
  soname links (libX.so.1 -> libX.so.<v> in the multiarch folder, as the hook's ldconfig leaves
  them): the same device, a step that makes none of them. Its ratio to preinjected is what the
  soname links cost a replay (issue 42: the image is merged /usr, so the step makes 30 links).

    .venv/bin/python benchmarks/front_end_work.py [--runs 100] [--no-replay] [--dir DIR] [--writable-root]

--dir: where the image and the container's overlay rootfs live (default /dev/shm; a folder on
disk makes the rootfs's upper layer a disk's, as a containerd snapshot's is); the bundles are on
a tmpfs of their own either way. --writable-root: `root.readonly` false (the linker files are
then written into the rootfs, not into an overlay of /etc in the bundle).
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import tempfile
import time

import run_with_libraries as bench
from common import start_resident


def go_escaped(text):
    """JSON text as containerd's Go encoder writes it: <, > and & as \\u escapes."""
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def linked_copy(image, driver, path):
    """PATH: a copy of IMAGE holding the soname link of each library in DRIVER (libX.so.1 ->
    libX.so.<v>) in the folder the spec mounts them into, its cache made again by ldconfig
    (as an image built with those links would have it)."""
    subprocess.run(["cp", "-a", image, path], check=True)
    for name in os.listdir(driver):
        if name.startswith("lib") and ".so." in name:
            os.symlink(name, os.path.join(path + bench.FOLDER, name.split(".so.")[0] + ".so.1"))
    subprocess.run(["ldconfig", "-r", path], check=True)
    return path


def spawn_ms(argv, env):
    start = time.perf_counter()
    pid = os.posix_spawn(argv[0], argv, env)
    os.waitpid(pid, 0)
    return (time.perf_counter() - start) * 1000


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--no-replay", action="store_true", help="leave every step to the resident worker")
    parser.add_argument("--dir", default="/dev/shm", help="where the image and the rootfs overlay live")
    parser.add_argument("--writable-root", action="store_true", help="root.readonly false")
    parser.add_argument("--debug-log", metavar="FILE", help="log each create's phases (log-level debug) into FILE")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="cdi-shim-front-end.", dir=args.dir)
    server = None
    try:
        rootfs, spec_dir = bench.toolkit_world(root)
        linked_image = linked_copy(rootfs, os.path.join(root, "driver"), os.path.join(root, "rootfs-linked-image.d"))
        sock = os.path.join(root, "run", "runtime.sock")
        settings = os.path.join(root, "cdi-shim.toml")
        with open(settings, "w") as out:
            out.write(f'spec-dirs = ["{spec_dir}"]\nresident-socket = "{sock}"\nruntime = "/bin/true"\n')
            if args.debug_log:  # (the front end's `phase=replay took=`, the worker's phases)
                out.write(f'log-level = "debug"\nlog-file = "{os.path.abspath(args.debug_log)}"\n')
        env = dict(os.environ, CDI_SHIM_CONFIG=settings, CDI_SHIM_CACHE_DIR=os.path.join(root, "cache"))
        server = start_resident(sock, env)
        bench.settle()
        bundles = bench.bundle_dir(root)
        gpu_rootfs = os.path.join(root, "rootfs-gpu")
        gpu = bench.bundle(bundles, "gpu", gpu_rootfs)
        asking_rootfs = os.path.join(root, "rootfs-asking")
        asking = bench.bundle(bundles, "asking", asking_rootfs, {"cdi.k8s.io/gpu": "nvidia.com/gpu=0"})
        with open(os.path.join(asking, "config.json")) as f:
            config = json.load(f)
        config["root"]["readonly"] = not args.writable_root
        asking_pristine = json.dumps(config).encode()
        option_rootfs = os.path.join(root, "rootfs-option")
        option = bench.bundle(bundles, "option", option_rootfs)
        with open(os.path.join(option, "config.json")) as f:
            config = json.load(f)
        config["root"]["readonly"] = not args.writable_root
        option_pristine = json.dumps(config).encode()
        plain = bench.bundle(bundles, "plain", rootfs)
        escaped = bench.bundle(bundles, "escaped", rootfs)
        with open(os.path.join(escaped, "config.json")) as f:
            config = json.load(f)
        config["process"]["args"] = ["sh", "-c", "true && true"]
        with open(os.path.join(escaped, "config.json"), "w") as out:
            out.write(go_escaped(json.dumps(config)))
        trivial = bench.bundle(bundles, "trivial", rootfs)
        with open(os.path.join(trivial, "config.json")) as f:
            config = json.load(f)
        config["hooks"] = {"createContainer": [{"path": "/usr/bin/nvidia-cdi-hook",
                                                "args": ["nvidia-cdi-hook", "new"]}]}
        with open(os.path.join(trivial, "config.json"), "w") as out:
            json.dump(config, out)
        injected = subprocess.run([os.path.join(bench.BIN, "cdi-shim"), "cdi", "inject", "--spec-dir", spec_dir,
                                   "--device", "nvidia.com/gpu=0", os.path.join(gpu, "config.json")],
                                  env=env, check=True, capture_output=True).stdout
        injected = json.loads(injected)
        injected["root"]["readonly"] = not args.writable_root
        pristine = json.dumps(injected).encode()
        gpu_escaped_rootfs = os.path.join(root, "rootfs-gpu-escaped")
        gpu_escaped = bench.bundle(bundles, "gpu-escaped", gpu_escaped_rootfs)
        injected["root"]["path"] = gpu_escaped_rootfs
        injected["process"]["env"].append("URL=https://example.com/?a=1&b=2")
        escaped_pristine = go_escaped(json.dumps(injected)).encode()
        linked_rootfs = os.path.join(root, "rootfs-linked")
        linked = bench.bundle(bundles, "linked", linked_rootfs)
        # Another step key than preinjected's: the key leaves out root.path and env, so two
        # images with one config would share one recipe file and take turns at rewriting it
        # (each then replayed by the worker, not the front end). A tmpfs of its own keys it apart.
        injected["process"]["env"].pop()
        injected["mounts"].append({"destination": "/linked", "type": "tmpfs", "source": "tmpfs",
                                   "options": ["nosuid", "nodev", "size=64k"]})
        injected["root"]["path"] = linked_rootfs
        linked_pristine = json.dumps(injected).encode()
        shim = os.path.join(bench.BIN, "cdi-shim-runtime")
        argv = {"true": ["/bin/true", "create", "--bundle", plain, "x"],
                "passthrough": [shim, "create", "--bundle", plain, "x"],
                "trivial": [shim, "create", "--bundle", trivial, "x"],
                "preinjected": [shim, "create", "--bundle", gpu, "g"],
                "annotation": [shim, "create", "--bundle", asking, "a"],
                "device-option": [shim, "--device", "nvidia.com/gpu=0", "create", "--bundle", option, "o"],
                "go-escaped": [shim, "create", "--bundle", escaped, "e"],
                "preinjected-go-escaped": [shim, "create", "--bundle", gpu_escaped, "ge"],
                "preinjected-linked": [shim, "create", "--bundle", linked, "l"]}
        times = {side: [] for side in argv}
        steps = os.path.join(root, "run", "steps")
        for index in range(args.runs + 1):
            bench.fresh_rootfs(rootfs, gpu_rootfs)
            bench.fresh_rootfs(rootfs, asking_rootfs)
            bench.fresh_rootfs(rootfs, option_rootfs)
            bench.fresh_rootfs(rootfs, gpu_escaped_rootfs)
            bench.fresh_rootfs(linked_image, linked_rootfs)
            for bundle, text in ((gpu, pristine), (asking, asking_pristine), (option, option_pristine),
                                 (gpu_escaped, escaped_pristine), (linked, linked_pristine)):
                with open(os.path.join(bundle, "config.json"), "wb") as out:
                    out.write(text)
            if args.no_replay and index == 1:
                os.chmod(steps, 0o777)      # (the front end then leaves every step to the worker)
            sides = list(argv)
            random.shuffle(sides)
            for side in sides:
                time.sleep(0.02)
                took = spawn_ms(argv[side], env)
                if index:       # (the first round: the worker keeps the step)
                    times[side].append(took)
            for bundle in (gpu, asking, option, gpu_escaped, linked):
                with open(os.path.join(bundle, "config.json"), "rb") as f:
                    text = f.read()
                assert b"nvidia-cdi-hook" not in text and b"/dev/nvidia0" in text, bundle
        for path in (gpu_rootfs, asking_rootfs, option_rootfs, gpu_escaped_rootfs, linked_rootfs):
            subprocess.run(["umount", path], check=False)
        med = {side: statistics.median(values) for side, values in times.items()}
        print(json.dumps({"runs": args.runs, "replay": not args.no_replay, "dir": args.dir,
                          "readonly_root": not args.writable_root,
                          "median_ms": {side: round(value, 3) for side, value in med.items()},
                          "over_bin_true_ms": {side: round(med[side] - med["true"], 3)
                                               for side in med if side != "true"},
                          "soname_links_ratio": round(med["preinjected"] / med["preinjected-linked"], 3)},
                         indent=2))
    finally:
        if server:
            server.terminate()
            server.wait()
        bench.cleanup(root)


if __name__ == "__main__":
    main()
