"""cdi-shim-runtime's own command line, as a new user meets it: its help before runc's, help of
create/run outside a bundle, `--device --help`, and a config file named by $CDI_SHIM_CONFIG that
does not exist.

Each test runs twice: with a config the native front end reads itself ("front-end"), and with
one it leaves to the Python half (a list over several lines: "python"), which must agree.
"""
import os
import re

import pytest

import runtime_helpers as rh

pytestmark = pytest.mark.runtime_e2e

OWN_HELP_WORDS = ("--device NAME", "cdi.k8s.io/", "NVIDIA_VISIBLE_DEVICES", "/var/run/nvidia-container-devices/",
                  "--debug", "CDI_SHIM_CONFIG")


@pytest.fixture(params=["front-end", "python"])
def reader(request, world):
    """Which half of the runtime reads the config (and so handles the command line first)."""
    if request.param == "python":
        with open(world.config_toml, "a") as f:
            f.write('annotation-prefixes = [\n  "cdi.k8s.io/",\n]\n')
    return request.param


def norm(text):
    return re.sub(r'time="[^"]*"', 'time="T"', text)


def runc_part(argv):
    """ARGV without our --device options: what runc gets."""
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
        elif arg == "--device":
            skip = i + 1 < len(argv) and not argv[i + 1].startswith("-")
        else:
            out.append(arg)
    return out


@pytest.mark.parametrize("argv", [("--help",), ("-h",), ("help",), (), ("--device", "--help"),
                                  ("--device", "nvidia.com/gpu=0", "--help"), ("--help", "state", "x")],
                         ids=lambda a: " ".join(a) or "no-args")
def test_help_describes_own_options_then_runcs(world, reader, argv):
    mine, plain = world.shim(*argv), world.runc_cmd(*runc_part(argv))
    assert plain.returncode == 0 and "USAGE" in plain.stdout
    assert (mine.returncode, mine.stderr) == (0, plain.stderr), mine.stderr  # no "--device is ignored ..."
    assert mine.stdout.endswith(plain.stdout) and len(mine.stdout) > len(plain.stdout)
    own = mine.stdout[:-len(plain.stdout)]
    assert own.startswith("cdi-shim-runtime: ") and own.count("cdi-shim-runtime: ") == 1, own
    for word in OWN_HELP_WORDS:
        assert word in own, f"{word!r} missing from:\n{own}"


@pytest.mark.parametrize("argv", [("run", "--help"), ("create", "--help"), ("create", "-h"), ("run", "-help"),
                                  ("create", "c1", "--help"), ("run", "--device", "nvidia.com/gpu=0", "--help"),
                                  ("run", "--device", "--help"), ("help", "create")],
                         ids=lambda a: " ".join(a))
def test_command_help_outside_a_bundle(world, reader, tmp_path, argv):
    """No config.json is read (there is none here): runc prints the command's help, as without us."""
    empty = tmp_path / "not-a-bundle"
    empty.mkdir()
    mine, plain = world.shim(*argv, cwd=str(empty)), world.runc_cmd(*runc_part(argv), cwd=str(empty))
    assert plain.returncode == 0 and "USAGE" in plain.stdout
    assert (mine.returncode, norm(mine.stdout), norm(mine.stderr)) == \
        (plain.returncode, norm(plain.stdout), norm(plain.stderr))


def test_named_config_file_must_exist(world, reader, tmp_path):
    """$CDI_SHIM_CONFIG naming a missing file is an error naming it, for every command (the default
    /etc/cdi-shim/config.toml stays optional: tests/runtime/test_requests.py)."""
    missing = str(tmp_path / "no-such-dir" / "cdi-shim.toml")
    env = world.env(CDI_SHIM_CONFIG=missing)
    bundle = world.bundle(annotations={"cdi.k8s.io/e2e": "nvidia.com/gpu=0"})
    plain_bundle = world.bundle()
    log = os.path.join(world.base, "runc.log")
    for argv in (("state", "no-such-container"), ("create", "--bundle", bundle.path, bundle.id),
                 ("create", "--bundle", plain_bundle.path, plain_bundle.id)):
        result = world.shim("--log", log, *argv, env=env)
        assert result.returncode == 1, (argv, result.stderr)
        assert f"cdi-shim config {missing} does not exist" in result.stderr, result.stderr
        assert any(missing in msg for level, msg in rh.read_log(log, "text") if level == "error")
    assert bundle.unchanged() and plain_bundle.unchanged()
    assert world.state(bundle.id) is None and world.state(plain_bundle.id) is None
