"""Fixtures of the cdi-shim-runtime end-to-end tests (see runtime_helpers.py)."""
import pytest

import runtime_helpers as rh


def pytest_configure(config):
    config.addinivalue_line("markers", "containerd: end-to-end test through a private containerd 1.6 "
                            "(select with -m containerd, leave out with -m 'not containerd')")
    config.addinivalue_line("markers", "runtime_e2e: end-to-end test of cdi-shim-runtime with real runc")


@pytest.fixture
def world(tmp_path):
    """A private runc + CDI world (fake GPUs, spec, config.toml, runc root) for one test."""
    w = rh.World(tmp_path)
    yield w
    w.cleanup()
