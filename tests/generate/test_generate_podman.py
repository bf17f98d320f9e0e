"""A generated spec is read alike by a peer: Debian's podman 4.3.1 (CDI library v0.5.2, which
accepts cdiVersion up to 0.5.0) runs a container with `--device nvidia.com/gpu=<UUID>` from
it, and its OCI config equals ours for the same request (tests/cdi/podman_peer.py)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cdi"))
import podman_peer as pp  # noqa: E402

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
    assert [d["path"] for d in podman["linux"]["devices"]][-5:] == [
        "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset", "/dev/nvidia1"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in podman["process"]["env"]
    assert [h["args"][1] for h in podman["hooks"]["createContainer"]] == ["create-symlinks", "update-ldcache"]
