"""docker run with cdi-shim, through real dockerd 20.10, 26.1 and 28.5 (Debian's docker.io of
bookworm, trixie and forky, fetched once into $CDI_SHIM_TEST_CACHE: cdi_shim_lab/releases.py), each
with its own containerd, data-root, exec-root, socket, no iptables and no bridge (cdi_shim_lab/dockerlab.py).
daemon.json is written by the real `cdi-shim runtime configure --runtime=docker` (with --cdi on 26
and 28); cdi-shim's nvidia-container-runtime-hook is on each dockerd's PATH (what offers --gpus).

Which path each request takes:
* `--runtime=cdi-shim -e NVIDIA_VISIBLE_DEVICES=0`: cdi-shim's env request, every version;
* `--gpus all` / `--gpus '"device=0"'`: dockerd adds NVIDIA_VISIBLE_DEVICES and the legacy prestart
  hook (every version: moby's daemon/nvidia_linux.go); cdi-shim-runtime makes the request and drops
  the hook; under plain runc the hook fails, saying to select cdi-shim;
* `--device nvidia.com/gpu=0`: dockerd's own CDI (26, 28, features.cdi on); where cdi-shim is the
  runtime, it does the spec's hooks natively.

A daemon that cannot start FAILS the tests with the reason (never a skip).
"""
import os

import pytest

VERSIONS = ("20.10", "26.1", "28.5")
REPORT = ("ls -l /dev/nvidia0 2>&1; cat /usr/local/fake-driver/version.txt 2>&1; "
          "echo FAKE_GPU_INDEX=$FAKE_GPU_INDEX; readlink /usr/lib/libnvidia-fake.so; true")


@pytest.fixture(scope="module", params=VERSIONS)
def docker(request, tmp_path_factory):
    if os.geteuid() != 0:
        pytest.fail("the Docker tests run private dockerd and containerd with runc: run them as root", pytrace=False)
    from cdi_shim_lab.dockerlab import DockerLab
    from cdi_shim_lab.lab import LabError

    version = request.param
    lab = None
    try:
        lab = DockerLab(tmp_path_factory.mktemp(f"docker-{version}"), version, cdi=version != "20.10")
        lab.setup()
    except LabError as err:
        if lab is not None:
            lab.stop()
        pytest.fail(f"Docker {version}: {err} (needs root, apt-get, Debian's archive, and: apt-get install "
                    "runc containerd busybox-static util-linux)", pytrace=False)
    yield lab
    lab.stop()


def report(lab, *args):
    out = lab.run(*args, command=("sh", "-c", REPORT))
    assert out.returncode == 0, f"docker run {' '.join(args)} on {lab.version}: {out.stderr.strip()}"
    return out.stdout


def has_gpu(text):
    return "195,   0" in text and "/dev/nvidia0" in text and "FAKE_GPU_INDEX=0" in text


def test_without_a_request_nothing_is_injected(docker):
    assert not has_gpu(report(docker, "--runtime=cdi-shim"))
    assert "No such file" in report(docker, "--runtime=cdi-shim")


def test_runtime_and_env_request(docker):
    out = report(docker, "--runtime=cdi-shim", "-e", "NVIDIA_VISIBLE_DEVICES=0")
    assert has_gpu(out) and "fake driver 555.42" in out


def test_env_request_under_plain_runc_gets_nothing(docker):
    # the control: the device comes from cdi-shim, not from the daemon
    assert not has_gpu(report(docker, "-e", "NVIDIA_VISIBLE_DEVICES=0"))


@pytest.mark.parametrize("gpus", ["all", '"device=0"', "device=0", "1"])
def test_gpus_through_cdi_shim(docker, gpus):
    out = report(docker, "--runtime=cdi-shim", "--gpus", gpus)
    assert has_gpu(out) and "fake driver 555.42" in out
    assert not os.path.exists(docker.hook_log)


def test_gpus_the_daemons_value_wins_over_the_users(docker):
    """dockerd appends its NVIDIA_VISIBLE_DEVICES after the image's and the user's (-e): with the
    --gpus hook, only that last value is the request (an image such as nvidia/cuda sets =all)."""
    out = docker.run("--runtime=cdi-shim", "-e", "NVIDIA_VISIBLE_DEVICES=all", "--gpus", "device=1",
                     command=("sh", "-c", "ls /dev/; echo FAKE_GPU_INDEX=$FAKE_GPU_INDEX"))
    assert out.returncode == 0, out.stderr
    names = out.stdout.split()
    assert "nvidia1" in names and "nvidia0" not in names and "FAKE_GPU_INDEX=1" in names
    both = report(docker, "--runtime=cdi-shim", "--gpus", "all")
    assert "/dev/nvidia0" in both


def test_gpus_with_env_requests_off(docker):
    """device-env = "" turns env requests off, but --gpus is the daemon's request: the front end's
    byte scan must send a config with the legacy hook to Python (else runc runs the failing hook)."""
    docker.write_shim_config(**{"device-env": ""})
    try:
        assert not has_gpu(report(docker, "--runtime=cdi-shim", "-e", "NVIDIA_VISIBLE_DEVICES=0"))
        assert has_gpu(report(docker, "--runtime=cdi-shim", "--gpus", "all"))
    finally:
        docker.write_shim_config()


def test_gpus_count_zero_starts_without_a_device(docker):
    # `--gpus 0`: NVIDIA_VISIBLE_DEVICES=void and the hook; the hook still goes
    assert not has_gpu(report(docker, "--runtime=cdi-shim", "--gpus", "0"))


def test_gpus_without_our_runtime_fails_saying_to_select_it(docker):
    out = docker.run("--gpus", "all", command=("true",))
    assert out.returncode != 0
    assert "--runtime=cdi-shim" in out.stderr and "nvidia-container-runtime-hook (cdi-shim)" in out.stderr


def test_gpus_as_default_runtime(docker):
    """--set-as-default (a reload is enough: runtimes and default-runtime), then plain `--gpus all`."""
    with open(docker.daemon_json) as stream:
        before = stream.read()
    out = docker.configure("--set-as-default")
    assert "must restart" not in out.stderr
    docker.restart_daemon()
    try:
        assert has_gpu(report(docker, "--gpus", "all"))
        assert has_gpu(report(docker, "-e", "NVIDIA_VISIBLE_DEVICES=0"))
    finally:
        with open(docker.daemon_json, "w") as stream:
            stream.write(before)
        docker.restart_daemon()


def test_cdi_device_injected_by_the_daemon(docker):
    if docker.version == "20.10":
        out = docker.run("--device", "nvidia.com/gpu=0", command=("true",))
        assert out.returncode != 0  # 20.10 takes it for a host path
        return
    assert has_gpu(report(docker, "--device", "nvidia.com/gpu=0"))
    assert has_gpu(report(docker, "--runtime=cdi-shim", "--device", "nvidia.com/gpu=0"))


def test_cdi_device_hooks_done_natively_by_cdi_shim(docker):
    if docker.version == "20.10":
        # no CDI in this daemon: configure refuses to turn it on, and changes nothing
        with open(docker.daemon_json) as stream:
            before = stream.read()
        out = docker.configure("--cdi", check=False)
        assert out.returncode != 0 and "Docker 20.10.24" in out.stderr and "no CDI support" in out.stderr
        with open(docker.daemon_json) as stream:
            assert stream.read() == before
        return
    out = report(docker, "--runtime=cdi-shim", "--device", "cdi-shim.dev/hooked=0")
    assert "libnvidia-fake.so.1" in out and "/dev/nvidia0" in out
    assert not os.path.exists(docker.hook_log), "the hook program ran under cdi-shim"
    # under plain runc the spec's hook program runs (and, being a stand-in, fails)
    failed = docker.run("--device", "cdi-shim.dev/hooked=0", command=("true",))
    assert failed.returncode != 0 and os.path.exists(docker.hook_log)
    os.unlink(docker.hook_log)


def test_gpus_and_cdi_device_through_the_resident_process(tmp_path):
    """As on a node: `cdi-shim runtime serve` runs (in containerd's mount namespace, where the shims
    call the runtime), and the creates that need Python go to its workers."""
    from cdi_shim_lab.dockerlab import DockerLab
    from cdi_shim_lab.lab import LabError

    lab = DockerLab(tmp_path, "28.5", cdi=True, resident=True)
    try:
        try:
            lab.setup()
        except LabError as err:
            pytest.fail(f"Docker 28.5 with the resident process: {err}", pytrace=False)
        log = str(tmp_path / "runtime.log")
        lab.write_shim_config(**{"log-file": log, "log-level": "debug"})
        assert has_gpu(report(lab, "--runtime=cdi-shim", "--gpus", "all"))
        assert has_gpu(report(lab, "--runtime=cdi-shim", "-e", "NVIDIA_VISIBLE_DEVICES=0"))
        with open(log) as stream:
            totals = [line for line in stream if "phase=total" in line]
        assert len(totals) == 2 and all(" in resident process " in line for line in totals), totals
    finally:
        lab.stop()


@pytest.mark.parametrize("version, injects", [("26.1", False), ("28.5", True)])
def test_without_the_cdi_feature_only_28_injects(tmp_path, version, injects):
    """What doctor's docker.cdi and configure's --cdi rest on: 25.0-28.1 inject CDI devices only with
    features.cdi, 28.2 and later unless it is false."""
    import json

    from cdi_shim_lab.dockerlab import DockerLab
    from cdi_shim_lab.lab import LabError

    lab = DockerLab(tmp_path, version, cdi=False)
    try:
        try:
            lab.setup()
            with open(lab.daemon_json) as stream:
                doc = json.load(stream)
            assert "features" not in doc
            doc["cdi-spec-dirs"] = [lab.spec_dir]
            with open(lab.daemon_json, "w") as stream:
                json.dump(doc, stream)
            lab.restart_daemon()
        except LabError as err:
            pytest.fail(f"Docker {version}: {err}", pytrace=False)
        out = lab.run("--device", "nvidia.com/gpu=0", command=("ls", "/dev/nvidia0"))
        assert (out.returncode == 0) == injects, out.stderr
        if not injects:
            assert 'could not select device driver "cdi"' in out.stderr
    finally:
        lab.stop()
