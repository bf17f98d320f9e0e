"""A generated spec is read alike by a peer: Debian's podman 4.3.1 (CDI library v0.5.2, which
accepts cdiVersion up to 0.5.0) runs a container with `--device nvidia.com/gpu=<UUID>` from
it, and its OCI config equals ours for the same request (tests/cdi/podman_peer.py)."""
import os
import re
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cdi"))
import podman_peer as pp  # noqa: E402

import fakedriver  # noqa: E402

pytestmark = pytest.mark.podman


@pytest.fixture(scope="module")
def peer(tmp_path_factory):
    try:
        pp.cdi_shim_command()
        peer = pp.PodmanPeer(tmp_path_factory.mktemp("podman-peer-generate"))
    except pp.PeerUnavailable as err:
        pytest.fail(str(err), pytrace=False)
    yield peer
    peer.close()


def test_podman_runs_a_generated_spec_and_agrees_with_us(peer, driver, run):
    run.gpus(2)
    text = run.generate("--dry-run", output=False).stdout
    assert "cdiVersion: 0.5.0" in text
    uuid = driver.uuids(2)[1]
    scenario = peer.differential({f"{pp.SPEC_DIRS[1]}/nvidia.yaml": text}, [f"nvidia.com/gpu={uuid}"])
    filled = pp.compare(scenario)
    # Head fills fileMode from the host node, v0.5.2 does not (the documented difference 1).
    assert set(filled) >= {"/dev/nvidia1", "/dev/nvidiactl"}
    podman = scenario.podman.config
    assert [d["path"] for d in podman["linux"]["devices"]][-7:] == [
        "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset", "/dev/nvidia1",
        "/dev/dri/card2", "/dev/dri/renderD129"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in podman["process"]["env"]
    # the spec's hooks, then the device's: its /dev/dri/by-path links
    hooks = podman["hooks"]["createContainer"]
    assert [h["args"][1] for h in hooks] == ["create-symlinks", "update-ldcache", "symlinks"]
    assert hooks[2]["args"][0] == "cdi-shim-nshook" and hooks[2]["path"].endswith("/cdi-shim-nshook")
    assert hooks[2]["args"][2:] == ["--link", f"../card2::/dev/dri/by-path/pci-{fakedriver.bus_id(1)}-card",
                                    "--link", f"../renderD129::/dev/dri/by-path/pci-{fakedriver.bus_id(1)}-render"]


def test_podman_4_3_refuses_a_spec_with_additional_gids(peer, driver, run, tmp_path):
    """Group-only DRM nodes make the spec 0.7.0 (additionalGids); Debian 12's podman 4.3 (CDI
    v0.5.2) refuses it, as docs/generate.md says (podman 4.9.3 too: toolkit issue #1860); ours takes it."""
    run.gpus(2)
    dev_root = str(tmp_path / "devroot")
    driver.make_nodes(2, dev_root=dev_root, drm_mode=0o660, drm_gid=44)
    text = run.generate("--driver-root", driver.root, "--dev-root", dev_root, "--sysfs-root", driver.sysfs,
                        "--proc-root", driver.proc, "--dry-run", roots=False, output=False).stdout
    assert "cdiVersion: 0.7.0" in text and "additionalGids" in text
    uuid = driver.uuids(2)[1]
    scenario = peer.differential({f"{pp.SPEC_DIRS[1]}/nvidia.yaml": text}, [f"nvidia.com/gpu={uuid}"],
                                 refresh_log=True)
    assert scenario.podman.rc != 0 and f"unresolvable CDI devices nvidia.com/gpu={uuid}" in scenario.podman.error, \
        scenario.podman
    # its strict parser stops at the first field it does not know: the spec annotation (0.6.0)
    # that a spec of 0.6.0 or later carries, or additionalGids (0.7.0)
    assert re.search(r'unknown field "(annotations|additionalGids)"', scenario.refresh_log), scenario.refresh_log
    assert scenario.ours.rc == 0, scenario.ours
    assert 44 in scenario.ours.config["process"]["user"]["additionalGids"]


def test_podman_runs_a_one_mount_spec_and_agrees_with_us(peer, driver, run, tmp_path):
    """--layout one-mount (docs/one-mount.md) is a plain CDI spec: podman 4.3 reads it (cdiVersion
    0.5.0), binds the host directory at /usr/local/nvidia/lib64 and runs its update-ldcache hook
    for that folder; its OCI config equals ours."""
    run.gpus(2)
    out = str(tmp_path / "nvidia.yaml")
    run.generate("--layout", "one-mount", "--driver-dir", str(tmp_path / "driver-dirs"), "--output", out,
                 output=False)
    with open(out) as stream:
        text = stream.read()
    assert "cdiVersion: 0.5.0" in text
    uuid = driver.uuids(2)[1]
    scenario = peer.differential({f"{pp.SPEC_DIRS[1]}/nvidia.yaml": text}, [f"nvidia.com/gpu={uuid}"])
    pp.compare(scenario)
    podman = scenario.podman.config
    mounts = {m["destination"]: m for m in podman["mounts"]}
    assert mounts["/usr/local/nvidia/lib64"]["source"].startswith(str(tmp_path / "driver-dirs"))
    hooks = podman["hooks"]["createContainer"]
    ldcache = [h for h in hooks if h["args"][1] == "update-ldcache"]
    assert ldcache and ldcache[0]["args"][2:4] == ["--folder", "/usr/local/nvidia/lib64"], hooks
