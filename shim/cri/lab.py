"""A private containerd with its CRI plugin, for the e2e tests and the pod benchmark.

Everything lives under one directory: root, state, socket, runc state (``Root`` of every
runtime), netns files, CNI dirs (empty: pods use host networking), container logs, the cdi-shim
config and registry cache, CDI specs and fake devices. The containerd config is
``containerd config default`` with the facts of these machines: ``restrict_oom_score_adj =
true`` (root lacks CAP_SYS_RESOURCE, so runc fails "can't get final child's PID from pipe"
otherwise), ``SystemdCgroup = false`` (PID 1 is not systemd), host-network pods without a
hostname, a local ``sandbox_image``; then the cdi-shim runtime is added by the real ``cdi-shim
runtime configure`` command. Images are an OCI-layout tarball made here from busybox-static
and imported with ``ctr -n k8s.io images import``; ``setup(library_image=True)`` adds LIB_IMAGE,
busybox plus the ldcache tests' library tree with its own ld.so.cache (library_layer).

The containerd is the system's (1.6: no CDI support of its own, so every device a pod gets is
cdi-shim's) or a real 1.7 / 2.1 fetched from Debian's trixie / forky into a cached prefix
(releases.py); ``native_cdi`` then sets its enable_cdi through ``runtime configure --enable-cdi``,
which also makes cdi_spec_dirs the lab's spec dir. containerd 2.x keeps state under
/run/containerd whatever the config says, so it runs in a private mount namespace with a tmpfs
of its own at /run (the system's containerd and other labs stay untouched).
"""
import hashlib
import io
import json
import os
import shlex
import platform
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid

import tomlkit

from . import hosttools, releases
from . import CRIClient
from .client import CRIError, read_container_log

IMAGE = "localhost/busybox:local"
PAUSE_IMAGE = "localhost/pause:local"
LIB_IMAGE = "localhost/busybox-libs:local"  # busybox + the ldcache tests' library tree (Lab.setup)
NAMESPACE = "k8s.io"
RUNTIME_NAME = "nvidia"
CMD_TIMEOUT = 120


class LabError(Exception):
    pass


# Stands in for runc where the pod benchmark times it (Lab(time_runc=True)): runs runc with the
# same arguments and, for create and start, appends "VERB CONTAINER-ID MS" to the log. (A fork
# and a wait more than exec'ing runc, on every side alike.)
RUNC_TIMER_C = r"""
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    const char *verb = NULL;
    for (int i = 1; i < argc && !verb; i++)
        if (strcmp(argv[i], "create") == 0 || strcmp(argv[i], "start") == 0)
            verb = argv[i];
    argv[0] = RUNC;
    if (!verb) {
        execv(RUNC, argv);
        return 127;
    }
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    pid_t pid = fork();
    if (pid == 0) {
        execv(RUNC, argv);
        _exit(127);
    }
    int status = 0;
    if (pid < 0)
        return 127;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return 127;
    clock_gettime(CLOCK_MONOTONIC, &b);
    char line[512];
    int n = snprintf(line, sizeof(line), "%s %s %.3f\n", verb, argv[argc - 1],
                     (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6);
    int fd = open(LOG, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) {
        if (write(fd, line, (size_t)n) != n)
            fprintf(stderr, "runc-timer: cannot log to %s\n", LOG);
        close(fd);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
"""


def build_runc_timer(path, runc, log, gcc):
    source = path + ".c"
    with open(source, "w") as stream:
        stream.write(RUNC_TIMER_C)
    subprocess.run([gcc, "-O2", "-o", path, source, f'-DRUNC="{runc}"', f'-DLOG="{log}"'], check=True,
                   timeout=CMD_TIMEOUT)
    return path


def find_tool(name, package):
    path = shutil.which(name) or next(
        (os.path.join(d, name) for d in ("/usr/sbin", "/sbin", "/usr/bin", "/bin")
         if os.access(os.path.join(d, name), os.X_OK)), None)
    if path is None:
        raise LabError(f"{name} not found: apt-get install {package}")
    return path


def static_busybox():
    path = hosttools.static_busybox()
    if path is None:
        raise LabError("no statically linked busybox: apt-get install busybox-static")
    return path


# --- the image ----------------------------------------------------------------------------------

def _oci_arch():
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le",
            "s390x": "s390x", "riscv64": "riscv64"}.get(machine, machine)


def _layer(busybox):
    """An uncompressed layer tar: busybox with its applets as links, a passwd, the usual dirs."""
    applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True).stdout.split()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def add_dir(name):
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(info)

        def add_file(name, data, mode=0o644):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))

        for directory in ("bin", "dev", "etc", "proc", "sys", "tmp", "usr", "usr/lib", "var", "root"):
            add_dir(directory)
        with open(busybox, "rb") as stream:
            add_file("bin/busybox", stream.read(), 0o755)
        for applet in sorted(set(applets) - {"busybox"}):
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, "busybox", 0o777, 0
            tar.addfile(info)
        add_file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
        add_file("etc/group", b"root:x:0:\n")
    return buffer.getvalue()


def build_oci_archive(path, busybox, images):
    """Write an OCI image layout tarball holding `images` ({reference: (entrypoint, cmd)} or
    (entrypoint, cmd, extra layers)): the busybox layer, then the image's extra layers (uncompressed tars)."""
    layer = _layer(busybox)
    layer_digest = "sha256:" + hashlib.sha256(layer).hexdigest()
    blobs = {layer_digest: layer}
    manifests = []
    for reference, (entrypoint, cmd, *more) in images.items():
        layers = [(layer_digest, len(layer))]
        for extra in (more[0] if more else ()):
            digest = "sha256:" + hashlib.sha256(extra).hexdigest()
            blobs[digest] = extra
            layers.append((digest, len(extra)))
        config = json.dumps({
            "architecture": _oci_arch(), "os": "linux",
            "config": {"Env": ["PATH=/bin"], "Entrypoint": entrypoint, "Cmd": cmd, "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [digest for digest, _ in layers]},
        }, sort_keys=True).encode()
        config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
        blobs[config_digest] = config
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest,
                       "size": len(config)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": digest, "size": size}
                       for digest, size in layers],
        }, sort_keys=True).encode()
        manifest_digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
        blobs[manifest_digest] = manifest
        manifests.append({
            "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest,
            "size": len(manifest), "platform": {"architecture": _oci_arch(), "os": "linux"},
            "annotations": {"io.containerd.image.name": reference,
                            "org.opencontainers.image.ref.name": reference.rsplit(":", 1)[-1]},
        })
    index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                        "manifests": manifests}, sort_keys=True).encode()
    with tarfile.open(path, "w") as tar:
        def add(name, data):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))

        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", index)
        for digest, data in blobs.items():
            add("blobs/sha256/" + digest.split(":", 1)[1], data)
    return path


def library_layer(work, ldconfig):
    """An uncompressed layer tar of the generated library tree of the ldcache tests
    (tests/linker/libtree.py, cached as a tarball under CDI_SHIM_TEST_CACHE: 480 gcc-built library
    files, 417 links, its own /etc/ld.so.conf(.d)) with the image's own ld.so.cache, made by the
    host's `ldconfig -r`, as an image ships one."""
    linker_tests = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "tests", "linker")
    if not os.path.exists(os.path.join(linker_tests, "libtree.py")):
        raise LabError(f"the library tree needs the cdi-shim checkout's {linker_tests}/libtree.py")
    sys.path.insert(0, linker_tests)
    try:
        import libtree
    finally:
        sys.path.remove(linker_tests)
    tarball, _ = libtree.tarball(releases.CACHE_DIR)
    root = os.path.join(work, "libtree-root")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    subprocess.run(["tar", "-C", root, "--numeric-owner", "-xf", tarball], check=True, timeout=CMD_TIMEOUT)
    subprocess.run([ldconfig, "-r", root], check=True, capture_output=True, timeout=CMD_TIMEOUT)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(os.listdir(root)):
            tar.add(os.path.join(root, name), arcname=name)
    shutil.rmtree(root, ignore_errors=True)
    return buffer.getvalue()


# --- fake devices and libraries ----------------------------------------------------------------

def make_char_device(path, major, minor):
    if not os.path.exists(path):
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    return path


def build_fake_libraries(directory, count, gcc):
    """`count` shared libraries with real SONAMEs (libfakedrv<N>.so.1 -> .so.1.0.0), built by gcc."""
    os.makedirs(directory, exist_ok=True)
    source = os.path.join(directory, "fake.c")
    with open(source, "w") as stream:
        stream.write("int fake_driver_entry(void) { return 42; }\n")
    paths = []
    for index in range(count):
        soname = f"libfakedrv{index}.so.1"
        target = os.path.join(directory, soname + ".0.0")
        if not os.path.exists(target):
            subprocess.run([gcc, "-shared", "-fPIC", "-O1", f"-Wl,-soname,{soname}", "-o", target, source],
                           check=True, capture_output=True, timeout=CMD_TIMEOUT)
        paths.append(target)
    return paths


DRIVER_FOLDER = "/usr/lib/x86_64-linux-gnu"
DRIVER_VERSION = "550.54.15"

# A hook program doing what nvidia-cdi-hook does for the subcommands of a generated spec
# (NVIDIA Container Toolkit 1.17+),
# run by runc as a createContainer hook: it reads the
# OCI state on stdin, finds the rootfs from the bundle's config.json and works on it (runc runs
# createContainer hooks in the container's mount namespace before pivot_root, so the rootfs
# holds the spec's bind mounts). It appends "<subcommand> <rootfs>" to LOG first: the evidence
# that it ran as a process.
#   update-ldcache: an /etc/ld.so.conf if missing, an ld.so.conf.d drop-in naming the --folder
#     directories, then the host's `ldconfig -r <rootfs>` (a full rescan of the image's library
#     directories, as the toolkit's `ldconfig -f /etc/ld.so.conf -C /etc/ld.so.cache` in the
#     pivot_rooted root; without its re-exec into new namespaces, so if anything cheaper);
#   create-symlinks: each --link TARGET::LINK inside the rootfs (kept when there);
#   update-application-profile: the EGLVisibleDGPUDevices profile for the config's /dev/nvidiaN;
#   enable-cuda-compat: nothing unless the image has /usr/local/cuda/compat (this one has not);
#   disable-device-node-modification: nothing unless the host has /proc/driver/nvidia/params.
HOOK_SCRIPT = r"""#!/bin/sh
set -eu
PATH=/usr/sbin:/usr/bin:/sbin:/bin
state=$(cat)
bundle=$(printf '%s' "$state" | sed -n 's/.*"bundle":"\([^"]*\)".*/\1/p')
[ -n "$bundle" ] || { echo "$0: no bundle in the OCI state" >&2; exit 1; }
root=$(sed -n 's/.*"root":{"path":"\([^"]*\)".*/\1/p' "$bundle/config.json")
case $root in /*) ;; *) root=$bundle/$root ;; esac
[ -n "$root" ] && [ "$root" != / ] || { echo "$0: no rootfs" >&2; exit 1; }
command=$1
shift
echo "$command $root" >> @LOG@
case $command in
update-ldcache)
    folders=
    while [ $# -gt 0 ]; do
        case $1 in
            --folder) folders="$folders$2
"; shift 2 ;;
            --folder=*) folders="$folders${1#--folder=}
"; shift ;;
            *) shift ;;
        esac
    done
    mkdir -p "$root/etc/ld.so.conf.d"
    [ -e "$root/etc/ld.so.conf" ] || echo 'include /etc/ld.so.conf.d/*.conf' > "$root/etc/ld.so.conf"
    printf '%s' "$folders" > "$root/etc/ld.so.conf.d/00-nvcr-$$.conf"
    @LDCONFIG@ -r "$root" 2>/dev/null
    ;;
create-symlinks)
    while [ $# -gt 0 ]; do
        case $1 in
            --link) spec=$2; shift 2 ;;
            --link=*) spec=${1#--link=}; shift ;;
            *) shift; continue ;;
        esac
        target=${spec%%::*}
        link=${spec#*::}
        mkdir -p "$root$(dirname "$link")"
        [ -e "$root$link" ] || [ -L "$root$link" ] || ln -s "$target" "$root$link"
    done
    ;;
update-application-profile)
    mask=0
    for n in $(sed -n 's/"path":"\/dev\/nvidia\([0-9][0-9]*\)"/\n\1\n/gp' "$bundle/config.json" | grep -x '[0-9]*'); do
        mask=$((mask | (1 << n)))
    done
    if [ "$mask" -ne 0 ]; then
        mkdir -p "$root/etc/nvidia/nvidia-application-profiles-rc.d"
        profile='{"profiles":[{"name":"_container_","settings":["EGLVisibleDGPUDevices",0x%x]}],'
        profile=$profile'"rules":[{"pattern":[],"profile":"_container_"}]}'
        printf "$profile" "$mask" > "$root/etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf"
    fi
    ;;
enable-cuda-compat)
    [ ! -d "$root/usr/local/cuda/compat" ] || { echo "$0: a compat folder: not done here" >&2; exit 1; }
    ;;
disable-device-node-modification)
    [ ! -e /proc/driver/nvidia/params ] || { echo "$0: /proc/driver/nvidia/params: not done here" >&2; exit 1; }
    ;;
*)
    echo "$0: unknown subcommand $command" >&2; exit 1 ;;
esac
"""


def build_driver_libraries(directory, count, gcc, version=DRIVER_VERSION):
    """`count` gcc-built driver libraries as a driver ships them: versioned file names
    (libnvidia-bench<N>.so.<version>), SONAME libnvidia-bench<N>.so.1."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for index in range(count):
        path = os.path.join(directory, f"libnvidia-bench{index}.so.{version}")
        if not os.path.exists(path):
            source = os.path.join(directory, f"lib{index}.c")
            with open(source, "w") as stream:
                stream.write(f"int cdi_shim_bench_{index}(void) {{ return {index}; }}\n")
            subprocess.run([gcc, "-shared", "-fPIC", "-o", path, source, f"-Wl,-soname,libnvidia-bench{index}.so.1"],
                           check=True, capture_output=True, timeout=CMD_TIMEOUT)
            os.unlink(source)
        paths.append(path)
    return paths


def toolkit_hooks(program, folder=DRIVER_FOLDER, version=DRIVER_VERSION):
    """The six createContainer hooks of a spec written by `nvidia-ctk cdi generate` (1.20), with
    PROGRAM as the hook program (path; args[0] its basename)."""
    name = os.path.basename(program)

    def hook(*args):
        return (f"    - hookName: createContainer\n      path: {program}\n"
                f"      args: [{name}, {', '.join(args)}]\n      env: [NVIDIA_CTK_DEBUG=false]\n")
    return (hook("create-symlinks", "--link", f"'libnvidia-bench0.so.1::{folder}/libnvidia-bench0.so'")
            + hook("create-symlinks", "--link", f"'libnvidia-bench1.so.1::{folder}/libnvidia-bench1.so'")
            + hook("enable-cuda-compat", f"--host-driver-version={version}")
            + hook("update-ldcache", "--folder", folder, "--folder", f"{folder}/vdpau")
            + hook("disable-device-node-modification")
            + hook("update-application-profile"))


# --- the lab -----------------------------------------------------------------------------------

def stop_process(process, timeout):
    """SIGTERM PROCESS (a Popen, or None), SIGKILL it after TIMEOUT seconds, and reap it."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


def kill_processes_naming(text):
    """SIGKILL every other process whose command line holds TEXT (a lab's socket: its shims)."""
    marker = text.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as stream:
                cmdline = stream.read()
        except OSError:
            continue
        if marker in cmdline:
            try:
                os.kill(int(entry), signal.SIGKILL)
            except ProcessLookupError:
                pass


class PodRun:
    """What one pod did: ids, container status, its output lines, CRI step times (seconds)."""

    def __init__(self):
        self.pod_id = self.container_id = None
        self.status = None
        self.output = []
        self.times = {}
        self.container_spec = None  # the OCI specs containerd gave the runtime (keep_configs=True)
        self.sandbox_spec = None


CRI_RUNTIME = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}


class Lab:
    def __init__(self, base, runtime_name=RUNTIME_NAME, log_level="info", runtime_log=False, resident=False,
                 containerd=None, native_cdi=None, time_runc=False, state_on_tmpfs=False):
        """`containerd`: "1.6" (None: the system's), "1.7" or "2.1" (fetched once; see releases.py).
        `native_cdi`: True / False sets containerd's enable_cdi (1.7+), None keeps its default.
        `time_runc`: runc runs behind RUNC_TIMER_C for both handlers (runc_times).
        `state_on_tmpfs`: containerd's state (the bundles) and runc's root on tmpfs mounts of their own,
        as a node's /run/containerd is; otherwise they are on BASE's filesystem."""
        if os.geteuid() != 0:
            raise LabError("a private containerd runs pods with runc and needs root")
        self.base = os.path.abspath(str(base))
        self.runtime_name = runtime_name
        self.containerd_version = containerd or releases.SYSTEM
        self.native_cdi = native_cdi
        self.bin_dir = None
        if self.containerd_version == releases.SYSTEM:
            self.containerd = find_tool("containerd", "containerd")
            self.ctr = find_tool("ctr", "containerd")
        elif self.containerd_version in releases.SUITES:
            try:
                tools = releases.binaries(releases.fetch(self.containerd_version))
            except releases.ReleaseError as err:
                raise LabError(f"cannot fetch containerd {self.containerd_version}: {err}") from None
            self.containerd, self.ctr = tools["containerd"], tools["ctr"]
            self.bin_dir = os.path.dirname(self.containerd)  # its containerd-shim-runc-v2 first on PATH
        else:
            raise LabError(f"containerd {self.containerd_version}: the lab runs {', '.join(releases.VERSIONS)}")
        if native_cdi and self.containerd_version == "1.6":
            raise LabError("containerd 1.6 has no CDI support of its own (enable_cdi needs 1.7)")
        self.private_run = not self.containerd_version.startswith("1.")
        self.config_version = 3 if self.private_run else 2
        self.runc = find_tool("runc", "runc")
        self.busybox = static_busybox()
        venv_bin = os.path.dirname(os.path.abspath(sys.executable))
        self.runtime_binary = os.path.join(venv_bin, "cdi-shim-runtime")
        if not os.access(self.runtime_binary, os.X_OK):
            raise LabError(f"cdi-shim-runtime is not installed next to {sys.executable}: "
                           "run `pip install -e '.[test]'`")
        self.cli = os.path.join(venv_bin, "cdi-shim")
        p = lambda *names: os.path.join(self.base, *names)  # noqa: E731
        self.root, self.state = p("root"), p("state")
        # Unix socket paths are limited to 108 bytes and containerd adds ".ttrpc": keep the
        # socket in a short directory of its own, whatever the depth of BASE.
        self.socket_dir = tempfile.mkdtemp(prefix="cdi-cri.", dir="/tmp")
        self.socket = os.path.join(self.socket_dir, "c.sock")
        # The runtime's resident process (`cdi-shim runtime serve`) when asked for; otherwise a
        # path where nothing listens, so a server running on this machine changes nothing.
        self.resident = resident
        self.resident_socket = os.path.join(self.socket_dir, "r.sock" if resident else "no-resident.sock")
        self.resident_process = None
        self.runc_root, self.logs, self.cni = p("runc"), p("logs"), p("cni")
        self.spec_dir, self.dev_dir, self.driver_dir = p("cdi"), p("dev"), p("driver")
        self.cache_dir, self.shim_config = p("cache"), p("cdi-shim.toml")
        self.config = p("containerd.toml")
        self.containerd_log = p("containerd.log")
        self.runtime_log = p("runtime.log") if runtime_log else ""
        self.runc_times_log = p("runc-times.log") if time_runc else None
        self.state_on_tmpfs = state_on_tmpfs
        self.runc_binary = p("runc-timer") if time_runc else self.runc   # what both handlers run as runc
        self.log_level = log_level
        self.process = None
        self.client = None
        self._count = 0
        # (host path, path) bound in containerd's private mount namespace (containerd 2.x), in
        # order; None for a tmpfs: a node's /opt/cdi-shim, say, over a tmpfs /opt, without
        # touching this machine's
        self.mounts = []

    # -- set-up --

    def env(self):
        env = dict(os.environ)
        env["CDI_SHIM_CONFIG"] = self.shim_config
        env["CDI_SHIM_CACHE_DIR"] = self.cache_dir
        path = env.get("PATH", "")
        if self.bin_dir:
            path = f"{self.bin_dir}:{path}" if path else self.bin_dir
        for directory in ("/usr/sbin", "/sbin", "/usr/bin", "/bin"):
            if directory not in path.split(":"):
                path = f"{path}:{directory}" if path else directory
        env["PATH"] = path
        return env

    def write_shim_config(self, **extra):
        values = {"runtime": self.runc_binary, "spec-dirs": [self.spec_dir], "log-level": self.log_level,
                  "resident-socket": self.resident_socket}
        if self.runtime_log:
            values["log-file"] = self.runtime_log
        values.update(extra)
        with open(self.shim_config, "w") as stream:
            for key, value in values.items():
                stream.write(f"{key} = {json.dumps(value)}\n")

    def base_config_text(self):
        """`containerd config default` with this lab's paths and the machine facts."""
        out = subprocess.run([self.containerd, "config", "default"], capture_output=True, text=True,
                             timeout=CMD_TIMEOUT)
        if out.returncode != 0:
            raise LabError(f"containerd config default failed: {out.stderr.strip()}")
        doc = tomlkit.parse(out.stdout)
        if doc.get("version") != self.config_version:
            raise LabError(f"containerd {self.containerd_version}'s default config is version {doc.get('version')}, "
                           f"not {self.config_version}")
        doc["root"], doc["state"] = self.root, self.state
        doc["grpc"]["address"] = self.socket
        cri = doc["plugins"][CRI_RUNTIME[self.config_version]]
        cri["disable_apparmor"] = True
        cri["restrict_oom_score_adj"] = True
        cri["netns_mounts_under_state_dir"] = True
        if self.config_version == 2:
            cri["sandbox_image"] = PAUSE_IMAGE
            cri["cni"]["bin_dir"] = os.path.join(self.cni, "bin")
        else:  # containerd 2.x: images and pinned sandbox image in their own plugin
            doc["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] = PAUSE_IMAGE
            cri["cni"]["bin_dirs"] = [os.path.join(self.cni, "bin")]
        cri["cni"]["conf_dir"] = os.path.join(self.cni, "net.d")
        runc = cri["containerd"]["runtimes"]["runc"]["options"]
        runc["Root"] = self.runc_root
        runc["SystemdCgroup"] = False
        if self.runc_binary != self.runc:
            runc["BinaryName"] = self.runc_binary
        doc["plugins"]["io.containerd.internal.v1.opt"]["path"] = os.path.join(self.base, "opt")
        return tomlkit.dumps(doc)

    def configure(self, *args):
        """Run the real `cdi-shim runtime configure` on this lab's config file."""
        command = [self.cli] if os.access(self.cli, os.X_OK) else [sys.executable, "-m", "shim.cli.main"]
        command += ["runtime", "configure", "--config", self.config, "--runtime-name", self.runtime_name,
                    "--runtime-binary", self.runtime_binary, "--containerd-binary", self.containerd] + list(args)
        if self.native_cdi is not None:
            command += ["--enable-cdi", "true" if self.native_cdi else "false"]
        out = subprocess.run(command, capture_output=True, text=True, env=self.env(), timeout=CMD_TIMEOUT)
        if out.returncode != 0:
            raise LabError(f"cdi-shim runtime configure failed: {out.stderr.strip()}")
        return out

    def add_runtime_copy(self, name, drop=()):
        """Add runtime `name` as a copy of ours without the keys in `drop` (e.g. the allow-list)."""
        with open(self.config) as stream:
            doc = tomlkit.parse(stream.read())
        runtimes = doc["plugins"][CRI_RUNTIME[self.config_version]]["containerd"]["runtimes"]
        entry = tomlkit.parse(tomlkit.dumps(tomlkit.document().add("x", runtimes[self.runtime_name].copy())))["x"]
        for key in drop:
            entry.pop(key, None)
        runtimes[name] = entry
        with open(self.config, "w") as stream:
            stream.write(tomlkit.dumps(doc))

    def write_gpu_spec(self):
        """nvidia.com/gpu=0: a fake GPU (char 195:0 made with mknod), an env var and a bind mount."""
        make_char_device(os.path.join(self.dev_dir, "nvidia0"), 195, 0)
        with open(os.path.join(self.driver_dir, "version.txt"), "w") as stream:
            stream.write("fake driver 555.42\n")
        self.write_spec("nvidia-gpu.yaml", self._fake_gpu_spec("nvidia.com/gpu", [
            (self.driver_dir, "/usr/local/fake-driver")]))

    def cri_equivalent_of_libraries_spec(self, libraries):
        """The same device node, env and bind mounts as CRI fields (what plain runc would need)."""
        pb = self.client.pb
        mounts = [pb.Mount(container_path=f"/usr/lib/fake-driver/{os.path.basename(path)}", host_path=path,
                           readonly=True) for path in libraries]
        devices = [pb.Device(container_path="/dev/nvidia0", host_path=os.path.join(self.dev_dir, "nvidia0"),
                             permissions="rwm")]
        return mounts, devices, {"FAKE_GPU_INDEX": "0", "FAKE_DRIVER": "555.42"}

    def write_libraries_spec(self, count=30):
        """bench.cdi-shim.dev/gpu=0: the fake GPU plus `count` gcc-built driver libraries, each a bind mount."""
        gcc = find_tool("gcc", "gcc")
        make_char_device(os.path.join(self.dev_dir, "nvidia0"), 195, 0)
        libraries = build_fake_libraries(os.path.join(self.base, "libs"), count, gcc)
        self.write_spec("bench-gpu-libs.yaml", self._fake_gpu_spec("bench.cdi-shim.dev/gpu", [
            (path, f"/usr/lib/fake-driver/{os.path.basename(path)}") for path in libraries]))
        return libraries

    def _fake_gpu_spec(self, kind, mounts):
        """A spec with device "0" (the fake GPU node and its env) and spec-wide env + bind mounts."""
        mount_lines = "".join(f"    - hostPath: {host}\n      containerPath: {container}\n"
                              "      options: [ro, nosuid, nodev, bind]\n" for host, container in mounts)
        return ('cdiVersion: "0.5.0"\n'
                f"kind: {kind}\n"
                "devices:\n"
                '  - name: "0"\n'
                "    containerEdits:\n"
                '      env: ["FAKE_GPU_INDEX=0"]\n'
                "      deviceNodes:\n"
                f"        - path: /dev/nvidia0\n          hostPath: {self.dev_dir}/nvidia0\n"
                "containerEdits:\n"
                '  env: ["FAKE_DRIVER=555.42"]\n'
                "  mounts:\n" + mount_lines)

    def write_native_cdi_specs(self, count=30, hook_program=None):
        """Two specs of the same device, as `nvidia-ctk cdi generate` writes one: /dev/nvidia0, `count`
        gcc-built driver libraries bind-mounted into DRIVER_FOLDER and the toolkit's six hooks.
        bench.cdi-shim.dev/hooked=0's hook program is HOOK_SCRIPT installed as <lab>/hooks/lab-cdi-hook, a
        name the cdi-shim runtime does not know (runc runs its hooks); bench.cdi-shim.dev/toolkit=0's
        is the same script installed as <lab>/hooks/nvidia-cdi-hook, the toolkit's name (the runtime
        does their work natively and drops them). Both append to the hook log: a line per hook
        process. bench.cdi-shim.dev/mounts=0 is the device without the hooks (what runc pays for the
        node and the mounts alone). HOOK_PROGRAM (a path, e.g. the toolkit's real nvidia-cdi-hook)
        replaces the script on the hooked side: copied in as lab-cdi-hook (the program dispatches on its
        subcommand, not its name); it writes no log, so the hooked side's processes are then not
        counted ("hook_log_counts_hooked" False). Returns {"hooked": device, "toolkit": device,
        "mounts": device, "hook_log": path, "hook_log_counts_hooked": bool, "libraries": [...]}."""
        gcc = find_tool("gcc", "gcc")
        ldconfig = find_tool("ldconfig", "libc-bin")
        make_char_device(os.path.join(self.dev_dir, "nvidia0"), 195, 0)
        libraries = build_driver_libraries(os.path.join(self.base, "driver-libs"), count, gcc)
        hooks_dir = os.path.join(self.base, "hooks")
        os.makedirs(hooks_dir, exist_ok=True)
        hook_log = os.path.join(hooks_dir, "hook.log")
        open(hook_log, "a").close()
        script = HOOK_SCRIPT.replace("@LOG@", hook_log).replace("@LDCONFIG@", ldconfig)
        mounts = "".join(f"    - hostPath: {path}\n      containerPath: {DRIVER_FOLDER}/{os.path.basename(path)}\n"
                         "      options: [ro, nosuid, nodev, bind]\n" for path in libraries)
        devices = {}
        for key, program in (("hooked", "lab-cdi-hook"), ("toolkit", "nvidia-cdi-hook"), ("mounts", None)):
            hooks = ""
            if program:
                path = os.path.join(hooks_dir, program)
                if key == "hooked" and hook_program:
                    if not os.access(hook_program, os.X_OK):
                        raise LabError(f"hook program {hook_program}: not an executable file")
                    shutil.copyfile(hook_program, path)
                else:
                    with open(path, "w") as stream:
                        stream.write(script)
                os.chmod(path, 0o755)
                hooks = "  hooks:\n" + toolkit_hooks(path)
            kind = f"bench.cdi-shim.dev/{key}"
            self.write_spec(f"bench-{key}.yaml", 'cdiVersion: "0.5.0"\n'
                            f"kind: {kind}\n"
                            "devices:\n"
                            '  - name: "0"\n'
                            "    containerEdits:\n"
                            "      deviceNodes:\n"
                            f"        - path: /dev/nvidia0\n          hostPath: {self.dev_dir}/nvidia0\n"
                            "containerEdits:\n"
                            "  mounts:\n" + mounts + hooks)
            devices[key] = f"{kind}=0"
        return dict(devices, hook_log=hook_log, hook_log_counts_hooked=not hook_program, libraries=libraries)

    def write_spec(self, name, text):
        path = os.path.join(self.spec_dir, name)
        with open(path, "w") as stream:
            stream.write(text)
        return path

    def setup(self, extra_runtimes=None, library_image=False, config_text=None):
        """Directories, configs, images; then start containerd. `extra_runtimes`: {name: keys to drop}.
        `library_image`: LIB_IMAGE too (busybox plus the library tree: library_layer).
        `config_text`: containerd's config as given (a node's, written by `install --node`) instead
        of the default one with our runtime configured."""
        for directory in (self.root, self.state, self.runc_root, self.logs, os.path.join(self.cni, "bin"),
                          os.path.join(self.cni, "net.d"), self.spec_dir, self.dev_dir, self.driver_dir):
            os.makedirs(directory, exist_ok=True)
        if self.state_on_tmpfs:     # (unmounted by stop, as every mount under BASE)
            for directory in (self.state, self.runc_root):
                subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0711", "cdi-shim-lab-state", directory],
                               check=True, timeout=CMD_TIMEOUT)
        if self.runc_times_log:
            build_runc_timer(self.runc_binary, self.runc, self.runc_times_log, find_tool("gcc", "gcc"))
        self.write_shim_config()
        self.write_gpu_spec()
        with open(self.config, "w") as stream:
            stream.write(config_text or self.base_config_text())
        if config_text is None:
            self.configure()
        for name, drop in (extra_runtimes or {}).items():
            self.add_runtime_copy(name, drop)
        self.start()
        images = {IMAGE: (None, ["/bin/sh"]), PAUSE_IMAGE: (["/bin/sleep"], ["2147483647"])}
        if library_image:
            images[LIB_IMAGE] = (None, ["/bin/sh"], [library_layer(self.base, find_tool("ldconfig", "libc-bin"))])
        archive = build_oci_archive(os.path.join(self.base, "images.tar"), self.busybox, images)
        self.ctr_cmd("images", "import", "--all-platforms", archive)
        try:
            self.client.wait_images(list(images))
        except CRIError as err:
            raise LabError(f"containerd's CRI plugin does not see the imported images: {err}") from None
        return self

    def ctr_cmd(self, *args):
        out = subprocess.run([self.ctr, "--address", self.socket, "--namespace", NAMESPACE] + list(args),
                             capture_output=True, text=True, timeout=CMD_TIMEOUT)
        if out.returncode != 0:
            raise LabError(f"ctr {' '.join(args)} failed: {out.stderr.strip()}")
        return out.stdout

    def start_resident(self):
        command = [self.cli, "runtime", "serve", "--socket", self.resident_socket]
        if self.private_run:
            # the server declines callers of another mount namespace: join containerd's private one
            command = [find_tool("nsenter", "util-linux"), f"--mount=/proc/{self.process.pid}/ns/mnt", "--"] + command
        log = open(os.path.join(self.base, "resident.log"), "ab")
        try:
            self.resident_process = subprocess.Popen(command,
                                                     stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                     env=self.env(), start_new_session=True)
        finally:
            log.close()
        deadline = time.monotonic() + 30
        while not os.path.exists(self.resident_socket):
            if self.resident_process.poll() is not None or time.monotonic() > deadline:
                raise LabError("cdi-shim runtime serve did not start")
            time.sleep(0.02)

    def start(self):
        if self.resident and self.resident_process is None and not self.private_run:
            self.start_resident()
        log = open(self.containerd_log, "ab")
        command = [self.containerd, "--config", self.config]
        if self.private_run:
            # containerd 2.x puts state under /run/containerd whatever `state` says: a /run of its own
            script = "mount -t tmpfs -o mode=0755 cdi-shim-lab-run /run && " + "".join(
                f"mount -t tmpfs -o mode=0755 cdi-shim-lab {shlex.quote(target)} && " if source is None else
                f"mkdir -p {shlex.quote(target)} && mount --bind {shlex.quote(source)} {shlex.quote(target)} && "
                for source, target in self.mounts)
            command = [find_tool("unshare", "util-linux"), "--mount", "--propagation", "private", "--", "/bin/sh",
                       "-c", script + 'exec "$@"', "sh"] + command
        try:
            self.process = subprocess.Popen(command, stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env(),
                                            start_new_session=True)
        finally:
            log.close()
        deadline = time.monotonic() + 30
        while not os.path.exists(self.socket):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise LabError(f"containerd did not start: {self.containerd_log_tail()}")
            time.sleep(0.02)
        self.client = CRIClient(self.socket)
        try:
            self.client.wait_ready(30)
        except CRIError as err:
            raise LabError(f"containerd's CRI plugin is not serving: {err}; {self.containerd_log_tail()}") from None
        if self.resident and self.resident_process is None:
            self.start_resident()  # in containerd's mount namespace (once /run is its own)

    def containerd_log_tail(self, lines=15):
        try:
            with open(self.containerd_log, errors="replace") as stream:
                return "containerd log: " + " | ".join(stream.read().strip().splitlines()[-lines:])
        except OSError:
            return "(no containerd log)"

    # -- pods --

    def runc_times(self, container_id):
        """{"create": ms, "start": ms} of runc for CONTAINER_ID, as the timer logged them (time_runc)."""
        times = {}
        with open(self.runc_times_log) as stream:
            for line in stream:
                verb, name, ms = line.split()
                if name == container_id:
                    times[verb] = float(ms)
        return times

    def oci_spec(self, container_id):
        """The OCI spec containerd hands the runtime for a container (`ctr containers info`): what the
        runtime's create sees before cdi-shim edits it."""
        return json.loads(self.ctr_cmd("containers", "info", container_id)).get("Spec") or {}

    def run_pod(self, handler, command, annotations=None, pod_annotations=None, envs=None, name=None,
                keep_configs=False, remove=True, timeout=60, mounts=(), devices=(), cdi_devices=(), image=IMAGE):
        """runp -> create -> start -> wait for exit -> stop -> remove; returns a PodRun.

        CRI errors propagate as CRIError (after the pod is cleaned up)."""
        self._count += 1
        name = name or f"pod{self._count}"
        run = PodRun()
        client = self.client
        log_dir = os.path.join(self.logs, f"{name}-{self._count}")
        os.makedirs(log_dir, exist_ok=True)
        pod = client.pod_config(name, str(uuid.uuid4()), log_dir, annotations=pod_annotations)
        container = client.container_config("main", image, command=command, envs=envs, annotations=annotations,
                                            log_path="main.log", mounts=mounts, devices=devices,
                                            cdi_devices=cdi_devices)
        clock = time.perf_counter
        t0 = clock()
        try:
            run.pod_id = client.run_pod_sandbox(pod, handler)
            run.times["runp"] = clock() - t0
            t = clock()
            run.container_id = client.create_container(run.pod_id, container, pod)
            run.times["create"] = clock() - t
            if keep_configs:
                run.container_spec = self.oci_spec(run.container_id)
                run.sandbox_spec = self.oci_spec(run.pod_id)
            t = clock()
            client.start_container(run.container_id)
            run.times["start"] = clock() - t
            run.times["startup"] = clock() - t0
            t = clock()
            run.status = client.wait_exited(run.container_id, timeout=timeout)
            run.times["wait"] = clock() - t
        finally:
            if run.pod_id and remove:
                t = clock()
                client.stop_pod_sandbox(run.pod_id)
                run.times["stop"] = clock() - t
                t = clock()
                client.remove_pod_sandbox(run.pod_id)
                run.times["remove"] = clock() - t
                run.times["lifecycle"] = clock() - t0
        run.output = read_container_log(os.path.join(log_dir, "main.log"))
        return run

    # -- tear-down --

    def stop(self):
        if self.client is not None:
            try:
                for sandbox in self.client.list_pod_sandboxes():
                    try:
                        self.client.stop_pod_sandbox(sandbox.id)
                        self.client.remove_pod_sandbox(sandbox.id)
                    except CRIError:
                        pass
            except CRIError:
                pass
            self.client.close()
            self.client = None
        stop_process(self.process, 15)
        self.process = None
        stop_process(self.resident_process, 15)
        self.resident_process = None
        kill_processes_naming(self.socket)    # shims of this lab's containerd
        self._unmount_leftovers()
        shutil.rmtree(self.socket_dir, ignore_errors=True)

    def _unmount_leftovers(self):
        try:
            with open("/proc/self/mountinfo") as stream:
                points = [line.split()[4] for line in stream]
        except OSError:
            return
        for point in sorted((p for p in points if p.startswith(self.base + "/")), key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True, timeout=CMD_TIMEOUT)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
