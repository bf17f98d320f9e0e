"""doctor's podman checks (shim/node/doctor/podman.py) on node trees: containers.conf's
registration of cdi-shim-runtime (merged as podman merges /usr/share's file, /etc's and its .d
drop-ins), a runtime path that does not exist, a syntax error, the default runtime. Through the
real `cdi-shim doctor --root` as well as run_checks."""

from shim.config import Config
from shim.node.doctor import FAIL, OK, WARN, Options, run_checks
from shim.node.doctor.podman import check_podman_default_runtime, check_podman_runtime
from tests.helpers import put_node_file as put, run_cli

CHECKS = (check_podman_runtime, check_podman_default_runtime)
RUNTIME = "/opt/cdi-shim/current/bin/cdi-shim-runtime"
CONF = "/etc/containers/containers.conf"


def node(root, conf=None, runtime=True, podman=False):
    if runtime:
        put(root, RUNTIME, "#!/bin/sh\n", 0o755)
    if podman:
        put(root, "/usr/bin/podman", "#!/bin/sh\n", 0o755)
    if conf is not None:
        put(root, CONF, conf)
    return str(root)


def results(root):
    options = Options(root=root, settings=Config(), path_dirs=["/usr/local/bin", "/usr/bin"])
    return {r.id: r for r in run_checks(options, CHECKS)}


REGISTERED = f'[engine.runtimes]\nrunc = ["/usr/bin/runc"]\ncdi-shim = ["{RUNTIME}"]\n'


def test_healthy_podman_node(tmp_path):
    found = results(node(tmp_path, REGISTERED))
    assert {i: r.status for i, r in found.items()} == {"podman.runtime": OK, "podman.default-runtime": OK}
    assert RUNTIME in found["podman.runtime"].saw
    assert "--runtime cdi-shim" in found["podman.default-runtime"].saw


def test_no_podman_no_podman_checks(tmp_path):
    assert results(node(tmp_path, None)) == {}


def test_podman_without_a_file_is_not_registered(tmp_path):
    found = results(node(tmp_path, None, podman=True))
    assert found["podman.runtime"].status == WARN
    assert "runtime configure --runtime=podman" in found["podman.runtime"].fix


def test_runtime_path_that_does_not_exist(tmp_path):
    found = results(node(tmp_path, REGISTERED, runtime=False))
    assert found["podman.runtime"].status == FAIL and RUNTIME in found["podman.runtime"].saw
    assert "none of which exists" in found["podman.runtime"].saw


def test_syntax_error_named_by_line_and_column(tmp_path):
    found = results(node(tmp_path, "[engine\n"))
    assert found["podman.runtime"].status == FAIL
    assert "not valid TOML at line 1, column 8" in found["podman.runtime"].saw
    assert "podman.default-runtime" not in found


def test_drop_in_and_vendor_file_merged_later_wins(tmp_path):
    root = node(tmp_path, '[engine]\nruntime = "crun"\n')
    put(root, "/usr/share/containers/containers.conf", '[engine.runtimes]\ncdi-shim = ["/nowhere/cdi-shim-runtime"]\n')
    put(root, CONF + ".d/50-gpu.conf", f'[engine]\nruntime = "cdi-shim"\n[engine.runtimes]\ncdi-shim = ["{RUNTIME}"]\n')
    found = results(root)
    assert found["podman.runtime"].status == OK
    assert found["podman.default-runtime"].status == OK and "without --runtime" in found["podman.default-runtime"].saw


def test_through_the_cli(tmp_path):
    root = node(tmp_path, REGISTERED)
    out = run_cli("doctor", "--root", root)
    assert "podman.runtime" in out.stdout and RUNTIME in out.stdout
