"""`cdi-shim install --node` on a node root that has Docker: daemon.json gets the cdi-shim runtime
(through runtime configure --runtime=docker's plan), other runtimes kept, and the --gpus program is
linked into /usr/local/bin unless the node has one; a second run changes nothing; a root without
Docker gets no daemon.json."""
import json
import os

from tests.helpers import read
from tests.node.test_install import install, node_root, snapshot


def docker_root(tmp_path, toolkit_hook=False):
    root = node_root(tmp_path)
    (root / "etc" / "docker").mkdir(parents=True)
    (root / "etc" / "docker" / "daemon.json").write_text(
        '{"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}, "log-level": "warn"}')
    if toolkit_hook:
        (root / "usr" / "bin").mkdir(parents=True)
        hook = root / "usr" / "bin" / "nvidia-container-runtime-hook"
        hook.write_text("#!/bin/sh\n")
        hook.chmod(0o755)
    return root


def test_docker_registered_and_gpus_program_linked(tmp_path, shim_env, fake_binary):
    root = docker_root(tmp_path)
    out = install(root, env=shim_env, binary=fake_binary)
    doc = json.loads(read(root / "etc" / "docker" / "daemon.json"))
    assert doc["runtimes"] == {"nvidia": {"path": "nvidia-container-runtime"}, "cdi-shim": {"path": fake_binary}}
    assert doc["log-level"] == "warn" and "features" not in doc   # no dockerd to tell its version: no CDI
    link = root / "usr" / "local" / "bin" / "nvidia-container-runtime-hook"
    assert os.readlink(link) == os.path.join(os.path.dirname(fake_binary), "nvidia-container-runtime-hook")
    assert "docker: changed" in out.stdout + out.stderr and "reload docker" in out.stdout + out.stderr
    before = snapshot(root)
    again = install(root, env=shim_env, binary=fake_binary)
    assert "docker: unchanged" in again.stdout + again.stderr
    assert snapshot(root) == before


def test_the_toolkit_s_hook_is_left_alone(tmp_path, shim_env, fake_binary):
    root = docker_root(tmp_path, toolkit_hook=True)
    install(root, env=shim_env, binary=fake_binary)
    assert not os.path.lexists(root / "usr" / "local" / "bin" / "nvidia-container-runtime-hook")


def test_no_docker_no_daemon_json(tmp_path, shim_env, fake_binary):
    root = node_root(tmp_path)
    out = install(root, env=shim_env, binary=fake_binary)
    assert not (root / "etc" / "docker").exists() and "no Docker here" in out.stdout + out.stderr


def test_a_broken_daemon_json_fails_the_step_not_the_others(tmp_path, shim_env, fake_binary):
    root = docker_root(tmp_path)
    (root / "etc" / "docker" / "daemon.json").write_text("{not json")
    out = install(root, env=shim_env, binary=fake_binary, check=False)
    assert "docker: failed" in out.stdout + out.stderr and "line 1, column 2" in out.stdout + out.stderr
    assert read(root / "etc" / "docker" / "daemon.json") == "{not json"
    assert fake_binary in read(root / "etc" / "containerd" / "config.toml")   # containerd's step still ran
