"""A generated spec runs: a real runc container started through `cdi-shim-runtime --device
nvidia.com/gpu=<UUID>` gets that GPU's node (and no other), the driver's libraries in its
linker cache, the create-symlinks links, and the driver's binaries (the World of
tests/runtime/runtime_helpers.py: busybox rootfs, private runc root and config)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runtime"))
import runtime_helpers as rh  # noqa: E402

from fakedriver import LIBDIR, VERSION, bus_id  # noqa: E402

SCRIPT = ("echo '== dev'; ls /dev; "
          "echo '== dri'; ls /dev/dri; "
          "echo '== by-path'; for l in /dev/dri/by-path/*; do echo $l $(readlink $l); done; "
          "echo '== xorg'; ls /usr/lib/xorg/modules/drivers /etc/vulkan/icd.d; "
          "echo '== smi'; /usr/bin/nvidia-smi; "
          f"echo '== links'; ls {LIBDIR}; "
          "echo '== cache'; grep -c libcuda.so.1 /etc/ld.so.cache; "
          "echo '== env'; env; echo '== end'")


def sections(text):
    out, current = {}, None
    for line in text.splitlines():
        if line.startswith("== "):
            current = out.setdefault(line[3:], [])
        elif current is not None:
            current.append(line)
    return out


@pytest.mark.runtime_e2e
@pytest.mark.parametrize("mode", ["run", "create"])
def test_container_with_a_generated_spec_gets_the_gpu(driver, run, tmp_path, mode):
    world = rh.World(tmp_path / "world")
    try:
        os.unlink(os.path.join(world.spec_dir, "nvidia-gpu.yaml"))   # the world's own nvidia.com/gpu spec
        run.gpus(2)
        run.generate("--output", os.path.join(world.spec_dir, "nvidia.yaml"), output=False)
        uuid = driver.uuids(2)[1]
        bundle = world.bundle(args=("sh", "-c", SCRIPT))
        out_path = os.path.join(world.base, "out.txt")
        with open(out_path, "wb") as out:
            if mode == "run":
                done = world.shim("--device", f"nvidia.com/gpu={uuid}", "run", "--bundle", bundle.path, bundle.id,
                                  stdout=out, stderr=None, capture_output=False)
                assert done.returncode == 0
            else:
                done = world.shim("--device", f"nvidia.com/gpu={uuid}", "create", "--bundle", bundle.path,
                                  bundle.id, stdout=out, stderr=None, capture_output=False)
                assert done.returncode == 0
                assert world.shim("start", bundle.id).returncode == 0
                world.wait_stopped(bundle.id)
                assert world.shim("delete", bundle.id).returncode == 0
        with open(out_path) as stream:
            report = sections(stream.read())
    finally:
        world.cleanup()
    assert "end" in report, report
    dev = report["dev"]
    assert "nvidia1" in dev and "nvidia0" not in dev
    for node in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"):
        assert node in dev
    assert report["dri"] == ["by-path", "card2", "renderD129"]      # GPU 1's DRM nodes, no other GPU's
    assert report["by-path"] == [f"/dev/dri/by-path/pci-{bus_id(1)}-card ../card2",
                                 f"/dev/dri/by-path/pci-{bus_id(1)}-render ../renderD129"]
    assert report["xorg"] == ["/etc/vulkan/icd.d:", "nvidia_icd.json", "", "/usr/lib/xorg/modules/drivers:",
                              "nvidia_drv.so"]
    assert report["smi"] == [f"nvidia-smi {VERSION}"]
    links = report["links"]
    for name in (f"libcuda.so.{VERSION}", "libcuda.so.1", "libcuda.so", "libnvidia-ml.so.1", "vdpau"):
        assert name in links, links
    assert int(report["cache"][0]) >= 1
    assert "NVIDIA_VISIBLE_DEVICES=void" in report["env"]
    assert f"NVIDIA_CTK_LIBCUDA_DIR={LIBDIR}" in report["env"]


@pytest.mark.runtime_e2e
def test_a_process_not_root_can_open_group_only_drm_nodes(driver, run, tmp_path):
    """DRM nodes of mode 0660, group 44 (video): the generated spec (cdiVersion 0.7.0) gives
    the node that group and the process that supplementary group, so uid 1000 may open it.
    (The fake node has no driver behind it: opening it fails with ENXIO/ENODEV once the
    permission check has passed; the control, a 0640 file of group 45, says EACCES.)"""
    world = rh.World(tmp_path / "world")
    try:
        os.unlink(os.path.join(world.spec_dir, "nvidia-gpu.yaml"))
        dev_root = str(tmp_path / "devroot")
        driver.make_nodes(2, dev_root=dev_root, drm_mode=0o660, drm_gid=44)
        run.gpus(2)
        done = run.generate("--driver-root", driver.root, "--dev-root", dev_root, "--sysfs-root", driver.sysfs,
                            "--proc-root", driver.proc, "--output", os.path.join(world.spec_dir, "nvidia.yaml"),
                            roots=False, output=False)
        assert "cdiVersion 0.7.0" in done.stderr, done.stderr

        def as_user(config):
            config["process"]["user"] = {"uid": 1000, "gid": 1000}

        script = ("echo \"groups=$(id -G)\"; echo \"node=$(stat -c '%g %a' /dev/dri/card2)\"; "
                  "cat /dev/dri/card2 2>&1; cat /secret 2>&1; true")
        bundle = world.bundle(args=("sh", "-c", script), edit=as_user)
        with open(os.path.join(bundle.rootfs, "secret"), "w") as out:
            out.write("secret\n")
        os.chown(os.path.join(bundle.rootfs, "secret"), 0, 45)
        os.chmod(os.path.join(bundle.rootfs, "secret"), 0o640)
        done = world.shim("--device", f"nvidia.com/gpu={driver.uuids(2)[1]}", "run", "--bundle", bundle.path,
                          bundle.id)
    finally:
        world.cleanup()
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "44" in lines[0].split("=", 1)[1].split(), lines
    assert lines[1] == "node=44 660"
    assert "/dev/dri/card2" in lines[2] and "Permission denied" not in lines[2], lines
    assert "No such device" in lines[2], lines
    assert "/secret" in lines[3] and "Permission denied" in lines[3], lines
