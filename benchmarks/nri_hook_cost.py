"""Where the NRI path's extra StartContainer time goes, without containerd (issue 45; docs/nri.md).

`cdi-shim bench pods --scenario nri-30-libs` puts ~7 ms (pooled paired median) between a pod
through the plugin with our native hook (nri-native) and the same device without hooks
(device-no-hooks), all of it in StartContainer: runc create, where runc runs createContainer
hooks. This takes containerd out and times `runc create` of the same container, built the same
way (the nri-30-libs spec: /dev/nvidia0, 30 driver libraries bind-mounted into
/usr/lib/x86_64-linux-gnu, the six hooks `nvidia-ctk cdi generate` writes; the plugin's policy
answers a pod annotation, its adjustment applied as containerd applies it,
tests/nri/containerd_nri.py), on an overlay of the lab's library image (busybox + the ldcache
tests' ~900-entry tree, its own cache) with a fresh upper layer each run, as containerd mounts a
snapshot. Sides, interleaved in rotated order each round:

- no-hooks: the device without hooks (device-no-hooks);
- true-hook: no-hooks plus one createContainer hook, /bin/true: what runc pays to run a hook;
- links-hook: no-hooks plus `cdi-shim-nshook nri` with the spec's links only (no cache): the
  native hook's exec, its state and rootfs, its links;
- native: the plugin's adjustment as nri-native has it (links, the cache through the plugin's
  hook server, kept by the image's layers after the first; the profile mount);
- native-planned: the same with the hook server's answers not kept (every container planned).

Printed: each side's `runc create` median, its paired median over no-hooks, and the hook
server's own time per answer (its log: "N ms, planned" / "kept"), with the kept answers' parts
(timed around the server's functions: the connection's whole service, the answer, reading the
container's layers and mounts, the memo's comparison, writing the files). The hook server runs
in this process (a thread), with its memos on, as `cdi-shim nri` starts it.

    .venv/bin/python benchmarks/nri_hook_cost.py --rounds 40        # as root

Needs root, runc, unshare, gcc, ldconfig and the tests' library tree (tests/linker/libtree.py,
cached). Runs in a mount namespace of its own.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
for sub in ("tests/runtime", "tests/nri", ""):
    sys.path.insert(0, os.path.join(REPO, sub))

import runtime_helpers as rh  # noqa: E402
from containerd_nri import container_of, nri_apply  # noqa: E402

SIDES = ("no-hooks", "true-hook", "links-hook", "native", "native-planned")
FOLDER = "/usr/lib/x86_64-linux-gnu"


def build(work):
    """(lower layer, {"hooked": spec folder, "plain": spec folder}, libraries)."""
    from cdi_shim_lab.images import build_driver_libraries, library_layer, toolkit_hooks

    ldconfig = rh.need("ldconfig", "libc-bin")
    lower = os.path.join(work, "lower")
    rh.build_rootfs(lower, rh.static_busybox())
    with tarfile.open(fileobj=__import__("io").BytesIO(library_layer(work, ldconfig))) as tar:
        tar.extractall(lower, filter="tar")
    libraries = build_driver_libraries(os.path.join(work, "driver"), 30, rh.need("gcc", "gcc"))
    os.mknod(os.path.join(work, "nvidia0"), 0o666 | 0o020000, os.makedev(195, 0))
    hook = os.path.join(work, "bin", "nvidia-cdi-hook")
    os.makedirs(os.path.dirname(hook))
    shutil.copy("/bin/true", hook)
    mounts = "".join(f"    - hostPath: {path}\n      containerPath: {FOLDER}/{os.path.basename(path)}\n"
                     "      options: [ro, nosuid, nodev, bind]\n" for path in libraries)
    specs = {}
    for key, hooks in (("hooked", "  hooks:\n" + toolkit_hooks(hook)), ("plain", "")):
        specs[key] = os.path.join(work, f"specs-{key}")
        os.makedirs(specs[key])
        with open(os.path.join(specs[key], "gpu.yaml"), "w") as out:
            out.write('cdiVersion: "0.5.0"\nkind: nvidia.com/gpu\ndevices:\n  - name: "0"\n    containerEdits:\n'
                      f"      deviceNodes:\n        - path: /dev/nvidia0\n          hostPath: {work}/nvidia0\n"
                      "containerEdits:\n  mounts:\n" + mounts + hooks)
    return lower, specs, libraries


class Harness:
    def __init__(self, work, server_path):
        from shim.nri.hookserver import HookServer
        from shim.nri.nativehook import ToolkitFiles

        self.work = work
        self.runc = rh.need("runc", "runc")
        self.root = os.path.join(work, "runc-root")
        self.logged = []
        self.server = HookServer(server_path, lambda level, text: self.logged.append(text), remember=True).start()
        self.files = ToolkitFiles(os.path.join(work, "files"))
        self.nshook = os.path.join(rh.VENV_BIN, "cdi-shim-nshook")
        tmp = os.path.join(work, "template")
        os.makedirs(tmp)
        subprocess.run([self.runc, "spec", "--bundle", tmp], check=True)
        with open(os.path.join(tmp, "config.json")) as stream:
            self.template = json.load(stream)
        self.template["process"]["args"] = ["/bin/true"]
        self.template["process"]["terminal"] = False
        self.count = 0

    def config(self, spec_dir, rootfs):
        from shim.config import Config
        from shim.nri.messages import nri
        from shim.nri.policy import Policy

        config = json.loads(json.dumps(self.template))
        config["root"] = {"path": rootfs, "readonly": False}
        policy = Policy(Config(spec_dirs=(spec_dir,)), ("*",), self.nshook, lambda *a: None,
                        hook_options=("--socket", self.server.path), files=self.files)
        pod = nri.PodSandbox(id="p", name="bench", namespace="default",
                             annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=0"})
        return nri_apply(config, policy.create_container(pod, container_of(config)))

    def configs(self, specs):
        """{side: config.json without its root} for each side."""
        plain = self.config(specs["plain"], "ROOTFS")
        native = self.config(specs["hooked"], "ROOTFS")
        (ours,) = [hook for hook in native["hooks"]["createContainer"] if hook["path"] == self.nshook]
        links = [arg for i, arg in enumerate(ours["args"]) if i and ours["args"][i - 1] == "--link"]
        true_hook = {"path": "/bin/true", "args": ["true"]}
        links_hook = dict(ours, args=["cdi-shim-nshook", "nri", *[a for link in links for a in ("--link", link)]])
        sides = {"no-hooks": plain, "true-hook": dict(plain, hooks={"createContainer": [true_hook]}),
                 "links-hook": dict(plain, hooks={"createContainer": [links_hook]}), "native": native,
                 "native-planned": native}
        return sides

    def create(self, config, lower, side):
        """Seconds `runc create` took for CONFIG on a fresh overlay of LOWER (started, waited, deleted after)."""
        self.count += 1
        bundle = os.path.join(self.work, "bundles", f"b{self.count}")
        rootfs = os.path.join(bundle, "rootfs")
        for sub in ("rootfs", "upper", "work"):
            os.makedirs(os.path.join(bundle, sub))
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir={lower},upperdir={bundle}/upper,workdir={bundle}/work", rootfs], check=True)
        config = json.loads(json.dumps(config))
        config["root"]["path"] = rootfs
        with open(os.path.join(bundle, "config.json"), "w") as out:
            json.dump(config, out)
        name = f"nricost-{os.getpid()}-{self.count}"
        keep = self.server.answers
        if side == "native-planned":
            self.server.answers = None
        errors = os.path.join(bundle, "stderr")
        try:
            with open(errors, "w") as err:     # (a file, not a pipe: the container holds it until it ends)
                start = time.perf_counter()
                done = subprocess.run([self.runc, "--root", self.root, "create", "--bundle", bundle, name],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
                took = time.perf_counter() - start
        finally:
            self.server.answers = keep
        try:
            if done.returncode != 0:
                with open(errors) as stream:
                    raise RuntimeError(f"{side}: runc create failed: {stream.read().strip()}")
            subprocess.run([self.runc, "--root", self.root, "start", name], check=True, capture_output=True)
        finally:
            subprocess.run([self.runc, "--root", self.root, "delete", "--force", name], capture_output=True)
            subprocess.run(["umount", "-l", rootfs], capture_output=True)
            shutil.rmtree(bundle, ignore_errors=True)
        return took


PARTS = (("serve", "shim.nri.hookserver", "HookServer", "_serve"),
         ("answer", "shim.nri.hookserver", "HookServer", "answer"),
         ("layers", "shim.nri.layers", "Container", "__init__"),
         ("recall", "shim.nri.layers", "AnswerMemo", "recall"),
         ("write", "shim.nri.cache", None, "write"))


def timed_parts():
    """{part: [ms]}, filled as the hook server's functions (PARTS) run."""
    import functools
    import importlib

    times = {name: [] for name, *_ in PARTS}
    for name, module, owner, function in PARTS:
        where = importlib.import_module(module)
        where = getattr(where, owner) if owner else where
        original = getattr(where, function)

        def wrapper(*args, _original=original, _name=name, **kwargs):
            start = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                times[_name].append((time.perf_counter() - start) * 1000)
        setattr(where, function, functools.wraps(original)(wrapper))
    return times


def _median(values):
    return statistics.median(values) if values else float("nan")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", help="write the times to this file")
    args = parser.parse_args(argv)
    if os.environ.get("CDI_SHIM_COST_NAMESPACE") != str(os.getpid()):
        command = [sys.executable, os.path.abspath(__file__), *(sys.argv[1:] if argv is None else argv)]
        return subprocess.run([rh.need("unshare", "util-linux"), "-m", "--propagation", "private", "sh", "-c",
                               'CDI_SHIM_COST_NAMESPACE=$$ exec "$@"', "sh", *command]).returncode
    work = tempfile.mkdtemp(prefix="nricost.")
    try:
        os.environ["CDI_SHIM_CACHE_DIR"] = os.path.join(work, "registry-cache")
        os.environ["CDI_SHIM_NVIDIA_PARAMS"] = os.path.join(work, "no-params")
        lower, specs, _ = build(work)
        parts = timed_parts()
        harness = Harness(work, os.path.join(work, "hook", "h.sock"))
        sides = harness.configs(specs)
        times = {side: [] for side in SIDES}
        kept_parts = {name: [] for name in parts}
        load = [os.getloadavg()[0]]
        for round_ in range(args.warmup + args.rounds):
            order = SIDES[round_ % len(SIDES):] + SIDES[:round_ % len(SIDES)]
            for side in order:
                before = {name: len(values) for name, values in parts.items()}
                took = harness.create(sides[side], lower, side)
                if round_ >= args.warmup:
                    times[side].append(took * 1000)
                    if side == "native" and "the answer kept" in harness.logged[-1]:
                        for name, values in parts.items():
                            kept_parts[name] += values[before[name]:]
            load.append(os.getloadavg()[0])
        answers = {"kept": [], "planned": []}
        for line in harness.logged[args.warmup * 2:]:
            found = re.search(r"\(([0-9.]+) ms, (planned|the answer kept)", line)
            if found:
                answers["planned" if found.group(2) == "planned" else "kept"].append(float(found.group(1)))
        harness.server.close()
    finally:
        subprocess.run(["umount", "-R", "-l", work], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    base = times["no-hooks"]
    print(f"runc create, {args.rounds} rounds ({args.warmup} warm-up), load average {min(load):.1f}-{max(load):.1f}:")
    for side in SIDES:
        paired = [a - b for a, b in zip(times[side], base)]
        print(f"  {side:15s} median {_median(times[side]):6.2f} ms   over no-hooks, paired median "
              f"{_median(paired):+6.2f} ms")
    for kind, values in answers.items():
        if values:
            print(f"  the hook server's answer, {kind}: median {_median(values):.2f} ms ({len(values)} answers)")
    print("  a kept answer's parts, median ms: " + ", ".join(f"{name} {_median(values):.2f}"
                                                          for name, values in kept_parts.items()))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"times_ms": times, "answers_ms": answers, "kept_parts_ms": kept_parts, "load": load}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
