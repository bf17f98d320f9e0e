"""Fixtures of the `cdi-shim cdi generate` tests: a fake driver (fakedriver.py) built once a
session with device nodes for 8 GPUs, and a runner of the installed `cdi-shim`."""
import os

import pytest

import fakedriver
from fakedriver import Runner


def pytest_configure(config):
    config.addinivalue_line("markers", "runtime_e2e: end-to-end test of cdi-shim-runtime with real runc")


@pytest.fixture(scope="session")
def driver(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.fail("the generate tests make device nodes with mknod and must run as root", pytrace=False)
    fake = fakedriver.FakeDriver(tmp_path_factory.mktemp("fake-driver"), gpus=8)
    yield fake
    fake.close()


@pytest.fixture
def run(driver, tmp_path):
    return Runner(driver, tmp_path)
