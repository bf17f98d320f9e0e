"""Fixtures of the ldcache tests; the shared helpers are in ldcache_helpers.py."""
import os
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
    root = roots.host_image(os.path.join(workdir, "host-tree"))
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
