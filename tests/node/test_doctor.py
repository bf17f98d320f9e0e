"""`cdi-shim doctor` on prepared node roots (--root).

Each root is a fake node built from real parts: device nodes made with mknod (char major 195),
driver libraries built by gcc with their real SONAMEs, the root's /etc/ld.so.cache written by
glibc's `ldconfig -r ROOT` (so our reader reads a real cache), a CDI spec written from the
root's own files (what `cdi generate` would write), a containerd config, a kubelet config.

A healthy node passes; each broken variant fails exactly the check it should, with its fix.

containerd: every containerd rule runs against a real containerd of each major version, asked
the way doctor asks a node's own: `containerd --version` and `containerd --config F config dump`.
The version-2 (1.6) roots name this machine's containerd 1.6 (Debian bookworm's) with
`--containerd-binary`; the 1.7 (version 2) and 2.1 (version 3) roots carry the real containerd
1.7.24 / 2.1.9 of Debian's trixie / forky (cdi_shim_lab/releases.py: fetched once with apt-get
download into $CDI_SHIM_TEST_CACHE) hard-linked as ROOT/usr/bin/containerd, found on ROOT's
PATH like a node's own. What the rules say is measured on those binaries: 1.6 reads a version-3
file as version 2, 1.7 refuses it, 2.1 refuses version 4 and warns of each old CRI table it
ignores in a version-3 file; enable_cdi is off by default in 1.7 and on in 2.x (their `config
dump`). No containerd 2.3 is packaged anywhere Debian serves, so its rules (version 4) alone are
reached through a stand-in that only answers `--version`.
"""
import json
import os
import shutil
import subprocess
import textwrap

import pytest

from shim.node.doctor import FAIL, OK, WARN, Node, Options, run_checks
from tests.helpers import cdi_shim_cli, need, run_cli

DRIVER = "570.86.10"
NEW_DRIVER = "575.51.02"
LIBDIR = "/usr/lib/x86_64-linux-gnu"
LIBRARIES = ("libcuda", "libnvidia-ml")


@pytest.fixture(scope="module")
def driver_files(tmp_path_factory):
    """{(library, version): path} of fake driver libraries built by gcc with real SONAMEs."""
    gcc = need("gcc", "gcc")
    out = tmp_path_factory.mktemp("driver")
    source = out / "lib.c"
    source.write_text("int fake_driver_entry(void) { return 0; }\n")
    built = {}
    for version in (DRIVER, NEW_DRIVER):
        for lib in LIBRARIES:
            path = out / f"{lib}.so.{version}"
            subprocess.run([gcc, "-shared", "-fPIC", "-o", str(path), f"-Wl,-soname,{lib}.so.1", str(source)],
                           check=True, capture_output=True)
            built[lib, version] = str(path)
    return built


def write(root, path, text, mode=0o644):
    full = os.path.join(root, path.lstrip("/"))
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w") as stream:
        stream.write(text)
    os.chmod(full, mode)
    return full


def install_driver(root, driver_files, version, libraries=LIBRARIES):
    """Put the driver VERSION's libraries in ROOT and rebuild ROOT's ld.so.cache with ldconfig."""
    libdir = os.path.join(root, LIBDIR.lstrip("/"))
    os.makedirs(libdir, exist_ok=True)
    for name in os.listdir(libdir):
        if name.startswith(LIBRARIES):
            os.unlink(os.path.join(libdir, name))
    for lib in libraries:
        shutil.copy(driver_files[lib, version], os.path.join(libdir, f"{lib}.so.{version}"))
    write(root, "/proc/driver/nvidia/version",
          f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  Wed Jan 22 01:19:27 UTC 2025\n"
          "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
    ldconfig()(root)


def ldconfig():
    path = need("ldconfig", "libc-bin")

    def run(root):
        subprocess.run([path, "-r", root], check=True, capture_output=True)
    return run


def generate_spec(root, version):
    """The spec `cdi generate` would write for ROOT's files now (driver VERSION)."""
    nodes = [p for p in ("/dev/nvidiactl", "/dev/nvidia-uvm") if os.path.exists(os.path.join(root, p[1:]))]
    mounts = [f"{LIBDIR}/{lib}.so.{version}" for lib in LIBRARIES
              if os.path.exists(os.path.join(root, LIBDIR[1:], f"{lib}.so.{version}"))]
    mounts.append("/usr/bin/nvidia-smi")
    lines = ["cdiVersion: 0.5.0", "kind: nvidia.com/gpu", "devices:",
             '  - name: "0"', "    containerEdits:", "      deviceNodes:",
             "        - {path: /dev/nvidia0, hostPath: /dev/nvidia0}",
             "  - name: all", "    containerEdits:", "      deviceNodes:",
             "        - {path: /dev/nvidia0, hostPath: /dev/nvidia0}",
             "containerEdits:", "  env: [NVIDIA_VISIBLE_DEVICES=void]", "  deviceNodes:"]
    lines += [f"    - {{path: {p}, hostPath: {p}}}" for p in nodes]
    lines += ["  hooks:", "    - {hookName: createContainer, path: /usr/bin/nvidia-cdi-hook, args: [nvidia-cdi-hook, "
              f"enable-cuda-compat, --host-driver-version={version}]}}", "  mounts:"]
    lines += [f"    - {{hostPath: {m}, containerPath: {m}, options: [ro, nosuid, nodev, rbind, rprivate]}}"
              for m in mounts]
    return write(root, "/etc/cdi/nvidia.yaml", "\n".join(lines) + "\n")


CONFIG_V2 = """\
version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes]
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
          runtime_type = "io.containerd.runc.v2"
          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
            SystemdCgroup = true

        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
          runtime_type = "io.containerd.runc.v2"
          container_annotations = ["cdi.k8s.io/*"]
          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
            BinaryName = "/usr/bin/cdi-shim-runtime"
            SystemdCgroup = true
"""

CONFIG_V3 = """\
version = 3

[plugins]
  [plugins.'io.containerd.cri.v1.runtime']
    enable_cdi = true
    cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi']

    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'

      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes]
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
          runtime_type = 'io.containerd.runc.v2'
          [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
            SystemdCgroup = true

        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]
          runtime_type = 'io.containerd.runc.v2'
          container_annotations = ['cdi.k8s.io/*']
          [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia.options]
            BinaryName = '/usr/bin/cdi-shim-runtime'
            SystemdCgroup = true
"""

def v2_cri(*lines):
    """CONFIG_V2 with LINES (keys) in its [plugins."io.containerd.grpc.v1.cri"] table."""
    header = '  [plugins."io.containerd.grpc.v1.cri"]\n'
    return CONFIG_V2.replace(header, header + "".join(f"    {line}\n" for line in lines))

# containerd 2.3 (version 4) is packaged nowhere Debian serves: a stand-in that answers --version only
STAND_IN_23 = """\
#!/bin/sh
if [ "$1" = --version ]; then
    echo "containerd github.com/containerd/containerd/v2 v2.3.0 0000000000000000000000000000000000000000"
    exit 0
fi
echo "a stand-in for containerd 2.3: only --version" >&2
exit 2
"""


def put_binary(source, target):
    """The real binary SOURCE at TARGET in a node root: a hard link (same file system), else a copy."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
    return target


RUNTIMECLASS = """\
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: nvidia
handler: {handler}
"""


class FakeNode:
    """A node root and how to check it."""

    def __init__(self, root, containerd):
        self.root, self.containerd = str(root), containerd

    def path(self, path):
        return os.path.join(self.root, path.lstrip("/"))

    def write(self, path, text, mode=0o644):
        return write(self.root, path, text, mode)

    def edit(self, path, old, new):
        text = open(self.path(path)).read()
        assert old in text, (old, path)
        self.write(path, text.replace(old, new))

    def options(self, **extra):
        extra.setdefault("runtimeclasses", [self.runtimeclass("nvidia")])
        if self.containerd == "1.6":  # the system's; 1.7 and 2.1 are ROOT's own /usr/bin/containerd
            extra.setdefault("containerd_binary", need("containerd", "containerd"))
        return Options(root=self.root, **extra)

    def runtimeclass(self, handler):
        return write(self.root, f"/k8s/runtimeclass-{handler}.yaml", RUNTIMECLASS.format(handler=handler))

    def checks(self, **extra):
        return {c.id: c for c in run_checks(self.options(**extra))}

    def failed(self, **extra):
        return {i: c for i, c in self.checks(**extra).items() if c.status == FAIL}


def make_node(root, driver_files, containerd="1.6", binary=None):
    """A healthy node; containerd "1.6" (the system's, named with --containerd-binary) or "1.7" /
    "2.1" (BINARY, the real release, put in ROOT/usr/bin)."""
    root = str(root)
    node = FakeNode(root, containerd)
    node.write("/proc/modules", "nvidia_uvm 1892352 0 - Live 0x0000000000000000 (PO)\n"
                                "nvidia 56786944 20 nvidia_uvm, Live 0x0000000000000000 (PO)\n"
                                "overlay 188416 0 - Live 0x0000000000000000\n")
    node.write("/proc/1/comm", "systemd\n")
    os.makedirs(node.path("/dev"), exist_ok=True)
    for name, major, minor in (("nvidiactl", 195, 255), ("nvidia0", 195, 0), ("nvidia-uvm", 509, 0)):
        os.mknod(node.path(f"/dev/{name}"), 0o666 | 0o020000, os.makedev(major, minor))
    node.write("/etc/ld.so.conf", f"{LIBDIR}\n")
    install_driver(root, driver_files, DRIVER)
    node.write("/usr/bin/nvidia-smi", "#!/bin/sh\necho fake nvidia-smi\n", 0o755)
    node.write("/usr/bin/cdi-shim-runtime", "#!/bin/sh\nexec runc \"$@\"\n", 0o755)
    node.write("/usr/bin/cdi-shim-nshook", "#!/bin/sh\nexit 0\n", 0o755)
    os.symlink("usr/bin", node.path("/bin"))  # usrmerge: PATH's /bin and /usr/bin are one directory
    generate_spec(root, DRIVER)
    os.makedirs(node.path("/var/run/cdi"))
    node.write("/var/lib/kubelet/config.yaml", "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                                               "cgroupDriver: systemd\n")
    node.write("/etc/containerd/config.toml", CONFIG_V3 if containerd.startswith("2.") else CONFIG_V2)
    if containerd != "1.6":
        put_binary(binary, node.path("/usr/bin/containerd"))
    return node


@pytest.fixture
def node(tmp_path, driver_files):
    return make_node(tmp_path / "root", driver_files)


@pytest.fixture
def node17(tmp_path, driver_files, containerd_release):
    """A containerd 1.7 node: a version-2 config, the real 1.7.24 as ROOT/usr/bin/containerd."""
    return make_node(tmp_path / "root", driver_files, "1.7", containerd_release("1.7"))


@pytest.fixture
def node2(tmp_path, driver_files, containerd_release):
    """A containerd 2.1 node: a version-3 config, the real 2.1.9 as ROOT/usr/bin/containerd."""
    return make_node(tmp_path / "root", driver_files, "2.1", containerd_release("2.1"))


@pytest.fixture(params=["1.6", "1.7", "2.1"])
def any_node(request, tmp_path, driver_files, containerd_release):
    """The same healthy node on each major containerd, as it ships (1.x: version 2; 2.1: version 3)."""
    version = request.param
    binary = None if version == "1.6" else containerd_release(version)
    return make_node(tmp_path / "root", driver_files, version, binary)


@pytest.fixture
def doctor_env(tmp_path):
    env = dict(os.environ)
    env.pop("CDI_SHIM_CONFIG", None)
    env["CDI_SHIM_CACHE_DIR"] = str(tmp_path / "cache")
    return env


def only_failure(node, expected, **extra):
    failed = node.failed(**extra)
    assert set(failed) == {expected}, {i: (c.saw, c.fix) for i, c in failed.items()}
    return failed[expected]


# --- healthy nodes ----------------------------------------------------------------------------------

def test_healthy_node_passes(node, doctor_env):
    out = run_cli("doctor", "--root", node.root, "--containerd-binary", need("containerd", "containerd"),
                  "--runtimeclass", node.runtimeclass("nvidia"), env=doctor_env)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert not [line for line in lines if line.startswith("fail")]
    ids = [line.split()[1] for line in lines]
    for expected in ("kernel.module", "kernel.devices", "userspace.libraries", "userspace.versions",
                     "userspace.nvidia-smi", "cdi.specs", "cdi.conflicts", "cdi.paths", "containerd.binaries",
                     "containerd.config", "containerd.ignored-sections", "containerd.loads", "containerd.runtime",
                     "containerd.cdi", "containerd.cgroup", "containerd.default-runtime", "runtimeclass.handler",
                     "runtime.resident", "runtime.log"):
        assert expected in ids, out.stdout
    status = {line.split()[1]: line.split()[0] for line in lines}
    assert status["containerd.loads"] == "ok"  # the real containerd 1.6 loaded the file
    assert status["userspace.versions"] == "ok" and DRIVER in out.stdout
    assert status["runtime.resident"] == "warn"  # not running: only slower


def test_healthy_node_json(node, doctor_env):
    out = run_cli("doctor", "--root", node.root, "--containerd-binary", need("containerd", "containerd"), "--json",
                  env=doctor_env)
    assert out.returncode == 0, out.stdout + out.stderr
    checks = json.loads(out.stdout)
    assert {c["status"] for c in checks} <= {"ok", "warn"}
    assert all(set(c) == {"check", "layer", "name", "status", "saw", "fix"} for c in checks)
    libs = next(c for c in checks if c["check"] == "userspace.libraries")
    assert f"{LIBDIR}/libcuda.so.1" in libs["saw"]


def test_healthy_node_on_each_containerd_passes(any_node):
    """The real containerd of each major version loads the node's config, and its `config dump`
    decides enable_cdi: absent from the file, 1.7 has it off (a warning: only annotations reach
    the runtime), 2.1 on; 1.6 has no CDI of its own."""
    node = any_node
    checks = node.checks()
    assert not [c for c in checks.values() if c.status == FAIL], checks
    assert f"containerd {node.containerd}" in checks["containerd.config"].saw
    assert checks["containerd.loads"].status == OK
    answer = checks["containerd.binaries"].saw
    assert f" {node.containerd}." in answer  # its own version string, e.g. 1.7.24~ds1 / 2.1.9+unknown
    cdi = checks["containerd.cdi"]
    if node.containerd == "1.6":
        assert cdi.status == OK and "no CDI support of its own" in cdi.saw
        return
    assert answer.startswith(node.path("/usr/bin/containerd"))  # found on ROOT's PATH
    assert "(`containerd config dump`)" in cdi.saw
    if node.containerd == "1.7":
        assert cdi.status == "warn" and "enable_cdi is off" in cdi.saw
        node.write("/etc/containerd/config.toml", v2_cri("enable_cdi = true"))
        cdi = node.checks()["containerd.cdi"]
    assert cdi.status == OK and "cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi']" in cdi.saw, cdi


# --- broken variants: each fails exactly its check ---------------------------------------------------

def test_no_module(node, doctor_env):
    node.write("/proc/modules", "overlay 188416 0 - Live 0x0000000000000000\n")
    check = only_failure(node, "kernel.module")
    assert "modprobe nvidia" in check.fix
    out = run_cli("doctor", "--root", node.root, "--containerd-binary", need("containerd", "containerd"),
                  env=doctor_env)
    assert out.returncode == 1
    line = next(line for line in out.stdout.splitlines() if "kernel.module" in line)
    assert line.startswith("fail") and "nvidia is not in /proc/modules" in line and "fix: load it" in line


def test_no_device_nodes(node):
    for name in ("nvidiactl", "nvidia0", "nvidia-uvm"):
        os.unlink(node.path(f"/dev/{name}"))
    check = only_failure(node, "kernel.devices")
    assert "/dev/nvidiactl missing" in check.saw and "nvidia-modprobe" in check.fix
    assert node.checks()["cdi.paths"].status == "warn"  # the same cause, reported once


def test_device_node_of_wrong_major(node):
    os.unlink(node.path("/dev/nvidia0"))
    os.mknod(node.path("/dev/nvidia0"), 0o666 | 0o020000, os.makedev(1, 3))
    check = only_failure(node, "kernel.devices")
    assert "/dev/nvidia0 major 1, not 195" in check.saw


def test_no_libcuda(node, driver_files):
    install_driver(node.root, driver_files, DRIVER, libraries=("libnvidia-ml",))
    generate_spec(node.root, DRIVER)  # the spec generated now has no libcuda either
    check = only_failure(node, "userspace.libraries")
    assert "libcuda.so.1" in check.saw and "libnvidia-ml" not in check.saw
    assert "ldconfig" in check.fix


def test_version_skew(node, driver_files):
    # libnvidia-ml of the new driver beside libcuda of the old one
    libdir = node.path(LIBDIR)
    os.unlink(os.path.join(libdir, f"libnvidia-ml.so.{DRIVER}"))
    os.unlink(os.path.join(libdir, "libnvidia-ml.so.1"))
    shutil.copy(driver_files["libnvidia-ml", NEW_DRIVER], os.path.join(libdir, f"libnvidia-ml.so.{NEW_DRIVER}"))
    ldconfig()(node.root)
    node.edit("/etc/cdi/nvidia.yaml", f"libnvidia-ml.so.{DRIVER}", f"libnvidia-ml.so.{NEW_DRIVER}")
    check = only_failure(node, "userspace.versions")
    assert f"{DRIVER}: libcuda.so.1, /proc/driver/nvidia/version" in check.saw
    assert f"{NEW_DRIVER}: libnvidia-ml.so.1" in check.saw


def test_stale_spec_after_driver_upgrade(node, driver_files):
    install_driver(node.root, driver_files, NEW_DRIVER)  # the spec still names the old files
    check = only_failure(node, "cdi.paths")
    assert f"names driver {DRIVER} files, the driver is {NEW_DRIVER}" in check.saw
    assert f"libcuda.so.{DRIVER}" in check.saw
    assert "cdi-shim cdi generate" in check.fix
    generate_spec(node.root, NEW_DRIVER)
    assert node.failed() == {}


def one_mount_spec(node, version=DRIVER, digest="0123456789ab"):
    """A host directory of the one-mount layout (shim/generate/hostdir.py) holding ROOT's driver
    libraries, and a spec binding it at /usr/local/nvidia/lib64 (as `cdi generate --layout
    one-mount` writes it)."""
    directory = f"/var/lib/cdi-shim/driver/{version}-{digest}"
    lib = node.path(directory + "/lib64")
    os.makedirs(lib)
    for name in LIBRARIES:
        os.link(node.path(f"{LIBDIR}/{name}.so.{version}"), f"{lib}/{name}.so.{version}")
        os.symlink(f"{name}.so.{version}", f"{lib}/{name}.so.1")
    node.edit("/etc/cdi/nvidia.yaml", "  mounts:\n",
              f"  mounts:\n    - {{hostPath: {directory}/lib64, containerPath: /usr/local/nvidia/lib64, "
              "options: [ro, nosuid, nodev, rbind, rprivate]}\n")
    return directory


def test_one_mount_host_directory(node):
    """Healthy: an ok line; a lib64 others can write to, or a directory of another driver: failures."""
    directory = one_mount_spec(node)
    check = node.checks()["cdi.host-dirs"]
    assert check.status == OK and "1 host directory" in check.saw, check
    assert node.failed() == {}
    os.chmod(node.path(directory + "/lib64"), 0o777)
    check = only_failure(node, "cdi.host-dirs")
    assert f"{node.path(directory)}/lib64 is writable by group or others (mode 777)" in check.saw, check.saw
    os.chmod(node.path(directory + "/lib64"), 0o755)
    os.unlink(node.path(directory + "/lib64/libcuda.so.1"))
    check = only_failure(node, "cdi.host-dirs")
    assert "has no libcuda.so.1" in check.saw


def test_one_mount_host_directory_of_another_driver(node, driver_files):
    one_mount_spec(node)
    install_driver(node.root, driver_files, NEW_DRIVER)
    failed = node.failed()
    assert f"holds driver {DRIVER} files, the driver is {NEW_DRIVER}" in failed["cdi.host-dirs"].saw


def test_yml_spec(node):
    os.rename(node.path("/etc/cdi/nvidia.yaml"), node.path("/etc/cdi/nvidia.yml"))
    check = only_failure(node, "cdi.specs")
    assert "/etc/cdi/nvidia.yml" in check.saw and "extension .yml" in check.saw
    assert "NAME.yaml" in check.fix


def test_spec_in_sub_directory_and_wrong_directory(node):
    node.write("/etc/cdi/vendor/extra.yaml", "cdiVersion: 0.5.0\n")
    node.write("/run/cdi/other.json", "{}")
    check = only_failure(node, "cdi.specs")
    assert "sub-directory of /etc/cdi" in check.saw
    assert "/run/cdi/other.json" in check.saw and "outside the spec directories" in check.saw


def test_invalid_spec_and_conflict(node):
    node.write("/etc/cdi/broken.yaml", "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n")
    check = only_failure(node, "cdi.specs")
    assert "broken.yaml" in check.saw and "no devices" in check.saw
    os.unlink(node.path("/etc/cdi/broken.yaml"))
    shutil.copy(node.path("/etc/cdi/nvidia.yaml"), node.path("/etc/cdi/nvidia-copy.yaml"))
    check = only_failure(node, "cdi.conflicts")
    assert "nvidia.com/gpu=0" in check.saw


def test_v2_headers_in_v3_file(node2):
    node2.write("/etc/containerd/config.toml", CONFIG_V3 + textwrap.dedent("""
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
          SystemdCgroup = false
        """))
    check = only_failure(node2, "containerd.ignored-sections")
    assert 'plugins."io.containerd.grpc.v1.cri"' in check.saw and "containerd" in check.saw
    assert "io.containerd.cri.v1.runtime" in check.fix
    # the real 2.1 says so itself, as a warning of `config dump` (and of each start)
    assert ("containerd 2.1's `config dump` warns it ignores containerd.runtimes.nvidia.options of plugin "
            "io.containerd.grpc.v1.cri") in check.saw


def test_enable_cdi_under_old_headers_of_a_v3_file_is_ignored(node2):
    """enable_cdi = false where containerd 2.1 does not read it: the check of the CDI settings goes
    by what the real binary loaded (on), the ignored section is the failure."""
    node2.write("/etc/containerd/config.toml", CONFIG_V3.replace("    enable_cdi = true\n", "") + textwrap.dedent("""
        [plugins."io.containerd.grpc.v1.cri"]
          enable_cdi = false
        """))
    check = only_failure(node2, "containerd.ignored-sections")
    assert "enable_cdi of plugin io.containerd.grpc.v1.cri" in check.saw
    cdi = node2.checks()["containerd.cdi"]
    assert cdi.status == OK and "(`containerd config dump`)" in cdi.saw


def test_v3_file_for_containerd_1_6(node):
    node.write("/etc/containerd/config.toml", CONFIG_V3)
    failed = node.failed()
    # measured: containerd 1.6 loads it (`config dump` succeeds) as version 2, so the cri.v1 sections,
    # our runtime among them, are dropped without a word
    assert "reads this file as version 2" in failed["containerd.config"].saw
    assert "io.containerd.cri.v1.runtime" in failed["containerd.ignored-sections"].saw
    assert "no runtime in [plugins.\"io.containerd.grpc.v1.cri\"]" in failed["containerd.runtime"].saw
    assert node.checks()["containerd.loads"].status == OK


def test_v3_file_for_containerd_1_7(node17):
    """Unlike 1.6, the real 1.7 refuses a version-3 file: containerd does not start at all."""
    node17.write("/etc/containerd/config.toml", CONFIG_V3)
    failed = node17.failed()
    assert set(failed) == {"containerd.config", "containerd.loads"}, failed
    assert "containerd 1.7 knows versions 1 and 2 only and refuses a version 3 file" in failed["containerd.config"].saw
    assert "unsupported config version" in failed["containerd.loads"].saw  # the binary's own words


def test_relative_binary_name(node):
    node.edit("/etc/containerd/config.toml", 'BinaryName = "/usr/bin/cdi-shim-runtime"',
              'BinaryName = "cdi-shim-runtime"')
    check = only_failure(node, "containerd.runtime")
    assert "not an absolute path" in check.saw
    # the values doctor knows, not placeholders (`--runtime-name NAME`, no --config)
    config = node.path("/etc/containerd/config.toml")
    assert f"rewrite the entry: `cdi-shim runtime configure --runtime=containerd --config {config}`" in check.fix
    node.edit("/etc/containerd/config.toml", "runtimes.nvidia", "runtimes.gpu-a")
    check = only_failure(node, "containerd.runtime", runtimeclasses=[node.runtimeclass("gpu-a")])
    assert f"`cdi-shim runtime configure --runtime=containerd --runtime-name gpu-a --config {config}`" in check.fix
    assert "NAME" not in check.fix


def test_hook_program_missing_beside_the_runtime(node):
    os.unlink(node.path("/usr/bin/cdi-shim-nshook"))
    check = only_failure(node, "runtime.hooks")
    assert "/usr/bin/cdi-shim-nshook missing beside cdi-shim-runtime" in check.saw
    assert "disable-device-node-modification" in check.saw and "reinstall cdi-shim" in check.fix


def test_hook_program_found_beside_a_linked_runtime(node):
    """BinaryName a link (as a package manager may make it): the program is looked for beside
    its target, resolved inside the root."""
    os.makedirs(node.path("/opt/cdi-shim/bin"))
    os.rename(node.path("/usr/bin/cdi-shim-runtime"), node.path("/opt/cdi-shim/bin/cdi-shim-runtime"))
    os.symlink("/opt/cdi-shim/bin/cdi-shim-runtime", node.path("/usr/bin/cdi-shim-runtime"))
    assert only_failure(node, "runtime.hooks").saw.startswith("/opt/cdi-shim/bin/cdi-shim-nshook missing")
    os.rename(node.path("/usr/bin/cdi-shim-nshook"), node.path("/opt/cdi-shim/bin/cdi-shim-nshook"))
    checks = node.checks()
    assert checks["runtime.hooks"].status == OK and "/opt/cdi-shim/bin/cdi-shim-nshook" in checks["runtime.hooks"].saw
    assert not node.failed()


def test_handler_mismatch(node):
    check = only_failure(node, "runtimeclass.handler", runtimeclasses=[node.runtimeclass("gpu")])
    assert 'no runtime for "gpu" is configured' in check.saw
    config = node.path("/etc/containerd/config.toml")
    assert check.fix.endswith(f"register that name: `cdi-shim runtime configure --runtime=containerd "
                              f"--runtime-name gpu --config {config}`"), check.fix
    assert "HANDLER" not in check.fix


def test_default_runtime_is_the_shim(node):
    node.edit("/etc/containerd/config.toml", 'default_runtime_name = "runc"', 'default_runtime_name = "nvidia"')
    check = only_failure(node, "containerd.default-runtime")
    assert 'default_runtime_name = "runc"' in check.fix
    assert node.checks(shim_as_default=True)["containerd.default-runtime"].status == OK


def test_systemd_cgroup_mismatch(node):
    ours = 'BinaryName = "/usr/bin/cdi-shim-runtime"\n            SystemdCgroup = '
    node.edit("/etc/containerd/config.toml", ours + "true", ours + "false")
    check = only_failure(node, "containerd.cgroup")
    assert 'PID 1 is "systemd"' in check.saw and "cgroupDriver: systemd" in check.saw
    assert "SystemdCgroup = true" in check.fix


def test_kubelet_cgroupfs_against_systemd_init(node):
    node.write("/var/lib/kubelet/config.yaml", "kind: KubeletConfiguration\ncgroupDriver: cgroupfs\n")
    check = only_failure(node, "containerd.cgroup")
    assert "cgroupDriver: cgroupfs" in check.saw


def test_enable_cdi_false_on_containerd_2(node2):
    node2.edit("/etc/containerd/config.toml", "enable_cdi = true", "enable_cdi = false")
    check = only_failure(node2, "containerd.cdi")
    assert "silently" in check.saw and "enable_cdi = true" in check.fix
    assert "(`containerd config dump`)" in check.saw


def test_enable_cdi_false_in_a_migrated_version_2_file_on_containerd_2(node2):
    """A version-2 file keeps working on 2.1 (migrated in memory), enable_cdi = false with it."""
    node2.write("/etc/containerd/config.toml", v2_cri("enable_cdi = false"))
    check = only_failure(node2, "containerd.cdi")
    assert 'enable_cdi = false in [plugins."io.containerd.grpc.v1.cri"] (`containerd config dump`)' in check.saw


@pytest.mark.parametrize("containerd", ["1.7", "2.1"])
def test_cdi_spec_dirs_differ(tmp_path, driver_files, containerd_release, containerd):
    node = make_node(tmp_path / "root", driver_files, containerd, containerd_release(containerd))
    if containerd == "1.7":
        node.write("/etc/containerd/config.toml", v2_cri("enable_cdi = true", 'cdi_spec_dirs = ["/etc/cdi-other"]'))
    else:
        node.edit("/etc/containerd/config.toml", "cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi']",
                  "cdi_spec_dirs = ['/etc/cdi-other']")
    check = only_failure(node, "containerd.cdi")
    assert "containerd resolves CDI devices from ['/etc/cdi-other']" in check.saw
    assert "cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi']" in check.fix


def test_several_containerd_binaries(node2, containerd_release):
    """A 1.7 left in /usr/local/bin (first on PATH) beside the 2.1 in /usr/bin: the 1.7 answers,
    and the real 1.7 refuses the node's version-3 file: the reason to remove the stray one."""
    put_binary(containerd_release("1.7"), node2.path("/usr/local/bin/containerd"))
    checks = node2.checks()
    binaries = checks["containerd.binaries"]
    assert binaries.status == "warn"
    assert "several containerd executables on PATH: /usr/local/bin/containerd, /usr/bin/containerd" in binaries.saw
    assert f"{node2.path('/usr/local/bin/containerd')} answers containerd github.com/containerd/containerd 1.7." \
        in binaries.saw
    assert checks["containerd.config"].status == FAIL and "containerd 1.7" in checks["containerd.config"].saw
    os.unlink(node2.path("/usr/local/bin/containerd"))
    assert not node2.failed()


# --- ROOT stays ROOT ----------------------------------------------------------------------------------

def test_absolute_links_resolve_inside_root(node, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "modules").write_text("nvidia 1 0 - Live 0x0\n")
    node.write("/proc/modules", "")
    os.unlink(node.path("/proc/modules"))
    os.symlink(str(outside / "modules"), node.path("/proc/modules"))  # names a host file: must not be read
    assert Node(node.root).host("/proc/modules") == node.path(str(outside / "modules"))
    assert only_failure(node, "kernel.module")
    os.unlink(node.path("/proc/modules"))
    node.write("/etc/modules-real", "nvidia 1 0 - Live 0x0\n")
    os.symlink("../../../../../../../../etc/modules-real", node.path("/proc/modules"))  # ".." stops at ROOT
    assert Node(node.root).host("/proc/modules") == node.path("/etc/modules-real")
    assert node.failed() == {}


@pytest.mark.parametrize("containerd", ["1.6", "1.7"])
def test_cri_v1_section_in_a_version_2_file_on_containerd_1(tmp_path, driver_files, containerd_release, containerd):
    # measured: containerd 1.6's and 1.7's `config dump` drop a plugin section they do not know, silently
    node = make_node(tmp_path / "root", driver_files, containerd,
                     None if containerd == "1.6" else containerd_release(containerd))
    node.write("/etc/containerd/config.toml", CONFIG_V2 + "\n[plugins.'io.containerd.cri.v1.runtime']\n"
                                                          "  enable_cdi = true\n")
    check = only_failure(node, "containerd.ignored-sections")
    assert "[plugins.'io.containerd.cri.v1.runtime'] (containerd 1.x has no such plugin)" in check.saw
    assert node.checks()["containerd.loads"].status == OK


def test_version_2_file_on_containerd_2_is_migrated(node2):
    node2.write("/etc/containerd/config.toml", CONFIG_V2)
    checks = node2.checks()
    assert not [c for c in checks.values() if c.status == FAIL], checks
    assert checks["containerd.config"].status == "warn"
    assert "containerd config migrate" in checks["containerd.config"].fix
    assert checks["containerd.runtime"].status == OK


# --- the runtime ------------------------------------------------------------------------------------

def test_resident_process_answers(node, doctor_env):
    """A real `cdi-shim runtime serve` on ROOT's socket answers the probe (a request of another
    version, which it declines before touching anything)."""
    from tests.helpers import cdi_shim_cli

    socket_path = node.path("/run/cdi-shim/runtime.sock")
    server = subprocess.Popen([cdi_shim_cli(), "runtime", "serve", "--socket", socket_path, "--workers", "1"],
                              env=doctor_env, stderr=subprocess.PIPE, text=True)
    try:
        assert "serving on" in server.stderr.readline()
        check = node.checks()["runtime.resident"]
        assert check.status == OK and "answers" in check.saw and "no linker step kept" in check.saw
        steps = node.path("/run/cdi-shim/steps")
        os.makedirs(steps, mode=0o700)
        open(os.path.join(steps, "0123456789abcdef"), "w").close()
        check = node.checks()["runtime.resident"]
        assert check.status == OK and "1 linker step(s) kept for the front end" in check.saw
        os.chmod(steps, 0o777)          # the front end would ignore them
        check = node.checks()["runtime.resident"]
        assert check.status == "warn" and "the front end ignores the linker steps" in check.saw, check.saw
        os.chmod(steps, 0o700)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert "does not exist" in node.checks()["runtime.resident"].saw  # the server removed its socket
    import socket

    stale = socket.socket(socket.AF_UNIX)
    stale.bind(socket_path)  # a socket file nobody listens on (a server killed with SIGKILL)
    stale.close()
    check = node.checks()["runtime.resident"]
    assert check.status == "warn" and "not answering" in check.saw


def test_resident_process_of_another_version(node, doctor_env):
    """The resident process still runs the version from before an upgrade (the real server, its
    version string changed): it declines every create of the installed front end, so doctor
    warns with the restart, naming both versions."""
    import sys

    from cdi import __version__

    socket_path = node.path("/run/cdi-shim/runtime.sock")
    code = ("import sys, cdi; cdi.__version__ = '0.0.0-old'; from shim.runtime.resident import serve; "
            "serve(sys.argv[1], ready=lambda p: print('serving', flush=True), workers=1)")
    server = subprocess.Popen([sys.executable, "-c", code, socket_path], env=doctor_env, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout.readline().startswith("serving")
        check = node.checks()["runtime.resident"]
        assert check.status == "warn", check.saw
        assert "runs cdi-shim 0.0.0-old" in check.saw and __version__ in check.saw, check.saw
        assert "systemctl restart cdi-shim-resident" in check.fix
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_runtime_log_that_grows(node):
    from shim.config import Config
    from shim.runtime.runlog import MAX_LOG_BYTES

    settings = Config(log_file="/var/log/cdi-shim/runtime.log")
    assert node.checks(settings=settings)["runtime.log"].status == FAIL  # its directory is missing
    os.makedirs(node.path("/var/log/cdi-shim"))
    assert node.checks(settings=settings)["runtime.log"].status == OK
    with open(node.path("/var/log/cdi-shim/runtime.log"), "wb") as stream:
        stream.truncate(3 * MAX_LOG_BYTES)
    check = only_failure(node, "runtime.log", settings=settings)
    assert "not being rotated" in check.saw


def test_cdi_shim_config_is_read_in_root(node, doctor_env):
    """Without $CDI_SHIM_CONFIG, --root reads ROOT/etc/cdi-shim/config.toml: its spec-dirs decide
    where specs are looked for, and a spec elsewhere is named as misplaced."""
    node.write("/etc/cdi-shim/config.toml", 'spec-dirs = ["/opt/cdi"]\n')
    out = run_cli("doctor", "--root", node.root, "--containerd-binary", need("containerd", "containerd"), "--json",
                  env=doctor_env)
    assert out.returncode == 1
    failed = {c["check"]: c for c in json.loads(out.stdout) if c["status"] == FAIL}
    assert set(failed) == {"cdi.specs"}, failed
    assert "no CDI spec in /opt/cdi" in failed["cdi.specs"]["saw"]
    assert '"/etc/cdi/nvidia.yaml" is outside the spec directories (/opt/cdi)' in failed["cdi.specs"]["saw"]
    out = run_cli("doctor", "--root", node.root, "--containerd-binary", need("containerd", "containerd"),
                  "--cdi-dir", "/etc/cdi", "--cdi-dir", "/var/run/cdi", env=doctor_env)
    assert out.returncode == 0, out.stdout


@pytest.mark.parametrize("containerd, file_version, status", [
    ("1.6", 1, "warn"), ("1.6", 2, OK), ("1.6", 3, FAIL), ("1.6", 4, FAIL),
    ("1.7", 1, "warn"), ("1.7", 2, OK), ("1.7", 3, FAIL), ("1.7", 4, FAIL),
    ("2.1", 1, FAIL), ("2.1", 2, "warn"), ("2.1", 3, OK), ("2.1", 4, FAIL),
    ("2.3", 4, OK), ("2.3", 3, "warn"),
])
def test_config_version_rules(node, containerd_release, containerd, file_version, status):
    """1.x reads 2; 2.0-2.2 read 3; 2.3 writes 4 and migrates 3. 1.6, 1.7 and 2.1 are the real
    binaries, and what each does with the file (`config dump`) must agree with what the rule says:
    a file the rule says containerd refuses is one the binary refuses, every other it loads.
    2.3 is the stand-in (no 2.3 package exists), checked against the rule only."""
    text = CONFIG_V2 if file_version <= 2 else CONFIG_V3
    text = text.replace("version = 2\n" if file_version <= 2 else "version = 3\n",
                        "" if file_version == 1 else f"version = {file_version}\n")
    node.write("/etc/containerd/config.toml", text)
    extra = {}
    if containerd == "2.3":
        extra["containerd_binary"] = node.write("/opt/containerd", STAND_IN_23, 0o755)
    elif containerd != "1.6":
        extra["containerd_binary"] = put_binary(containerd_release(containerd), node.path("/opt/containerd"))
    checks = node.checks(**extra)
    check = checks["containerd.config"]
    assert check.status == status, check
    assert f"version = {file_version}" in check.saw or file_version == 1
    assert f"containerd {containerd}" in check.saw
    if containerd == "2.3":
        return
    refused = "refuses" in check.saw or "reads at most" in check.saw
    assert (checks["containerd.loads"].status == FAIL) == refused, (check, checks["containerd.loads"])


def test_imports_are_read_inside_root(node2):
    """containerd 2.x merges imported files: our entry may live in a drop-in (`runtime configure
    --drop-in`), named by an absolute path that means ROOT's file."""
    main = CONFIG_V3.split("        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]")[0]
    ours = "version = 3\n" + CONFIG_V3[CONFIG_V3.index("        [plugins.'io.containerd.cri.v1.runtime'.containerd"
                                                         ".runtimes.nvidia]"):]
    node2.write("/etc/containerd/config.toml", main.replace("version = 3\n", "version = 3\nimports = "
                                                            "['/etc/containerd/conf.d/*.toml']\n"))
    assert "containerd.runtime" in node2.failed()
    node2.write("/etc/containerd/conf.d/99-cdi-shim.toml", ours)
    checks = node2.checks(runtimeclasses=[node2.runtimeclass("nvidia")])
    assert not [c for c in checks.values() if c.status == FAIL], checks
    assert checks["containerd.runtime"].saw == '"nvidia" -> /usr/bin/cdi-shim-runtime'


def test_doctor_on_this_machine(doctor_env):
    """This machine's own / (no GPU): every check runs to its verdict, none breaks."""
    out = run_cli("doctor", "--json", env=doctor_env)
    assert out.returncode in (0, 1), out.stderr
    checks = json.loads(out.stdout)
    assert not [c for c in checks if c["layer"] == "doctor"], checks
    assert {"kernel.module", "userspace.libraries", "containerd.config"} <= {c["check"] for c in checks}


# --- who writes config.toml: k3s / rke2 templates, kubespray -------------------------------------------

K3S = "/var/lib/rancher/k3s/agent/etc/containerd"
K3S_CONFIG = """# File generated by k3s. DO NOT EDIT. Use config.toml.tmpl instead.
version = 2

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = true
"""
K3S_ENTRY = """
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
  container_annotations = ["cdi.k8s.io/*"]
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
  BinaryName = "/usr/bin/cdi-shim-runtime"
  SystemdCgroup = {{ .SystemdCgroup }}
"""


def test_healthy_node_has_no_config_owner_line(node):
    assert "containerd.config-owner" not in node.checks()


def test_k3s_hand_edit_of_config_toml_fails_saying_edit_the_template(node):
    node.write(f"{K3S}/config.toml", K3S_CONFIG + K3S_ENTRY.replace("{{ .SystemdCgroup }}", "true"))
    check = node.checks(containerd_config=f"{K3S}/config.toml")["containerd.config-owner"]
    assert check.status == FAIL
    assert "k3s regenerates it at every start" in check.saw
    assert check.fix.startswith("edit config.toml.tmpl, not config.toml: `cdi-shim install --node` writes "
                                f"{K3S}/config.toml.tmpl extending k3s's base template")


def test_k3s_template_without_the_runtime_fails(node):
    node.write(f"{K3S}/config.toml", K3S_CONFIG)
    node.write(f"{K3S}/config.toml.tmpl", '{{ template "base" . }}\n')
    check = node.checks()["containerd.config-owner"]
    assert check.status == FAIL
    assert check.fix.startswith(f"edit {K3S}/config.toml.tmpl, not config.toml: k3s regenerates config.toml")


def test_k3s_template_with_the_runtime_passes_and_asks_for_a_restart_until_rendered(node):
    node.write(f"{K3S}/config.toml", K3S_CONFIG)
    node.write(f"{K3S}/config.toml.tmpl", '{{ template "base" . }}\n' + K3S_ENTRY)
    check = node.checks()["containerd.config-owner"]
    assert check.status == "warn" and check.fix == "restart k3s (or k3s-agent)"
    node.write(f"{K3S}/config.toml", K3S_CONFIG + K3S_ENTRY.replace("{{ .SystemdCgroup }}", "true"))
    assert node.checks()["containerd.config-owner"].status == OK


def test_rke2_node_without_template_names_its_config(node):
    rke2 = K3S.replace("k3s", "rke2")
    node.write(f"{rke2}/config.toml", K3S_CONFIG.replace("k3s", "rke2"))
    check = node.checks()["containerd.config-owner"]
    assert check.status == FAIL and f"pass --config {rke2}/config.toml" in check.saw
    assert "restart rke2-server (or rke2-agent)" in check.fix


def test_kubespray_rendered_config_warns_to_edit_the_inventory(node):
    text = open(node.path("/etc/containerd/config.toml")).read()
    node.write("/etc/containerd/config.toml", 'version = 2\nroot = "/var/lib/containerd"\n'
               'state = "/run/containerd"\noom_score = 0\n' + text.replace("version = 2\n", ""))
    check = node.checks()["containerd.config-owner"]
    assert check.status == "warn" and "kubespray" in check.saw
    assert check.fix.startswith("edit the kubespray inventory, not config.toml")
    assert "containerd_additional_runtimes" in check.fix


# --- where the runtime is installed -----------------------------------------------------------------

def _runtime_in(node, folder):
    """Move the node's runtime (and its hook) into FOLDER and name it in containerd's config."""
    os.makedirs(node.path(folder), exist_ok=True)
    for name in ("cdi-shim-runtime", "cdi-shim-nshook"):
        os.rename(node.path(f"/usr/bin/{name}"), node.path(f"{folder}/{name}"))
    node.edit("/etc/containerd/config.toml", 'BinaryName = "/usr/bin/cdi-shim-runtime"',
              f'BinaryName = "{folder}/cdi-shim-runtime"')


def test_runtime_under_the_node_prefix_is_fine(node):
    _runtime_in(node, "/opt/cdi-shim/releases/0.2.0/bin")
    os.symlink("releases/0.2.0", node.path("/opt/cdi-shim/current"))
    node.edit("/etc/containerd/config.toml", "/opt/cdi-shim/releases/0.2.0/bin", "/opt/cdi-shim/current/bin")
    assert node.checks()["runtime.install"].status == OK


def test_runtime_in_a_git_checkout_warns(node):
    _runtime_in(node, "/root/src/cdi-shim/.venv/bin")
    os.makedirs(node.path("/root/src/cdi-shim/.git"))
    check = node.checks()["runtime.install"]
    assert check.status == WARN and "git working tree /root/src/cdi-shim" in check.saw, check.saw
    assert "/opt/cdi-shim" in check.fix


@pytest.mark.parametrize("owner, mode", [(1000, 0o755), (0, 0o775)])
def test_runtime_in_a_folder_others_can_write_warns(node, owner, mode):
    _runtime_in(node, "/home/user/venv/bin")
    os.chown(node.path("/home/user/venv"), owner, 0)
    os.chmod(node.path("/home/user/venv"), mode)
    check = node.checks()["runtime.install"]
    assert check.status == WARN and f"/home/user/venv is owned by uid {owner}, mode {mode:04o}" in check.saw, check.saw


# --- issue 31: files that are not regular files ------------------------------------------------------

def _not_regular(node, path, shape):
    """Make the node's PATH a FIFO, a link loop (two links naming each other) or a directory."""
    full = node.path(path)
    if os.path.lexists(full):
        os.unlink(full)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    if shape == "fifo":
        os.mkfifo(full)
    elif shape == "loop":
        os.symlink(os.path.basename(full) + ".other", full)
        os.symlink(os.path.basename(full), full + ".other")
    else:
        os.mkdir(full)


SHAPES = {"fifo": "a FIFO, not a regular file", "loop": "a link loop (too many levels of symbolic links)",
          "dir": "a directory, not a regular file"}


def _doctor(node, env, *extra):
    """`cdi-shim doctor --root` in a child with a time limit: a hang fails the test, not the run."""
    try:
        return subprocess.run([cdi_shim_cli(), "doctor", "--root", node.root, "--containerd-binary",
                               need("containerd", "containerd"), *extra], capture_output=True, text=True, env=env,
                              timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"doctor {' '.join(extra)} hung (a blocking open of a FIFO)")


@pytest.mark.parametrize("shape", list(SHAPES))
def test_cdi_shim_config_that_is_no_regular_file_is_one_line_never_a_hang(node, doctor_env, shape):
    """doctor --root opened ROOT/etc/cdi-shim/config.toml with a blocking open (a FIFO hung it)
    and resolved a link loop on the way with a traceback."""
    _not_regular(node, "/etc/cdi-shim/config.toml", shape)
    out = _doctor(node, doctor_env)
    assert out.returncode == 1 and out.stdout == "", out.stdout
    assert out.stderr.splitlines() == [
        f"Error: cannot read cdi-shim config {node.path('/etc/cdi-shim/config.toml')}: {SHAPES[shape]}"], out.stderr


@pytest.mark.parametrize("shape", list(SHAPES))
def test_containerd_config_spec_and_runtimeclass_that_are_no_regular_files(node, doctor_env, shape):
    runtimeclass = node.path("/k8s/runtimeclass-broken.yaml")
    _not_regular(node, "/k8s/runtimeclass-broken.yaml", shape)
    _not_regular(node, "/etc/cdi/broken.yaml", shape)
    extra = ["--runtimeclass", runtimeclass] if shape != "dir" else []  # click refuses a directory itself
    checks = {c["check"]: c for c in json.loads(_doctor(node, doctor_env, "--json", *extra).stdout)}
    if extra:
        assert f"{runtimeclass}: cannot be read: {SHAPES[shape]}" in checks["runtimeclass.handler"]["saw"]
        # a directory named *.yaml in a spec directory is a sub-directory, not read
        assert f"/etc/cdi/broken.yaml: cannot be read: {SHAPES[shape]}" in checks["cdi.specs"]["saw"]
    _not_regular(node, "/etc/containerd/config.toml", shape)
    config = {c["check"]: c for c in json.loads(_doctor(node, doctor_env, "--json").stdout)}["containerd.config"]
    assert config["status"] == FAIL
    assert config["saw"] == f"/etc/containerd/config.toml is unreadable: {SHAPES[shape]}; containerd will not start"


def test_kubernetes_node_accepting_env_requests_of_unprivileged_containers_warns(node):
    """The image picks the GPUs (issue 31, item 3): warned with the fix on a Kubernetes node only."""
    from shim.config import Config

    check = node.checks()["runtime.env-requests"]   # the fake node has /var/lib/kubelet/config.yaml
    assert check.status == "warn"
    assert "a Kubernetes node (/var/lib/kubelet/config.yaml) accepts NVIDIA_VISIBLE_DEVICES from unprivileged " \
        "containers (accept-env-unprivileged = true, the default)" in check.saw
    assert check.fix.startswith("set accept-env-unprivileged = false in /etc/cdi-shim/config.toml (in "), check.fix
    assert "CDI annotations (cdi.k8s.io/*)" in check.fix and "not envvar" in check.fix
    off = node.checks(settings=Config(accept_env_unprivileged=False, source="/etc/cdi-shim/config.toml"))
    assert off["runtime.env-requests"].status == OK
    os.unlink(node.path("/var/lib/kubelet/config.yaml"))
    assert "runtime.env-requests" not in node.checks()   # docker, podman, plain runc: env is the interface


# --- /dev/char links (issue 30 item 3) ---------------------------------------------------------------

def test_dev_char_links_missing_warn_with_the_systemd_cgroup_driver_only(node):
    """The healthy node runs "nvidia" with SystemdCgroup = true and has no /dev/char: each spec
    device node is reported with its link and the fix; with the links (as install makes them, and
    one absolute, as nvidia-ctk makes them) it is ok; with SystemdCgroup = false it is not checked."""
    check = node.checks()["containerd.dev-char"]
    assert check.status == WARN, check
    assert "/dev/char/195:0 (/dev/nvidia0)" in check.saw and "/dev/char/195:255 (/dev/nvidiactl)" in check.saw
    assert "/dev/char/509:0 (/dev/nvidia-uvm)" in check.saw and "daemon-reload" in check.saw
    assert "cdi-shim install --node" in check.fix
    os.makedirs(node.path("/dev/char"))
    os.symlink("../nvidia0", node.path("/dev/char/195:0"))
    os.symlink("/dev/nvidiactl", node.path("/dev/char/195:255"))   # absolute: the node's own file
    os.symlink("../nvidia0", node.path("/dev/char/509:0"))         # leads to another device
    check = node.checks()["containerd.dev-char"]
    assert check.status == WARN and check.saw.count("/dev/char/") == 1, check
    assert "/dev/char/509:0 (/dev/nvidia-uvm)" in check.saw
    os.unlink(node.path("/dev/char/509:0"))
    os.symlink("../nvidia-uvm", node.path("/dev/char/509:0"))
    check = node.checks()["containerd.dev-char"]
    assert check.status == OK and "all 3 device nodes" in check.saw, check
    shutil.rmtree(node.path("/dev/char"))
    node.edit("/etc/containerd/config.toml", "SystemdCgroup = true", "SystemdCgroup = false")
    assert "containerd.dev-char" not in node.checks()


# --- a release moved or removed under the node prefix's `current` (issue 46, item 4) -----------------

def _released_node(node):
    """The runtime in release 0.2.0 (0.1.0 installed too), `current` -> releases/0.2.0, and
    containerd, Docker and podman each naming /opt/cdi-shim/current/bin/cdi-shim-runtime."""
    _runtime_in(node, "/opt/cdi-shim/releases/0.2.0/bin")
    for name in ("cdi-shim-runtime", "cdi-shim-nshook"):
        node.write(f"/opt/cdi-shim/releases/0.1.0/bin/{name}", "#!/bin/sh\nexit 0\n", 0o755)
    os.symlink("releases/0.2.0", node.path("/opt/cdi-shim/current"))
    current = "/opt/cdi-shim/current/bin/cdi-shim-runtime"
    node.edit("/etc/containerd/config.toml", "/opt/cdi-shim/releases/0.2.0/bin/cdi-shim-runtime", current)
    node.write("/etc/docker/daemon.json", json.dumps({"runtimes": {"cdi-shim": {"path": current}}}))
    node.write("/etc/containers/containers.conf", f'[engine.runtimes]\ncdi-shim = ["{current}"]\n')
    return current


def test_release_link_resolved(node):
    _released_node(node)
    checks = node.checks()
    assert checks["runtime.release"].status == OK
    assert checks["runtime.release"].saw == ("/opt/cdi-shim/current -> releases/0.2.0 (2 release(s) in "
                                             "/opt/cdi-shim/releases)")
    assert checks["runtime.install"].status == OK and checks["containerd.runtime"].status == OK


def test_a_dangling_release_link_is_one_failure_with_one_fix(node, doctor_env):
    """The release `current` names was moved away: one failure naming the link and its missing
    target, whose fix (point `current` at an installed release) is the only one; containerd's,
    Docker's and podman's checks defer to it instead of each giving a fix of its own (containerd's
    "rewrite the entry" would write the same path again)."""
    current = _released_node(node)
    os.rename(node.path("/opt/cdi-shim/releases/0.2.0"), node.path("/opt/cdi-shim/old-0.2.0"))
    check = only_failure(node, "runtime.release")
    assert check.saw.startswith(f"/opt/cdi-shim/current (in {node.root}) -> releases/0.2.0, which does not exist "
                                "(the release was moved or removed): containerd, Docker, podman name "
                                f"{current}"), check.saw
    assert check.fix.startswith("point /opt/cdi-shim/current at an installed release: ln -sfn releases/0.1.0 "
                                "/opt/cdi-shim/current (installed: 0.1.0)"), check.fix
    checks = node.checks()
    for engine in ("containerd.runtime", "docker.runtime", "podman.runtime"):
        assert checks[engine].status == WARN and checks[engine].fix == "", (engine, checks[engine])
        assert checks[engine].saw.endswith("(see runtime.release)"), checks[engine].saw
    out = run_cli("doctor", "--root", node.root, "--containerd-binary", need("containerd", "containerd"),
                  env=doctor_env)
    assert out.returncode == 1
    assert [line.split()[1] for line in out.stdout.splitlines() if line.startswith("fail")] == ["runtime.release"]
    for line in out.stdout.splitlines():   # no other fix of the runtime's
        if line.split()[1] in ("containerd.runtime", "docker.runtime", "podman.runtime"):
            assert line.startswith("warn") and "-- fix:" not in line, line
    # the fix as given, run in the root: everything passes
    os.unlink(node.path("/opt/cdi-shim/current"))
    os.symlink("releases/0.1.0", node.path("/opt/cdi-shim/current"))
    assert node.failed() == {}


def test_a_dangling_release_link_with_no_release_left(node):
    _released_node(node)
    shutil.rmtree(node.path("/opt/cdi-shim/releases"))
    check = only_failure(node, "runtime.release")
    assert check.fix.startswith("install a release (docs/install.md")


def test_long_path_lists_are_capped_in_the_report_and_whole_in_json(node, doctor_env):
    """A spec naming many files the node lacks: the report line names the first three and "and N
    more", as `cdi validate` does; --json keeps them all."""
    mounts = "".join(f"      - hostPath: /opt/gone/lib{i}.so\n        containerPath: /opt/gone/lib{i}.so\n"
                     for i in range(7))
    node.write("/etc/cdi/gone.yaml", 'cdiVersion: "0.5.0"\nkind: example.com/gone\ndevices:\n  - name: all\n'
                                     "    containerEdits:\n      mounts:\n" + mounts.replace("      - ", "        - ")
                                     .replace("        containerPath", "          containerPath"))
    check = node.checks()["cdi.paths"]
    assert check.status == FAIL, check
    missing = check.saw.split(": ", 1)[1].split(", ")
    assert len(missing) == 7 and check.brief != check.saw
    argv = ["doctor", "--root", node.root, "--containerd-binary", need("containerd", "containerd")]
    [line] = [x for x in run_cli(*argv, env=doctor_env).stdout.splitlines() if " cdi.paths " in x]
    assert f"do not exist: {', '.join(missing[:3])} and 4 more  -- fix: " in line, line
    [entry] = [c for c in json.loads(run_cli(*argv, "--json", env=doctor_env).stdout) if c["check"] == "cdi.paths"]
    assert entry["saw"] == check.saw
