"""`cdi-shim install --node` on a node root that has podman: containers.conf gets the cdi-shim
runtime (through runtime configure --runtime=podman's plan), every other key and runtime kept; a
second run changes nothing; a broken file fails the step, not the others; a root without podman
gets no containers.conf."""
import tomlkit

from tests.helpers import read
from tests.node.test_install import install, node_root

CONF = '# site\n[engine]\nruntime = "crun"\n\n[engine.runtimes]\ncrun = ["/usr/bin/crun"]\n'


def podman_root(tmp_path, text=CONF):
    root = node_root(tmp_path)
    (root / "etc" / "containers").mkdir(parents=True)
    (root / "etc" / "containers" / "containers.conf").write_text(text)
    return root


def test_podman_registered_and_other_runtimes_kept(tmp_path, shim_env, fake_binary):
    root = podman_root(tmp_path)
    out = install(root, env=shim_env, binary=fake_binary)
    text = read(root / "etc" / "containers" / "containers.conf")
    doc = tomlkit.parse(text)
    assert doc["engine"]["runtimes"].unwrap() == {"crun": ["/usr/bin/crun"], "cdi-shim": [fake_binary]}
    assert doc["engine"]["runtime"] == "crun" and text.startswith("# site\n")
    assert "podman: changed" in out.stdout + out.stderr
    again = install(root, env=shim_env, binary=fake_binary)
    assert "podman: unchanged" in again.stdout + again.stderr


def test_no_podman_no_containers_conf(tmp_path, shim_env, fake_binary):
    root = node_root(tmp_path)
    out = install(root, env=shim_env, binary=fake_binary)
    assert not (root / "etc" / "containers").exists() and "no podman here" in out.stdout + out.stderr


def test_a_broken_containers_conf_fails_the_step_not_the_others(tmp_path, shim_env, fake_binary):
    root = podman_root(tmp_path, "[engine\n")
    out = install(root, env=shim_env, binary=fake_binary, check=False)
    assert "podman: failed" in out.stdout + out.stderr and "line 1, column 8" in out.stdout + out.stderr
    assert read(root / "etc" / "containers" / "containers.conf") == "[engine\n"
    assert fake_binary in read(root / "etc" / "containerd" / "config.toml")   # containerd's step still ran
