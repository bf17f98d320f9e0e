"""Pods through real containerd 1.7 and 2.1 (Debian trixie / forky: cdi_shim_lab/releases.py) with the
cdi-shim runtime handler, containerd's own CDI on and off.

With enable_cdi on (`runtime configure --enable-cdi true`, cdi_spec_dirs = the lab's spec dir),
containerd injects the device a container asks for, by the CRI CDIDevices field (what the
kubelet passes from a device plugin) or by a cdi.k8s.io/ annotation, before the runtime runs:
the OCI spec containerd made (`ctr containers info`) already holds the device node. With it off,
containerd ignores both; the annotation (allowed by container_annotations) reaches
cdi-shim-runtime, which injects it. The spec has no hooks (device node + env + a mount), so the
container's view is the same whoever injected: checked from inside the container.

Toolkit-shaped hooks (nvidia-cdi-hook update-ldcache, absent on this host) done natively by
the runtime are another change; here only what already holds: plain runc fails such a pod.
"""
import os

import pytest

from tests.cri.test_pods import PROBE, cdi_annotations

pytestmark = pytest.mark.cri

DEVICE = "nvidia.com/gpu=0"
ANNOTATION = {"cdi.k8s.io/gpu": DEVICE}
NODE = "character special file c3:0"  # 195:0 in hex


def probe(lab, handler="nvidia", **request):
    run = lab.run_pod(handler, ["sh", "-c", PROBE], keep_configs=True, **request)
    assert run.status.exit_code == 0, run.output
    return run, dict(line.split("=", 1) for line in run.output if "=" in line)


def injected_by_us(lab, container_id):
    if not os.path.exists(lab.runtime_log):     # (no create reached the Python side: none was ours)
        return []
    with open(lab.runtime_log) as stream:
        return [line for line in stream if f"container {container_id}: injected" in line]


def devices_from_containerd(run):
    """Device nodes in the OCI spec containerd made, before the runtime saw it."""
    return [d["path"] for d in (run.container_spec.get("linux") or {}).get("devices") or []]


def assert_gets_the_device(seen):
    assert seen["node"] == NODE
    assert seen["env"] == "0/555.42"
    assert seen["mount"] == "fake driver 555.42"


def test_cdi_devices_field_injected_by_containerd(native_lab):
    run, seen = probe(native_lab, cdi_devices=[DEVICE])
    assert_gets_the_device(seen)
    assert devices_from_containerd(run) == ["/dev/nvidia0"]
    env = run.container_spec["process"]["env"]
    assert "FAKE_GPU_INDEX=0" in env and "FAKE_DRIVER=555.42" in env
    assert not injected_by_us(native_lab, run.container_id)  # nothing left to request


def test_annotation_injected_by_containerd_and_again_by_the_runtime(native_lab):
    """Known: containerd resolves cdi.k8s.io/ annotations itself, and the container_annotations
    allow-list passes them on, so cdi-shim-runtime requests the device again and applies the same
    edits a second time. Device nodes, mounts and env replace their own (this spec: the same
    result); a spec's hooks would be listed twice. When that changes (no allow-list for
    containerd's own prefix when enable_cdi is on, or a runtime that skips edits already there),
    this test says so."""
    run, seen = probe(native_lab, annotations=ANNOTATION)
    assert_gets_the_device(seen)
    assert devices_from_containerd(run) == ["/dev/nvidia0"]
    assert cdi_annotations(run.container_spec) == ANNOTATION
    assert injected_by_us(native_lab, run.container_id)


def test_cdi_off_annotation_done_by_the_runtime(cdi_off_lab):
    run, seen = probe(cdi_off_lab, annotations=ANNOTATION)
    assert_gets_the_device(seen)
    assert devices_from_containerd(run) == []  # containerd ignored the request
    assert cdi_annotations(run.container_spec) == ANNOTATION
    assert injected_by_us(cdi_off_lab, run.container_id)


def test_cdi_off_cdi_devices_field_dropped(cdi_off_lab):
    """What `runtime configure` warns of with enable_cdi = false: the CDIDevices field is lost."""
    run, seen = probe(cdi_off_lab, cdi_devices=[DEVICE])
    assert "No such file" in seen["node"] and seen["env"] == "/"
    assert devices_from_containerd(run) == []
    assert not injected_by_us(cdi_off_lab, run.container_id)


TOOLKIT_SPEC = """cdiVersion: "0.5.0"
kind: toolkit.example.com/gpu
devices:
  - name: "0"
    containerEdits:
      deviceNodes:
        - path: /dev/nvidia0
          hostPath: {dev}/nvidia0
containerEdits:
  hooks:
    - hookName: createContainer
      path: /usr/bin/nvidia-cdi-hook
      args: [nvidia-cdi-hook, update-ldcache, --folder, /usr/lib/x86_64-linux-gnu]
"""


def test_toolkit_hook_spec_fails_under_plain_runc_handler(native_lab):
    """A toolkit-shaped spec (an nvidia-cdi-hook update-ldcache hook, the binary absent here),
    injected by containerd: plain runc runs the hook and the pod fails. (That cdi-shim-runtime
    does such hooks natively is tested with that change, not here.)"""
    from cdi_shim_lab.cri import CRIError

    assert not os.path.exists("/usr/bin/nvidia-cdi-hook")
    native_lab.write_spec("toolkit-gpu.yaml", TOOLKIT_SPEC.format(dev=native_lab.dev_dir))
    with pytest.raises(CRIError) as err:
        native_lab.run_pod("runc", ["true"], cdi_devices=["toolkit.example.com/gpu=0"])
    assert "nvidia-cdi-hook" in err.value.details, err.value.details


def test_pod_benchmark_on_containerd_2_1_smoke(cri_build_dir, tmp_path):
    """`cdi-shim bench pods --containerd 2.1`: the lab runs the fetched 2.1 (and the resident
    process in its private mount namespace, so it prepares the creates)."""
    from tests.helpers import run_cli

    out = run_cli("bench", "pods", "-n", "1", "--warmup", "0", "--scenario", "one-device", "--containerd", "2.1",
                  "--workdir", str(tmp_path), check=True)
    assert "containerd github.com/containerd/containerd/v2 2.1." in out.stdout
    assert "\none-device: " in out.stdout
    assert "(median ms per pod, 1 pods, 1 prepared by the resident process, 0 replayed by the front end)" in out.stdout
    assert [p for p in os.listdir(tmp_path) if p.startswith("cdi-shim-podbench-")] == []


def test_pod_benchmark_native_cdi_scenario(cri_build_dir, tmp_path):
    """`cdi-shim bench pods --containerd 2.1 --native-cdi`, 3 rounds: the four sides measured on the
    library image; (a)'s six hooks ran as processes (the hook program's log, a line per process)
    and did their work, seen from inside one more pod (30 driver libraries in its ld.so.cache, the
    create-symlinks link, the application profile); (b) shows the same work with no hook process,
    done by the resident runtime (its linker phase logged). With --time-runc each pod's StartContainer
    is split into runc's create and start (timed by the lab's runc stand-in) and the rest."""
    import json

    from cdi_shim_lab.pods import NATIVE_SCENARIOS, STEPS
    from tests.helpers import run_cli

    data = tmp_path / "bench.json"
    out = run_cli("bench", "pods", "-n", "3", "--warmup", "0", "--containerd", "2.1", "--native-cdi", "--time-runc",
                  "--workdir", str(tmp_path), "--json", str(data), check=True)
    result = json.loads(data.read_text())
    assert result["meta"]["native_cdi"]["driver_libraries"] == 30
    assert list(result["scenarios"]) == ["native-cdi-30-libs"]
    scenario = result["scenarios"]["native-cdi-30-libs"]
    sides = NATIVE_SCENARIOS["native-cdi-30-libs"][1]
    assert list(scenario["samples"]) == list(sides)
    for key, samples in scenario["samples"].items():
        assert len(samples) == 3, key
        for sample in samples:
            assert all(sample[metric] > 0 for metric in ("startup", "lifecycle") + STEPS), (key, sample)
            assert 0 < sample["runc_create"] + sample["runc_start"] < sample["start"], (key, sample)
            assert sample["runc_start"] > 0
            assert sample["start_less_runc"] == sample["start"] - sample["runc_create"] - sample["runc_start"]
    hooks = {key: {s["hook_processes"] for s in samples} for key, samples in scenario["samples"].items()}
    assert hooks == {"no-device-runc": {0}, "no-device-shim": {0}, "device-no-hooks-runc": {0}, "hooks-runc": {6},
                     "native-shim": {0}}
    assert scenario["sides"]["device-no-hooks-runc"]["device"] == "bench.cdi-shim.dev/mounts=0"
    assert scenario["sides"]["hooks-runc"]["handler"] == "runc"
    assert scenario["sides"]["native-shim"]["handler"] == "nvidia"
    assert scenario["sides"]["hooks-runc"]["device"] == "bench.cdi-shim.dev/hooked=0"
    assert scenario["sides"]["native-shim"]["device"] == "bench.cdi-shim.dev/toolkit=0"
    for key, processes in (("hooks-runc", 6), ("native-shim", 0)):
        assert scenario["check"][key] == {"cache_driver_libraries": 30, "link": "libnvidia-bench0.so.1",
                                          "profile_bytes": scenario["check"][key]["profile_bytes"],
                                          "hook_processes": processes}
        assert scenario["check"][key]["profile_bytes"] > 0
    native = scenario["samples"]["native-shim"]
    # the first pod's step done by the resident worker, which keeps it and writes its recipe;
    # each later pod's by the worker again or replayed by the front end (csrc/engine/replay.c),
    # never by an interpreter; the last one's replayed (a step is kept once the image's files are
    # a second old: the first pod may come sooner after the image's import)
    assert native[0]["phases"].get("linker", 0) > 0 and native[0]["phases"].get("resident") == 1, native
    assert all(s["phases"].get("resident") == 1 or (s["phases"].get("replay", 0) > 0 and "linker" not in s["phases"])
               for s in native), native
    assert native[-1]["phases"].get("replay", 0) > 0, native
    for key in ("hooks-runc", "device-no-hooks-runc", "no-device-runc"):  # runc's handler: no cdi-shim
        assert not any(s["phases"] for s in scenario["samples"][key]), key
    assert set(scenario["check"]) == {"hooks-runc", "native-shim"}
    assert "start-up target native-shim / no-device-runc <= 1.05x" in out.stdout
    assert "startup   hooks-runc / native-shim: paired median" in out.stdout
    assert "extra ms of native-shim over no-device-runc (paired medians): start-up " in out.stdout
    assert "      runc create " in out.stdout and "      the rest " in out.stdout
    assert [p for p in os.listdir(tmp_path) if p.startswith("cdi-shim-podbench-")] == []


def test_pod_benchmark_native_cdi_own_hook_program(cri_build_dir, tmp_path):
    """`--toolkit-hook PROGRAM` (for the toolkit's real nvidia-cdi-hook, not built here): side (a)
    runs PROGRAM, copied into the lab as lab-cdi-hook, and nothing else; the hook log the lab's own
    stand-in writes stays empty, so (a)'s processes are reported as not counted and the check pod
    shows their work. PROGRAM here: the stand-in script with a log of its own, so the test sees
    each of its runs and the name runc gave it."""
    import json

    from cdi_shim_lab.hosttools import find_tool
    from cdi_shim_lab.images import HOOK_SCRIPT
    from tests.helpers import run_cli

    own_log = tmp_path / "own.log"
    own_log.touch()
    program = tmp_path / "some-hook"
    program.write_text(HOOK_SCRIPT.replace("@LOG@", f'{own_log}; echo "$0" >> {own_log}')
                       .replace("@LDCONFIG@", find_tool("ldconfig", "libc-bin")))
    program.chmod(0o755)
    data = tmp_path / "bench.json"
    out = run_cli("bench", "pods", "-n", "1", "--warmup", "0", "--containerd", "2.1", "--native-cdi",
                  "--toolkit-hook", str(program), "--workdir", str(tmp_path), "--json", str(data), check=True)
    scenario = json.loads(data.read_text())["scenarios"]["native-cdi-30-libs"]
    runs = own_log.read_text().split("\n")
    # one measured pod and one check pod of side (a), six hooks each: a subcommand line and a $0 line
    assert len(runs) == 2 * 2 * 6 + 1 and runs[-1] == "", runs
    assert all(line.endswith("/hooks/lab-cdi-hook") for line in runs[1::2] if line), runs
    assert [s["hook_processes"] for s in scenario["samples"]["hooks-runc"]] == [None]
    assert scenario["check"]["hooks-runc"]["cache_driver_libraries"] == 30
    assert scenario["check"]["hooks-runc"]["hook_processes"] is None
    assert scenario["check"]["native-shim"]["hook_processes"] == 0
    assert f"(a)'s hook program: {program}" in out.stdout
    assert "hook processes not counted (a real hook program, no log)" in out.stdout
    refused = run_cli("bench", "pods", "--toolkit-hook", str(program))
    assert refused.returncode != 0 and "--toolkit-hook needs --native-cdi" in refused.stderr


def test_pod_benchmark_one_mount_scenario_on_containerd_2_1(cri_build_dir, tmp_path):
    """`cdi-shim bench pods --containerd 2.1 --scenario one-mount`: the one-mount device comes
    through CDIDevices, containerd injects it, hooks and all, and the cdi-shim handler does the
    update-ldcache hook natively: the spec's hook program (it logs each run) never runs, and one
    more pod finds the folder's libraries in its ld.so.cache."""
    import json

    from tests.helpers import run_cli

    data = tmp_path / "b.json"
    out = run_cli("bench", "pods", "--containerd", "2.1", "--scenario", "one-mount", "-n", "1", "--warmup", "0",
                  "--time-runc", "--json", str(data), "--workdir", str(tmp_path), check=True)
    scenario = json.loads(data.read_text())["scenarios"]["one-mount"]
    assert scenario["native_cdi"] is True
    assert scenario["sides"]["one-mount-shim"]["request"] == "CDIDevices bench.cdi-shim.dev/onemount=0"
    assert all(s["hook_processes"] == 0 and s["runc_start"] > 0 for samples in scenario["samples"].values()
               for s in samples)
    check = scenario["check"]["one-mount-shim"]
    assert check["libcuda"] == 1 and check["folder_cache_entries"] >= 20 and check["hook_processes"] == 0
    assert "extra ms of one-mount-shim over no-device-runc (paired medians)" in out.stdout
    assert [p for p in os.listdir(tmp_path) if p.startswith("cdi-shim-podbench-")] == []
