"""Fixtures of the `cdi-shim cdi generate` tests: a fake driver (fakedriver.py) built once a
session with device nodes for 8 GPUs, and a runner of the installed `cdi-shim`."""
import os
import subprocess
import sys

import pytest

import fakedriver

CLI = os.path.join(os.path.dirname(sys.executable), "cdi-shim")


def pytest_configure(config):
    config.addinivalue_line("markers", "runtime_e2e: end-to-end test of cdi-shim-runtime with real runc")


@pytest.fixture(scope="session")
def driver(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.fail("the generate tests make device nodes with mknod and must run as root", pytrace=False)
    fake = fakedriver.FakeDriver(tmp_path_factory.mktemp("fake-driver"), gpus=8)
    yield fake
    fake.close()


class Runner:
    """`cdi-shim cdi generate` against the session's driver, with a per-test NVML description."""

    def __init__(self, driver, base):
        self.driver = driver
        self.base = str(base)
        self.config = os.path.join(self.base, "fake-nvml.conf")
        self.log = os.path.join(self.base, "nvml-calls.log")
        self.output = os.path.join(self.base, "cdi", "nvidia.yaml")
        self.gpus(2)

    def gpus(self, count=None, lines=None):
        if lines is None:
            lines = [f"driver {self.driver.version}"] + fakedriver.gpu_lines(count)
        with open(self.config, "w") as out:
            out.write("\n".join(lines) + "\n")

    def env(self):
        return dict(os.environ, FAKE_NVML_CONFIG=self.config, FAKE_NVML_LOG=self.log)

    def cli(self, *argv, check=None):
        done = subprocess.run([CLI, *argv], capture_output=True, text=True, env=self.env(), timeout=120)
        if check is not None:
            assert done.returncode == check, (done.returncode, done.stdout, done.stderr)
        return done

    def generate(self, *extra, check=0, roots=True, output=True):
        argv = ["cdi", "generate"]
        if roots:
            argv += ["--driver-root", self.driver.root, "--dev-root", self.driver.dev_root]
        if output:
            argv += ["--output", self.output]
        return self.cli(*argv, *extra, check=check)

    def calls(self):
        try:
            with open(self.log) as stream:
                return stream.read().split()
        except FileNotFoundError:
            return []


@pytest.fixture
def run(driver, tmp_path):
    return Runner(driver, tmp_path)
