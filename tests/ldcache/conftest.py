"""Fixtures of the ldcache tests; the shared helpers are in ldcache_helpers.py."""
import os
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ldcache_helpers import LDCONFIG, roots  # noqa: E402


# ---- fixtures ----------------------------------------------------------------------

@pytest.fixture(scope="session")
def workdir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("ldcache"))


@pytest.fixture(scope="session")
def host_tree(workdir):
    """A copy (hard links) of this machine's library tree: the multiarch directory with its
    links, /etc/ld.so.conf(.d) and the merged-/usr symlinks. ~550 cache entries."""
    root = os.path.join(workdir, "host-tree")
    libdir = os.path.join(root, roots.HOST_LIBDIR.lstrip("/"))
    os.makedirs(libdir)
    for name in os.listdir(roots.HOST_LIBDIR):
        src = os.path.join(roots.HOST_LIBDIR, name)
        if ".so" not in name:
            continue
        if os.path.islink(src):
            os.symlink(os.readlink(src), os.path.join(libdir, name))
        elif os.path.isfile(src):
            os.link(src, os.path.join(libdir, name))
    for sub in ("usr/lib64", "etc/ld.so.conf.d", "var/cache/ldconfig"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    os.symlink("usr/lib", os.path.join(root, "lib"))
    os.symlink("usr/lib64", os.path.join(root, "lib64"))
    shutil.copy("/etc/ld.so.conf", os.path.join(root, "etc/ld.so.conf"))
    for name in ("libc.conf", "x86_64-linux-gnu.conf"):
        src = os.path.join("/etc/ld.so.conf.d", name)
        if os.path.exists(src):
            shutil.copy(src, os.path.join(root, "etc/ld.so.conf.d", name))
    with open(os.path.join(root, "etc/debian_version"), "w") as out:
        out.write("12.0\n")
    # Its own cache, made by glibc, so that incremental updates have a start.
    subprocess.run([LDCONFIG, "-X", "-r", root], check=True, timeout=60)
    return root


@pytest.fixture(scope="session")
def debian_root(workdir):
    """A minimal Debian 12 rootfs made by debootstrap (the tarball is cached across runs)."""
    try:
        tarball = roots.debootstrap_tarball()
    except (RuntimeError, subprocess.CalledProcessError) as err:
        pytest.fail(f"cannot make the debootstrap rootfs: {err}")
    return roots.extract(tarball, os.path.join(workdir, "debian"))


@pytest.fixture
def scratch(tmp_path):
    return str(tmp_path)
