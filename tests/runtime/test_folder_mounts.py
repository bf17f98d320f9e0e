"""A folder of driver libraries mounted whole (the GKE layout, /usr/local/nvidia/lib64) and
asked of update-ldcache: under runc with nvidia-cdi-hook, ldconfig runs after runc's mounts and
finds the folder's libraries; the native step reads them through the mount's host source
(shim/ldconfig/mounted.py). Real runc, the real loader, a gcc-built library with a real SONAME."""
import os
import subprocess

import pytest

import runtime_helpers as rh
from test_hook_fidelity import _request
from test_runtime_toolkit_hooks import PROGRAM, VERSION, _absent_params, _hook

RESIDENT_TOO = True
FOLDER = "/usr/local/nvidia/lib64"


def _spec(world, host_folder, folder=FOLDER):
    return ('cdiVersion: "0.5.0"\nkind: nvidia.com/gpu\n'
            'devices:\n  - name: "0"\n    containerEdits:\n'
            f"      deviceNodes: [{{path: /dev/nvidia0, hostPath: {world.node(0)}}}]\n"
            "containerEdits:\n"
            "  mounts:\n"
            f"    - hostPath: {host_folder}\n      containerPath: {folder}\n"
            "      options: [ro, nosuid, nodev, rbind, rprivate]\n"
            "  hooks:\n" + _hook("update-ldcache", "--folder", folder))


def _host_folder(tmp_path, driver, answer=42):
    """The host folder as a driver installer leaves it: the versioned file and its soname link."""
    folder = tmp_path / "host-lib64"
    folder.mkdir(exist_ok=True)
    rh.library(folder / f"libnvidia-ml.so.{VERSION}", "libnvidia-ml.so.1",
             f"int cdi_shim_fake(void) {{ return {answer}; }}\n")
    if not os.path.lexists(folder / "libnvidia-ml.so.1"):
        os.symlink(f"libnvidia-ml.so.{VERSION}", folder / "libnvidia-ml.so.1")
    return folder


def _cache_listing(world, bundle):
    cache = bundle.rootfs + "/etc/ld.so.cache"      # (written where the hook's ldconfig writes it)
    return subprocess.run([os.path.join(rh.VENV_BIN, "cdi-shim"), "ldcache", "list", "--cache", cache],
                          env=world.env(), capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("how", ["preinjected", "annotation"])
def test_a_folder_mounted_whole_is_in_the_cache(world, driver, tmp_path, how):
    """The program links libnvidia-ml.so.1 by soname and runs: the loader finds it through our
    cache at the mounted folder (the hook is dropped)."""
    host = _host_folder(tmp_path, driver)
    world.write_spec("nvidia-gpu.yaml", _spec(world, host))
    bundle = world.bundle(args=["/prog"])
    rh.glibc_image(bundle.rootfs, PROGRAM, str(host / f"libnvidia-ml.so.{VERSION}"), str(tmp_path), ["-ldl"])
    subprocess.run([rh.need("ldconfig", "libc-bin"), "-r", bundle.rootfs], check=True, timeout=60)
    _request(world, bundle, how)
    result = world.shim("run", "--bundle", bundle.path, bundle.id, env=world.env(**_absent_params(tmp_path)))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "linked=42 cuda=-1", result.stdout
    assert f"{FOLDER}/libnvidia-ml.so.1" in _cache_listing(world, bundle)
    assert "nvidia-cdi-hook" not in bundle.read_bytes().decode()     # done natively, not left to runc


@pytest.mark.parametrize("how", ["preinjected", "annotation"])
def test_a_folder_mounted_over_an_image_folder_hides_its_libraries(world, driver, tmp_path, how):
    """The image has its own /usr/local/nvidia/lib64 (listed in ld.so.conf) with a libold.so.1;
    the mount hides it: the cache has the host folder's library, not the hidden one (ldconfig
    after runc's mounts never sees it)."""
    host = _host_folder(tmp_path, driver)
    world.write_spec("nvidia-gpu.yaml", _spec(world, host))
    bundle = world.bundle(args=["/prog"])
    rootfs = bundle.rootfs
    rh.glibc_image(rootfs, PROGRAM, str(host / f"libnvidia-ml.so.{VERSION}"), str(tmp_path), ["-ldl"])
    os.makedirs(rootfs + FOLDER)
    rh.library(rootfs + FOLDER + "/libold.so.1", "libold.so.1", "int old(void) { return 1; }\n")
    with open(rootfs + "/etc/ld.so.conf.d/nvidia.conf", "w") as out:
        out.write(FOLDER + "\n")
    subprocess.run([rh.need("ldconfig", "libc-bin"), "-r", rootfs], check=True, timeout=60)
    _request(world, bundle, how)
    result = world.shim("run", "--bundle", bundle.path, bundle.id, env=world.env(**_absent_params(tmp_path)))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "linked=42 cuda=-1", result.stdout
    listing = _cache_listing(world, bundle)
    assert f"{FOLDER}/libnvidia-ml.so.1" in listing
    assert "libold.so.1" not in listing, listing


def test_a_changed_host_folder_is_not_served_stale(world, driver, tmp_path):
    """A second create of the same image and spec after the host folder changed (a new library
    there): the cache of the second has it (no step or plan of the first replayed)."""
    host = _host_folder(tmp_path, driver)
    world.write_spec("nvidia-gpu.yaml", _spec(world, host))
    listings = []
    for round in range(2):
        bundle = world.bundle(args=["/prog"])
        os.makedirs(tmp_path / str(round))
        rh.glibc_image(bundle.rootfs, PROGRAM, str(host / f"libnvidia-ml.so.{VERSION}"), str(tmp_path / str(round)),
                       ["-ldl"])
        subprocess.run([rh.need("ldconfig", "libc-bin"), "-r", bundle.rootfs], check=True, timeout=60)
        _request(world, bundle, "preinjected")
        result = world.shim("run", "--bundle", bundle.path, bundle.id, env=world.env(**_absent_params(tmp_path)))
        assert result.returncode == 0, result.stderr
        listings.append(_cache_listing(world, bundle))
        rh.library(host / "libnvidia-extra.so.1", "libnvidia-extra.so.1", "int extra(void) { return 7; }\n")
    assert "libnvidia-extra.so.1" not in listings[0]
    assert f"{FOLDER}/libnvidia-extra.so.1" in listings[1], listings[1]


@pytest.mark.parametrize("how", ["preinjected"])
def test_a_folder_from_a_tmpfs_leaves_the_hook(world, driver, tmp_path, how):
    """A tmpfs at the folder: its content exists only once runc mounts it, so no cache is
    written without it; the hook stays, and its program missing here, the create fails naming it."""
    world.write_spec("nvidia-gpu.yaml", _spec(world, tmp_path).replace(
        f"    - hostPath: {tmp_path}\n      containerPath: {FOLDER}\n"
        "      options: [ro, nosuid, nodev, rbind, rprivate]\n",
        f"    - hostPath: tmpfs\n      containerPath: {FOLDER}\n      type: tmpfs\n      options: [nosuid]\n"))
    bundle = world.bundle(args=["/prog"])
    host = _host_folder(tmp_path, driver)
    rh.glibc_image(bundle.rootfs, PROGRAM, str(host / f"libnvidia-ml.so.{VERSION}"), str(tmp_path), ["-ldl"])
    _request(world, bundle, how)
    result = world.shim("create", "--bundle", bundle.path, bundle.id, env=world.env(**_absent_params(tmp_path)))
    assert result.returncode != 0
    assert "update-ldcache" in result.stderr and "not a bind" in result.stderr, result.stderr
