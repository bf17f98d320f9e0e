"""doctor's Docker checks (shim/node/doctor/docker.py) on node trees: daemon.json's registration
and default runtime, dockerd's CDI and spec dirs, a runtime path that does not exist, the program
that offers --gpus. Through the real `cdi-shim doctor --root` as well as run_checks."""
import json
import os


from shim.config import Config
from shim.node.doctor import FAIL, OK, WARN, Options, run_checks
from shim.node.doctor.docker import (check_docker_cdi, check_docker_default_runtime, check_docker_gpus,
                                     check_docker_runtime)
from tests.helpers import put_node_file as put, run_cli

CHECKS = (check_docker_runtime, check_docker_default_runtime, check_docker_cdi, check_docker_gpus)
RUNTIME = "/opt/cdi-shim/current/bin/cdi-shim-runtime"
HOOK = "/usr/local/bin/nvidia-container-runtime-hook"


def node(root, daemon=None, runtime=True, hook=True):
    if runtime:
        put(root, RUNTIME, "#!/bin/sh\n", 0o755)
    if hook:
        put(root, HOOK, "#!/bin/sh\nexit 1\n", 0o755)
    if daemon is not None:
        put(root, "/etc/docker/daemon.json", daemon if isinstance(daemon, str) else json.dumps(daemon))
    return str(root)


def results(root, spec_dirs=("/etc/cdi", "/var/run/cdi")):
    options = Options(root=root, settings=Config(spec_dirs=tuple(spec_dirs)), path_dirs=["/usr/local/bin", "/usr/bin"])
    return {r.id: r for r in run_checks(options, CHECKS)}


HEALTHY = {"runtimes": {"cdi-shim": {"path": RUNTIME}, "nvidia": {"path": "nvidia-container-runtime"}},
           "features": {"cdi": True}}


def test_healthy_docker_node(tmp_path):
    found = results(node(tmp_path, HEALTHY))
    assert {i: r.status for i, r in found.items()} == {
        "docker.runtime": OK, "docker.default-runtime": OK, "docker.cdi": OK, "docker.gpus": OK}
    assert RUNTIME in found["docker.runtime"].saw
    assert "--runtime=cdi-shim" in found["docker.default-runtime"].saw


def test_no_docker_no_docker_checks(tmp_path):
    assert results(node(tmp_path, None)) == {}


def test_not_registered(tmp_path):
    found = results(node(tmp_path, {"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}}))
    assert found["docker.runtime"].status == WARN
    assert "runtime configure --runtime=docker" in found["docker.runtime"].fix


def test_runtime_path_that_does_not_exist(tmp_path):
    found = results(node(tmp_path, {"runtimes": {"cdi-shim": {"path": "/usr/local/old/bin/cdi-shim-runtime"}}}))
    check = found["docker.runtime"]
    assert check.status == FAIL and "/usr/local/old/bin/cdi-shim-runtime" in check.saw and "does not exist" in check.saw


def test_unparsable_daemon_json(tmp_path):
    found = results(node(tmp_path, '{"runtimes": {\n  "cdi-shim": }\n}'))
    assert found["docker.runtime"].status == FAIL and "line 2, column" in found["docker.runtime"].saw
    assert "docker.cdi" not in found


def test_default_runtime(tmp_path):
    ours = results(node(tmp_path / "a", dict(HEALTHY, **{"default-runtime": "cdi-shim"})))
    assert ours["docker.default-runtime"].status == OK and "without --runtime" in ours["docker.default-runtime"].saw
    dangling = results(node(tmp_path / "b", dict(HEALTHY, **{"default-runtime": "gone"})))
    assert dangling["docker.default-runtime"].status == FAIL and '"gone"' in dangling["docker.default-runtime"].saw


def test_cdi_off_and_spec_dirs_that_differ(tmp_path):
    off = results(node(tmp_path / "a", {"runtimes": HEALTHY["runtimes"]}))
    assert off["docker.cdi"].status == WARN and "--cdi" in off["docker.cdi"].fix
    differ = results(node(tmp_path / "b", dict(HEALTHY, **{"cdi-spec-dirs": ["/etc/cdi"]})),
                     spec_dirs=("/etc/cdi", "/var/run/cdi"))
    assert differ["docker.cdi"].status == WARN and "different specs" in differ["docker.cdi"].saw


def test_no_gpus_hook(tmp_path):
    found = results(node(tmp_path, HEALTHY, hook=False))
    assert found["docker.gpus"].status == WARN and "--gpus" in found["docker.gpus"].saw
    assert found["docker.gpus"].fix.startswith("ln -s /") and "/nvidia-container-runtime-hook /usr/local/bin/" \
        in found["docker.gpus"].fix


def test_through_the_cli(tmp_path):
    root = node(tmp_path, {"runtimes": {"cdi-shim": {"path": "/nowhere/cdi-shim-runtime"}}})
    out = run_cli("doctor", "--root", root, "--json", env=dict(os.environ, CDI_SHIM_CONFIG=""), check=None)
    checks = {c["check"]: c for c in json.loads(out.stdout)}
    assert out.returncode == 1 and checks["docker.runtime"]["status"] == FAIL
