"""A hostile driver root and dev root (issue 33): `cdi generate` never hands a container what
lies outside them. Each tree is built here from real parts: links, mknod'ed nodes of the wrong
major, a real listening socket, names that are not UTF-8, on top of the fake driver
(gcc-built libraries, the fake NVML through the real pynvml)."""
import json
import os
import shutil
import socket
import stat

import pytest
import yaml

import fakedriver
from fakedriver import VERSION


def load(path):
    with open(path) as stream:
        return yaml.safe_load(stream)


def host_paths(doc):
    """Every host path the spec hands to runc: mount sources and device nodes."""
    found = []
    for edits in [doc["containerEdits"]] + [d["containerEdits"] for d in doc["devices"]]:
        found += [m["hostPath"] for m in edits.get("mounts", [])]
        found += [n.get("hostPath", n["path"]) for n in edits.get("deviceNodes", [])]
    return found


@pytest.fixture
def fresh(tmp_path):
    """A fake driver of its own (the test plants things in it) and its runner."""
    fake = fakedriver.FakeDriver(tmp_path / "fake", gpus=1)
    runner = fakedriver.Runner(fake, tmp_path)
    runner.gpus(1)
    yield fake, runner
    fake.close()


# --- 1. IPC sockets and folders, and every other mount --------------------------------------------

def test_mps_folder_linked_to_the_host_root_is_refused(fresh):
    """`ln -s / R/tmp/nvidia-mps` would bind the host's / read-write into every GPU container."""
    fake, runner = fresh
    os.makedirs(fake.root + "/tmp")
    os.symlink("/", fake.root + "/tmp/nvidia-mps")
    done = runner.generate()
    assert f"warning: {fake.root}/tmp/nvidia-mps is a symbolic link (to /): refused" in done.stderr
    doc = load(runner.output)
    assert "/tmp/nvidia-mps" not in [m["containerPath"] for m in doc["containerEdits"]["mounts"]]
    assert "/" not in host_paths(doc)
    # the real folder where it is named is mounted, from the driver root
    os.unlink(fake.root + "/tmp/nvidia-mps")
    os.mkdir(fake.root + "/tmp/nvidia-mps")
    runner.generate()
    mounts = {m["containerPath"]: m for m in load(runner.output)["containerEdits"]["mounts"]}
    assert mounts["/tmp/nvidia-mps"]["hostPath"] == fake.root + "/tmp/nvidia-mps"


def test_ipc_socket_linked_to_a_host_socket_is_refused(fresh, tmp_path):
    """A socket path linked to the host's containerd socket (here a real listening socket outside
    the root) is never mounted; the one real socket is, at its resolved path."""
    fake, runner = fresh
    host_socket = socket.socket(socket.AF_UNIX)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        host_socket.bind("containerd.sock")
    finally:
        os.chdir(cwd)
    try:
        os.makedirs(fake.root + "/run/nvidia-fabricmanager")
        os.symlink(str(tmp_path / "containerd.sock"), fake.root + "/run/nvidia-fabricmanager/socket")
        # the persistenced socket through a folder link inside the root: resolved, not as named
        os.rename(fake.root + "/run/nvidia-persistenced", fake.root + "/run/persistenced.real")
        os.symlink("persistenced.real", fake.root + "/run/nvidia-persistenced")
        done = runner.generate()
    finally:
        host_socket.close()
    assert (f"warning: {fake.root}/run/nvidia-fabricmanager/socket is a symbolic link (to "
            f"{tmp_path}/containerd.sock): refused") in done.stderr
    doc = load(runner.output)
    mounts = {m["containerPath"]: m for m in doc["containerEdits"]["mounts"]}
    assert "/run/nvidia-fabricmanager/socket" not in mounts
    assert mounts["/run/nvidia-persistenced/socket"]["hostPath"] == fake.root + "/run/persistenced.real/socket"
    assert all(p.startswith((fake.root + "/", fake.dev_root + "/")) for p in host_paths(doc)), host_paths(doc)


def test_a_link_that_climbs_out_of_the_root_is_refused(fresh):
    """Links whose ".." climbs above the driver root (an in-root walk stops them at its top, as a
    chroot does: a driver never ships one) are left out with a warning naming them; an absolute
    link means the root's own file (test_generate: absolute links stay inside)."""
    fake, runner = fresh
    with open(fake.root + "/etc/host-secret", "w") as out:
        out.write("secret\n")
    climb = "../" * 30 + "etc/host-secret"
    optix = fake.root + "/usr/share/nvidia/nvoptix.bin"
    os.unlink(optix)
    os.symlink(climb, optix)
    smi = fake.root + "/usr/bin/nvidia-smi"
    os.unlink(smi)
    os.symlink("../" * 30 + "bin/sh", smi)
    os.makedirs(fake.root + "/bin")
    shutil.copy("/bin/sh", fake.root + "/bin/sh")
    done = runner.generate()
    assert f"warning: {optix} is a link to {climb}, which leads out of the driver root {fake.root}: refused" \
        in done.stderr
    assert f"warning: {smi} is a link to {'../' * 30}bin/sh, which leads out of the driver root" in done.stderr
    doc = load(runner.output)
    mounts = {m["containerPath"]: m["hostPath"] for m in doc["containerEdits"]["mounts"]}
    assert "/usr/share/nvidia/nvoptix.bin" not in mounts and "/usr/bin/nvidia-smi" not in mounts
    assert fake.root + "/etc/host-secret" not in mounts.values()


def test_every_mount_source_is_the_resolved_file(fresh):
    """Libraries, binaries, firmware and graphics files reached through links inside the root:
    the spec names the file the walk reached, never a path with a link in it."""
    fake, runner = fresh
    os.rename(fake.root + "/usr/share/nvidia", fake.root + "/usr/share/nvidia.real")
    os.symlink("/usr/share/nvidia.real", fake.root + "/usr/share/nvidia")      # absolute: the root's own
    os.makedirs(fake.root + "/var/tmp.real/nvidia-mps")
    os.symlink("/var/tmp.real", fake.root + "/tmp")                            # the MPS folder's parent
    runner.generate()
    doc = load(runner.output)
    for source in host_paths(doc):
        assert os.path.realpath(source) == source, source
    mounts = {m["containerPath"]: m["hostPath"] for m in doc["containerEdits"]["mounts"]}
    assert mounts["/usr/share/nvidia/nvoptix.bin"] == fake.root + "/usr/share/nvidia.real/nvoptix.bin"
    assert mounts["/tmp/nvidia-mps"] == fake.root + "/var/tmp.real/nvidia-mps"


# --- 2. device nodes -------------------------------------------------------------------------------

def _dev_root(run, tmp_path, gpus=2):
    dev_root = str(tmp_path / "devroot")
    run.driver.make_nodes(gpus, dev_root=dev_root)
    return dev_root


def _generate(run, dev_root, proc=None, check=0):
    return run.generate("--driver-root", run.driver.root, "--dev-root", dev_root, "--sysfs-root", run.driver.sysfs,
                        "--proc-root", proc or run.driver.proc, "--output", run.output, roots=False, output=False,
                        check=check)


def _replace_node(path, major, minor):
    os.unlink(path)
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))


def test_gpu_node_of_another_major_is_refused(run, tmp_path):
    """`mknod R/dev/nvidia1 c 1 3` (/dev/null's numbers, standing in for /dev/mem): GPU 1's node is
    refused by name and number, and the spec (which needs it) is not written."""
    dev_root = _dev_root(run, tmp_path)
    _replace_node(f"{dev_root}/dev/nvidia1", 1, 3)
    done = _generate(run, dev_root, check=1)
    assert (f"/dev/nvidia1 under the dev root {dev_root} (GPU 1 (GPU-00000001-1111-2222-3333-000000000001, minor "
            f"number 1)): {dev_root}/dev/nvidia1 (/dev/nvidia1) is the character device 1:3, not one of major 195 "
            "(NVIDIA): left out") in done.stderr
    assert not os.path.exists(run.output)


def test_gpu_node_linked_to_a_host_node_is_never_the_host_s(run, tmp_path):
    """`ln -s /dev/null R/dev/nvidia1`: resolved inside the dev root, where there is no /dev/null:
    missing, never the host's /dev/null; with a /dev/null of its own there, refused by its major."""
    dev_root = _dev_root(run, tmp_path)
    os.unlink(f"{dev_root}/dev/nvidia1")
    os.symlink("/dev/null", f"{dev_root}/dev/nvidia1")
    done = _generate(run, dev_root, check=1)
    assert f"/dev/nvidia1 under the dev root {dev_root} (GPU 1" in done.stderr and "is missing" in done.stderr
    os.mknod(f"{dev_root}/dev/null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    done = _generate(run, dev_root, check=1)
    assert f"{dev_root}/dev/null (/dev/nvidia1) is the character device 1:3, not one of major 195" in done.stderr
    # a link to a real GPU node inside the dev root is fine: the spec names the node itself
    os.unlink(f"{dev_root}/dev/nvidia1")
    os.mknod(f"{dev_root}/dev/nvidia1.node", 0o666 | stat.S_IFCHR, os.makedev(195, 1))
    os.symlink("nvidia1.node", f"{dev_root}/dev/nvidia1")
    _generate(run, dev_root)
    devices = {d["name"]: d["containerEdits"] for d in load(run.output)["devices"]}
    assert devices["1"]["deviceNodes"][0] == {"path": "/dev/nvidia1", "hostPath": f"{dev_root}/dev/nvidia1.node"}


def test_optional_nodes_of_the_wrong_major_are_left_out_with_a_warning(run, tmp_path):
    """nvidia-uvm's major is the one /proc/devices gives (not 511 here), nvidia-modeset's 195,
    a DRM node's 226: each other one is left out, named, and the rest of the spec written."""
    dev_root = _dev_root(run, tmp_path)
    proc = str(tmp_path / "proc")
    fakedriver.write_proc_devices(proc, uvm=fakedriver.UVM_MAJOR - 1)
    _replace_node(f"{dev_root}/dev/nvidia-modeset", 1, 1)
    card, _render = fakedriver.drm_names(0)
    _replace_node(f"{dev_root}/dev/dri/{card}", 8, 0)         # a disk's numbers
    done = _generate(run, dev_root, proc)
    uvm = fakedriver.UVM_MAJOR
    for node, numbers, major, where in (
            ("nvidia-uvm", f"{uvm}:0", uvm - 1, f"nvidia-uvm in {proc}/devices"),
            ("nvidia-uvm-tools", f"{uvm}:1", uvm - 1, f"nvidia-uvm in {proc}/devices"),
            ("nvidia-modeset", "1:1", 195, "NVIDIA"), (f"dri/{card}", "8:0", 226, "DRM")):
        assert (f"warning: {dev_root}/dev/{node} (/dev/{node}) is the character device {numbers}, not one of major "
                f"{major} ({where}): left out") in done.stderr, done.stderr
    doc = load(run.output)
    assert [n["path"] for n in doc["containerEdits"]["deviceNodes"]] == ["/dev/nvidiactl"]
    devices = {d["name"]: d["containerEdits"] for d in doc["devices"]}
    assert [n["path"] for n in devices["0"]["deviceNodes"]] == ["/dev/nvidia0", "/dev/dri/renderD128"]
    assert [a for a in devices["0"]["hooks"][0]["args"] if a.endswith("-card")] == []   # its by-path link too
    # a module that is not loaded (no nvidia-uvm in /proc/devices): its nodes cannot be checked
    fakedriver.write_proc_devices(proc, uvm=None)
    done = _generate(run, dev_root, proc)
    assert (f"warning: {dev_root}/dev/nvidia-uvm (/dev/nvidia-uvm): nvidia-uvm in {proc}/devices has no major "
            "number for it") in done.stderr


def test_mig_capability_node_of_another_major_is_refused(run, tmp_path):
    from test_generate import _mig_setup

    proc = _mig_setup(run, tmp_path)
    fakedriver.write_proc_devices(proc, caps=fakedriver.CAPS_MAJOR + 1)
    done = _generate(run, run.driver.dev_root, proc, check=1)
    caps = f"{run.driver.dev_root}/dev/nvidia-caps/nvidia-cap12"
    assert (f"{caps} (/dev/nvidia-caps/nvidia-cap12) is the character device {fakedriver.CAPS_MAJOR}:12, not one of "
            f"major {fakedriver.CAPS_MAJOR + 1} (nvidia-caps in {proc}/devices)") in done.stderr
    run.gpus(2)


def test_gid_on_every_node_of_a_group_other_than_root_s(run, tmp_path):
    """nvidia-ctk 1.20 parity (issue 31 item 6): a node whose group is not root's carries that gid
    even when it is world-accessible (0666); only a group-only node adds additionalGids (and so
    cdiVersion 0.7.0)."""
    dev_root = str(tmp_path / "devroot")
    run.driver.make_nodes(2, dev_root=dev_root, drm_mode=0o666, drm_gid=44)
    done = _generate(run, dev_root)
    assert "cdiVersion 0.5.0" in done.stderr, done.stderr
    doc = load(run.output)
    for device in doc["devices"]:
        edits = device["containerEdits"]
        assert "additionalGids" not in edits
        for node in edits["deviceNodes"]:
            assert node.get("gid") == (44 if node["path"].startswith("/dev/dri/") else None), node
    assert all("gid" not in n for n in doc["containerEdits"]["deviceNodes"])     # root's group: none
    run.cli("cdi", "validate", run.output, check=0)


# --- 5. names that are not UTF-8 ------------------------------------------------------------------

def test_names_that_are_not_utf8_are_skipped_with_a_warning(fresh):
    """A library and a firmware file whose names are not valid UTF-8: skipped, named (\\xff),
    and the spec written and valid (it used to crash in the YAML writer)."""
    fake, runner = fresh
    libdir = os.fsencode(fake.libdir)
    shutil.copy(fake.libdir + f"/libnvidia-fbc.so.{VERSION}", libdir + b"/libnvidia-evil\xff.so." + VERSION.encode())
    firmware = os.fsencode(fake.root + f"/lib/firmware/nvidia/{VERSION}")
    with open(firmware + b"/gsp_\xfe.bin", "wb") as out:
        out.write(b"firmware")
    done = runner.generate()
    assert f"warning: {fake.libdir}/libnvidia-evil\\xff.so.{VERSION}: the name is not valid UTF-8, left out" \
        in done.stderr
    assert f"/lib/firmware/nvidia/{VERSION}/gsp_\\xfe.bin: the name is not valid UTF-8, left out" in done.stderr
    doc = load(runner.output)
    assert not any("evil" in p or "gsp_" in p and "\ufffd" in p for p in host_paths(doc))
    runner.cli("cdi", "validate", runner.output, check=0)
    # the same through a link: a valid name leading to one that is not
    os.symlink(b"libnvidia-evil\xff.so." + VERSION.encode(), libdir + b"/libnvidia-ok.so." + VERSION.encode())
    done = runner.generate()
    assert f"leads to {fake.libdir}/libnvidia-evil\\xff.so.{VERSION}, whose name is not valid UTF-8" in done.stderr
    assert json.dumps(load(runner.output))     # plain text throughout
