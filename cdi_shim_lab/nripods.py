"""GPU pod start-up with the NRI plugin (`cdi-shim bench pods --scenario nri-30-libs`, docs/nri.md).

containerd 2.1 (NRI on as shipped, enable_cdi on), a private lab (cdi_shim_lab/nrilab.py) with
`cdi-shim nri` on its NRI socket, every pod on the image of busybox plus the ldcache tests'
library tree (LIB_IMAGE). One device in every side's spec, as `nvidia-ctk cdi generate` writes
it (Lab.write_native_cdi_specs): /dev/nvidia0, 30 gcc-built driver libraries and the toolkit's
six createContainer hooks. Each round runs a pod of every side, in an order rotated round by
round (the four sides of issue 45, and a fifth):

* nri-native: the stock runc handler, the device asked for by pod annotation; the plugin gives
  the edits and folds the toolkit's hooks (program named nvidia-cdi-hook) into one native hook,
  `cdi-shim-nshook nri`, whose cache the plugin's process writes;
* nri-toolkit-hook: the same, the spec's hooks run by runc as the toolkit's plugin leaves them:
  six processes of the real `nvidia-cdi-hook` (benchmarks/toolkit.py builds it, cached at
  TOOLKIT_HOOK), copied in under a name the plugin does not fold (lab-cdi-hook). Where the real
  program is absent the lab's stand-in script (ldconfig -r on the rootfs) runs instead, and the
  report says so;
* runtime-handler: cdi-shim's runtime handler (resident), the device through the CRI CDIDevices
  field (containerd injects it, the runtime does the hooks natively before runc: no hook process);
* device-no-hooks: the same device without its hooks, by pod annotation through the plugin (what
  the node, the mounts and NRI cost runc and containerd);
* containerd-cdi-runc: the hooked device through the CRI CDIDevices field on the stock runc
  handler, the plugin running: containerd's own CDI injects it before NRI, and NRI cannot remove
  the hooks it added, so runc runs them as the toolkit's processes (docs/nri.md, "What NRI
  cannot do": what that costs).

The stand-in logs a line per hook process: a pod showing other than its side's count fails the
run; one more pod of each hooked side then checks from inside that the hooks' work is there (30
driver libraries in its ld.so.cache, the link, the profile). Target: nri-native / device-no-hooks
at most 1.10x (paired per round).
"""
import os
import re
import statistics
import tempfile

from .lab import LIB_IMAGE
from .pods import BenchError, _phases_since, _rotate, _tool_version, check_device_pod, lab_run, new_lab, run_meta

NAME = "nri-30-libs"
TITLE = ("NRI on containerd 2.1: one device + 30 driver libraries + the toolkit's six hooks, the same spec on "
         "every side")
TOOLKIT_HOOK = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cdi-shim",
                            "toolkit-v1.20.0", "bin", "nvidia-cdi-hook")
# side: (label, handler (None: ours), device key of Lab.write_native_cdi_specs, how asked, hook processes)
SIDES = {
    "nri-native": ("NRI, our native hook (cdi-shim-nshook nri; the cache by the plugin's process), runc handler",
                   "runc", "toolkit", "nri", 0),
    "nri-toolkit-hook": ("NRI, the spec's hooks run by runc as the toolkit's plugin leaves them, runc handler",
                         "runc", "hooked", "nri", 6),
    "runtime-handler": ("cdi-shim's runtime handler (resident), CDIDevices: the hooks done before runc",
                        None, "toolkit", "cdi", 0),
    "device-no-hooks": ("the same device without its hooks, NRI, runc handler", "runc", "mounts", "nri", 0),
    "containerd-cdi-runc": ("containerd's own CDI (CDIDevices), runc handler, the plugin running: the spec's hooks "
                            "run by runc, NRI cannot remove them", "runc", "hooked", "cdi", 6),
}
RATIOS = (("nri-native", "device-no-hooks", 1.10), ("nri-toolkit-hook", "nri-native", None),
          ("runtime-handler", "device-no-hooks", None), ("nri-native", "runtime-handler", None),
          ("nri-toolkit-hook", "device-no-hooks", None), ("containerd-cdi-runc", "nri-native", None),
          ("containerd-cdi-runc", "device-no-hooks", None))


def toolkit_hook_program(path=None):
    """(the real nvidia-cdi-hook to run, or None, and what the report says about it)."""
    if path:
        return path, path      # (cdi-shim bench pods checked it exists)
    path = TOOLKIT_HOOK
    if os.access(path, os.X_OK):
        return path, f"the real nvidia-cdi-hook, {path} (the benchmarks/toolkit.py build)"
    return None, (f"the real nvidia-cdi-hook is ABSENT (no {path}; `python benchmarks/toolkit.py` builds it): "
                  "nri-toolkit-hook runs the lab's stand-in script (ldconfig -r on the rootfs) instead")


def _request(kind, device):
    return dict(pod_annotations={"cdi.k8s.io/gpu": device}) if kind == "nri" else dict(cdi_devices=[device])


def _check(lab, key, devices, side):
    """One more pod of a hooked side, not measured (pods.check_device_pod), asked for as SIDE asks."""
    _, handler, device, kind, expected = side
    return check_device_pod(lab, NAME, key, devices, (handler, device, expected), _request(kind, devices[device]))


def plugin_cache_work(text):
    """{"planned": [ms], "kept": [ms]}: the plugin's cache work per container, from its log
    (shim/nri/hookserver.py: planned, or the answer kept for the image's layers)."""
    work = {"planned": [], "kept": []}
    for took, how in re.findall(r"hook: the linker cache of .*\(([0-9.]+) ms, (planned|the answer kept)", text):
        work["planned" if how == "planned" else "kept"].append(float(took))
    return work


def run(rounds=10, warmup=2, workdir=None, log=print, toolkit_hook=None, time_runc=False, state_on_disk=False):
    """The NRI scenario; returns a result dict as cdi_shim_lab.pods.run does (pods.report prints it)."""
    from .nrilab import NRILab

    program, program_note = toolkit_hook_program(toolkit_hook)
    log(f"{NAME}: {program_note}")
    base = tempfile.mkdtemp(prefix="cdi-shim-podbench-", dir=workdir)
    lab = new_lab(NRILab, base, resident=True, containerd="2.1", native_cdi=True, time_runc=time_runc,
                  state_on_tmpfs=not state_on_disk)
    result = {"meta": run_meta(lab, rounds, warmup, True, time_runc, state_on_disk), "scenarios": {}}
    with lab_run(lab, base, result):
        lab.setup(library_image=True)
        lab.start_plugin()
        devices = lab.write_native_cdi_specs(30, hook_program=program)
        result["meta"]["native_cdi"] = {"image": LIB_IMAGE, "driver_libraries": len(devices["libraries"])}
        result["meta"]["nri"] = {"hook_program": program_note, "hook_program_version": _tool_version(
            [program, "--version"]) if program else None}
        result["meta"]["load_before"] = os.getloadavg()
        log(f"{NAME}: {warmup} warm-up + {rounds} measured rounds of {len(SIDES)} pods ({TITLE})")
        plan = {key: (handler or lab.runtime_name, dict(_request(kind, devices[device]), image=LIB_IMAGE),
                      None if device == "hooked" and not devices["hook_log_counts_hooked"] else expected)
                for key, (_, handler, device, kind, expected) in SIDES.items()}
        _, offset = _phases_since(lab.runtime_log, 0)
        samples, offset = _rotate(lab, NAME, plan, devices["hook_log"], rounds, warmup, offset)
        check = {key: _check(lab, key, devices, side) for key, side in SIDES.items()
                 if side[2] in ("hooked", "toolkit")}
        text = lab.plugin_log_text()
        served = text.count("hook: the linker cache of ")
        work = plugin_cache_work(text)
        log(f"{NAME}: the plugin's cache work per container, median ms: " + ", ".join(
            f"{how} {statistics.median(times):.1f} ({len(times)} containers)" for how, times in work.items() if times))
        result["scenarios"][NAME] = {
            "title": TITLE, "kind": "sides", "rounds": rounds, "check": check, "plugin_caches": served,
            "plugin_cache_ms": work,
            "sides": {key: {"label": label + (f"; hook program: {program_note}" if device == "hooked" else ""),
                            "handler": handler or lab.runtime_name, "device": devices[device],
                            "request": (f"pod annotation cdi.k8s.io/gpu={devices[device]}" if kind == "nri"
                                        else f"CDIDevices {devices[device]}"), "image": LIB_IMAGE}
                      for key, (label, handler, device, kind, _) in SIDES.items()},
            "samples": samples, "ratios": [list(r) for r in RATIOS]}
    return result


def run_as_pods(pairs=10, warmup=2, scenarios=None, workdir=None, log=print, resident=True, containerd=None,
                time_runc=False, state_on_disk=False, toolkit_hook=None):
    """run() called as cdi_shim_lab.pods.run is (`cdi-shim bench pods --scenario nri-30-libs`)."""
    if list(scenarios or ()) != [NAME] or containerd != "2.1" or not resident:
        raise BenchError(f"{NAME} runs alone, on --containerd 2.1, with the resident process (a lab of its own: "
                         "containerd's NRI with cdi-shim nri)")
    return run(rounds=pairs, warmup=warmup, workdir=workdir, log=log, toolkit_hook=toolkit_hook,
               time_runc=time_runc, state_on_disk=state_on_disk)
