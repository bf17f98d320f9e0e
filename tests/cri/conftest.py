"""Fixtures of the containerd/CRI tests: a private containerd 1.6 (the system's) with the cdi-shim
runtime; real containerd 1.7 and 2.1 (Debian trixie / forky, fetched once into
$CDI_SHIM_TEST_CACHE) with containerd's own CDI on and off.

Missing host tools FAIL with the apt-get line to install them (never skip): containerd (+ctr),
runc, busybox-static, gcc; and grpcio from the test extra.
"""
import os

import pytest

from tests.helpers import need


def pytest_configure(config):
    config.addinivalue_line("markers", "cri: end-to-end test through a private containerd's CRI plugin")


def _grpc_or_fail():
    import importlib.util

    if importlib.util.find_spec("grpc") is None:
        pytest.fail("grpc not installed: pip install -e '.[test]' (grpcio; or the bench extra)", pytrace=False)


@pytest.fixture(scope="session")
def cri_build_dir(tmp_path_factory):
    """The CRI client can run: grpcio is there (its messages are built from a table,
    shim/bench/cri_messages.py; nothing is compiled any more, the name stays for the tests that ask)."""
    _grpc_or_fail()
    return str(tmp_path_factory.mktemp("cri-build"))


@pytest.fixture(scope="session")
def lab(tmp_path_factory, cri_build_dir):
    """One private containerd for the session: runtimes runc, nvidia (cdi-shim) and nvidia-noallow
    (cdi-shim without the container_annotations allow-list); the runtime's resident process runs,
    as it would on a node (the interpreter-per-create path has the runc e2e tests)."""
    for name, package in (("containerd", "containerd"), ("ctr", "containerd"), ("runc", "runc"),
                          ("busybox", "busybox-static"), ("gcc", "gcc")):
        need(name, package)
    if os.geteuid() != 0:
        pytest.fail("the CRI tests run a private containerd and pods with runc: run them as root", pytrace=False)
    from cdi_shim_lab.lab import Lab, LabError

    base = tmp_path_factory.mktemp("lab")
    the_lab = Lab(base, runtime_log=True, log_level="debug", resident=True)
    try:
        the_lab.setup(extra_runtimes={"nvidia-noallow": ["container_annotations"]})
    except LabError as err:
        the_lab.stop()
        pytest.fail(str(err), pytrace=False)
    yield the_lab
    the_lab.stop()


def _release_lab(tmp_path_factory, version, native_cdi):
    for name, package in (("runc", "runc"), ("busybox", "busybox-static"), ("unshare", "util-linux")):
        need(name, package)
    if os.geteuid() != 0:
        pytest.fail("the CRI tests run a private containerd and pods with runc: run them as root", pytrace=False)
    from cdi_shim_lab.lab import Lab, LabError

    base = tmp_path_factory.mktemp(f"lab-{version}-cdi-{'on' if native_cdi else 'off'}")
    the_lab = Lab(base, runtime_log=True, log_level="debug", containerd=version, native_cdi=native_cdi)
    try:
        the_lab.setup()
    except LabError as err:
        the_lab.stop()
        pytest.fail(str(err), pytrace=False)
    return the_lab


@pytest.fixture(scope="module", params=["1.7", "2.1"])
def native_lab(request, tmp_path_factory, cri_build_dir):
    """A real containerd 1.7 / 2.1 (Debian trixie / forky, fetched once) with its own CDI on:
    `runtime configure --enable-cdi true` makes cdi_spec_dirs the lab's spec dir."""
    the_lab = _release_lab(tmp_path_factory, request.param, True)
    yield the_lab
    the_lab.stop()


@pytest.fixture(scope="module", params=["1.7", "2.1"])
def cdi_off_lab(request, tmp_path_factory, cri_build_dir):
    """The same containerd with enable_cdi = false (`runtime configure --enable-cdi false`)."""
    the_lab = _release_lab(tmp_path_factory, request.param, False)
    yield the_lab
    the_lab.stop()
