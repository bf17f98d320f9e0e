"""`cdi-shim bench pods --endpoint`: a node's own containerd measured without the lab.

The containerd here is the lab's private one (Debian 12's containerd 1.6 package, its own root,
state and socket, configured by `cdi-shim runtime configure` as install --node would), but the
benchmark is given only its socket, as an operator gives /run/containerd/containerd.sock: the
command runs in a process where `import cdi_shim_lab` fails, from a folder outside the checkout.
"""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.cri

# cdi-shim's CLI with the lab unimportable (None in sys.modules makes every import of it fail)
NO_LAB = ("import sys; sys.modules['cdi_shim_lab'] = None; from shim.cli.main import main; "
          "sys.argv[0] = 'cdi-shim'; main()")


def bench(lab, tmp_path, *args):
    env = dict(lab.env(), PATH=os.environ["PATH"])
    return subprocess.run([sys.executable, "-c", NO_LAB, "bench", "pods", "--endpoint", f"unix://{lab.socket}",
                           "--ctr", lab.ctr, *args], capture_output=True, text=True, cwd=str(tmp_path), env=env,
                          timeout=600)


def ours(lab):
    return [pod for pod in lab.client.list_pod_sandboxes() if "cdi-shim.dev/bench" in pod.labels]


def injections(lab):
    if not os.path.exists(lab.runtime_log):
        return 0
    with open(lab.runtime_log) as stream:
        return sum(1 for line in stream if ": injected" in line)


def test_gpu_against_plain_pods_on_the_nodes_containerd(lab, tmp_path):
    before = {pod.id for pod in lab.client.list_pod_sandboxes()}
    injected = injections(lab)
    done = bench(lab, tmp_path, "--handler", "nvidia", "-n", "3", "--warmup", "1", "--json", "out.json")
    assert done.returncode == 0, done.stderr
    assert "cdi_shim_lab" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    result = json.loads((tmp_path / "out.json").read_text())
    meta = result["meta"]
    assert (len(result["A"]), len(result["B"])) == (3, 3)
    assert all(sample["startup"] > 0 and sample["lifecycle"] >= sample["startup"]
               for sample in result["A"] + result["B"])
    assert (meta["A_handler"], meta["B_handler"], meta["request"]) == ("nvidia", "", "annotation")
    # the device was there: the probe pod of A saw the spec's node, B's did not
    assert meta["check"] == {"checked": True, "node": "/dev/nvidia0", "baseline_sees_it": False}
    # 1 warm-up + 3 pairs + the two probe pods; none left, the imported image removed again
    assert (meta["pods_made"], meta["pods_left"]) == (10, 0)
    assert meta["image_imported"] and not lab.client.image_status(meta["image"]).image.id
    assert not ours(lab) and {pod.id for pod in lab.client.list_pod_sandboxes()} == before
    # the GPU pods went through cdi-shim (its log names each injection: 1 + 3 + the probe pod)
    assert injections(lab) - injected == 5
    report = done.stdout
    assert "A = GPU pod: nvidia.com/gpu=0 by annotation, handler nvidia" in report
    assert "B = pod without a device, handler (default)" in report
    assert "checked: A's container has /dev/nvidia0, B's not" in report
    assert "10 pods made, 0 left" in report
    for metric in ("start-up", "lifecycle", "runp", "create", "start"):
        assert any(line.strip().startswith(metric) and line.count("x") >= 2 for line in report.splitlines()), report


def test_a_handler_that_loses_the_request_fails_the_run_and_cleans_up(lab, tmp_path):
    """nvidia-noallow drops the cdi.k8s.io/ annotation: no figure from GPU pods without a GPU."""
    done = bench(lab, tmp_path, "--handler", "nvidia-noallow", "-n", "1")
    assert done.returncode == 1, done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not see /dev/nvidia0" in lines[0] and "nvidia-noallow" in lines[0], done.stderr
    assert not ours(lab)


def test_env_request_and_a_given_image(lab, tmp_path):
    """NVIDIA_VISIBLE_DEVICES=0 on the cdi-shim handler, the lab's busybox image (already there)."""
    from cdi_shim_lab.lab import IMAGE

    done = bench(lab, tmp_path, "--handler", "nvidia", "--request", "env", "--image", IMAGE, "-n", "1",
                 "--warmup", "0", "--json", "out.json")
    assert done.returncode == 0, done.stderr
    meta = json.loads((tmp_path / "out.json").read_text())["meta"]
    assert meta["command"] == ["true"] and not meta["image_imported"] and meta["check"]["checked"] is False
    assert lab.client.image_status(IMAGE).image.id     # a given image stays
    assert not ours(lab)


def test_no_endpoint_is_one_line_naming_the_socket(tmp_path):
    socket = tmp_path / "containerd.sock"
    done = subprocess.run([sys.executable, "-c", NO_LAB, "bench", "pods", "--endpoint", f"unix://{socket}",
                           "--handler", "nvidia"], capture_output=True, text=True, cwd=str(tmp_path))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(socket) in lines[0] and "is containerd running" in lines[0], done.stderr


@pytest.fixture(scope="module")
def nri_lab(tmp_path_factory, cri_build_dir):
    """containerd 1.7 (Debian trixie's, NRI turned on) with the real `cdi-shim nri` on its NRI socket."""
    from cdi_shim_lab.lab import LabError
    from cdi_shim_lab.nrilab import NRILab
    from tests.helpers import need

    for name, package in (("runc", "runc"), ("busybox", "busybox-static"), ("unshare", "util-linux")):
        need(name, package)
    lab = NRILab(tmp_path_factory.mktemp("nri-bench"), containerd="1.7", runtime_log=True)
    try:
        lab.setup()
        lab.start_plugin()
    except LabError as err:
        lab.stop()
        pytest.fail(str(err), pytrace=False)
    yield lab
    lab.stop()


def test_nri_on_the_default_handler(nri_lab, tmp_path):
    """--nri: both sides on containerd's default handler (runc), the device from the NRI plugin."""
    done = bench(nri_lab, tmp_path, "--nri", "-n", "2", "--warmup", "0", "--json", "out.json")
    assert done.returncode == 0, done.stderr
    meta = json.loads((tmp_path / "out.json").read_text())["meta"]
    assert (meta["nri"], meta["A_handler"], meta["B_handler"]) == (True, "", "")
    assert meta["check"] == {"checked": True, "node": "/dev/nvidia0", "baseline_sees_it": False}
    assert (meta["pods_made"], meta["pods_left"]) == (6, 0) and not ours(nri_lab)
    # a namespace the plugin does not serve: the GPU pod has no GPU, and the run says so
    refused = bench(nri_lab, tmp_path, "--nri", "--namespace", "elsewhere", "-n", "1")
    assert refused.returncode == 1 and "does not see /dev/nvidia0" in refused.stderr, refused.stderr
    assert not ours(nri_lab)
