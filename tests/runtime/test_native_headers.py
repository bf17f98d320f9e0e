"""Rules the native programs share with the Python half are defined once, in Python, and the C
headers are made from them (shim/native_headers.py): the configuration keys (shim/config.py's
KEYS, which also make the file `install --node` writes), runc's argv, the request patterns and
the hook programs.

The front end must understand every key Python accepts: a key it does not know sends every runc
call, `state` included, through the interpreter. A copy of cdi-shim-runtime in a folder with no
Python beside it tells: a call that reaches for the interpreter fails there (exit 127,
"cdi-shim: ..."), a call passed straight to runc answers as runc does.
"""
import glob
import os
import shutil
import subprocess

import pytest

from shim import config as shim_config
from shim import native_headers
from shim.config import KEYS, Config, default_config_text, load_config
from tests.helpers import VENV_BIN, need, read

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PASSTHROUGH = (("state", "nosuch"), ("kill", "nosuch", "KILL"), ("delete", "nosuch"), ("start", "nosuch"),
               ("exec", "nosuch", "true"))


def valid_values(key, kind, default, choices):
    if key == "runtime":
        return [need("runc", "runc")]
    if choices:
        return list(choices)
    if kind is bool:
        return [True, False]
    if kind is tuple:
        return [(), ("a/", "b.example.com/x"), default]
    return ["", "some-value", default]


CASES = [(key, value) for key, kind, default, choices, _, _ in KEYS
         for value in valid_values(key, kind, default, choices)]


@pytest.fixture(scope="module")
def bare_front_end(tmp_path_factory):
    """cdi-shim-runtime alone in a folder: no interpreter to start."""
    folder = tmp_path_factory.mktemp("bare") / "bin"
    folder.mkdir()
    shutil.copy2(os.path.join(VENV_BIN, "cdi-shim-runtime"), folder / "cdi-shim-runtime")
    return str(folder / "cdi-shim-runtime")


def run(program, config, argv, tmp_path):
    env = dict(os.environ, CDI_SHIM_CONFIG=str(config))
    root = str(tmp_path / "runc-root")
    return subprocess.run([program, "--root", root, *argv], capture_output=True, text=True, env=env, timeout=30)


@pytest.mark.parametrize("path", list(native_headers.HEADERS))
def test_the_headers_are_made_from_the_python_rules(path):
    assert read(os.path.join(TOP, path)) == native_headers.HEADERS[path](), \
        f"{path} differs from the rules it is made from: run .venv/bin/python -m shim.native_headers"


def test_every_header_is_included_by_a_program():
    sources = "".join(read(os.path.join(TOP, name)) for name in
                      glob.glob("csrc/frontend/*.c", root_dir=TOP) + glob.glob("csrc/engine/*.c", root_dir=TOP)
                      + ["csrc/hooks/nshook.c"])
    for path in native_headers.HEADERS:
        assert f'{os.path.basename(path)}"' in sources, path


def test_python_takes_its_keys_from_the_table():
    assert list(Config.DEFAULTS) == [key.replace("-", "_") for key, *_ in KEYS]
    assert {front for *_, front, _ in KEYS} == {"reads", "skips"}


@pytest.mark.parametrize("key,value", CASES, ids=[f"{key}={value!r}" for key, value in CASES])
def test_no_documented_key_sends_a_passthrough_call_to_python(bare_front_end, tmp_path, key, value):
    config = tmp_path / "config.toml"
    config.write_text(f"{key} = {shim_config.toml_value(value)}  # a comment\n")
    assert getattr(load_config(str(config)), key.replace("-", "_")) == value   # Python accepts it
    runc = need("runc", "runc")
    for argv in PASSTHROUGH:
        ours, theirs = run(bare_front_end, config, argv, tmp_path), run(runc, config, argv, tmp_path)
        assert "cdi-shim:" not in ours.stderr, (argv, ours.stderr)
        assert (ours.returncode, ours.stdout) == (theirs.returncode, theirs.stdout), (argv, ours.stderr)


@pytest.mark.parametrize("text", ['log-level = "loud"', 'file-binds = "both"', 'volume-mount-requests = "on"',
                                  'spec-dirs = "/etc/cdi"', 'accept-env-unprivileged = "yes"',
                                  'env-vendors = [1]', 'log_level = "debug"', 'no-such-key = true',
                                  'runtime = "runc"\nruntime = "runc"'])
def test_a_value_python_refuses_goes_to_python_to_be_reported(bare_front_end, tmp_path, text):
    config = tmp_path / "config.toml"
    config.write_text(text + "\n")
    with pytest.raises(shim_config.ConfigError):
        load_config(str(config))
    done = run(bare_front_end, config, ("state", "nosuch"), tmp_path)
    assert done.returncode == 127 and done.stderr.startswith("cdi-shim: "), done.stderr


def test_the_default_file_is_every_key_at_its_default(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(default_config_text())
    assert load_config(str(path)) == Config()
    assert [line.split(" = ")[0] for line in read(path).splitlines() if not line.startswith("#")] == \
        [key for key, *_ in KEYS]
    path.write_text(default_config_text({"accept-env-unprivileged": False}, why="# a Kubernetes node"))
    assert load_config(str(path)).accept_env_unprivileged is False
    assert "# a Kubernetes node" in read(path)
    with pytest.raises(ValueError, match="unknown config keys"):
        default_config_text({"log_level": "debug"})
