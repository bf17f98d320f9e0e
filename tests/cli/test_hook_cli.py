"""`cdi-shim-hook`, the lean hook program: -h and --version as `cdi-shim` has them, without
importing click where a container start runs it."""
import os
import re
import subprocess

import pytest

from cdi import __version__
from tests.conftest import tool
from tests.helpers import python_prefix


def hook(*args, importtime=False, stdin="", tmp_path=None):
    """Run the installed program; with IMPORTTIME, a copy of it in a prefix whose python3 adds
    -X importtime (the program starts the python3 beside it)."""
    program = tool("cdi-shim-hook")
    if importtime:
        program = os.path.join(python_prefix(tmp_path, ["cdi-shim-hook"], ["-X", "importtime"]), "cdi-shim-hook")
    return subprocess.run([program, *args], input=stdin, capture_output=True, text=True)


def imported(stderr):
    return {line.split("|")[-1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("option", ["-h", "--help"])
def test_help(option):
    result = hook(option)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Usage: cdi-shim-hook [OPTIONS] COMMAND [ARGS]...")
    assert "update-ldcache" in result.stdout and "create-symlinks" in result.stdout
    sub = hook("update-ldcache", option)
    assert sub.returncode == 0 and sub.stdout.startswith("Usage: cdi-shim-hook update-ldcache [OPTIONS]")


def test_version_like_cdi_shim_and_without_click(tmp_path):
    result = hook("--version", importtime=True, tmp_path=tmp_path)
    assert (result.returncode, result.stdout) == (0, f"cdi-shim-hook, version {__version__}\n"), result.stderr
    ours = subprocess.run([tool("cdi-shim"), "--version"], capture_output=True, text=True).stdout
    assert re.sub(r"^cdi-shim,", "cdi-shim-hook,", ours) == result.stdout
    assert "click" not in imported(result.stderr)


def test_hook_run_does_not_import_click(tmp_path):
    result = hook("update-ldcache", "--folder", "/usr/lib", stdin="not json", importtime=True, tmp_path=tmp_path)
    assert result.returncode == 1 and "Error: " in result.stderr
    assert "click" not in imported(result.stderr) and "shim.linker.hooks" in imported(result.stderr)
