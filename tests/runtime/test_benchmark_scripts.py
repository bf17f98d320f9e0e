"""The benchmark scripts the figures of benchmarks/RESULTS.md come from still run (a run or two each, on tmpfs):
a figure that cannot be measured again is not a figure."""
import json
import os
import subprocess
import sys

import pytest

import runtime_helpers as rh

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks")


def _run(script, *args, timeout=300):
    rh.require_root()
    for tool in ("runc", "gcc", "ldconfig"):
        rh.need(tool, {"ldconfig": "libc-bin"}.get(tool, tool))
    run = subprocess.run([sys.executable, os.path.join(BENCHMARKS, script), *args], capture_output=True, text=True,
                         timeout=timeout)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout[run.stdout.index("{") if script != "runtime_overhead.py" else run.stdout.index("["):])


def test_nshook_benchmark():
    result = _run("nshook.py", "--runs", "2")
    for case in ("symlinks", "symlinks-from-state", "bind-params"):
        assert result[case]["nshook_ms"] > 0 and result[case]["python_hook_ms"] > 0


@pytest.mark.parametrize("mode", [["--preinjected"], []], ids=["preinjected", "run"])
def test_run_with_libraries_benchmark(mode):
    rh.static_busybox()
    result = _run("run_with_libraries.py", "--runs", "1", "--dir", "/dev/shm", *mode)
    if mode:
        assert result["driver_libraries"] == 30 and result["shim_create_ms"] > 0
        assert result["runc_create_of_the_config_cdi_shim_wrote_ms"] > 0
        low, high = result["median_paired_diff_95pct_ms"]
        assert low <= result["median_paired_diff_ms"] <= high
        assert result["annotation_create_ms"] > 0       # (the script checks the device was injected)
        low, high = result["annotation_minus_preinjected_95pct_ms"]
        assert low <= result["annotation_minus_preinjected_ms"] <= high
    else:
        assert result["resident"]["shim_run_with_device_ms"] > 0


@pytest.mark.parametrize("mode", [[], ["--no-replay"]], ids=["replay", "worker"])
def test_front_end_work_benchmark(mode):
    rh.static_busybox()
    result = _run("front_end_work.py", "--runs", "2", *mode)
    assert result["replay"] is not bool(mode)
    assert set(result["over_bin_true_ms"]) == {"passthrough", "trivial", "preinjected", "annotation", "device-option",
                                               "go-escaped", "preinjected-go-escaped", "preinjected-linked"}
    assert result["soname_links_ratio"] > 0


def test_file_binds_benchmark():
    rh.static_busybox()
    result = _run("file_binds.py", "--runs", "2", "--binds", "4")
    assert result["binds"] == 4 and result["runc_create_plain_ms"] > 0
    for side in ("runc", "hook", "true"):
        low, high = result[f"{side}_over_plain_95pct_ms"]
        assert low <= result[f"{side}_over_plain_ms"] <= high
    assert set(result["kernel_part"]) == {"create_mount_points_ms", "bind_ms", "propagation_and_remount_ms"}


@pytest.mark.parametrize("root", [[], ["--writable-root"], ["--lifecycle", "run"]],
                         ids=["read-only-root", "writable-root", "run"])
def test_one_mount_benchmark(root):
    rh.static_busybox()
    result = _run("one_mount.py", "--runs", "1", "--dir", "/dev/shm", "--image", "small", *root)
    assert result["readonly_root"] is not ("--writable-root" in root)
    assert result["lifecycle"] == ("run" if "run" in root else "create")
    sides = {"runc", "runc+folders", "runc+nodes", "runc+edits", "runc+edits+hook", "one-mount", "one-mount-hook",
             "one-mount-injected", "files"}
    assert set(result["median_ms"]) == sides
    assert result["entries_in_host_lib64"] > 30
    for name in sides - {"runc"}:
        low, high = result["median_paired_ratio"][f"{name}/runc 95pct"]
        assert low <= result["median_paired_ratio"][f"{name}/runc"] <= high


def test_memo_layers_benchmark_turns_each_layer_off(tmp_path):
    """Each side of memo_layers.py does what its name says: its last create's debug log shows
    the layers it keeps acting and the ones it turned off not."""
    rh.static_busybox()
    logs = tmp_path / "logs"
    result = _run("memo_layers.py", "--runs", "1", "--bin-true", "--dir", "/dev/shm", "--debug-log", str(logs))
    assert result["runtime"] == "/bin/true" and set(result["worth_pre_ms"]) >= {"replay", "step, replay on"}

    def log(side):      # (the last create's lines: the first of each side keeps what the others use)
        lines = (logs / (side.replace(" ", "_") + ".log")).read_text().splitlines()
        ends = [at for at, line in enumerate(lines) if "phase=total" in line or "phase=replay" in line]
        return "\n".join(lines[ends[-2] + 1:])

    front_end, plan, files = "phase=replay", "the plan of an earlier container", "remembered, 0 read"
    for kind in ("pre", "ann"):
        assert front_end in log(f"{kind} all") and front_end in log(f"{kind} -step")
        # (the recipes refused: no replay at all, the worker steps, its plan memo acting)
        assert front_end not in log(f"{kind} -replay") and plan in log(f"{kind} -replay")
        assert files not in log(f"{kind} -replay")
        assert plan not in log(f"{kind} -replay -plan") and files in log(f"{kind} -replay -plan")
        side = log(f"{kind} -replay -plan -file")
        assert plan not in side and "remembered" not in side
    assert "injected nvidia.com/gpu=0" in log("ann all") and plan in log("ann -replay -registry")
