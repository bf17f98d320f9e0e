"""The runtime's config file (shim/config.py) when it is not what it should be: a FIFO (a blocking
open would wedge every create that reaches Python), a link loop, a directory, a key spelled with
"_". Through the installed cdi-shim-runtime with real runc, and through the loader in a child
process with a time limit, so that a hang fails the test instead of stopping the run."""
import os
import subprocess
import sys

import pytest

import runtime_helpers as rh

SHAPES = {"fifo": "a FIFO, not a regular file", "loop": "a link loop (too many levels of symbolic links)",
          "dir": "a directory, not a regular file"}


def make(path, shape):
    if shape == "fifo":
        os.mkfifo(path)
    elif shape == "loop":
        os.symlink(path + ".other", path)
        os.symlink(path, path + ".other")
    else:
        os.mkdir(path)


def load_in_child(path):
    code = ("import sys\nfrom shim.config import ConfigError, load_config\n"
            "try:\n    load_config(sys.argv[1])\nexcept ConfigError as err:\n    print(err)\n")
    try:
        return subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"load_config({path}) hung")


@pytest.mark.parametrize("shape", list(SHAPES))
def test_loader_refuses_what_is_no_regular_file_in_one_line(tmp_path, shape):
    path = str(tmp_path / "config.toml")
    make(path, shape)
    out = load_in_child(path)
    assert out.stderr == "" and out.stdout == f"cannot read cdi-shim config {path}: {SHAPES[shape]}\n"


@pytest.mark.runtime_e2e
@pytest.mark.parametrize("shape", ["fifo", "loop"])
def test_create_with_such_a_config_fails_with_the_error_never_a_hang(tmp_path, shape):
    world = rh.World(tmp_path)
    try:
        os.unlink(world.config_toml)
        make(world.config_toml, shape)
        bundle = world.bundle(args=("true",))
        try:
            done = world.shim("--device", "nvidia.com/gpu=0", "create", "--bundle", bundle.path, bundle.id,
                              timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"cdi-shim-runtime create hung on a {shape} at the config path")
        assert done.returncode == 1
        assert f"cannot read cdi-shim config {world.config_toml}: {SHAPES[shape]}" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and bundle.unchanged()
    finally:
        world.cleanup()


@pytest.mark.parametrize("key, said", [
    ("log_level", 'unknown key "log_level": did you mean "log-level"? (keys are written with "-")'),
    ("Log-Level", 'unknown key "Log-Level": did you mean "log-level"?'),
    ("spec-dir", 'unknown key "spec-dir": did you mean "spec-dirs"?'),
    ("colour", 'unknown key "colour" (known keys: runtime, spec-dirs, '),
])
def test_unknown_key_gets_the_key_meant(tmp_path, key, said):
    path = tmp_path / "config.toml"
    path.write_text(f'{key} = "debug"\n')
    out = load_in_child(str(path))
    assert out.stdout.startswith(f"cdi-shim config {path}: {said}"), out.stdout
