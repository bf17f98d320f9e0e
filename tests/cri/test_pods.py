"""Real pods through a private containerd 1.6's CRI plugin (RunPodSandbox ... RemovePodSandbox).

containerd 1.6 has no CDI support of its own, so a device seen in these containers is cdi-shim's.
The lab (cdi_shim_lab/lab.py) configures runtimes with the real `cdi-shim runtime configure`:
``nvidia`` (cdi-shim-runtime, container_annotations ["cdi.k8s.io/*"]), ``nvidia-noallow`` (the
same entry without the allow-list) and the stock ``runc``.
"""
import base64
import json
import os
import re

import pytest
from tests.helpers import run_cli

pytestmark = pytest.mark.cri

REQUEST = {"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}
# what the container reports: the device node (type, major, minor), the spec's env, the mount
PROBE = ("echo \"node=$(stat -c '%F %t:%T' /dev/nvidia0 2>&1)\"; "
         "echo \"env=$FAKE_GPU_INDEX/$FAKE_DRIVER\"; "
         "echo \"mount=$(cat /usr/local/fake-driver/version.txt 2>&1)\"")


def probe(lab, handler, annotations=None, pod_annotations=None):
    run = lab.run_pod(handler, ["sh", "-c", PROBE], annotations=annotations, pod_annotations=pod_annotations,
                      keep_configs=True)
    assert run.status.exit_code == 0, run.output
    seen = dict(line.split("=", 1) for line in run.output if "=" in line)
    return run, seen


def cdi_annotations(spec):
    return {k: v for k, v in (spec.get("annotations") or {}).items() if k.startswith("cdi.k8s.io/")}


def injected_lines(lab, container_id):
    with open(lab.runtime_log) as stream:
        return [line for line in stream if f"container {container_id}: injected" in line]


def test_device_env_and_mount_reach_the_container(lab):
    run, seen = probe(lab, "nvidia", annotations=REQUEST)
    assert seen["node"] == "character special file c3:0"  # 195:0 in hex, made by runc from the spec
    assert seen["env"] == "0/555.42"
    assert seen["mount"] == "fake driver 555.42"
    # containerd passed the annotation (allow-list) and nothing else did the work
    assert cdi_annotations(run.container_spec) == REQUEST
    assert not run.container_spec["linux"].get("devices")
    assert injected_lines(lab, run.container_id)
    # containerd-shim's calls reached the resident process (same mount namespace, our uid)
    with open(lab.runtime_log) as stream:
        totals = [line for line in stream if "phase=total" in line]
    assert totals and all(" in resident process " in line for line in totals), totals


def test_runc_handler_gives_nothing(lab):
    run, seen = probe(lab, "runc", annotations=REQUEST)
    assert "No such file" in seen["node"]
    assert seen["env"] == "/"
    assert "No such file" in seen["mount"]
    assert not injected_lines(lab, run.container_id)


def test_runtimeclass_handler_mismatch_fails_like_the_pod_would(lab):
    from cdi_shim_lab.cri import CRIError

    with pytest.raises(CRIError) as err:
        lab.run_pod("nvidia-gpu", ["true"])
    assert 'no runtime for "nvidia-gpu" is configured' in err.value.details
    out = run_cli("runtimeclass", "--handler", "nvidia-gpu", "--config", lab.config, env=lab.env(), check=False)
    assert 'no runtime for "nvidia-gpu" is configured' in out.stderr
    run_cli("runtimeclass", "--handler", "nvidia", "--config", lab.config, env=lab.env(), check=True)


def test_without_the_allow_list_the_request_is_lost(lab):
    """Why `runtime configure` writes container_annotations: containerd drops every other annotation."""
    run, seen = probe(lab, "nvidia-noallow", annotations=REQUEST)
    assert cdi_annotations(run.container_spec) == {}  # dropped by containerd before the runtime
    assert "No such file" in seen["node"] and seen["env"] == "/"
    assert not injected_lines(lab, run.container_id)
    # the same pod on the entry with the allow-list gets its device
    run, seen = probe(lab, "nvidia", annotations=REQUEST)
    assert seen["node"] == "character special file c3:0"


def test_pod_annotations_never_reach_the_request_path(lab):
    run, seen = probe(lab, "nvidia", pod_annotations=REQUEST)
    assert cdi_annotations(run.sandbox_spec) == {}
    assert cdi_annotations(run.container_spec) == {}
    assert "No such file" in seen["node"] and seen["env"] == "/"
    # and nothing in what the runtime got could even look like a request
    for spec in (run.sandbox_spec, run.container_spec):
        assert "cdi.k8s.io/" not in json.dumps(spec)
    assert not injected_lines(lab, run.container_id)


def runtime_options(lab, container_id):
    """The runtime options containerd recorded for a container (runc's Options protobuf, raw)."""
    info = json.loads(lab.ctr_cmd("containers", "info", container_id))
    return info["Runtime"]["Name"], base64.b64decode(info["Runtime"]["Options"]["value"])


def test_sandbox_and_container_run_with_our_binary(lab):
    """Both the pause sandbox and the container go to cdi-shim-runtime (BinaryName) via runc.v2."""
    run = lab.run_pod("nvidia", ["sh", "-c", "sleep 0.2"], remove=False)
    plain = lab.run_pod("runc", ["sh", "-c", "true"], remove=False)
    try:
        for container_id in (run.pod_id, run.container_id):
            name, options = runtime_options(lab, container_id)
            assert name == "io.containerd.runc.v2"
            assert lab.runtime_binary.encode() in options
            assert lab.runc_root.encode() in options  # Root copied from the runc entry
        for container_id in (plain.pod_id, plain.container_id):
            assert lab.runtime_binary.encode() not in runtime_options(lab, container_id)[1]
    finally:
        for pod in (run, plain):
            lab.client.stop_pod_sandbox(pod.pod_id)
            lab.client.remove_pod_sandbox(pod.pod_id)
    assert lab.client.list_containers(run.pod_id) == []


def test_list_containers_and_status(lab):
    run = lab.run_pod("nvidia", ["sh", "-c", "exit 3"], annotations=REQUEST, remove=False)
    try:
        listed = lab.client.list_containers(run.pod_id)
        assert [c.id for c in listed] == [run.container_id]
        assert dict(listed[0].annotations) == REQUEST
        status = lab.client.container_status(run.container_id).status
        assert status.exit_code == 3 and status.state == lab.client.pb.CONTAINER_EXITED
    finally:
        lab.client.stop_pod_sandbox(run.pod_id)
        lab.client.remove_pod_sandbox(run.pod_id)


def test_pod_benchmark_smoke(cri_build_dir, tmp_path):
    """`cdi-shim bench pods` end to end, one pair per scenario (figures: see the closing note)."""
    out = run_cli("bench", "pods", "-n", "1", "--warmup", "0", "--json", str(tmp_path / "b.json"),
                  "--workdir", str(tmp_path), check=True)
    for name in ("no-device", "one-device", "device-30-libs", "device-30-libs-vs-cri"):
        assert f"\n{name}: " in out.stdout
    assert re.search(r"start-up target <= 1\.03x: (meets|MISSES) it", out.stdout)
    # the lab ran the resident process (the default), and it prepared every create that asked
    assert "resident process on" in out.stdout
    assert "runtime phases (median ms per pod, 1 pods, 1 prepared by the resident process, 0 replayed by the " \
        "front end): config" in out.stdout
    result = json.loads((tmp_path / "b.json").read_text())
    sample = result["scenarios"]["device-30-libs"]["A"][0]
    assert sample["phases"]["resident"] == 1
    assert sample["startup"] > 0 and sample["lifecycle"] >= sample["startup"]
    assert set(sample["phases"]) >= {"config", "requests", "resolve", "apply", "write", "total"}
    assert [p for p in os.listdir(tmp_path) if p.startswith("cdi-shim-podbench-")] == []  # cleaned up


def test_pod_benchmark_one_mount_scenario(cri_build_dir, tmp_path):
    """`cdi-shim bench pods --scenario one-mount` on containerd 1.6: the fake driver's GPU 0 in the
    one-mount layout (written by the real `cdi generate --layout one-mount`), asked for by
    annotation (cdi-shim injects it), against a pod without it and a runc pod given the spec's
    edits as CRI fields. The spec's hook program logs each run: no side runs it. One more pod
    shows the folder's libraries in its ld.so.cache, the tool and the GPU node."""
    from cdi_shim_lab.pods import ONE_MOUNT_SCENARIOS

    data = tmp_path / "b.json"
    out = run_cli("bench", "pods", "--scenario", "one-mount", "-n", "2", "--warmup", "0", "--json", str(data),
                  "--workdir", str(tmp_path), check=True)
    scenario = json.loads(data.read_text())["scenarios"]["one-mount"]
    assert list(scenario["samples"]) == list(ONE_MOUNT_SCENARIOS["one-mount"][1])
    assert scenario["native_cdi"] is False
    sides = scenario["sides"]
    assert sides["one-mount-shim"]["request"] == "annotation cdi.k8s.io/gpu=bench.cdi-shim.dev/onemount=0"
    assert sides["one-mount-shim"]["handler"] == "nvidia" and sides["edits-runc"]["handler"] == "runc"
    assert re.fullmatch(r"7 devices, \d+ mounts and \d+ env vars as CRI fields", sides["edits-runc"]["request"])
    for key, samples in scenario["samples"].items():
        assert len(samples) == 2 and all(s["hook_processes"] == 0 and s["startup"] > 0 for s in samples), key
    assert all(s["phases"].get("resident") == 1 or s["phases"].get("replay", 0) > 0
               for s in scenario["samples"]["one-mount-shim"])
    assert not any(s["phases"] for key in ("no-device-runc", "edits-runc") for s in scenario["samples"][key])
    check = scenario["check"]["one-mount-shim"]
    assert check["libcuda"] == 1 and check["folder_cache_entries"] >= 20 and check["hook_processes"] == 0
    assert check["files"] == ["/usr/local/nvidia/lib64/libcuda.so.1", "/usr/local/nvidia/bin/nvidia-smi",
                              "/dev/nvidia0"] and check["libdir"] == "/usr/local/nvidia/lib64"
    assert re.search(r"start-up target one-mount-shim / no-device-runc <= 1\.03x: (meets|MISSES) it", out.stdout)
    assert "startup   edits-runc / no-device-runc: paired median" in out.stdout
    assert [p for p in os.listdir(tmp_path) if p.startswith("cdi-shim-podbench-")] == []
