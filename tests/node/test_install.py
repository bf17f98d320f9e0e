"""`cdi-shim install --node` on prepared node roots (--root): idempotent (a second run leaves every
file byte-identical and says nothing changed), its containerd result loaded by a real containerd
(`containerd --config ROOT/etc/containerd/config.toml config dump`): the system's 1.6 (version 2)
and Debian forky's 2.1.9 (version 3; cdi_shim_lab/releases.py fetches it once into
$CDI_SHIM_TEST_CACHE), each starting from its own `containerd config default`; a pod through the
installed handler on both (the CRI lab of cdi_shim_lab/lab.py), k3s/rke2 templates, the CDI spec from
the fake driver of tests/generate (real gcc-built libraries, the fake NVML through the real
pynvml, mknod device nodes), systemctl through --systemctl (PID 1 is not systemd here).
"""
import os
import shutil
import stat
import subprocess
import sys

import pytest

from shim.node.install import UNIT_NAME, unit_text
from tests.helpers import need, read, run_cli, toml_loads

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
V2_DEFAULT = os.path.join(HERE, "data", "containerd-1.6-default.toml")
# /etc/containerd/config.toml of Debian 12's containerd 1.6.20~ds1-1+deb12u3 (trixie's and forky's are this text)
DEBIAN12_CONFIG = os.path.join(HERE, "data", "containerd-1.6-debian12.toml")
CRI2 = "io.containerd.grpc.v1.cri"
CRI3 = "io.containerd.cri.v1.runtime"
K3S_DIR = "var/lib/rancher/k3s/agent/etc/containerd"


def containerd():
    return need("containerd", "containerd")


class Containerd:
    """A real containerd a node may run: VERSION, its BINARY, the config version and CRI plugin
    table it reads, its `containerd config default` (what a node image ships) and the DISTRIBUTION's
    own /etc/containerd/config.toml (what Debian's package ships: a short version-2 file with a
    `[plugins]` super-table, the same in bookworm, trixie and forky)."""

    def __init__(self, version, binary, directory, distribution=None):
        self.version, self.binary, self.distribution = version, binary, distribution
        self.config_version = 2 if version.startswith("1.") else 3
        self.cri = CRI2 if self.config_version == 2 else CRI3
        out = subprocess.run([binary, "config", "default"], capture_output=True, text=True, timeout=60, check=True)
        self.default = os.path.join(str(directory), f"containerd-{version}-default.toml")
        with open(self.default, "w") as stream:
            stream.write(out.stdout)

    def dump(self, path):
        out = subprocess.run([self.binary, "--config", str(path), "config", "dump"], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "Ignoring unknown key" not in out.stderr, out.stderr  # containerd 2.x: a table it does not read
        return toml_loads(out.stdout)

    def runtimes(self, path):
        return self.dump(path)["plugins"][self.cri]["containerd"]["runtimes"]

    def __repr__(self):
        return f"containerd {self.version}"


@pytest.fixture(scope="module", params=["1.6", "1.7", "2.1"])
def node_containerd(request, tmp_path_factory, containerd_release):
    """The system's containerd 1.6 (Debian 12's), then the real 1.7 of Debian trixie and 2.1 of forky,
    each with its package's own config file (bookworm's kept in tests/node/data: the system's file
    may have been edited; the others from the unpacked package)."""
    if request.param == "1.6":
        binary, distribution = containerd(), DEBIAN12_CONFIG
    else:
        binary = containerd_release(request.param)
        prefix = os.path.dirname(os.path.dirname(os.path.dirname(binary)))   # PREFIX/usr/bin/containerd
        distribution = os.path.join(prefix, "etc", "containerd", "config.toml")
    return Containerd(request.param, binary, tmp_path_factory.mktemp(f"containerd-{request.param}"), distribution)


def snapshot(root):
    """{relative path: ("file", bytes, mode) | ("link", target) | ("dir", mode)} of everything under ROOT."""
    found = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            rel = os.path.relpath(path, root)
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                found[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(info.st_mode):
                found[rel] = ("dir", stat.S_IMODE(info.st_mode))
            elif stat.S_ISCHR(info.st_mode):   # a device node: its numbers, never opened
                found[rel] = ("char", info.st_rdev)
            else:
                with open(path, "rb") as stream:
                    found[rel] = ("file", stream.read(), stat.S_IMODE(info.st_mode), info.st_mtime_ns)
    return found


def install(root, *extra, env, binary, check=True, containerd_binary=None):
    args = ["install", "--node", "--root", str(root), "--runtime-binary", binary,
            "--cdi-shim-binary", "/usr/local/bin/cdi-shim", "--containerd-binary",
            containerd_binary or containerd()] + list(extra)
    return run_cli(*args, env=env, check=check)


def dump(path):
    out = subprocess.run([containerd(), "--config", str(path), "config", "dump"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return toml_loads(out.stdout)


def node_root(tmp_path, config=V2_DEFAULT):
    root = tmp_path / "node"
    (root / "etc" / "containerd").mkdir(parents=True)
    if config:
        shutil.copy(config, root / "etc" / "containerd" / "config.toml")
    return root


def node_config(root, text):
    """ROOT's /etc/cdi-shim/config.toml, written with TEXT (an operator's own, before install)."""
    config = root / "etc" / "cdi-shim" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(text)
    return config


@pytest.mark.parametrize("restart", [False, True], ids=["", "restart"])
@pytest.mark.parametrize("drop_in", [True, False], ids=["drop-in", "main-file"])
@pytest.mark.parametrize("config", ["distribution", "default"])
def test_second_run_changes_nothing_and_containerd_loads_the_result(tmp_path, shim_env, fake_binary, drop_in,
                                                                     restart, config, node_containerd):
    """On a node shipping its distribution's own config (Debian 12's 1.6 file, trixie's 1.7, forky's
    2.1: version 2, which 2.1 migrates) or containerd's own default: 1.6 and 1.7 (version 2), 2.1
    (version 3). The second run rewrites nothing, backs nothing up and restarts nothing, even where
    the text we would write differs from the first run's in whitespace only (a blank line of the
    drop-in's copied CRI section on Debian's file: "changed" is the parsed content)."""
    real = node_containerd
    root = node_root(tmp_path, config=real.distribution if config == "distribution" else real.default)
    extra = ["--drop-in"] if drop_in else []
    log = tmp_path / "systemctl.log"
    if restart:
        state = tmp_path / "state"
        state.mkdir()
        (state / "active-containerd").touch()
        program = tmp_path / "systemctl"
        program.write_text(FAKE_SYSTEMCTL.format(log=log, state=state))
        program.chmod(0o755)
        extra += ["--restart", "--systemctl", str(program)]
    first = install(root, *extra, env=shim_env, binary=fake_binary, containerd_binary=real.binary)
    assert "containerd: changed: registered runtime \"nvidia\"" in first.stderr
    assert "loaded and checked by the installed containerd" in first.stderr
    if restart:
        assert "restarted containerd" in first.stderr and "restart containerd" in read(log).splitlines()
        log.write_text("")
    else:
        assert "containerd must be restarted to load the runtime (rerun with --restart)" in first.stderr
    if config == "distribution" and real.config_version == 3:
        assert f"migrated {root}/etc/containerd/config.toml from version 2 to 3" in first.stderr
    before = snapshot(root)
    second = install(root, *extra, env=shim_env, binary=fake_binary, containerd_binary=real.binary)
    assert snapshot(root) == before  # byte-identical, not even rewritten (mtimes equal)
    assert second.stderr.rstrip().endswith("cdi-shim: nothing changed"), second.stderr
    assert "changed:" not in second.stderr.replace("unchanged:", "").replace("nothing changed", "")
    if restart:   # only questions asked of systemd
        assert {line.split()[0] for line in read(log).splitlines()} == {"is-enabled", "is-active"}

    main = root / "etc" / "containerd" / "config.toml"
    loaded = real.dump(main)
    assert loaded["version"] == real.config_version
    cri = loaded["plugins"][real.cri]
    section = cri["containerd"]
    entry = section["runtimes"]["nvidia"]
    assert entry["options"]["BinaryName"] == fake_binary
    assert entry["container_annotations"] == ["cdi.k8s.io/*"]
    assert entry["runtime_type"] == "io.containerd.runc.v2"
    assert "runc" in section["runtimes"] and section["default_runtime_name"] == "runc"
    if real.config_version == 3:  # containerd's own CDI resolves from the node's spec-dirs
        assert cri["enable_cdi"] is True and cri["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]
    elif real.version == "1.7":  # 1.7 ships it off, and install keeps it so: cdi-shim-runtime injects
        assert cri["enable_cdi"] is False
    written = toml_loads(read(main))
    assert written["version"] == real.config_version
    if drop_in:
        # the import is relative to the main file: right on the node and under ROOT alike
        assert written["imports"] == ["conf.d/99-cdi-shim.toml"]
        assert toml_loads(read(root / "etc" / "containerd" / "conf.d" / "99-cdi-shim.toml"))["version"] == \
            real.config_version
    else:
        assert not written.get("imports")


def test_everything_it_puts_in_place(tmp_path, shim_env, fake_binary):
    root = node_root(tmp_path)
    out = install(root, "--drop-in", env=shim_env, binary=fake_binary)
    config = root / "etc" / "cdi-shim" / "config.toml"
    from shim.config import load_config

    loaded = load_config(str(config))
    assert loaded.spec_dirs == ("/etc/cdi", "/var/run/cdi") and loaded.annotation_prefixes == ("cdi.k8s.io/",)
    unit = root / "etc" / "systemd" / "system" / UNIT_NAME
    assert read(unit) == unit_text("/usr/local/bin/cdi-shim")
    assert "ExecStart=/usr/local/bin/cdi-shim runtime serve" in read(unit)
    wants = root / "etc" / "systemd" / "system" / "multi-user.target.wants" / UNIT_NAME
    assert os.readlink(wants) == f"/etc/systemd/system/{UNIT_NAME}"  # what `systemctl enable` makes
    assert f"systemctl not run (the root is {root}, not /)" in out.stderr
    assert "no GPU here" in out.stderr and not (root / "var" / "run" / "cdi").exists()
    assert not list((root / "etc" / "containerd").glob(".*lock*"))


def test_contrib_unit_is_the_installed_one():
    from shim.node.units import NODE_CDI_SHIM

    assert read(os.path.join(REPO, "contrib", UNIT_NAME)) == unit_text(NODE_CDI_SHIM)


def test_an_existing_cdi_shim_config_is_kept(tmp_path, shim_env, fake_binary):
    root = node_root(tmp_path)
    config = node_config(root, 'annotation-prefixes = ["cdi.k8s.io/", "example.com/"]\n')
    out = install(root, "--drop-in", env=shim_env, binary=fake_binary)
    assert read(config) == 'annotation-prefixes = ["cdi.k8s.io/", "example.com/"]\n'
    assert "exists (kept as it is)" in out.stderr
    entry = dump(root / "etc" / "containerd" / "config.toml")["plugins"][CRI2]["containerd"]["runtimes"]["nvidia"]
    assert entry["container_annotations"] == ["cdi.k8s.io/*", "example.com/*"]  # ROOT's config, not the host's


def test_a_node_without_containerd_config(tmp_path, shim_env, fake_binary, node_containerd):
    """No config.toml: the version is the installed containerd's (2 for 1.6, 3 for 2.1)."""
    real = node_containerd
    root = node_root(tmp_path, config=None)
    install(root, "--drop-in", env=shim_env, binary=fake_binary, containerd_binary=real.binary)
    main = root / "etc" / "containerd" / "config.toml"
    assert toml_loads(read(main))["version"] == real.config_version
    assert real.runtimes(main)["nvidia"]["options"]["BinaryName"] == fake_binary
    before = snapshot(root)
    assert install(root, "--drop-in", env=shim_env, binary=fake_binary,
                   containerd_binary=real.binary).stderr.rstrip().endswith("nothing changed")
    assert snapshot(root) == before


def test_containerd_cdi_follows_the_node_s_spec_dirs(tmp_path, shim_env, fake_binary, containerd_release):
    """containerd 2.1 resolves CDI devices itself (enable_cdi is on by default): install makes its
    cdi_spec_dirs the spec-dirs of the node's cdi-shim config, so both read the same specs."""
    real = Containerd("2.1", containerd_release("2.1"), tmp_path)
    root = node_root(tmp_path, config=real.default)
    node_config(root, 'spec-dirs = ["/opt/cdi", "/var/run/cdi"]\n')
    install(root, "--drop-in", env=shim_env, binary=fake_binary, containerd_binary=real.binary)
    cri = real.dump(root / "etc" / "containerd" / "config.toml")["plugins"][CRI3]
    assert cri["enable_cdi"] is True and cri["cdi_spec_dirs"] == ["/opt/cdi", "/var/run/cdi"]


def test_a_regenerated_config_is_registered_again(tmp_path, shim_env, fake_binary):
    """What a managed node's boot does: config.toml comes back as the node image has it."""
    root = node_root(tmp_path)
    install(root, "--drop-in", env=shim_env, binary=fake_binary)
    shutil.copy(V2_DEFAULT, root / "etc" / "containerd" / "config.toml")
    out = install(root, "--drop-in", env=shim_env, binary=fake_binary)
    assert "containerd: changed" in out.stderr and "config: unchanged" in out.stderr
    assert "nvidia" in dump(root / "etc" / "containerd" / "config.toml")["plugins"][CRI2]["containerd"]["runtimes"]


def test_restart_in_a_root_without_systemctl_fails_saying_why(tmp_path, shim_env, fake_binary):
    root = node_root(tmp_path)
    out = install(root, "--drop-in", "--restart", env=shim_env, binary=fake_binary, check=False)
    assert out.returncode == 1
    assert "cannot restart containerd: systemctl not run (the root is" in out.stderr
    # nothing changed: no restart asked of anyone, exit 0
    again = install(root, "--drop-in", "--restart", env=shim_env, binary=fake_binary)
    assert again.stderr.rstrip().endswith("nothing changed")


# --- systemctl: a recording stand-in (PID 1 is not systemd here) --------------------------------------

FAKE_SYSTEMCTL = """#!/bin/sh
echo "$*" >> "{log}"
case "$1" in
  is-enabled) test -e "{state}/enabled" ;;
  is-active) test -e "{state}/active-$3" ;;
  enable) touch "{state}/enabled" ;;
  start|restart) touch "{state}/active-$2" ;;
  *) exit 0 ;;
esac
"""


def test_systemctl_enables_starts_and_restarts_only_on_change(tmp_path, shim_env, fake_binary):
    root = node_root(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    log = tmp_path / "systemctl.log"
    program = tmp_path / "systemctl"
    program.write_text(FAKE_SYSTEMCTL.format(log=log, state=state))
    program.chmod(0o755)
    (state / "active-containerd").touch()
    systemctl = ["--systemctl", str(program), "--no-spec-refresh"]   # (its unit: test_spec_refresh_unit_*)
    out = install(root, "--drop-in", "--restart", *systemctl, env=shim_env, binary=fake_binary)
    assert read(log).splitlines() == [
        "daemon-reload", f"is-enabled --quiet {UNIT_NAME}", f"enable {UNIT_NAME}",
        f"is-active --quiet {UNIT_NAME}", f"start {UNIT_NAME}", "restart containerd"]
    assert "restarted containerd" in out.stderr
    assert not (root / "etc" / "systemd" / "system" / "multi-user.target.wants").exists()  # systemctl's job
    log.write_text("")
    out = install(root, "--drop-in", "--restart", *systemctl, env=shim_env, binary=fake_binary)
    assert read(log).splitlines() == [f"is-enabled --quiet {UNIT_NAME}", f"is-active --quiet {UNIT_NAME}"]
    assert out.stderr.rstrip().endswith("nothing changed")
    # a new cdi-shim location: the unit is rewritten and the running service restarted; containerd is not
    log.write_text("")
    out = run_cli("install", "--node", "--drop-in", "--restart", "--root", str(root), "--runtime-binary", fake_binary,
                  "--cdi-shim-binary", "/opt/cdi-shim/bin/cdi-shim", "--containerd-binary", containerd(), *systemctl,
                  env=shim_env, check=True)
    assert read(log).splitlines() == ["daemon-reload", f"is-enabled --quiet {UNIT_NAME}",
                                      f"is-active --quiet {UNIT_NAME}", f"restart {UNIT_NAME}"]
    assert "containerd need not be restarted" in out.stderr


# --- k3s / rke2 --------------------------------------------------------------------------------------

K3S_GENERATED = """# File generated by k3s. DO NOT EDIT. Use config.toml.tmpl instead.
version = 2

[plugins."io.containerd.internal.v1.opt"]
  path = "/var/lib/rancher/k3s/agent/containerd"
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "10010"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = {systemd}
"""


def k3s_root(tmp_path, generated=K3S_GENERATED.format(systemd="true"), distribution="k3s"):
    root = tmp_path / "node"
    directory = root / K3S_DIR.replace("k3s", distribution)
    directory.mkdir(parents=True)
    if generated is not None:
        (directory / "config.toml").write_text(generated)
    return root, directory


def render(template, base, systemd):
    """What k3s makes of our template: the base template's text in place of {{ template "base" . }}."""
    assert template.count('{{ template "base" . }}') == 1
    return template.replace('{{ template "base" . }}', base).replace("{{ .SystemdCgroup }}", systemd)


@pytest.mark.parametrize("distribution", ["k3s", "rke2"])
def test_k3s_template_extends_the_base_and_renders_to_a_config_containerd_loads(tmp_path, shim_env, fake_binary,
                                                                                distribution):
    root, directory = k3s_root(tmp_path, distribution=distribution)
    out = install(root, env=shim_env, binary=fake_binary)
    template = directory / "config.toml.tmpl"
    text = read(template)
    assert text.splitlines()[2] == '{{ template "base" . }}'
    assert "edit this file, not config.toml" in text
    assert not (root / "etc" / "containerd").exists()  # k3s's containerd does not read /etc/containerd
    services = "k3s / k3s-agent" if distribution == "k3s" else "rke2-server / rke2-agent"
    assert f"{services} must be restarted" in out.stderr
    rendered = tmp_path / "rendered.toml"
    rendered.write_text(render(text, K3S_GENERATED.format(systemd="true"), "true"))
    entry = dump(rendered)["plugins"][CRI2]["containerd"]["runtimes"]["nvidia"]
    assert entry["options"] == {**entry["options"], "BinaryName": fake_binary, "SystemdCgroup": True}
    assert entry["container_annotations"] == ["cdi.k8s.io/*"]
    before = snapshot(root)
    again = install(root, env=shim_env, binary=fake_binary)
    assert snapshot(root) == before and again.stderr.rstrip().endswith("nothing changed")


def test_k3s_with_containerd_2_gets_the_v3_template(tmp_path, shim_env, fake_binary):
    root, directory = k3s_root(tmp_path, generated="# File generated by k3s. DO NOT EDIT.\nversion = 3\n")
    install(root, env=shim_env, binary=fake_binary)
    text = read(directory / "config-v3.toml.tmpl")
    assert "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]" in text
    assert not (directory / "config.toml.tmpl").exists()
    toml_loads(render(text, "version = 3\n", "false"))  # parses once rendered


def test_k3s_foreign_template_is_refused_with_the_lines_to_add(tmp_path, shim_env, fake_binary):
    root, directory = k3s_root(tmp_path)
    template = directory / "config.toml.tmpl"
    template.write_text('{{ template "base" . }}\n# mine\n')
    out = install(root, env=shim_env, binary=fake_binary, check=False)
    assert out.returncode == 1
    assert "exists and was not written by cdi-shim" in out.stderr
    assert "edit the template, not config.toml" in out.stderr
    assert f'BinaryName = "{fake_binary}"' in out.stderr
    assert read(template) == '{{ template "base" . }}\n# mine\n'


def test_k3s_before_its_first_start_is_refused(tmp_path, shim_env, fake_binary):
    root, directory = k3s_root(tmp_path, generated=None)
    out = install(root, env=shim_env, binary=fake_binary, check=False)
    assert out.returncode == 1 and "start k3s once, then rerun this command" in out.stderr
    assert not (directory / "config.toml.tmpl").exists()


def test_k3s_with_the_toolkit_needs_another_runtime_name(tmp_path, shim_env, fake_binary):
    root, directory = k3s_root(tmp_path)
    toolkit = root / "usr" / "bin" / "nvidia-container-runtime"
    toolkit.parent.mkdir(parents=True)
    toolkit.write_text("#!/bin/sh\n")
    out = install(root, env=shim_env, binary=fake_binary, check=False)
    assert out.returncode == 1 and "pass --runtime-name cdi-shim" in out.stderr
    install(root, "--runtime-name", "cdi-shim", env=shim_env, binary=fake_binary)
    assert ".containerd.runtimes.cdi-shim]" in read(directory / "config.toml.tmpl")


# --- the CDI spec, on a node with a (fake) GPU --------------------------------------------------------

@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory):
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "generate"))
    try:
        import fakedriver
    finally:
        sys.path.pop(0)
    if os.geteuid() != 0:
        pytest.fail("the fake driver's device nodes need mknod: run as root", pytrace=False)
    driver = fakedriver.FakeDriver(tmp_path_factory.mktemp("fake-driver"), gpus=2)
    yield driver
    driver.close()


def test_spec_generated_when_a_gpu_is_present_and_kept_when_current(tmp_path, shim_env, fake_binary, fake_driver):
    root = node_root(tmp_path)
    roots = ["--driver-root", fake_driver.root, "--dev-root", fake_driver.dev_root]
    out = install(root, "--drop-in", *roots, env=shim_env, binary=fake_binary)
    spec = root / "var" / "run" / "cdi" / "nvidia.yaml"
    assert f"cdi-spec: changed: wrote {spec}: " in out.stderr and "(2 GPU(s), driver 580.65.06)" in out.stderr
    listed = run_cli("cdi", "list", "--spec-dir", str(spec.parent), env=shim_env, check=True)
    assert "nvidia.com/gpu=0" in listed.stdout.split() and "nvidia.com/gpu=all" in listed.stdout.split()
    before = snapshot(root)
    again = install(root, "--drop-in", *roots, env=shim_env, binary=fake_binary)
    assert snapshot(root) == before
    assert f"cdi-spec: unchanged: {spec} is current" in again.stderr
    assert again.stderr.rstrip().endswith("nothing changed")
    fake_driver.set_gpus(3)
    fake_driver.make_nodes(3)
    try:
        third = install(root, "--drop-in", *roots, env=shim_env, binary=fake_binary)
    finally:
        fake_driver.set_gpus(2)
    assert "(3 GPU(s)" in third.stderr and "containerd need not be restarted" in third.stderr


def test_the_one_mount_layout_is_kept_by_install(tmp_path, shim_env, fake_binary, fake_driver):
    """--layout one-mount: the spec binds ROOT/var/lib/cdi-shim/driver/<version>-<digest>/lib64 at
    /usr/local/nvidia/lib64; a second run changes nothing; a leftover directory of an older
    driver that no spec names and no container binds is removed."""
    root = node_root(tmp_path)
    roots = ["--driver-root", fake_driver.root, "--dev-root", fake_driver.dev_root, "--layout", "one-mount"]
    out = install(root, "--drop-in", *roots, env=shim_env, binary=fake_binary)
    base = root / "var" / "lib" / "cdi-shim" / "driver"
    (name,) = os.listdir(base)
    spec = (root / "var" / "run" / "cdi" / "nvidia.yaml").read_text()
    assert f"hostPath: {base}/{name}/lib64\n    containerPath: /usr/local/nvidia/lib64" in spec, spec
    assert f"the driver's files are in {base}/{name}" in out.stderr
    stale = base / "535.54.03-0123456789ab"
    (stale / "lib64").mkdir(parents=True)
    before = snapshot(root)
    again = install(root, "--drop-in", *roots, env=shim_env, binary=fake_binary)
    assert "cdi-spec: unchanged" in again.stderr
    assert "removed unused host directories 535.54.03-0123456789ab" in again.stderr
    assert sorted(os.listdir(base)) == [name]
    assert snapshot(root) == {k: v for k, v in before.items() if "535.54.03" not in str(k)}


# --- a pod through the installed handler ------------------------------------------------------------

@pytest.mark.parametrize("version", ["1.6", "2.1"])
def test_pod_through_the_installed_handler_gets_its_device(tmp_path, monkeypatch, version):
    """The CRI lab (cdi_shim_lab/lab.py: a private containerd, real pods; 2.1 in a private mount
    namespace with its own /run) with its runtime registered by `install --node --drop-in` on a
    node root holding the lab's containerd config and cdi-shim config, instead of `runtime
    configure`: a pod of RuntimeClass handler "nvidia" asking for nvidia.com/gpu=0 through the
    device plugin's annotation gets the device node, the env and the mount of the spec. On 2.1
    containerd's own CDI is on (its default), its cdi_spec_dirs made the node's spec-dirs by the
    install, so the device resolves whoever injects it first."""
    for name, package in (("runc", "runc"), ("busybox", "busybox-static"), ("unshare", "util-linux")):
        need(name, package)
    if version == "1.6":
        need("containerd", "containerd")
        need("ctr", "containerd")
    if os.geteuid() != 0:
        pytest.fail("a private containerd runs pods with runc: run as root", pytrace=False)
    monkeypatch.setenv("CDI_SHIM_CRI_BUILD_DIR", str(tmp_path / "cri-build"))
    from cdi_shim_lab.lab import Lab, LabError

    node = tmp_path / "node"

    class InstalledLab(Lab):
        def configure(self, *args):
            shim_config = node / "etc" / "cdi-shim" / "config.toml"
            if not shim_config.exists():  # the node's cdi-shim config: the lab's (its spec dir)
                shim_config.parent.mkdir(parents=True)
                shutil.copy(self.shim_config, shim_config)
            self.installed = run_cli("install", "--node", "--drop-in", "--root", str(node), "--runtime-binary",
                                     self.runtime_binary, "--cdi-shim-binary", self.cli, "--containerd-binary",
                                     self.containerd, env=self.env(), check=True)
            return self.installed

    try:
        lab = InstalledLab(tmp_path / "lab", containerd=version)
    except LabError as err:
        pytest.fail(str(err), pytrace=False)
    lab.config = str(node / "etc" / "containerd" / "config.toml")
    os.makedirs(os.path.dirname(lab.config))
    try:
        try:
            lab.setup()
        except LabError as err:
            pytest.fail(str(err), pytrace=False)
        assert "containerd: changed: registered runtime \"nvidia\"" in lab.installed.stderr
        drop_in = node / "etc" / "containerd" / "conf.d" / "99-cdi-shim.toml"
        assert toml_loads(read(drop_in))["version"] == lab.config_version == (2 if version == "1.6" else 3)
        if version != "1.6":
            cri = toml_loads(read(drop_in))["plugins"][CRI3]
            assert cri["cdi_spec_dirs"] == [lab.spec_dir]
        probe = ("echo \"node=$(stat -c '%F %t:%T' /dev/nvidia0 2>&1)\"; echo \"env=$FAKE_GPU_INDEX/$FAKE_DRIVER\"; "
                 "echo \"mount=$(cat /usr/local/fake-driver/version.txt 2>&1)\"")
        run = lab.run_pod("nvidia", ["sh", "-c", probe], annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=0"})
        assert run.status.exit_code == 0, run.output
        seen = dict(line.split("=", 1) for line in run.output if "=" in line)
        assert seen == {"node": "character special file c3:0", "env": "0/555.42", "mount": "fake driver 555.42"}
        if version == "1.6":  # no CDI of its own: plain runc ignores the annotation
            plain = lab.run_pod("runc", ["sh", "-c", probe], annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=0"})
            assert "No such file" in dict(line.split("=", 1) for line in plain.output if "=" in line)["node"]
        before = snapshot(node)
        again = lab.configure()  # the next node start, containerd running
        assert again.stderr.rstrip().endswith("nothing changed") and snapshot(node) == before
    finally:
        lab.stop()


def test_a_failing_step_does_not_stop_the_others_nor_the_restart(tmp_path, shim_env, fake_binary):
    """A GPU node whose driver has no NVML: the spec fails, the runtime is registered all the same,
    containerd restarted (asked), and the command fails naming the step."""
    root = node_root(tmp_path)
    dev = tmp_path / "devroot" / "dev"
    dev.mkdir(parents=True)
    os.mknod(dev / "nvidiactl", 0o666 | stat.S_IFCHR, os.makedev(195, 255))
    (tmp_path / "driver").mkdir()
    log = tmp_path / "systemctl.log"
    program = tmp_path / "systemctl"
    program.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\n')
    program.chmod(0o755)
    out = install(root, "--drop-in", "--restart", "--systemctl", str(program), "--driver-root",
                  str(tmp_path / "driver"), "--dev-root", str(tmp_path / "devroot"), env=shim_env, binary=fake_binary,
                  check=False)
    assert out.returncode == 1
    assert "cdi-spec: failed: cannot generate the CDI spec: " in out.stderr
    assert "Error: 1 step(s) failed: cdi-spec: " in out.stderr
    assert "restart containerd" in read(log).splitlines()
    assert "nvidia" in dump(root / "etc" / "containerd" / "config.toml")["plugins"][CRI2]["containerd"]["runtimes"]


def test_no_resident_unit_when_the_config_turns_it_off(tmp_path, shim_env, fake_binary):
    root = node_root(tmp_path)
    node_config(root, 'resident-socket = ""\n')
    out = install(root, "--drop-in", "--no-spec-refresh", env=shim_env, binary=fake_binary)
    assert "spec-refresh: unchanged: not installed (--no-spec-refresh)" in out.stderr
    assert 'resident: unchanged: resident-socket is "" in' in out.stderr
    assert not (root / "etc" / "systemd").exists()


def test_node_image_names_the_node_s_own_paths(tmp_path, shim_env):
    """Building a node image: BinaryName and ExecStart are the node's paths, present inside ROOT only."""
    root = node_root(tmp_path)
    binary = "/opt/cdi-shim/current/venv/bin/cdi-shim-runtime"
    missing = run_cli("install", "--node", "--drop-in", "--root", str(root), "--runtime-binary", binary,
                      "--containerd-binary", containerd(), env=shim_env, check=False)
    assert missing.returncode == 1 and f"{root}{binary} is not an executable file" in missing.stderr
    inside = root / binary.lstrip("/")
    inside.parent.mkdir(parents=True)
    inside.write_text("#!/bin/sh\n")
    inside.chmod(0o755)
    run_cli("install", "--node", "--drop-in", "--root", str(root), "--runtime-binary", binary,
            "--cdi-shim-binary", "/opt/cdi-shim/current/venv/bin/cdi-shim", "--containerd-binary", containerd(),
            env=shim_env, check=True)
    entry = dump(root / "etc" / "containerd" / "config.toml")["plugins"][CRI2]["containerd"]["runtimes"]["nvidia"]
    assert entry["options"]["BinaryName"] == binary
    assert "ExecStart=/opt/cdi-shim/current/venv/bin/cdi-shim runtime serve" in read(
        root / "etc" / "systemd" / "system" / UNIT_NAME)


# --- issue 31: request defaults fit the node --------------------------------------------------------

def _runtime_settings(root, env):
    """The settings the runtime reads from ROOT's config (the real loader, in a child)."""
    code = ("import sys\nfrom shim.config import load_config\n"
            "c = load_config(sys.argv[1])\nprint(c.accept_env_unprivileged, c.device_env)\n")
    out = subprocess.run([sys.executable, "-c", code, str(root / "etc" / "cdi-shim" / "config.toml")],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.mark.parametrize("marker", ["var/lib/kubelet/config.yaml", "etc/kubernetes/kubelet.conf", None])
def test_install_on_a_kubernetes_node_turns_env_requests_of_unprivileged_containers_off(
        tmp_path, shim_env, fake_binary, marker):
    root = node_root(tmp_path)
    if marker:
        (root / marker).parent.mkdir(parents=True, exist_ok=True)
        (root / marker).write_text("kind: KubeletConfiguration\n")
    out = install(root, env=shim_env, binary=fake_binary, check=None)
    assert "config: changed: wrote" in out.stderr, out.stderr
    if marker:
        assert f"a Kubernetes node, /{marker}: accept-env-unprivileged = false" in out.stderr
        assert "deviceListStrategy cdi-annotations, cdi-cri or volume-mounts, not envvar" in out.stderr
        assert _runtime_settings(root, shim_env) == ["False", "NVIDIA_VISIBLE_DEVICES"]
    else:  # docker, podman, plain runc: env requests are the interface
        assert "accept-env-unprivileged" not in out.stderr
        assert _runtime_settings(root, shim_env) == ["True", "NVIDIA_VISIBLE_DEVICES"]
    doctor = run_cli("doctor", "--root", str(root), "--containerd-binary", containerd(), "--json",
                     env={k: v for k, v in shim_env.items() if k != "CDI_SHIM_CONFIG"})
    import json
    checks = {c["check"]: c for c in json.loads(doctor.stdout)}
    if marker:
        assert checks["runtime.env-requests"]["status"] == "ok", checks["runtime.env-requests"]
    else:
        assert "runtime.env-requests" not in checks


def test_install_keeps_an_operators_config_and_warns_on_a_kubernetes_node(tmp_path, shim_env, fake_binary):
    root = node_root(tmp_path)
    (root / "var/lib/kubelet").mkdir(parents=True)
    (root / "var/lib/kubelet/config.yaml").write_text("kind: KubeletConfiguration\n")
    config = node_config(root, 'log-level = "debug"\n')
    out = install(root, env=shim_env, binary=fake_binary, check=None)
    assert read(config) == 'log-level = "debug"\n'
    assert f"config: warning: a Kubernetes node (/var/lib/kubelet/config.yaml) and accept-env-unprivileged is " \
        f"true in {config}" in out.stderr, out.stderr


# --- a hostile node tree (issue 33 item 3, finding 8) -------------------------------------------------

def test_absolute_links_in_the_node_tree_never_lead_out_of_it(tmp_path, shim_env, fake_binary, fake_driver):
    """Links planted in the node tree: an absolute one means the tree's own file (the config, the
    unit, the spec are written there); one that leads nowhere inside the tree is a one-line error
    naming it, and the host's file of that name is never read or written."""
    root = node_root(tmp_path)
    outside = tmp_path / "outside"
    (outside / "containerd").mkdir(parents=True)
    shutil.copy(V2_DEFAULT, outside / "containerd" / "config.toml")
    (outside / "systemd").mkdir()
    before = snapshot(outside)
    # /etc/cdi-shim -> /opt/cfg and /var/run -> /run: absolute, inside the tree
    (root / "opt" / "cfg").mkdir(parents=True)
    os.symlink("/opt/cfg", root / "etc" / "cdi-shim")
    (root / "run").mkdir()
    (root / "var").mkdir()
    os.symlink("/run", root / "var" / "run")
    # /etc/systemd/system -> the host's folder: nowhere inside the tree
    (root / "etc" / "systemd").mkdir()
    os.symlink(str(outside / "systemd"), root / "etc" / "systemd" / "system")
    roots = ["--driver-root", fake_driver.root, "--dev-root", fake_driver.dev_root]
    out = install(root, "--drop-in", *roots, env=shim_env, binary=fake_binary, check=False)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert (f"resident: failed: {root}/etc/systemd/system is a link to {outside}/systemd, which leads to no folder "
            f"in the node root {root}") in out.stderr
    assert (root / "opt" / "cfg" / "config.toml").is_file() and not os.path.exists("/opt/cfg/config.toml")
    assert (root / "run" / "cdi" / "nvidia.yaml").is_file()
    assert snapshot(outside) == before
    # the containerd config folder linked out of the tree: refused, the host's config untouched
    shutil.rmtree(root / "etc" / "containerd")
    os.symlink(str(outside / "containerd"), root / "etc" / "containerd")
    os.unlink(root / "etc" / "systemd" / "system")
    out = install(root, "--drop-in", *roots, env=shim_env, binary=fake_binary, check=False)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"containerd: failed: {root}/etc/containerd is a link to {outside}/containerd" in out.stderr
    assert snapshot(outside) == before
    assert out.stderr.strip().splitlines()[-1].startswith("Error: 1 step(s) failed: containerd: ")


@pytest.mark.parametrize("root_kind", ["a node tree", "this host"])
def test_links_another_user_planted_are_not_followed(tmp_path, shim_env, fake_binary, root_kind):
    """The node's containerd config a link another user owns, and /etc/cdi-shim a folder link of
    theirs: install rewrote the root-owned file the first leads to and wrote root's config into
    their folder. Each step fails on one line naming the link and its owner; neither target is
    touched (issue 43, finding 7: cdi.safeio.resolve_trusted)."""
    from shim.node.install import Installer, InstallError

    root = node_root(tmp_path, config=None)
    target = root / "etc" / "containerd" / "root-owned.toml"
    shutil.copy(V2_DEFAULT, target)
    os.symlink("root-owned.toml", root / "etc" / "containerd" / "config.toml")
    os.lchown(root / "etc" / "containerd" / "config.toml", 1000, 1000)
    theirs = root / "home" / "eve"
    theirs.mkdir(parents=True)
    os.chown(theirs, 1000, 1000)
    os.symlink("/home/eve" if root_kind == "a node tree" else theirs, root / "etc" / "cdi-shim")
    os.lchown(root / "etc" / "cdi-shim", 1000, 1000)
    if root_kind == "this host":     # the rule as `install` on the node itself meets it
        installer = Installer(root="/")
        for node_path in (str(root / "etc" / "containerd" / "config.toml"), str(root / "etc" / "cdi-shim" / "x")):
            with pytest.raises(InstallError, match=r"will not follow the link .* it is owned by uid 1000"):
                installer.target(node_path)
        assert os.listdir(theirs) == []
        return
    out = install(root, env=shim_env, binary=fake_binary, check=False)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert (f"containerd: failed: /etc/containerd/config.toml: will not follow the link "
            f"{root}/etc/containerd/config.toml: it is owned by uid 1000") in out.stderr, out.stderr
    assert (f"config: failed: /etc/cdi-shim/config.toml: will not follow the link {root}/etc/cdi-shim: it is owned "
            "by uid 1000") in out.stderr, out.stderr
    assert read(target) == read(V2_DEFAULT) and os.listdir(theirs) == []


def test_a_world_writable_containerd_config_is_rewritten_0644_and_so_is_its_backup(tmp_path, shim_env, fake_binary):
    root = node_root(tmp_path)
    main = root / "etc" / "containerd" / "config.toml"
    main.chmod(0o666)
    own = node_config(root, 'annotation-prefixes = ["cdi.k8s.io/"]\n')
    own.chmod(0o664)
    out = install(root, env=shim_env, binary=fake_binary)
    assert f"containerd: warning: {main} is writable by group or others (mode 666); rewritten 0644" in out.stderr
    assert f"config: warning: {own} is writable by group or others (mode 664); fix it: chmod go-w {own}" \
        in out.stderr
    assert stat.S_IMODE(os.stat(main).st_mode) == 0o644
    backups = list(main.parent.glob("config.toml.bak-*"))
    assert len(backups) == 1 and stat.S_IMODE(os.stat(backups[0]).st_mode) == 0o644
    assert read(backups[0]) == read(V2_DEFAULT)
    unit = root / "etc" / "systemd" / "system" / UNIT_NAME
    assert stat.S_IMODE(os.stat(unit).st_mode) == 0o644
    # a 0600 config stays 0600 (stricter is kept)
    main.chmod(0o600)
    install(root, "--runtime-name", "other", env=shim_env, binary=fake_binary)
    assert stat.S_IMODE(os.stat(main).st_mode) == 0o600


def test_a_failing_step_is_one_line_naming_the_file(tmp_path, shim_env, fake_binary):
    """/etc/systemd/system a file: the unit's step fails on one line naming it, no traceback, no
    temp file left; the steps before it are whole."""
    root = node_root(tmp_path)
    (root / "etc" / "systemd").mkdir()
    (root / "etc" / "systemd" / "system").write_text("not a folder\n")
    out = install(root, "--drop-in", env=shim_env, binary=fake_binary, check=False)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"resident: failed: {root}/etc/systemd/system: Not a directory" in out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        f"Error: 2 step(s) failed: resident: {root}/etc/systemd/system: Not a directory; "
        f"spec-refresh: {root}/etc/systemd/system: Not a directory")
    assert "nvidia" in dump(root / "etc" / "containerd" / "config.toml")["plugins"][CRI2]["containerd"]["runtimes"]
    assert read(root / "etc" / "systemd" / "system") == "not a folder\n"
    assert [p.name for p in (root / "etc" / "systemd").iterdir()] == ["system"]


# --- /dev/char links (issue 30 item 3) ----------------------------------------------------------------

NO_GPU = ("--dev-root", "/nonexistent-dev-root")  # the spec is the test's: no generation from the root's nodes


def dev_char_root(tmp_path):
    """A node root with a spec naming /dev/nvidia0, /dev/nvidiactl, /dev/nvidia-uvm and a cap
    (mknod: major 195, uvm 509, caps 235) and /dev/nvidia1, which is not there yet."""
    if os.geteuid() != 0:
        pytest.fail("device nodes need mknod: run as root", pytrace=False)
    root = node_root(tmp_path)
    dev = root / "dev"
    (dev / "nvidia-caps").mkdir(parents=True)
    for name, major, minor in (("nvidia0", 195, 0), ("nvidiactl", 195, 255), ("nvidia-uvm", 509, 0),
                               ("nvidia-caps/nvidia-cap1", 235, 1)):
        os.mknod(dev / name, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    spec = root / "etc" / "cdi" / "nvidia.yaml"
    spec.parent.mkdir(parents=True)
    spec.write_text('cdiVersion: "0.6.0"\nkind: nvidia.com/gpu\n'
                    'devices:\n'
                    '- name: "0"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n'
                    '    - path: /dev/nvidia-caps/nvidia-cap1\n'
                    '- name: "1"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia1\n'
                    'containerEdits:\n  deviceNodes:\n  - path: /dev/nvidiactl\n  - path: /dev/nvidia-uvm\n')
    return root


def char_links(root):
    folder = root / "dev" / "char"
    return {name: os.readlink(folder / name) for name in sorted(os.listdir(folder))} if folder.exists() else {}


def test_dev_char_links_for_every_spec_device_node_and_the_udev_rule(tmp_path, shim_env, fake_binary):
    root = dev_char_root(tmp_path)
    first = install(root, *NO_GPU, env=shim_env, binary=fake_binary)
    assert char_links(root) == {"195:0": "../nvidia0", "195:255": "../nvidiactl", "509:0": "../nvidia-uvm",
                                "235:1": "../nvidia-caps/nvidia-cap1"}
    assert os.stat(root / "dev" / "char" / "235:1").st_rdev == os.makedev(235, 1)  # udev's form resolves
    assert "dev-char: changed: linked " in first.stderr and f"{root}/dev/char/195:0 -> ../nvidia0" in first.stderr
    assert f"dev-char: {root}/dev/nvidia1 is not a character device here" in first.stderr
    rule = read(root / "etc" / "udev" / "rules.d" / "71-cdi-shim-dev-char.rules")
    assert ('ACTION=="add", SUBSYSTEM=="module", KERNEL=="nvidia|nvidia_uvm|nvidia_modeset", '
            'RUN+="/usr/local/bin/cdi-shim install --node --dev-char-only"') in rule.splitlines()
    before = snapshot(root)
    second = install(root, *NO_GPU, env=shim_env, binary=fake_binary)
    assert snapshot(root) == before
    assert "dev-char: unchanged: 4 /dev/char link(s) in place" in second.stderr, second.stderr
    assert second.stderr.rstrip().endswith("nothing changed")
    # nvidia1 appears later (what the udev rule's run does): only its link is made, the rule is kept
    os.mknod(root / "dev" / "nvidia1", 0o666 | stat.S_IFCHR, os.makedev(195, 1))
    later = install(root, "--dev-char-only", *NO_GPU, env=shim_env, binary=fake_binary)
    assert [line.split(":")[1] for line in later.stderr.splitlines()] == [" dev-char", " changed"], later.stderr
    assert char_links(root)["195:1"] == "../nvidia1"


def test_dev_char_wrong_link_replaced_foreign_one_kept_file_left(tmp_path, shim_env, fake_binary):
    root = dev_char_root(tmp_path)
    folder = root / "dev" / "char"
    folder.mkdir()
    os.symlink("../null", folder / "195:0")              # leads elsewhere: replaced
    os.symlink("/dev/nvidiactl", folder / "195:255")     # nvidia-ctk's absolute form, right: kept
    (folder / "509:0").write_text("not a link\n")        # not ours to remove
    out = install(root, *NO_GPU, env=shim_env, binary=fake_binary)
    assert f"{folder}/195:0 -> ../nvidia0 (was -> ../null)" in out.stderr, out.stderr
    assert f"dev-char: warning: {folder}/509:0 exists and is not a link: left as it is" in out.stderr
    links = {n: os.readlink(folder / n) for n in ("195:0", "195:255")}
    assert links == {"195:0": "../nvidia0", "195:255": "/dev/nvidiactl"}
    assert read(folder / "509:0") == "not a link\n"
    assert not [n for n in os.listdir(folder) if n.startswith(".")]  # no temp link left


def test_dev_char_links_planted_out_of_the_root_are_not_followed(tmp_path, shim_env, fake_binary):
    """/dev/char an absolute link to a host folder: the tree's own folder of that name is used;
    /dev/nvidia0 a link climbing out of the root to a host device: no link for it."""
    root = dev_char_root(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.mknod(outside / "gpu", 0o666 | stat.S_IFCHR, os.makedev(195, 7))
    os.unlink(root / "dev" / "nvidia0")
    os.symlink("../../../outside/gpu", root / "dev" / "nvidia0")
    os.symlink(str(outside), root / "dev" / "char")
    out = install(root, *NO_GPU, env=shim_env, binary=fake_binary, check=False)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"dev-char: failed: {root}/" in out.stderr and "/dev/char: File exists" in out.stderr
    assert os.listdir(outside) == ["gpu"]
    (root / str(outside).lstrip("/")).mkdir(parents=True)   # the tree's own folder of that name
    out = install(root, *NO_GPU, env=shim_env, binary=fake_binary)
    assert os.listdir(outside) == ["gpu"]
    inside = root / str(outside).lstrip("/")
    assert sorted(os.listdir(inside)) == ["195:255", "235:1", "509:0"]
    assert f"dev-char: {root}/dev/nvidia0 is not a character device here: no link" in out.stderr, out.stderr


# --- the spec refresh: cdi generate --watch as a unit (issue 46, item 2) ------------------------------

def test_spec_refresh_unit_runs_this_cdi_shim_with_the_install_s_options(tmp_path, shim_env, fake_binary):
    """Installed and enabled by default; its ExecStart names the install's cdi-shim and the
    generate options the install was given; systemctl enables and starts it, restarts it when its
    text changed (a new release), and a second run asks only; --no-spec-refresh leaves it out."""
    from shim.node.units import render

    root = node_root(tmp_path)
    unit = root / "etc" / "systemd" / "system" / "cdi-shim-generate.service"
    out = install(root, "--drop-in", "--driver-root", "/run/nvidia/driver", "--layout", "one-mount",
                  env=shim_env, binary=fake_binary)
    assert f"spec-refresh: changed: wrote {unit}; enabled it" in out.stderr, out.stderr
    assert read(unit) == render("cdi-shim-generate.service", "/usr/local/bin/cdi-shim",
                                ["--driver-root", "/run/nvidia/driver", "--layout", "one-mount"])
    assert ("ExecStart=/usr/local/bin/cdi-shim cdi generate --watch --interval 5 --nvml-interval 60 "
            "--driver-root /run/nvidia/driver --layout one-mount\n") in read(unit)
    assert os.readlink(root / "etc/systemd/system/multi-user.target.wants/cdi-shim-generate.service") == \
        "/etc/systemd/system/cdi-shim-generate.service"

    state, log, program = tmp_path / "state", tmp_path / "systemctl.log", tmp_path / "systemctl"
    state.mkdir()
    program.write_text(FAKE_SYSTEMCTL.replace('test -e "{state}/enabled"', 'test -e "{state}/enabled-$3"')
                       .replace('enable) touch "{state}/enabled"', 'enable) touch "{state}/enabled-$2"')
                       .format(log=log, state=state))
    program.chmod(0o755)
    systemctl = ["--systemctl", str(program), "--driver-root", "/run/nvidia/driver", "--layout", "one-mount"]
    install(root, "--drop-in", *systemctl, env=shim_env, binary=fake_binary)
    calls = read(log).splitlines()
    assert calls[calls.index("is-enabled --quiet cdi-shim-generate.service"):] == [
        "is-enabled --quiet cdi-shim-generate.service", "enable cdi-shim-generate.service",
        "is-active --quiet cdi-shim-generate.service", "start cdi-shim-generate.service"]
    log.write_text("")
    again = install(root, "--drop-in", *systemctl, env=shim_env, binary=fake_binary)
    assert again.stderr.rstrip().endswith("nothing changed")
    assert {line.split()[0] for line in read(log).splitlines()} == {"is-enabled", "is-active"}
    log.write_text("")      # a new release's path: rewritten and restarted
    run_cli("install", "--node", "--drop-in", "--root", str(root), "--runtime-binary", fake_binary,
            "--cdi-shim-binary", "/opt/cdi-shim/current/bin/cdi-shim", "--containerd-binary", containerd(),
            *systemctl, env=shim_env, check=True)
    assert "restart cdi-shim-generate.service" in read(log).splitlines()
    assert "ExecStart=/opt/cdi-shim/current/bin/cdi-shim cdi generate --watch" in read(unit)

    other = node_root(tmp_path / "other")
    out = install(other, "--drop-in", "--no-spec-refresh", env=shim_env, binary=fake_binary)
    assert "spec-refresh: unchanged: not installed (--no-spec-refresh)" in out.stderr
    assert not (other / "etc" / "systemd" / "system" / "cdi-shim-generate.service").exists()
