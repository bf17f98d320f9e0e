"""Fixtures of the containerd configuration tests."""
import os

import pytest


@pytest.fixture
def shim_env(tmp_path, monkeypatch):
    """A cdi-shim config with the default prefixes, private to the test."""
    config = tmp_path / "cdi-shim.toml"
    config.write_text('annotation-prefixes = ["cdi.k8s.io/"]\n')
    monkeypatch.setenv("CDI_SHIM_CONFIG", str(config))
    monkeypatch.setenv("CDI_SHIM_CACHE_DIR", str(tmp_path / "cache"))
    return dict(os.environ)


@pytest.fixture
def fake_binary(tmp_path):
    """An executable standing in for cdi-shim-runtime (golden files name it @BINARY@)."""
    path = tmp_path / "bin" / "cdi-shim-runtime"
    path.parent.mkdir()
    path.write_text("#!/bin/sh\nexec runc \"$@\"\n")
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def runtime_binary(tmp_path):
    """An executable standing in for cdi-shim-runtime that does nothing (Docker's and podman's
    configuration tests)."""
    path = tmp_path / "bin" / "cdi-shim-runtime"
    path.parent.mkdir()
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return str(path)


@pytest.fixture(scope="session")
def containerd_release():
    """containerd_release("1.7" | "2.1") -> path of that real containerd, fetched once from Debian's
    trixie / forky with apt-get download and kept under $CDI_SHIM_TEST_CACHE (never installed)."""
    from cdi_shim_lab.releases import ReleaseError, binaries, fetch

    def get(version):
        try:
            return binaries(fetch(version))["containerd"]
        except ReleaseError as err:
            pytest.fail(f"cannot fetch containerd {version}: {err}", pytrace=False)
    return get
