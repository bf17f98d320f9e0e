"""Pod start-up through a real containerd: the cdi-shim handler against plain runc (`cdi-shim bench pods`).

Each pod is RunPodSandbox -> CreateContainer -> StartContainer -> (container `/bin/true` exits) ->
StopPodSandbox -> RemovePodSandbox through a private containerd (cdi_shim_lab/lab.py), a host-network
pod with one container. "start-up" is RunPodSandbox's call until StartContainer returns (the
container runs); "lifecycle" is the whole sequence. Pairs alternate the handlers, and which of the
two goes first, so drift on these shared machines hits both alike; ratios are reported per pair
(median of A_i/B_i) and as the ratio of medians.

Scenarios (A = the cdi-shim runtime's handler, B = the runc handler):

* no-device: the same pod on both handlers (the runtime's native front end passes every call
  straight to runc: its cost is one extra exec per runtime call);
* one-device: A's container carries ``cdi.k8s.io/gpu: nvidia.com/gpu=0`` (a fake GPU node, an env
  var, one bind mount), B runs the pod without it;
* device-30-libs: A asks for a device whose spec also bind-mounts 30 gcc-built driver libraries
  into the image's library directory; the runtime computes the container's ld.so.cache for them
  and bind-mounts it (no hook, no ldconfig);
* device-30-libs-vs-cri: the same A against a runc pod given the same node, env and 30 bind mounts
  through CRI fields: what runc itself costs for the device is then on both sides, and the ratio
  is cdi-shim's own cost.

On containerd 2.1 (enable_cdi on), native-cdi-30-libs (``--native-cdi``) asks for the device through the CRI
``CDIDevices`` field, so containerd injects its spec before any runtime runs: /dev/nvidia0, 30 gcc-built
driver libraries (versioned file names, SONAME .so.1) and the six createContainer hooks of a spec
written by ``nvidia-ctk cdi generate``. Every round runs five pods, in an order rotated round by
round, on an image of busybox plus the ldcache tests' library tree (545 cache entries, its own
ld.so.cache): no device on runc; no device on the cdi-shim handler; the device without its hooks on
runc (what the node and the mounts cost runc and containerd); (a) on runc, the hooks' program
a lab-private script (``lab-cdi-hook``, a name cdi-shim does not know) doing the toolkit's work, run
by runc as six processes (update-ldcache: a conf.d drop-in and the host's ``ldconfig -r`` on the
rootfs; create-symlinks; the application profile); (b) the same spec with the program installed as
``nvidia-cdi-hook``, on the cdi-shim handler, which does the hooks' work natively and drops them.
The hook program logs a line per process: a pod of (a) that shows other than 6, or of (b) other
than 0, fails the run; one more pod of each device side then checks from inside that the work is
there (30 driver libraries in its ld.so.cache, the link, the profile). Reported: medians per side,
(b) / no device (target <= 1.05x) and (a) / (b), paired per round.

containerd's state directory (each container's bundle: config.json, runc's log, the files the
runtime writes there) and runc's root are tmpfs mounts of their own, as /run/containerd is on a
node; ``--state-on-disk`` leaves them on the work directory's filesystem (before 12-03, session 6,
every figure was taken that way). The image snapshots stay on disk, as /var/lib/containerd is.

With ``time_runc`` (``--time-runc``) runc runs behind a small timer on every side (cdi_shim_lab/lab.py,
RUNC_TIMER_C) and each pod's StartContainer splits into runc create, runc start and the rest
(containerd, its shim, the runtime in front of runc); each ratio then says where the extra
milliseconds went, paired per round.

The runtime's own per-phase times come from its debug log (``log-level = "debug"``,
``phase=<name> took=<ms>ms`` lines). By default the lab runs the runtime's resident process
(`cdi-shim runtime serve`), as a node would; ``resident=False`` measures the path that starts
an interpreter per create instead.

``containerd`` picks the lab's containerd: "1.6" (the system's), "1.7" or "2.1" (real releases
from Debian trixie / forky, fetched once into a cache: cdi_shim_lab/releases.py), each with its own
default for enable_cdi (1.7 off, 2.1 on, with cdi_spec_dirs = the lab's spec dir): on 2.1,
containerd itself injects the annotated device before the runtime runs.
"""
import contextlib
import importlib.util
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from .images import DRIVER_FOLDER
from .lab import LIB_IMAGE, Lab, LabError

COMMAND = ["/bin/true"]
SCENARIOS = {
    "no-device": ("pod without a device: cdi-shim handler vs runc handler", None, 1.03),
    "one-device": ("one CDI device (node + env + 1 bind mount) vs a runc pod without it",
                   {"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}, 1.15),
    "device-30-libs": ("one CDI device + 30 driver libraries as bind mounts vs a runc pod without it "
                       "(cdi-shim computes the linker cache for them)",
                       {"cdi.k8s.io/gpu": "bench.cdi-shim.dev/gpu=0"}, 1.15),
    "device-30-libs-vs-cri": ("the same device + 30 libraries vs a runc pod given the same node, env and "
                              "mounts through CRI fields (cdi-shim's own cost)",
                              {"cdi.k8s.io/gpu": "bench.cdi-shim.dev/gpu=0"}, None),
}
DEFAULT_SCENARIOS = tuple(SCENARIOS)
# Native CDI (containerd 2.1, enable_cdi on): the device comes through the CRI CDIDevices field and
# containerd injects its spec, hooks included, before any runtime runs. Every pod of a round runs
# on LIB_IMAGE; the sides rotate their order round by round. side: (label, handler (None: ours),
# device key of Lab.write_native_cdi_specs or None, hook processes each pod must show).
NATIVE_SCENARIOS = {
    "native-cdi-30-libs": (
        "containerd 2.1's own CDI: one device + 30 driver libraries + the toolkit's six hooks through CDIDevices",
        {"no-device-runc": ("no device, runc handler", "runc", None, 0),
         "no-device-shim": ("no device, cdi-shim handler", None, None, 0),
         "device-no-hooks-runc": ("the same device without its hooks, runc handler (what the node and the 30 "
                                  "mounts cost runc and containerd)", "runc", "mounts", 0),
         "hooks-runc": ("(a) the hooks run by runc (hook program lab-cdi-hook: ldconfig -r on the rootfs)",
                        "runc", "hooked", 6),
         "native-shim": ("(b) hook program named nvidia-cdi-hook, cdi-shim handler (resident): the hooks' work "
                         "done natively, the hooks dropped", None, "toolkit", 0)},
        # (numerator, denominator, target of the paired start-up ratio)
        (("native-shim", "no-device-runc", 1.05), ("native-shim", "no-device-shim", None),
         ("native-shim", "device-no-hooks-runc", None), ("device-no-hooks-runc", "no-device-runc", None),
         ("hooks-runc", "native-shim", None), ("hooks-runc", "no-device-runc", None))),
}
# The one-mount layout (docs/one-mount.md), on any containerd: Lab.write_one_mount_spec's device,
# every pod on LIB_IMAGE, the sides rotated round by round. side: (label, handler (None: ours),
# what the pod is given: None, "cri" (the spec's edits as CRI fields) or "request" (the device)).
ONE_MOUNT_SCENARIOS = {
    "one-mount": (
        "the one-mount layout (cdi generate --layout one-mount, the tests' fake driver, GPU 0): two folder "
        "binds, the device nodes, the files that keep their own binds, an update-ldcache hook",
        {"no-device-runc": ("no device, runc handler", "runc", None),
         "edits-runc": ("the spec's device nodes, mounts and env as CRI fields, no hook, runc handler (what runc "
                        "and containerd pay for the edits)", "runc", "cri"),
         "one-mount-shim": ("the device, cdi-shim handler (resident): the update-ldcache hook done natively",
                            None, "request")},
        (("one-mount-shim", "no-device-runc", 1.03), ("edits-runc", "no-device-runc", None),
         ("one-mount-shim", "edits-runc", None))),
}
ALL_SCENARIOS = DEFAULT_SCENARIOS + tuple(NATIVE_SCENARIOS) + tuple(ONE_MOUNT_SCENARIOS)
STEPS = ("runp", "create", "start", "wait", "stop", "remove")
RUNC_TIMES = ("runc_create", "runc_start", "start_less_runc")   # with time_runc (NATIVE_SCENARIOS)
PHASES = ("config", "requests", "resolve", "apply", "linker", "write", "recipe", "total", "replay", "links")
_PHASE = re.compile(r"phase=(\w+) took=([0-9.]+)ms")


class BenchError(Exception):
    pass


def _phases_since(path, offset):
    """Runtime phase times (ms) logged after byte `offset` of the runtime log; returns (phases, new offset).
    phases["resident"] counts the creates a resident process prepared; phases["replay"] is the time
    of those the front end replayed (a step the resident process kept: csrc/frontend/replay.c)."""
    if not path or not os.path.exists(path):
        return {}, offset
    with open(path, "rb") as stream:
        stream.seek(offset)
        data = stream.read()
    phases = {}
    for line in data.decode("utf-8", "replace").splitlines():
        match = _PHASE.search(line)
        if match:
            phases[match.group(1)] = phases.get(match.group(1), 0.0) + float(match.group(2))
            if match.group(1) == "total" and " in resident process " in line:
                phases["resident"] = phases.get("resident", 0) + 1
    return phases, offset + len(data)


def _tool_version(argv):
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        return out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return ""


def new_lab(make, base, **options):
    """MAKE(base, **OPTIONS) (Lab or NRILab), with the lab's options of every pod benchmark; a
    LabError is a BenchError, BASE removed."""
    try:
        return make(base, runtime_log=True, log_level="debug", **options)
    except LabError as err:
        shutil.rmtree(base, ignore_errors=True)
        raise BenchError(str(err)) from None


def run_meta(lab, pairs, warmup, resident, time_runc, state_on_disk):
    """The result's "meta" of a run on LAB."""
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "pairs": pairs, "warmup": warmup,
            "containerd": _tool_version([lab.containerd, "--version"]),
            "runc": _tool_version([lab.runc, "--version"]), "kernel": platform.release(),
            "cpus": os.cpu_count(), "command": COMMAND, "resident": resident, "time_runc": time_runc,
            "state": "disk" if state_on_disk else "tmpfs"}


@contextlib.contextmanager
def lab_run(lab, base, result):
    """The body of a run on LAB: a LabError is a BenchError; the load after it noted in RESULT's
    meta; the lab stopped and BASE removed however it ends."""
    try:
        yield
        result["meta"]["load_after"] = os.getloadavg()
    except LabError as err:
        raise BenchError(str(err)) from None
    finally:
        lab.stop()
        shutil.rmtree(base, ignore_errors=True)


def run(pairs=20, warmup=2, scenarios=None, workdir=None, log=print, resident=True, containerd=None,
        time_runc=False, state_on_disk=False, toolkit_hook=None):
    """Run the benchmark; returns a JSON-able dict of every measurement. The NATIVE_SCENARIOS need
    containerd 2.1 (the lab then sets enable_cdi on); `pairs` is then the number of measured rounds.
    `time_runc`: runc runs behind a timer (Lab's RUNC_TIMER_C) on every side, and each pod of the
    NATIVE_SCENARIOS also gets runc's create and start times: StartContainer less them is what
    containerd, its shim and the runtime in front of runc took. containerd's state (the bundles)
    and runc's root are on tmpfs mounts, as /run/containerd is on a node, unless `state_on_disk`.
    `toolkit_hook`: the path of a real nvidia-cdi-hook, run by runc on side (a) instead of the
    lab's stand-in script (its hook processes are then not counted; the check pod shows their work)."""
    scenarios = list(scenarios or DEFAULT_SCENARIOS)
    unknown = [name for name in scenarios if name not in ALL_SCENARIOS]
    if unknown:
        raise BenchError(f"unknown scenario {', '.join(unknown)}: the benchmark has {', '.join(ALL_SCENARIOS)}")
    native = [name for name in scenarios if name in NATIVE_SCENARIOS]
    one_mount = [name for name in scenarios if name in ONE_MOUNT_SCENARIOS]
    if time_runc and not (native or one_mount):
        raise BenchError("runc's own times (time_runc) are taken in the native-CDI and one-mount scenarios only")
    if toolkit_hook and not native:
        raise BenchError("a real hook program (toolkit_hook) is run in the native-CDI scenario only (--native-cdi)")
    if native and containerd != "2.1":
        raise BenchError(f"{', '.join(native)}: containerd's own CDI with the CDIDevices field needs --containerd 2.1")
    missing = [name for name in ("grpc", "google.protobuf") if importlib.util.find_spec(name) is None]
    if missing:
        raise BenchError(f"{', '.join(missing)} not installed: the CRI client needs grpcio "
                         "(pip install 'cdi-shim[bench]')")
    base = tempfile.mkdtemp(prefix="cdi-shim-podbench-", dir=workdir)
    lab = new_lab(Lab, base, resident=resident, containerd=containerd, native_cdi=True if native else None,
                  time_runc=time_runc, state_on_tmpfs=not state_on_disk)
    result = {"meta": run_meta(lab, pairs, warmup, resident, time_runc, state_on_disk), "scenarios": {}}
    with lab_run(lab, base, result):
        lab.setup(library_image=bool(native or one_mount))
        libraries = lab.write_libraries_spec(30) if any(n.startswith("device-30-libs") for n in scenarios) else []
        native_devices = lab.write_native_cdi_specs(30, hook_program=toolkit_hook) if native else None
        if native:
            result["meta"]["native_cdi"] = {"image": LIB_IMAGE, "driver_libraries": len(native_devices["libraries"]),
                                            "devices": {k: native_devices[k] for k in ("hooked", "toolkit", "mounts")},
                                            "hooked_program": toolkit_hook or "the lab's stand-in script",
                                            "hooked_program_version": _tool_version([toolkit_hook, "--version"])
                                            if toolkit_hook else None}
        result["meta"]["python_path_ms"] = python_path_cost()
        result["meta"]["passthrough_ms"] = passthrough_cost(lab)
        result["meta"]["load_before"] = os.getloadavg()
        offset = 0
        for name in scenarios:
            if name in NATIVE_SCENARIOS:
                offset = _run_sides(lab, name, native_devices, pairs, warmup, result, offset, log)
                continue
            if name in ONE_MOUNT_SCENARIOS:
                offset = _run_one_mount(lab, name, pairs, warmup, result, offset, log)
                continue
            title, annotations, target = SCENARIOS[name]
            log(f"{name}: {warmup} warm-up + {pairs} measured pairs ({title})")
            samples = {"A": [], "B": []}
            for index in range(warmup + pairs):
                extra_b = {}
                if name == "device-30-libs-vs-cri":
                    mounts, devices, envs = lab.cri_equivalent_of_libraries_spec(libraries)
                    extra_b = {"mounts": mounts, "devices": devices, "envs": envs}
                order = [("A", lab.runtime_name, annotations, {}), ("B", "runc", None, extra_b)]
                if index % 2:
                    order.reverse()
                for side, handler, pod_annotations, extra in order:
                    _, offset = _phases_since(lab.runtime_log, offset)
                    pod = lab.run_pod(handler, COMMAND, annotations=pod_annotations, name=f"bench-{side.lower()}",
                                      **extra)
                    if pod.status.exit_code != 0:
                        raise BenchError(f"{name}: the container exited {pod.status.exit_code}: {pod.output}")
                    phases, offset = _phases_since(lab.runtime_log, offset)
                    if index >= warmup:
                        sample = {k: v * 1000 for k, v in pod.times.items()}
                        sample["phases"] = phases
                        samples[side].append(sample)
            result["scenarios"][name] = {"title": title, "target": target, "A": samples["A"], "B": samples["B"],
                                         "A_handler": lab.runtime_name, "B_handler": "runc"}
    return result


def _hook_lines(path):
    with open(path, "rb") as stream:
        return stream.read().count(b"\n")


def _rotate(lab, name, plan, hook_log, rounds, warmup, offset):
    """Rounds of one pod a side, the order rotated round by round. plan: {key: (handler, run_pod
    arguments, hook processes each pod must show, or None: not counted)}. A pod whose hook log
    lines differ from its count fails the run (no figure from pods that did not do the work).
    Returns ({key: samples}, offset)."""
    keys = list(plan)
    samples = {key: [] for key in keys}
    for index in range(warmup + rounds):
        shift = index % len(keys)
        for key in keys[shift:] + keys[:shift]:
            handler, pod_args, expected_hooks = plan[key]
            _, offset = _phases_since(lab.runtime_log, offset)
            hooks_before = _hook_lines(hook_log)
            pod = lab.run_pod(handler, COMMAND, name=f"bench-{key}", **pod_args)
            if pod.status.exit_code != 0:
                raise BenchError(f"{name} {key}: the container exited {pod.status.exit_code}: {pod.output}")
            hook_processes = None if expected_hooks is None else _hook_lines(hook_log) - hooks_before
            if hook_processes != expected_hooks:
                raise BenchError(f"{name} {key}: {hook_processes} hook processes ran, not {expected_hooks}")
            phases, offset = _phases_since(lab.runtime_log, offset)
            if index >= warmup:
                sample = {k: v * 1000 for k, v in pod.times.items()}
                sample["phases"] = phases
                sample["hook_processes"] = hook_processes
                if lab.runc_times_log:
                    runc = lab.runc_times(pod.container_id)
                    sample["runc_create"], sample["runc_start"] = runc["create"], runc["start"]
                    sample["start_less_runc"] = sample["start"] - runc["create"] - runc["start"]
                samples[key].append(sample)
    return samples, offset


def _run_sides(lab, name, devices, rounds, warmup, result, offset, log):
    """One of NATIVE_SCENARIOS: each round runs a pod of every side (_rotate); a real hook
    program writes no log, so its side's processes are not counted and the check pod shows its work."""
    title, sides, ratios = NATIVE_SCENARIOS[name]
    log(f"{name}: {warmup} warm-up + {rounds} measured rounds of {len(sides)} pods ({title})")
    plan = {key: (handler or lab.runtime_name,
                  dict(cdi_devices=[devices[device]] if device else (), image=LIB_IMAGE),
                  None if device == "hooked" and not devices["hook_log_counts_hooked"] else expected_hooks)
            for key, (_, handler, device, expected_hooks) in sides.items()}
    samples, offset = _rotate(lab, name, plan, devices["hook_log"], rounds, warmup, offset)
    check = {key: _check_side(lab, name, key, devices, sides[key]) for key in sides
             if sides[key][2] in ("hooked", "toolkit")}
    result["scenarios"][name] = {
        "title": title, "kind": "sides", "rounds": rounds, "check": check,
        "sides": {key: {"label": label if device != "hooked" or devices["hook_log_counts_hooked"] else
                        "(a) the hooks run by runc (hook program: the real nvidia-cdi-hook, copied in as lab-cdi-hook)",
                        "handler": handler or lab.runtime_name, "device": devices[device] if device else None,
                        "image": LIB_IMAGE} for key, (label, handler, device, _) in sides.items()},
        "samples": samples, "ratios": [list(r) for r in ratios]}
    return offset


def _run_one_mount(lab, name, rounds, warmup, result, offset, log):
    """ONE_MOUNT_SCENARIOS: the fake driver's GPU 0 in the one-mount layout (Lab.write_one_mount_spec),
    requested through CDIDevices where containerd's own CDI is on (2.1: containerd injects, the
    runtime does the update-ldcache hook natively) and by annotation elsewhere (1.6: cdi-shim
    injects). The spec's hook program logs each run: every side must show none."""
    title, sides, ratios = ONE_MOUNT_SCENARIOS[name]
    spec = lab.write_one_mount_spec()
    mounts, devices, envs = lab.cri_equivalent_of_spec(spec["spec"])
    native = lab.native_cdi if lab.native_cdi is not None else lab.containerd_version == "2.1"
    request = (dict(cdi_devices=[spec["device"]]) if native else
               dict(annotations={"cdi.k8s.io/gpu": spec["device"]}))
    pod_args = {None: {}, "cri": dict(mounts=mounts, devices=devices, envs=envs), "request": request}
    shown = {None: None, "cri": f"{len(devices)} devices, {len(mounts)} mounts and {len(envs)} env vars as CRI fields",
             "request": (f"CDIDevices {spec['device']}" if native else f"annotation cdi.k8s.io/gpu={spec['device']}")}
    log(f"{name}: {warmup} warm-up + {rounds} measured rounds of {len(sides)} pods ({title}; "
        f"request: {shown['request']})")
    plan = {key: (handler or lab.runtime_name, dict(pod_args[kind], image=LIB_IMAGE), 0)
            for key, (_, handler, kind) in sides.items()}
    samples, offset = _rotate(lab, name, plan, spec["hook_log"], rounds, warmup, offset)
    check = {key: _check_one_mount(lab, name, key, plan[key], spec) for key, (_, _, kind) in sides.items()
             if kind == "request"}
    result["scenarios"][name] = {
        "title": title, "kind": "sides", "rounds": rounds, "check": check, "native_cdi": native,
        "sides": {key: {"label": label, "handler": handler or lab.runtime_name,
                        "device": spec["device"] if kind else None, "request": shown[kind], "image": LIB_IMAGE}
                  for key, (label, handler, kind) in sides.items()},
        "samples": samples, "ratios": [list(r) for r in ratios]}
    return offset


# What a device side's container sees, from inside (busybox): the driver SONAMEs its ld.so.cache lists,
# the create-symlinks link, the application profile.
PROBE = ("echo cache=$(tr '\\000' '\\n' < /etc/ld.so.cache "
         "| grep -o 'libnvidia-bench[0-9]*[.]so[.]1$' | sort -u | wc -l); "
         f"echo link=$(readlink {DRIVER_FOLDER}/libnvidia-bench0.so); "
         "echo profile=$(cat /etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf 2>/dev/null | wc -c)")


def _check_side(lab, name, key, devices, side):
    """One more pod of a device side (label, handler, device key, hook processes), asked for
    through the CRI CDIDevices field: check_device_pod."""
    _, handler, device, expected_hooks = side
    return check_device_pod(lab, name, key, devices, (handler, device, expected_hooks),
                            dict(cdi_devices=[devices[device]]))


def check_device_pod(lab, name, key, devices, side, request):
    """One more pod of a device side, not measured, running PROBE: the work of the hooks must be
    there (every driver library in the cache, the link, the profile), whoever did it. SIDE:
    (handler, device key of Lab.write_native_cdi_specs, hook processes the pod must show);
    REQUEST: run_pod's arguments asking for the device (CDIDevices, or the NRI plugin's pod
    annotation: cdi_shim_lab/nripods.py)."""
    handler, device, expected_hooks = side
    hooks_before = _hook_lines(devices["hook_log"])
    pod = lab.run_pod(handler or lab.runtime_name, ["sh", "-c", PROBE], name=f"check-{key}", image=LIB_IMAGE,
                      **request)
    seen = dict(line.split("=", 1) for line in pod.output if "=" in line)
    found = {"cache_driver_libraries": int(seen.get("cache") or 0), "link": seen.get("link", ""),
             "profile_bytes": int(seen.get("profile") or 0),
             "hook_processes": _hook_lines(devices["hook_log"]) - hooks_before}
    wanted = {"cache_driver_libraries": len(devices["libraries"]), "link": "libnvidia-bench0.so.1",
              "hook_processes": expected_hooks}
    if device == "hooked" and not devices["hook_log_counts_hooked"]:
        found["hook_processes"] = None   # only the stand-in writes the log
        del wanted["hook_processes"]
    wrong = {k: found[k] for k, v in wanted.items() if found[k] != v}
    if pod.status.exit_code != 0 or wrong or not found["profile_bytes"]:
        raise BenchError(f"{name} {key}: the device's work is not all there (exit {pod.status.exit_code}, "
                         f"found {found}, wanted {wanted} and a profile): {pod.output}")
    return found


# What the one-mount device's container sees, from inside (busybox): the ld.so.cache entries in
# the folder, libcuda's among them, the folder's libcuda, the tool, the GPU node, the spec's env.
ONE_MOUNT_FOLDER = "/usr/local/nvidia/lib64"
ONE_MOUNT_PROBE = (f"entries=$(tr '\\000' '\\n' < /etc/ld.so.cache | grep '^{ONE_MOUNT_FOLDER}/'); "
                   "echo cache=$(echo \"$entries\" | grep -c .); "
                   f"echo libcuda=$(echo \"$entries\" | grep -c '^{ONE_MOUNT_FOLDER}/libcuda[.]so[.]1$'); "
                   f"echo file=$(ls {ONE_MOUNT_FOLDER}/libcuda.so.1); "
                   "echo smi=$(ls /usr/local/nvidia/bin/nvidia-smi); "
                   "echo node=$(ls /dev/nvidia0); echo libdir=$NVIDIA_CTK_LIBCUDA_DIR")


def _check_one_mount(lab, name, key, plan_entry, spec):
    """One more pod of the device side, not measured, running ONE_MOUNT_PROBE: the folder's
    libraries in the container's ld.so.cache (the hook's work), the folder, the tool and the node
    there, and no hook process."""
    handler, pod_args, _ = plan_entry
    hooks_before = _hook_lines(spec["hook_log"])
    pod = lab.run_pod(handler, ["sh", "-c", ONE_MOUNT_PROBE], name=f"check-{key}", **pod_args)
    seen = dict(line.split("=", 1) for line in pod.output if "=" in line)
    sonames = {entry for entry in os.listdir(os.path.join(spec["host_dir"], "lib64")) if ".so." in entry}
    found = {"folder_cache_entries": int(seen.get("cache") or 0), "libcuda": int(seen.get("libcuda") or 0),
             "files": [seen.get(k, "") for k in ("file", "smi", "node")], "libdir": seen.get("libdir", ""),
             "hook_processes": _hook_lines(spec["hook_log"]) - hooks_before}
    wanted = {"libcuda": 1, "files": [f"{ONE_MOUNT_FOLDER}/libcuda.so.1", "/usr/local/nvidia/bin/nvidia-smi",
                                      "/dev/nvidia0"], "libdir": ONE_MOUNT_FOLDER, "hook_processes": 0}
    wrong = {k: found[k] for k, v in wanted.items() if found[k] != v}
    if pod.status.exit_code != 0 or wrong or found["folder_cache_entries"] < len(sonames) // 2:
        raise BenchError(f"{name} {key}: the device is not all there (exit {pod.status.exit_code}, found {found}, "
                         f"wanted {wanted} and at least {len(sonames) // 2} cache entries in the folder): {pod.output}")
    return found


def python_path_cost(runs=15):
    """Median ms of what the runtime's Python create path costs outside its logged phases:
    interpreter start (`python -I -S`, as the native front end execs it) and the imports."""
    import shim

    package_root = os.path.dirname(os.path.dirname(os.path.abspath(shim.__file__)))   # the runtime's own
    boot = f"import sys; sys.path[:0] = [{package_root!r}]; import shim.runtime.main, cdi.registry, cdi.container_edits"

    def timed(argv):
        samples = []
        for _ in range(runs):
            start = time.perf_counter()
            subprocess.run(argv, check=True)
            samples.append((time.perf_counter() - start) * 1000)
        return statistics.median(samples)

    bare = timed([sys.executable, "-I", "-S", "-c", "pass"])
    with_imports = timed([sys.executable, "-I", "-S", "-c", boot])
    return {"interpreter": bare, "imports": with_imports - bare}


def passthrough_cost(lab, runs=100):
    """Median ms of one passthrough runtime call: `cdi-shim-runtime state X` against `runc state X`
    (a container that does not exist: both exit 1 the same way), alternating."""
    env = lab.env()
    argv = ["--root", lab.runc_root, "state", "cdi-shim-bench-no-such-container"]
    samples = {"shim": [], "runc": []}
    for index in range(runs):
        order = [("shim", lab.runtime_binary), ("runc", lab.runc)]
        if index % 2:
            order.reverse()
        for side, binary in order:
            start = time.perf_counter()
            subprocess.run([binary] + argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            samples[side].append((time.perf_counter() - start) * 1000)
    return {side: statistics.median(values) for side, values in samples.items()}


def _median(values):
    return statistics.median(values) if values else float("nan")


def summarize(scenario):
    """Medians and paired ratios of one scenario's samples."""
    a, b = scenario["A"], scenario["B"]
    out = {}
    for metric in ("startup", "lifecycle") + STEPS:
        xs = [s[metric] for s in a if metric in s]
        ys = [s[metric] for s in b if metric in s]
        ratios = [x / y for x, y in zip(xs, ys) if y > 0]
        out[metric] = {"A": _median(xs), "B": _median(ys),
                       "ratio_of_medians": _median(xs) / _median(ys) if ys and _median(ys) else float("nan"),
                       "paired_ratio": _median(ratios),
                       "paired_min": min(ratios) if ratios else float("nan"),
                       "paired_max": max(ratios) if ratios else float("nan")}
    phase_names = sorted({p for s in a for p in s["phases"]}, key=lambda p: PHASES.index(p) if p in PHASES else 99)
    out["phases"] = {p: _median([s["phases"].get(p, 0.0) for s in a]) for p in phase_names if p != "resident"}
    out["calls_with_phases"] = sum(1 for s in a if s["phases"])
    out["resident_pods"] = sum(1 for s in a if s["phases"].get("resident"))
    out["replayed_pods"] = sum(1 for s in a if "replay" in s["phases"])
    return out


def summarize_sides(scenario):
    """Medians per side and metric, and the scenario's ratios (paired per round and of medians)."""
    samples = scenario["samples"]
    out = {"medians": {}, "ratios": [], "phases": {}, "hook_processes": {}}
    for key, values in samples.items():
        out["medians"][key] = {metric: _median([s[metric] for s in values if metric in s])
                               for metric in ("startup", "lifecycle") + STEPS + RUNC_TIMES
                               if any(metric in s for s in values)}
        names = sorted({p for s in values for p in s["phases"]}, key=lambda p: PHASES.index(p) if p in PHASES else 99)
        out["phases"][key] = {p: _median([s["phases"].get(p, 0.0) for s in values]) for p in names if p != "resident"}
        out["phases"][key]["resident pods"] = sum(1 for s in values if s["phases"].get("resident"))
        out["phases"][key]["replayed pods"] = sum(1 for s in values if "replay" in s["phases"])
        counts = {s.get("hook_processes", 0) for s in values}
        out["hook_processes"][key] = [None] if None in counts else sorted(counts)
    for numerator, denominator, target in scenario["ratios"]:
        entry = {"numerator": numerator, "denominator": denominator, "target": target}
        for metric in ("startup", "lifecycle"):
            xs = [s[metric] for s in samples[numerator]]
            ys = [s[metric] for s in samples[denominator]]
            paired = [x / y for x, y in zip(xs, ys) if y > 0]
            entry[metric] = {"paired_ratio": _median(paired), "ratio_of_medians": _median(xs) / _median(ys)
                             if ys and _median(ys) else float("nan"),
                             "paired_min": min(paired) if paired else float("nan"),
                             "paired_max": max(paired) if paired else float("nan")}
        if all("runc_create" in sample for sample in samples[numerator] + samples[denominator]):
            # where the numerator's extra start-up time went, paired per round (median ms)
            entry["extra_ms"] = {metric: _median([x[metric] - y[metric] for x, y in
                                                  zip(samples[numerator], samples[denominator])])
                                 for metric in ("startup", "runp", "create", "start") + RUNC_TIMES}
        out["ratios"].append(entry)
    return out


def _report_sides(name, scenario):
    s = summarize_sides(scenario)
    lines = ["", f"{name}: {scenario['title']} ({scenario['rounds']} rounds, the sides' order rotated)"]
    for key, side in scenario["sides"].items():
        lines.append(f"  {key}: {side['label']}; handler {side['handler']}"
                     + (f", {side['request']}" if side.get("request") else
                        f", CDIDevices {side['device']}" if side["device"] else "")
                     + "; spec hook processes per pod "
                     + ("not counted" if None in s["hook_processes"][key] else str(s["hook_processes"][key])))
    width = max(len(key) for key in scenario["sides"])
    lines.append("  median ms       " + "  ".join(f"{key:>{width}}" for key in scenario["sides"]))
    for metric in ("startup", "lifecycle") + STEPS + RUNC_TIMES:
        if not all(metric in s["medians"][key] for key in scenario["sides"]):
            continue
        label = {"startup": "start-up", "lifecycle": "lifecycle", "runc_create": "    runc create",
                 "runc_start": "    runc start", "start_less_runc": "    the rest"}.get(metric, "  " + metric)
        lines.append(f"  {label:<15}" + "  ".join(f"{s['medians'][key][metric]:>{width}.1f}"
                                                  for key in scenario["sides"]))
    for entry in s["ratios"]:
        for metric in ("startup", "lifecycle"):
            m = entry[metric]
            lines.append(f"  {metric:<9} {entry['numerator']} / {entry['denominator']}: paired median "
                         f"{m['paired_ratio']:.3f}x [{m['paired_min']:.3f} .. {m['paired_max']:.3f}], "
                         f"of medians {m['ratio_of_medians']:.3f}x")
        if "extra_ms" in entry:
            extra = entry["extra_ms"]
            lines.append(f"  extra ms of {entry['numerator']} over {entry['denominator']} (paired medians): start-up "
                         f"{extra['startup']:+.1f}; runp {extra['runp']:+.1f}, create {extra['create']:+.1f}, "
                         f"start {extra['start']:+.1f} (runc create {extra['runc_create']:+.1f}, runc start "
                         f"{extra['runc_start']:+.1f}, the rest {extra['start_less_runc']:+.1f})")
        if entry["target"]:
            verdict = "meets" if entry["startup"]["paired_ratio"] <= entry["target"] else "MISSES"
            lines.append(f"  start-up target {entry['numerator']} / {entry['denominator']} <= {entry['target']:.2f}x: "
                         f"{verdict} it (paired median {entry['startup']['paired_ratio']:.3f}x)")
    for key, found in scenario.get("check", {}).items():
        if "folder_cache_entries" in found:
            lines.append(f"  checked in one more {key} pod: {found['folder_cache_entries']} entries of "
                         f"{ONE_MOUNT_FOLDER} in its ld.so.cache (libcuda.so.1 among them), "
                         f"{', '.join(found['files'])} there, {found['hook_processes']} spec hook processes")
            continue
        lines.append(f"  checked in one more {key} pod: {found['cache_driver_libraries']} driver libraries in its "
                     f"ld.so.cache, link -> {found['link']}, profile {found['profile_bytes']} bytes, "
                     + ("hook processes not counted (a real hook program, no log)" if found["hook_processes"] is None
                        else f"{found['hook_processes']} spec hook processes (its hook program's runs)"))
    for key, phases in s["phases"].items():
        if any(not p.endswith(" pods") for p in phases):
            lines.append(f"  runtime phases of {key} (median ms per pod, {phases['resident pods']} pods prepared by "
                         f"the resident process, {phases['replayed pods']} replayed by the front end): "
                         + ", ".join(f"{p} {v:.2f}" for p, v in phases.items() if not p.endswith(" pods")))
    return lines


def report(result):
    meta = result["meta"]
    lines = [f"pod start-up, {meta['pairs']} pairs (rounds) per scenario ({meta['warmup']} warm-up), "
             f"{meta['cpus']} CPUs, "
             f"kernel {meta['kernel']}, resident process {'on' if meta.get('resident') else 'off'}, "
             f"containerd's state and runc's root on {meta.get('state', 'disk')}",
             f"  {meta['containerd']}", f"  {meta['runc'].splitlines()[0] if meta['runc'] else ''}"]
    if meta.get("load_before"):
        lines.append("  load average (1, 5, 15 min) before: " + ", ".join(f"{x:.2f}" for x in meta["load_before"])
                     + "; after: " + ", ".join(f"{x:.2f}" for x in meta.get("load_after", ())))
    cost = meta.get("passthrough_ms")
    if cost:
        lines.append(f"  one passthrough runtime call (`state`, median of 100): "
                     f"cdi-shim-runtime {cost['shim']:.2f} ms, "
                     f"runc {cost['runc']:.2f} ms: +{cost['shim'] - cost['runc']:.2f} ms a call "
                     "(4 calls until a pod's container runs, 12 in its lifecycle)")
    native = meta.get("native_cdi")
    if native:
        lines.append(f"  native CDI: image {native['image']} (busybox + the ldcache tests' library tree), "
                     f"{native['driver_libraries']} driver libraries")
        if native.get("hooked_program"):
            lines.append(f"  (a)'s hook program: {native['hooked_program']}"
                         + (f" ({native['hooked_program_version'].splitlines()[0]})"
                            if native.get("hooked_program_version") else ""))
    for name, scenario in result["scenarios"].items():
        if scenario.get("kind") == "sides":
            lines += _report_sides(name, scenario)
            continue
        s = summarize(scenario)
        lines += ["", f"{name}: {scenario['title']}",
                  f"  A = handler {scenario['A_handler']} (cdi-shim-runtime), B = handler {scenario['B_handler']}",
                  "  metric          A median ms  B median ms  A/B medians  A/B paired (median)  [min .. max]"]
        for metric in ("startup", "lifecycle") + STEPS:
            m = s[metric]
            label = {"startup": "start-up", "lifecycle": "lifecycle"}.get(metric, "  " + metric)
            lines.append(f"  {label:<15} {m['A']:>10.1f}  {m['B']:>11.1f}  {m['ratio_of_medians']:>10.3f}x"
                         f"  {m['paired_ratio']:>18.3f}x  [{m['paired_min']:.3f} .. {m['paired_max']:.3f}]")
        target = scenario["target"]
        if target:
            verdict = "meets" if s["startup"]["paired_ratio"] <= target else "MISSES"
            lines.append(f"  start-up target <= {target:.2f}x: {verdict} it "
                         f"(paired median {s['startup']['paired_ratio']:.3f}x)")
        if s["phases"]:
            phases = ", ".join(f"{p} {v:.2f}" for p, v in s["phases"].items())
            lines.append(f"  runtime phases (median ms per pod, {s['calls_with_phases']} pods, "
                         f"{s['resident_pods']} prepared by the resident process, {s['replayed_pods']} replayed "
                         f"by the front end): {phases}")
            cost = meta.get("python_path_ms")
            if cost and s["resident_pods"] + s["replayed_pods"] < s["calls_with_phases"]:
                lines.append(f"  before those phases: interpreter start {cost['interpreter']:.1f} ms + imports "
                             f"{cost['imports']:.1f} ms (measured apart, median of 15)")
        else:
            lines.append("  runtime phases: none logged (the native front end passed every call straight to runc)")
    return "\n".join(lines) + "\n"


def write_json(result, path):
    with open(path, "w") as stream:
        json.dump(result, stream, indent=1)


def plot(result, path):
    """Box plots of start-up and lifecycle per scenario and handler (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["scenarios"])
    fig, axes = plt.subplots(1, 2, figsize=(4 + 3 * len(names), 5))
    for axis, metric, title in ((axes[0], "startup", "start-up (RunPodSandbox until running)"),
                                (axes[1], "lifecycle", "full lifecycle")):
        data, labels = [], []
        for name in names:
            scenario = result["scenarios"][name]
            if scenario.get("kind") == "sides":
                for key, side in scenario["sides"].items():
                    data.append([s[metric] for s in scenario["samples"][key]])
                    labels.append(f"{name}\n{key}")
                continue
            for side in ("A", "B"):
                data.append([s[metric] for s in scenario[side]])
                labels.append(f"{name} {side}\n{scenario[side + '_handler']}")
        axis.boxplot(data, showfliers=True)
        axis.set_xticks(range(1, len(labels) + 1))
        axis.set_xticklabels(labels, fontsize=7, rotation=30, ha="right")
        axis.set_ylabel("ms")
        axis.set_title(title)
        axis.grid(axis="y", alpha=0.3)
    fig.suptitle(f"cdi-shim pod start-up, {result['meta']['pairs']} pairs per scenario")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
