"""The real loader: inside a runc container, a program linked against a fake
libnvidia-ml.so.1 (gcc-built, versioned file name, mounted from a fake driver directory)
runs because our cache resolves it, and dlopen("libnvidia-ml.so.1") works -- with a
read-only rootfs, no ldconfig, no hook and nothing written into the rootfs.

The rootfs is a small glibc root made of this machine's loader and libc (busybox-static
is not glibc)."""
import json
import os
import shutil
import subprocess

import pytest

from ldcache_helpers import GCC, build_library, fake_driver, require
from shim.ldconfig import ldcache

FOLDER = "/usr/local/nvidia/lib"
VERSION = "550.54.15"
APP_C = r"""
#include <dlfcn.h>
#include <stdio.h>
int nvmlInit_v2(void);
const char *cdi_shim_fake_driver(void);
int main(void) {
    printf("linked: nvmlInit_v2=%d driver=%s\n", nvmlInit_v2(), cdi_shim_fake_driver());
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (h == NULL) { printf("dlopen failed: %s\n", dlerror()); return 3; }
    const char *(*version)(void) = (const char *(*)(void))dlsym(h, "cdi_shim_fake_driver");
    printf("dlopen: driver=%s\n", version ? version() : "?");
    void *h2 = dlopen("libcdi-shim-image.so.1", RTLD_NOW);
    printf("image library: %s\n", h2 ? "found" : dlerror());
    return 0;
}
"""


def _glibc_root(path):
    """A rootfs with this machine's ld.so and libc (and the image's own cache, by ldconfig)."""
    libdir = os.path.join(path, "usr/lib/x86_64-linux-gnu")
    os.makedirs(libdir)
    for name in ("ld-linux-x86-64.so.2", "libc.so.6"):
        shutil.copy2(os.path.realpath(os.path.join("/usr/lib/x86_64-linux-gnu", name)),
                     os.path.join(libdir, name))
    build_library(os.path.join(libdir, "libcdi-shim-image.so.1.0"), "libcdi-shim-image.so.1")
    os.symlink("libcdi-shim-image.so.1.0", os.path.join(libdir, "libcdi-shim-image.so.1"))
    os.makedirs(os.path.join(path, "usr/lib64"))
    os.symlink("../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
               os.path.join(path, "usr/lib64/ld-linux-x86-64.so.2"))
    for link, target in (("lib", "usr/lib"), ("lib64", "usr/lib64")):
        os.symlink(target, os.path.join(path, link))
    os.makedirs(os.path.join(path, "etc/ld.so.conf.d"))
    with open(os.path.join(path, "etc/ld.so.conf"), "w") as out:
        out.write("include /etc/ld.so.conf.d/*.conf\n")
    with open(os.path.join(path, "etc/ld.so.conf.d/x86_64-linux-gnu.conf"), "w") as out:
        out.write("/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n")
    with open(os.path.join(path, "etc/debian_version"), "w") as out:
        out.write("12\n")
    subprocess.run(["ldconfig", "-X", "-r", path], check=True)
    for d in ("proc", "dev", "sys", "tmp", FOLDER.lstrip("/")):
        os.makedirs(os.path.join(path, d), exist_ok=True)
    return path


def _bundle(base, rootfs, mounts):
    bundle = os.path.join(base, "bundle")
    os.makedirs(bundle)
    subprocess.run(["runc", "spec"], cwd=bundle, check=True)
    with open(os.path.join(bundle, "config.json")) as src:
        config = json.load(src)
    config["root"] = {"path": rootfs, "readonly": True}
    config["process"]["terminal"] = False
    config["process"]["args"] = ["/app"]
    config["mounts"] += [{"destination": dest, "type": "bind", "source": src,
                          "options": ["rbind", "ro", "nosuid", "nodev"]} for dest, src in mounts]
    with open(os.path.join(bundle, "config.json"), "w") as out:
        json.dump(config, out)
    return bundle


def _run(bundle, state, name):
    proc = subprocess.run(["runc", "--root", state, "run", "--bundle", bundle, name],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    subprocess.run(["runc", "--root", state, "delete", "-f", name], capture_output=True)
    return proc


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    require("runc", "runc")
    if GCC is None:
        pytest.fail("gcc not found: apt-get install gcc")
    base = str(tmp_path_factory.mktemp("loader"))
    rootfs = _glibc_root(os.path.join(base, "rootfs"))
    driver = os.path.join(base, "driver")               # the host's fake driver root
    fake_driver(driver, VERSION, names=("nvidia-ml",))
    app = os.path.join(rootfs, "app")
    src = os.path.join(base, "app.c")
    with open(src, "w") as out:
        out.write(APP_C)
    # Linked against the versioned file: its NEEDED entry is the SONAME, libnvidia-ml.so.1.
    subprocess.run([GCC, "-o", app, src, os.path.join(driver, f"libnvidia-ml.so.{VERSION}")],
                   check=True)
    return base, rootfs, driver


def test_cache_resolves_mounted_driver_library(setup):
    base, rootfs, driver = setup
    host_file = os.path.join(driver, f"libnvidia-ml.so.{VERSION}")
    container_file = f"{FOLDER}/libnvidia-ml.so.{VERSION}"
    before = sorted(os.listdir(rootfs))
    plan = ldcache.plan(rootfs, [FOLDER], {container_file: host_file})
    assert plan.mode == "incremental"
    cache_file = os.path.join(base, "ld.so.cache")
    ldcache.write_cache(cache_file, plan.cache)
    assert ldcache.read_cache(cache_file).lookup("libnvidia-ml.so.1") == [container_file]
    assert sorted(os.listdir(rootfs)) == before          # nothing written into the rootfs
    bundle = _bundle(os.path.join(base, "with"), rootfs,
                     [(container_file, host_file), ("/etc/ld.so.cache", cache_file)])
    proc = _run(bundle, os.path.join(base, "state"), "ldcache-loader-ok")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"linked: nvmlInit_v2=0 driver={VERSION}" in proc.stdout
    assert f"dlopen: driver={VERSION}" in proc.stdout
    assert "image library: found" in proc.stdout


def test_without_our_cache_the_program_does_not_start(setup):
    """The control: the image's own cache does not know the driver library."""
    base, rootfs, driver = setup
    host_file = os.path.join(driver, f"libnvidia-ml.so.{VERSION}")
    bundle = _bundle(os.path.join(base, "without"), rootfs,
                     [(f"{FOLDER}/libnvidia-ml.so.{VERSION}", host_file)])
    proc = _run(bundle, os.path.join(base, "state"), "ldcache-loader-control")
    assert proc.returncode != 0
    assert "libnvidia-ml.so.1" in proc.stderr


def test_debian_image_with_driver(setup, debian_root, tmp_path):
    """The same in the debootstrap'ed Debian 12 image (its own cache, ~100 libraries)."""
    from ldcache_helpers import roots
    base, _rootfs, driver = setup
    rootfs = roots.copy_tree(debian_root, str(tmp_path / "rootfs"))
    os.makedirs(os.path.join(rootfs, FOLDER.lstrip("/")))
    shutil.copy2(os.path.join(base, "rootfs", "app"), os.path.join(rootfs, "app"))
    image_lib = os.path.join(rootfs, "usr/lib/x86_64-linux-gnu/libcdi-shim-image.so.1")
    os.link(os.path.join(base, "rootfs/usr/lib/x86_64-linux-gnu/libcdi-shim-image.so.1.0"), image_lib)
    host_file = os.path.join(driver, f"libnvidia-ml.so.{VERSION}")
    container_file = f"{FOLDER}/libnvidia-ml.so.{VERSION}"
    plan = ldcache.plan(rootfs, [FOLDER], {container_file: host_file})
    cache_file = str(tmp_path / "ld.so.cache")
    ldcache.write_cache(cache_file, plan.cache)
    bundle = _bundle(str(tmp_path / "b"), rootfs,
                     [(container_file, host_file), ("/etc/ld.so.cache", cache_file)])
    proc = _run(bundle, str(tmp_path / "state"), "ldcache-loader-debian")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"dlopen: driver={VERSION}" in proc.stdout
    # The image's library was added after its cache was made: its directory was scanned again.
    assert plan.mode == "incremental" and "image library: found" in proc.stdout
