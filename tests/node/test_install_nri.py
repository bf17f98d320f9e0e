"""`cdi-shim install --node --nri` on prepared node roots (--root), as tests/node/test_install.py:
the NRI plugin's unit written, enabled (offline: the WantedBy link; with --systemctl: enable and
start), restarted only when its text changed, containerd's config never touched and containerd
never restarted; a note where the installed containerd reads NRI as off (1.7's default)."""
import os

import pytest

from shim.node.install import UNIT_NAME
from shim.node.nri_unit import NRI_UNIT_NAME, nri_unit_text
from shim.node.units import NODE_CDI_SHIM
from tests.helpers import read, run_cli
from tests.node.test_install import FAKE_SYSTEMCTL, REPO, containerd, install, node_root, snapshot


def test_contrib_unit_is_the_installed_one():
    """contrib/ holds the unit as an install on the node prefix writes it (as the resident's)."""
    assert read(os.path.join(REPO, "contrib", NRI_UNIT_NAME)) == nri_unit_text(NODE_CDI_SHIM)
    text = nri_unit_text("/opt/cdi-shim/current/bin/cdi-shim")
    assert "ExecStart=/opt/cdi-shim/current/bin/cdi-shim nri\n" in text
    assert "Restart=always\n" in text and "After=containerd.service\n" in text


def test_nri_unit_in_place_of_the_runtime_and_the_resident(tmp_path, shim_env, fake_binary):
    root = node_root(tmp_path)
    config = root / "etc" / "containerd" / "config.toml"
    before = config.read_bytes()
    out = install(root, "--nri", "--restart", env=shim_env, binary=fake_binary)
    units = root / "etc" / "systemd" / "system"
    assert read(units / NRI_UNIT_NAME) == nri_unit_text("/usr/local/bin/cdi-shim")
    assert os.readlink(units / "multi-user.target.wants" / NRI_UNIT_NAME) == f"/etc/systemd/system/{NRI_UNIT_NAME}"
    assert not (units / UNIT_NAME).exists()      # no resident process: nothing uses it under NRI
    assert config.read_bytes() == before and not (root / "etc" / "containerd" / "conf.d").exists()
    assert "containerd need not be restarted" in out.stderr and "restarted containerd" not in out.stderr
    assert f"systemctl not run (the root is {root}, not /)" in out.stderr
    first = snapshot(root)
    again = install(root, "--nri", "--restart", env=shim_env, binary=fake_binary)
    assert snapshot(root) == first
    assert again.stderr.rstrip().endswith("nothing changed")


def test_systemctl_enables_starts_and_restarts_the_plugin_never_containerd(tmp_path, shim_env, fake_binary):
    root = node_root(tmp_path)
    state, log, program = tmp_path / "state", tmp_path / "systemctl.log", tmp_path / "systemctl"
    state.mkdir()
    program.write_text(FAKE_SYSTEMCTL.format(log=log, state=state))
    program.chmod(0o755)
    (state / "active-containerd").touch()
    systemctl = ["--systemctl", str(program), "--no-spec-refresh"]   # (the spec refresh's unit: test_install.py)
    install(root, "--nri", "--restart", *systemctl, env=shim_env, binary=fake_binary)
    assert read(log).splitlines() == [
        "daemon-reload", f"is-enabled --quiet {NRI_UNIT_NAME}", f"enable {NRI_UNIT_NAME}",
        f"is-active --quiet {NRI_UNIT_NAME}", f"start {NRI_UNIT_NAME}"]
    log.write_text("")
    out = install(root, "--nri", "--restart", *systemctl, env=shim_env, binary=fake_binary)
    assert read(log).splitlines() == [f"is-enabled --quiet {NRI_UNIT_NAME}", f"is-active --quiet {NRI_UNIT_NAME}"]
    assert out.stderr.rstrip().endswith("nothing changed")
    # a new release's path: the unit is rewritten and the running plugin restarted; containerd is not
    log.write_text("")
    out = run_cli("install", "--node", "--nri", "--restart", "--root", str(root), "--runtime-binary", fake_binary,
                  "--cdi-shim-binary", "/opt/cdi-shim/bin/cdi-shim", "--containerd-binary", containerd(), *systemctl,
                  env=shim_env, check=True)
    assert read(log).splitlines() == ["daemon-reload", f"is-enabled --quiet {NRI_UNIT_NAME}",
                                      f"is-active --quiet {NRI_UNIT_NAME}", f"restart {NRI_UNIT_NAME}"]
    assert "containerd need not be restarted" in out.stderr


@pytest.mark.parametrize("version", ["1.7", "2.1"])
def test_a_note_where_containerd_has_nri_off(tmp_path, shim_env, fake_binary, containerd_release, version):
    """containerd 1.7's default config has NRI off: the install says how to turn it on (and leaves
    the config alone); 2.1's has it on: no note."""
    import subprocess

    binary = containerd_release(version)
    root = node_root(tmp_path, config=None)
    default = subprocess.run([binary, "config", "default"], capture_output=True, text=True, check=True).stdout
    (root / "etc" / "containerd" / "config.toml").write_text(default)
    out = install(root, "--nri", env=shim_env, binary=fake_binary, containerd_binary=binary)
    note = "warning: NRI is off in containerd's config"
    if version == "1.7":
        assert note in out.stderr and 'disable = false` and restart containerd once' in out.stderr
    else:
        assert note not in out.stderr
    assert (root / "etc" / "containerd" / "config.toml").read_text() == default


def test_the_installed_unit_runs_the_plugin(tmp_path, shim_env, fake_binary):
    """The unit's ExecStart, run as systemd would (the installed cdi-shim, no shell): the plugin
    starts and waits for containerd's socket, saying so."""
    import subprocess
    import sys

    cdi_shim = os.path.join(os.path.dirname(sys.executable), "cdi-shim")
    root = node_root(tmp_path)
    run_cli("install", "--node", "--nri", "--root", str(root), "--runtime-binary", fake_binary, "--cdi-shim-binary",
            cdi_shim, "--containerd-binary", containerd(), env=shim_env, check=True)
    text = read(root / "etc" / "systemd" / "system" / NRI_UNIT_NAME)
    (command,) = [line.split("=", 1)[1] for line in text.splitlines() if line.startswith("ExecStart=")]
    socket = str(tmp_path / "nri.sock")
    done = subprocess.run(command.split() + ["--socket", socket, "--once"], capture_output=True, text=True,
                          env=shim_env, timeout=60)
    assert done.returncode != 0 and f"cannot connect to {socket}" in done.stderr
