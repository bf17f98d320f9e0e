"""podman run with cdi-shim as its runtime, through real podman 4.3 (bookworm's own) and 5.8
(forky's, unpacked with its own glibc into $CDI_SHIM_TEST_CACHE: cdi_shim_lab/releases.py), each with
its own storage, run root, tmp dir and containers.conf, no network, in a private mount namespace
whose /var/run/cdi is the lab's spec folder (cdi_shim_lab/podmanlab.py). containers.conf is written by
the real `cdi-shim runtime configure --runtime=podman`.

The GPU is the tests' fake driver (tests/generate/fakedriver.py: gcc-built libraries, mknod'd
nodes) and its spec is the one `cdi-shim cdi generate` writes, twice:

* nvidia.com/gpu: its hooks name a stand-in program that only logs and fails. Where cdi-shim is
  the runtime it does their work natively and drops them, so the stand-in never runs; under
  plain runc podman's hooks run it, and the container fails (the control);
* cdi-shim.dev/gpu: its hooks name cdi-shim-hook, so plain runc gets the same container.

A podman that cannot start FAILS the tests with the reason (never a skip).
"""
import os
import subprocess

import pytest

VERSIONS = ("4.3", "5.8")
REPORT = ("ls -l /dev/nvidia0 2>&1; /prog; for lib in libnvidia-ml.so.1 libcuda.so.1; do "
          "grep -q $lib /etc/ld.so.cache && echo cached=$lib; done; "
          "echo link=$(readlink /usr/lib/x86_64-linux-gnu/libcuda.so); true")


def _generate(lab, driver, output, hook_program, kind=()):
    out = subprocess.run([lab.cli, "cdi", "generate", "--driver-root", driver.root, "--dev-root", driver.dev_root,
                          "--sysfs-root", driver.sysfs, "--proc-root", driver.proc, "--output", output,
                          "--hook-program", hook_program, *kind], env=lab.env(), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


@pytest.fixture(scope="module", params=VERSIONS)
def podman(request, tmp_path_factory):
    if os.geteuid() != 0:
        pytest.fail("the podman tests run root podman with runc: run them as root", pytrace=False)
    from cdi_shim_lab.lab import LabError
    from cdi_shim_lab.podmanlab import PodmanLab
    from tests.generate.fakedriver import FakeDriver

    version = request.param
    base = tmp_path_factory.mktemp(f"podman-{version}")
    driver = FakeDriver(base / "fake-driver", gpus=2)
    driver.close()
    lab = None
    try:
        lab = PodmanLab(base / "lab", version)
        lab.setup()
    except LabError as err:
        if lab is not None:
            lab.stop()
        pytest.fail(f"podman {version}: {err} (needs root, apt-get, Debian's archive, and: apt-get install podman "
                    "conmon runc patchelf busybox-static gcc util-linux)", pytrace=False)
    lab.hook_log = str(base / "stand-in.log")
    stand_in = base / "nvidia-cdi-hook"
    stand_in.write_text(f'#!/bin/sh\necho "$@" >> {lab.hook_log}\nexit 1\n')
    stand_in.chmod(0o755)
    _generate(lab, driver, os.path.join(lab.spec_dir, "nvidia.yaml"), str(stand_in))
    _generate(lab, driver, os.path.join(lab.spec_dir, "cdi-shim-dev.yaml"), lab.hook_program,
              ("--vendor", "cdi-shim.dev"))
    yield lab
    lab.stop()


def report(lab, *args):
    out = lab.run(*args, command=("sh", "-c", REPORT))
    assert out.returncode == 0, f"podman run {' '.join(args)} on {lab.version}: {out.stderr.strip()}"
    return out.stdout


def has_gpu(text):
    """The device node, the driver's libraries loaded through the linker cache the spec's
    update-ldcache hook made, and the create-symlinks hook's link."""
    return ("195,   0" in text and "libnvidia-ml.so.1=loaded" in text and "libcuda.so.1=loaded" in text
            and "cached=libnvidia-ml.so.1" in text and "cached=libcuda.so.1" in text and "link=libcuda.so.1" in text)


def test_configure_registered_the_runtime_and_kept_runc(podman):
    from shim.node.podman_config import load_containers_conf, runtimes_of

    doc = load_containers_conf(podman.containers_conf)
    assert runtimes_of(doc) == {"runc": [podman.runc], "cdi-shim": [podman.runtime_binary]}
    assert doc["engine"]["runtime"] == "runc"
    again = podman.configure()
    assert "nothing changed" in again.stderr


def test_device_injected_by_podman_and_hooks_done_natively(podman):
    out = report(podman, "--runtime", "cdi-shim", "--device", "nvidia.com/gpu=0")
    assert has_gpu(out), out
    assert not os.path.exists(podman.hook_log), "the spec's hook program ran under cdi-shim"


def test_under_runc_the_spec_hooks_run(podman):
    # the control: podman's hooks run the spec's program (the stand-in fails the container) ...
    failed = podman.run("--device", "nvidia.com/gpu=0", command=("true",))
    assert failed.returncode != 0 and os.path.exists(podman.hook_log), failed.stderr
    os.unlink(podman.hook_log)
    # ... and with a working hook program, runc gets the same container as cdi-shim
    assert has_gpu(report(podman, "--device", "cdi-shim.dev/gpu=0"))
    assert has_gpu(report(podman, "--runtime", "cdi-shim", "--device", "cdi-shim.dev/gpu=0"))


def test_without_a_request_nothing_is_injected(podman):
    out = report(podman, "--runtime", "cdi-shim")
    assert "No such file" in out and "libcuda.so.1=loaded" not in out


def test_env_request_through_cdi_shim(podman):
    out = report(podman, "--runtime", "cdi-shim", "-e", "NVIDIA_VISIBLE_DEVICES=0")
    assert has_gpu(out), out
    assert not has_gpu(report(podman, "-e", "NVIDIA_VISIBLE_DEVICES=0"))   # runc ignores it
    assert not os.path.exists(podman.hook_log)


def test_set_as_default(podman):
    """--set-as-default: plain `podman run --device` goes through cdi-shim; podman needs no restart."""
    with open(podman.containers_conf) as stream:
        before = stream.read()
    out = podman.configure("--set-as-default")
    assert "podman needs no restart" in out.stderr and "loaded by podman" in out.stderr
    try:
        assert has_gpu(report(podman, "--device", "nvidia.com/gpu=0"))
        assert not os.path.exists(podman.hook_log)
    finally:
        with open(podman.containers_conf, "w") as stream:
            stream.write(before)


def test_gpus_flag(podman):
    """podman 5's --gpus N asks for nvidia.com/gpu=N (podman injects it; cdi-shim does the hooks);
    4.3 takes the flag and ignores it: the container starts without a GPU."""
    out = report(podman, "--runtime", "cdi-shim", "--gpus", "0")
    if podman.version == "4.3":
        assert not has_gpu(out) and "No such file" in out
    else:
        assert has_gpu(out), out
        assert not os.path.exists(podman.hook_log)


def test_device_through_the_resident_process(tmp_path):
    """As on a node: `cdi-shim runtime serve` runs (in the mount namespace podman's runtime runs
    in), and a create that needs Python goes to its workers."""
    from cdi_shim_lab.lab import LabError
    from cdi_shim_lab.podmanlab import PodmanLab
    from tests.generate.fakedriver import FakeDriver

    driver = FakeDriver(tmp_path / "fake-driver", gpus=1)
    driver.close()
    lab = PodmanLab(tmp_path / "lab", "5.8", resident=True)
    try:
        try:
            lab.setup()
        except LabError as err:
            pytest.fail(f"podman 5.8 with the resident process: {err}", pytrace=False)
        _generate(lab, driver, os.path.join(lab.spec_dir, "nvidia.yaml"), "/nonexistent/nvidia-cdi-hook")
        log = str(tmp_path / "runtime.log")
        lab.write_shim_config(**{"log-file": log, "log-level": "debug"})
        assert has_gpu(report(lab, "--runtime", "cdi-shim", "--device", "nvidia.com/gpu=0"))
        assert has_gpu(report(lab, "--runtime", "cdi-shim", "-e", "NVIDIA_VISIBLE_DEVICES=0"))
        with open(log) as stream:
            totals = [line for line in stream if "phase=total" in line]
        assert len(totals) == 2 and all(" in resident process " in line for line in totals), totals
    finally:
        lab.stop()
