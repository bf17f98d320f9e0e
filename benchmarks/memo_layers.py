"""What each cache layer of the create step saves a create, with the other layers on.

The layers (docs/fast.md, "The caches, in one table"):
- replay: the C replay of a recipe (csrc/engine/replay.c: a step's; request.c: a request's
  injection), the one applier of a kept step; off: the recipes' directory opened to others, so
  the front end and the worker refuse them (and the worker writes none: there is no memo of steps
  in its memory any more);
- step: the worker's own C replay of a step's recipe, tried before it steps (shim/linker/
  stepmemo.py, StepMemo.replay); off: it never replays (recipes are still written);
- plan: the memo of whole ldconfig plans (shim/ldconfig/plan.py); off: it never gives a kept plan
  (the paths each plan looked at are still recorded, for the step memo);
- file: the engine's file memo (csrc/engine/filememo.c); off: remember_files(False);
- registry: the spec registry's cache file (cdi/registry.py); off: $CDI_SHIM_CACHE_DIR "".

Each side is one `create` (through real runc, or /bin/true: --bin-true), with its own resident process (one worker, so
that every create after the first finds the worker warm) started with its layers off, its own
bundle and a fresh overlay rootfs of the image each round; the sides go in a new random order
each round, 20 ms apart. Two paths, with the spec and image of benchmarks/run_with_libraries.py
(30 gcc-built driver libraries, the six hooks of a toolkit-generated spec, a ~540-library
image):
- pre: the config as containerd's own CDI leaves it (`cdi-shim cdi inject`: no request, the
  spec's mounts and hooks);
- ann: a config asking for the device by the annotation cdi.k8s.io/gpu.
Plus runc: `runc create` of the injected config without its hooks (the same edits, no step).

A layer's worth is the median over rounds of (create with it off) - (create with it on, every
other layer as in the first), with a bootstrap 95 % interval. Each worker's layer is measured where
the layers above it are on (the "others on" figure; with replay on, no create reaches the worker
after the first, so these are nothing by construction) and where they
are off, as for a create whose step is not kept (a step that warned, ran chmod, or whose plan
looked at more paths than a memo checks): the plan memo with the replay off, the file memo below
the plan memo.

    .venv/bin/python benchmarks/memo_layers.py [--runs 40] [--bin-true] [--dir /run] [--debug-log DIR]

(as root: runc, overlay mounts, a tmpfs for the bundles.) --bin-true: the runtime /bin/true
instead of runc, so each figure is the work before runc (runc create alone swings by several ms
on a shared machine: the layers' worth is below that). --debug-log DIR writes each side's
log (log-level debug: phases, "replayed") to DIR/SIDE.log, to check that each side does what it
says; the debug log costs time, so figures come from runs without it.
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

import run_with_libraries as bench

from shim.config import default_config_text

# side: (path, layers off)
SIDES = {
    "pre all": ("pre", ()),
    "pre -step": ("pre", ("step",)),
    "pre -plan": ("pre", ("plan",)),
    "pre -file": ("pre", ("file",)),
    "pre -replay": ("pre", ("replay",)),
    "pre -replay -plan": ("pre", ("replay", "plan")),
    "pre -replay -file": ("pre", ("replay", "file")),
    "pre -replay -plan -file": ("pre", ("replay", "plan", "file")),
    "ann all": ("ann", ()),
    "ann -step": ("ann", ("step",)),
    "ann -replay": ("ann", ("replay",)),
    "ann -replay -registry": ("ann", ("replay", "registry")),
    "ann -replay -plan": ("ann", ("replay", "plan")),
    "ann -replay -file": ("ann", ("replay", "file")),
    "ann -replay -plan -file": ("ann", ("replay", "plan", "file")),
    "runc": ("runc", ()),
}

# layer: (side with it off, reference side with it on)
WORTH = {
    "pre": [("replay", "pre -replay", "pre all"),
            ("step, replay on", "pre -step", "pre all"),
            ("plan, replay on", "pre -plan", "pre all"),
            ("file, replay on", "pre -file", "pre all"),
            ("plan, replay off", "pre -replay -plan", "pre -replay"),
            ("file, replay off", "pre -replay -file", "pre -replay"),
            ("file, replay and plan off", "pre -replay -plan -file", "pre -replay -plan")],
    "ann": [("replay", "ann -replay", "ann all"),
            ("step, replay on", "ann -step", "ann all"),
            ("registry, replay off", "ann -replay -registry", "ann -replay"),
            ("plan, replay off", "ann -replay -plan", "ann -replay"),
            ("file, replay off", "ann -replay -file", "ann -replay"),
            ("file, replay and plan off", "ann -replay -plan -file", "ann -replay -plan")],
}

WARM_ROUNDS = 2     # not counted: the first create keeps the step, the recipe, the plan


def serve(socket_path, off):
    """The resident process (shim.runtime.resident.serve) with the layers OFF turned off in its
    workers, after its own warm-up and each worker's memos (resident._Worker) turned every layer on."""
    from shim.runtime import resident

    warm_up = resident.warm_up

    def warm_up_with_layers_off():
        warm_up()
        if "file" in off:
            from shim.ldconfig import ldcache

            worker_init = resident._Worker.__init__

            def worker_without_file_memo(self, declined):
                worker_init(self, declined)
                ldcache.remember_files(False)       # (its Memos turned the file memo on)
            resident._Worker.__init__ = worker_without_file_memo
        if "plan" in off:
            from shim.ldconfig import plan

            plan.PlanMemo.recall = lambda self, tree, arguments, mounts: None
        if "step" in off:
            from shim.linker import stepmemo

            stepmemo.StepMemo.replay = lambda self, raw, bundle, mode: False
    resident.warm_up = warm_up_with_layers_off
    resident.serve(socket_path, workers=1)


def start_server(socket_path, off, env):
    argv = [sys.executable, os.path.abspath(__file__), "--serve", socket_path, "--off", ",".join(off)]
    server = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not os.path.exists(socket_path):
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise RuntimeError(f"the resident process for {socket_path} did not start")
        time.sleep(0.01)
    return server


_QUIET = [(os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0)]


def timed_ms(argv, env):
    """Wall time of one process, in ms (its stdout discarded; a failure raises)."""
    start = time.perf_counter()
    pid = os.posix_spawn(argv[0], argv, env, file_actions=_QUIET)
    _, status = os.waitpid(pid, 0)
    took = (time.perf_counter() - start) * 1000
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({os.waitstatus_to_exitcode(status)})")
    return took


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--dir", default="/run", help="where the image and the rootfs overlays live")
    parser.add_argument("--debug-log", metavar="DIR", help="each side's debug log in DIR/SIDE.log")
    parser.add_argument("--bin-true", action="store_true",
                        help="the runtime /bin/true instead of runc (cdi-shim's config key `runtime`)")
    parser.add_argument("--serve", metavar="SOCKET", help=argparse.SUPPRESS)
    parser.add_argument("--off", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, set(filter(None, args.off.split(","))))
        return
    root = tempfile.mkdtemp(prefix="cdi-shim-memo-layers.", dir=args.dir)
    servers = []
    try:
        rootfs, spec_dir = bench.toolkit_world(root)
        bundles = bench.bundle_dir(root)
        state = os.path.join(root, "state")
        base_env = dict(os.environ, CDI_SHIM_CACHE_DIR=os.path.join(root, "cache"))
        probe = bench.bundle(bundles, "probe", rootfs)
        injected = json.loads(subprocess.run(
            [os.path.join(bench.BIN, "cdi-shim"), "cdi", "inject", "--spec-dir", spec_dir, "--device",
             "nvidia.com/gpu=0", os.path.join(probe, "config.json")],
            env=base_env, check=True, capture_output=True).stdout)
        assert len(injected["hooks"]["createContainer"]) == 6
        shim = os.path.join(bench.BIN, "cdi-shim-runtime")
        runtime = "/bin/true" if args.bin_true else shutil.which("runc")
        sides = {}
        for number, (side, (kind, off)) in enumerate(SIDES.items()):
            rootfs_copy = os.path.join(root, f"rootfs-{number}")
            if kind == "ann":
                where = bench.bundle(bundles, f"b{number}", rootfs_copy, {"cdi.k8s.io/gpu": "nvidia.com/gpu=0"})
                with open(os.path.join(where, "config.json"), "rb") as f:
                    pristine = f.read()
            else:
                where = os.path.join(bundles, f"b{number}")
                os.makedirs(where)
                config = dict(injected, root={"path": rootfs_copy, "readonly": True})
                if kind == "runc":
                    config.pop("hooks")
                pristine = json.dumps(config).encode()
            env = dict(base_env)
            if kind != "runc":
                run = os.path.join(root, f"run-{number}")
                os.makedirs(os.path.join(run, "steps"), mode=0o700)
                if "replay" in off:     # (the front end refuses a recipe others may write)
                    os.chmod(os.path.join(run, "steps"), 0o777)
                settings = os.path.join(root, f"config-{number}.toml")
                values = {"spec-dirs": (spec_dir,), "resident-socket": f"{run}/runtime.sock"}
                if args.bin_true:
                    values["runtime"] = "/bin/true"
                if args.debug_log:
                    values["log-level"] = "debug"
                    values["log-file"] = os.path.join(os.path.abspath(args.debug_log), side.replace(" ", "_") + ".log")
                with open(settings, "w") as out:    # (as `install --node` writes it: every key)
                    out.write(default_config_text(values))
                env["CDI_SHIM_CONFIG"] = settings
                if "registry" in off:
                    env["CDI_SHIM_CACHE_DIR"] = ""
                servers.append(start_server(f"{run}/runtime.sock", off, env))
            argv = ([runtime] if kind == "runc" else [shim]) + ["--root", state, "create", "--bundle", where]
            sides[side] = {"argv": argv, "env": env, "bundle": where, "rootfs": rootfs_copy, "pristine": pristine,
                           "times": []}
        if args.debug_log:
            os.makedirs(args.debug_log, exist_ok=True)
        time.sleep(2.1)     # every file made above older than the settle windows (1 s and 2 s)
        for index in range(args.runs + WARM_ROUNDS):
            order = list(sides)
            random.shuffle(order)
            for name in order:
                side = sides[name]
                bench.fresh_rootfs(rootfs, side["rootfs"])
                with open(os.path.join(side["bundle"], "config.json"), "wb") as out:
                    out.write(side["pristine"])
                time.sleep(0.02)
                cid = f"m{list(sides).index(name)}-{index}"
                took = timed_ms(side["argv"] + [cid], side["env"])
                if not args.bin_true:
                    subprocess.run([runtime, "--root", state, "delete", "--force", cid], check=True)
                if index >= WARM_ROUNDS:
                    side["times"].append(took)
            if index == 0:
                time.sleep(1.1)     # what the first creates wrote (recipes) older than the settle window
        for side in sides.values():
            with open(os.path.join(side["bundle"], "config.json"), "rb") as f:
                assert b"nvidia-cdi-hook" not in f.read()
        result = report(sides, args)
        print("{\n" + ",\n".join(f"{json.dumps(key)}: {json.dumps(value)}" for key, value in result.items()) + "\n}")
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            server.wait()
        for number in range(len(SIDES)):
            subprocess.run(["umount", os.path.join(root, f"rootfs-{number}")], stderr=subprocess.DEVNULL)
        bench.cleanup(root)


def report(sides, args):
    med = statistics.median
    times = {name: side["times"] for name, side in sides.items()}
    result = {"runs": args.runs, "dir": args.dir, "runtime": "/bin/true" if args.bin_true else "runc",
              "debug_log": bool(args.debug_log),
              "median_create_ms": {name: round(med(values), 2) for name, values in times.items()},
              "over_runc_ms": {name: round(med(v - r for v, r in zip(values, times["runc"])), 2)
                               for name, values in times.items() if name != "runc"}}
    for kind, rows in WORTH.items():
        result[f"worth_{kind}_ms"] = {
            layer: {"saves": round(med(o - r for o, r in zip(times[off], times[ref])), 2),
                    "95pct": bench.interval([o - r for o, r in zip(times[off], times[ref])])}
            for layer, off, ref in rows}
    return result


if __name__ == "__main__":
    main()
