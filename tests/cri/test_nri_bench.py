"""`cdi-shim bench pods --scenario nri-30-libs --containerd 2.1` (cdi_shim_lab/nripods.py), briefly:
the NRI plugin's GPU pod start-up in rounds of four pods on the library image, the same spec on
every side. The real nvidia-cdi-hook is not in CI: its default place (under $XDG_CACHE_HOME) is
made empty here, so the report must say it is absent and the lab's stand-in runs instead, its
six processes counted per pod."""
import json
import os

import pytest

pytestmark = pytest.mark.cri


def test_pod_benchmark_nri_scenario(cri_build_dir, tmp_path):
    from cdi_shim_lab.nripods import SIDES
    from cdi_shim_lab.pods import STEPS
    from tests.helpers import run_cli

    data = tmp_path / "bench.json"
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "no-cache"))
    out = run_cli("bench", "pods", "-n", "2", "--warmup", "0", "--scenario", "nri-30-libs", "--containerd", "2.1",
                  "--workdir", str(tmp_path), "--json", str(data), env=env, check=True)
    assert "the real nvidia-cdi-hook is ABSENT" in out.stderr and "benchmarks/toolkit.py" in out.stderr
    result = json.loads(data.read_text())
    scenario = result["scenarios"]["nri-30-libs"]
    assert list(scenario["samples"]) == list(SIDES)
    for key, samples in scenario["samples"].items():
        assert len(samples) == 2, key
        assert all(sample[metric] > 0 for sample in samples for metric in ("startup", "lifecycle") + STEPS), key
    hooks = {key: {s["hook_processes"] for s in samples} for key, samples in scenario["samples"].items()}
    assert hooks == {"nri-native": {0}, "nri-toolkit-hook": {6}, "runtime-handler": {0}, "device-no-hooks": {0},
                     "containerd-cdi-runc": {6}}
    sides = scenario["sides"]
    assert [sides[key]["handler"] for key in SIDES] == ["runc", "runc", "nvidia", "runc", "runc"]
    assert sides["containerd-cdi-runc"]["request"] == "CDIDevices bench.cdi-shim.dev/hooked=0"
    assert sides["nri-native"]["request"] == "pod annotation cdi.k8s.io/gpu=bench.cdi-shim.dev/toolkit=0"
    assert sides["runtime-handler"]["request"] == "CDIDevices bench.cdi-shim.dev/toolkit=0"
    assert sides["device-no-hooks"]["device"] == "bench.cdi-shim.dev/mounts=0"
    assert "ABSENT" in sides["nri-toolkit-hook"]["label"]
    for key, processes in (("nri-native", 0), ("nri-toolkit-hook", 6), ("runtime-handler", 0),
                           ("containerd-cdi-runc", 6)):
        check = scenario["check"][key]
        assert check["cache_driver_libraries"] == 30 and check["link"] == "libnvidia-bench0.so.1", (key, check)
        assert check["profile_bytes"] > 0 and check["hook_processes"] == processes, (key, check)
    # every nri-native pod's cache (and its check pod's) written by the plugin's process
    assert scenario["plugin_caches"] == 3
    for key in ("nri-native", "nri-toolkit-hook", "device-no-hooks"):   # the runc handler: no cdi-shim runtime
        assert not any(s["phases"] for s in scenario["samples"][key]), key
    assert all(s["phases"] for s in scenario["samples"]["runtime-handler"])
    assert "start-up target nri-native / device-no-hooks <= 1.10x" in out.stdout
    assert "startup   nri-toolkit-hook / nri-native: paired median" in out.stdout
    assert "startup   containerd-cdi-runc / nri-native: paired median" in out.stdout
    assert [p for p in os.listdir(tmp_path) if p.startswith("cdi-shim-podbench-")] == []


def test_nri_scenario_runs_alone_on_2_1(tmp_path):
    from tests.helpers import run_cli

    out = run_cli("bench", "pods", "--scenario", "nri-30-libs", "--scenario", "one-device", "--containerd", "2.1",
                  "--workdir", str(tmp_path), check=False)
    assert "nri-30-libs runs alone, on --containerd 2.1" in out.stderr
    out = run_cli("bench", "pods", "--scenario", "nri-30-libs", "--workdir", str(tmp_path), check=False)
    assert "nri-30-libs runs alone, on --containerd 2.1" in out.stderr
