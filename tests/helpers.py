"""Helpers of the tests that run `cdi-shim` and host tools (plain functions; fixtures are in the conftest.py files)."""
import os
import shutil
import subprocess
import sys

import pytest

try:
    from tomllib import loads as toml_loads
except ImportError:  # Python < 3.11
    import tomlkit

    def toml_loads(text):
        return tomlkit.parse(text).unwrap()

VENV_BIN = os.path.dirname(sys.executable)


def need(name, package):
    path = shutil.which(name) or next((os.path.join(d, name) for d in ("/usr/sbin", "/sbin")
                                       if os.access(os.path.join(d, name), os.X_OK)), None)
    if path is None:
        pytest.fail(f"{name} not found: apt-get install {package}", pytrace=False)
    return path


def read(path):
    with open(path) as stream:
        return stream.read()


def cdi_shim_cli():
    path = os.path.join(VENV_BIN, "cdi-shim")
    if not os.access(path, os.X_OK):
        pytest.fail(f"cdi-shim is not installed next to {sys.executable}: run `pip install -e '.[test]'`",
                    pytrace=False)
    return path


def run_cli(*args, env=None, check=None):
    out = subprocess.run([cdi_shim_cli()] + list(args), capture_output=True, text=True, env=env, timeout=120)
    if check is True:
        assert out.returncode == 0, out.stderr
    elif check is False:
        assert out.returncode != 0, out.stdout
    return out
