"""Helpers of the tests that run `cdi-shim` and host tools (plain functions; fixtures are in the conftest.py files)."""
import contextlib
import os
import shutil
import subprocess
import sys

import pytest

from cdi.safeio import RACY_WINDOW_NS

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


def python_prefix(directory, programs=(), python_options=()):
    """A Python prefix in DIRECTORY shaped like a venv, for the native programs, which find their
    interpreter (bin/python3) and packages (lib/pythonX.Y/site-packages) relative to themselves:
    bin/python3 runs this interpreter (with PYTHON_OPTIONS, e.g. -X importtime, when given),
    site-packages is this venv's, and bin/ holds copies of the installed PROGRAMS. Returns bin/."""
    import sysconfig

    bin_dir = os.path.join(str(directory), "bin")
    lib_dir = os.path.join(str(directory), "lib", "python%d.%d" % sys.version_info[:2])
    os.makedirs(bin_dir, exist_ok=True)
    os.makedirs(lib_dir, exist_ok=True)
    os.symlink(sysconfig.get_path("purelib"), os.path.join(lib_dir, "site-packages"))
    python = os.path.join(bin_dir, "python3")
    if python_options:
        with open(python, "w") as script:
            script.write("#!/bin/sh\nexec %s %s \"$@\"\n" % (sys.executable, " ".join(python_options)))
        os.chmod(python, 0o755)
    else:
        os.symlink(sys.executable, python)
    for name in programs:
        shutil.copy(os.path.join(VENV_BIN, name), os.path.join(bin_dir, name))
    return bin_dir


def native_programs():
    """csrc/programs.py, the table of native programs setup.py builds (sources, how to compile)."""
    import importlib.util

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location("cdi_shim_programs", os.path.join(repo, "csrc", "programs.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def node_release(directory, name="test"):
    """A node prefix in DIRECTORY as `install` lays it out: releases/NAME (a python_prefix with
    the installed programs) and `current` linking to it. Returns the prefix."""
    prefix = os.path.join(str(directory), "opt", "cdi-shim")
    python_prefix(os.path.join(prefix, "releases", name),
                  ["cdi-shim", "cdi-shim-runtime", "cdi-shim-hook", "cdi-shim-nshook"])
    os.symlink(os.path.join("releases", name), os.path.join(prefix, "current"))
    return prefix


def put_node_file(root, path, text="", mode=0o644):
    """PATH (absolute on the node) under the node tree ROOT, with TEXT and MODE."""
    full = os.path.join(str(root), path.lstrip("/"))
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w") as stream:
        stream.write(text)
    os.chmod(full, mode)


# The engine's settle window, seconds (the one window, cdi/safeio.py's), put back after a test.
ENGINE_SETTLE = RACY_WINDOW_NS / 1e9


@contextlib.contextmanager
def file_memo(enabled, forget=None, settle=0):
    """The engine's file memo on or off (ldcache.remember_files) for the block, trusting files
    SETTLE seconds old (0: however new, so no test waits for files to age); its previous state
    and ENGINE_SETTLE come back after. The one place tests set the settle window."""
    from shim.ldconfig import ldcache

    previous = ldcache.remember_files(enabled, forget=forget, settle=settle)
    try:
        yield
    finally:
        ldcache.remember_files(previous, settle=ENGINE_SETTLE)


def cli_with_settle(argv, settle=0):
    """The command line running `cdi-shim ARGV` in this interpreter with the engine's settle window
    set to SETTLE first: a resident server (`runtime serve`) started so keeps it in its workers,
    whose memos then trust files however new, and no test waits for files to age."""
    code = ("import sys; from shim.ldconfig import ldcache; "
            f"ldcache.remember_files(False, settle={settle!r}); "
            "from shim.cli.main import main; main(prog_name='cdi-shim')")
    return [sys.executable, "-c", code, *argv]
