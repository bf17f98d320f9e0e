import os
import shutil
import sys

import pytest

VENV_BIN = os.path.dirname(sys.executable)


def tool(name):
    """Path of an installed console script of this package (next to the interpreter)."""
    path = os.path.join(VENV_BIN, name)
    if not os.path.exists(path):
        pytest.fail(f"{name} is not installed next to {sys.executable}: run `pip install -e '.[test]'`")
    return path


def require_binary(name, package):
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found: apt-get install {package}")
    return path


def write_spec(directory, name, text):
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    with open(path, "w") as out:
        out.write(text)
    return path


def simple_spec(kind="example.com/dev", devices=("a",), env_prefix="X", version="0.5.0", extra=""):
    lines = [f'cdiVersion: "{version}"', f"kind: {kind}", "devices:"]
    for device in devices:
        lines += [f'  - name: "{device}"', "    containerEdits:",
                  f"      env: [{env_prefix}_{device.upper().replace('-', '_')}=1]"]
    return "\n".join(lines) + "\n" + extra


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A private registry cache directory for the test (and its subprocesses)."""
    path = tmp_path / "cache"
    monkeypatch.setenv("CDI_SHIM_CACHE_DIR", str(path))
    return str(path)
