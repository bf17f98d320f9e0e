"""A private podman, for the podman e2e tests and benchmark.

Debian's podman 4.3 (bookworm's own, /usr/bin/podman) or 5.8 (forky's, unpacked with its own
glibc: releases.fetch_podman) runs with bookworm's conmon and runc, its storage (vfs), run root
and tmp dir under one directory, cgroupfs, file events and no network. Its containers.conf is
the lab's own ($CONTAINERS_CONF: podman then reads no other), with cdi-shim registered by the
real ``cdi-shim runtime configure --runtime=podman``.

Every podman command runs in one private mount namespace (a holder process made by unshare; each
command enters it with nsenter) that has a tmpfs of its own at /run, with the lab's spec folder
bound at /run/cdi (= /var/run/cdi), and an empty tmpfs over /etc/cdi where that exists: podman
4.3 reads specs only from those two folders, and nothing of the host's is read or changed.

The runtime's config comes from ``$CDI_SHIM_CONFIG``, which reaches it through containers.conf's
``conmon_env_vars`` (conmon, which runs the runtime, gets only those and PATH).
The image: a busybox rootfs with the host's glibc loader and libc and /prog (gcc-built: dlopens
the driver libraries through the linker cache), run with ``--rootfs DIR:O`` (an overlay per
container: the rootfs itself never changes).
"""
import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

from . import releases
from .hosttools import CMD_TIMEOUT, LabError, find_tool, need_static_busybox, stop_process

RUNTIME_NAME = "cdi-shim"
LIBDIR = "/usr/lib/x86_64-linux-gnu"
PROGRAM = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(void) {
    const char *names[] = {"libnvidia-ml.so.1", "libcuda.so.1"};
    for (int i = 0; i < 2; i++) {
        void *lib = dlopen(names[i], RTLD_NOW);
        printf("%s=%s\n", names[i], lib ? "loaded" : dlerror());
    }
    return 0;
}
"""


class PodmanLab:
    def __init__(self, base, version, runtime_binary=None, resident=False):
        """`version`: "4.3" (the system's podman) or "5.8" (forky's, unpacked privately).
        `runtime_binary`: what containers.conf names (default: cdi-shim-runtime beside this interpreter).
        `resident`: the runtime's resident process (`cdi-shim runtime serve`) runs, in the lab's mount
        namespace (the server declines callers of another one)."""
        if os.geteuid() != 0:
            raise LabError("the podman lab runs root podman with runc: run it as root")
        if version not in releases.PODMAN_VERSIONS:
            raise LabError(f"podman {version}: the lab runs {', '.join(releases.PODMAN_VERSIONS)}")
        self.version = version
        self.helper_dir = None
        if version == releases.SYSTEM_PODMAN:
            self.podman = find_tool("podman", "podman")
        else:
            try:
                tools = releases.podman_binaries(releases.fetch_podman(version))
            except releases.ReleaseError as err:
                raise LabError(f"cannot fetch podman {version} (Debian's podman of forky): {err}") from None
            self.podman, self.helper_dir = tools["podman"], os.path.dirname(tools["netavark"])
        self.conmon = find_tool("conmon", "conmon")
        self.runc = find_tool("runc", "runc")
        self.unshare = find_tool("unshare", "util-linux")
        self.nsenter = find_tool("nsenter", "util-linux")
        self.gcc = find_tool("gcc", "gcc")
        self.ldconfig = find_tool("ldconfig", "libc-bin")
        self.busybox = need_static_busybox()
        venv_bin = os.path.dirname(os.path.abspath(sys.executable))
        self.runtime_binary = runtime_binary or os.path.join(venv_bin, "cdi-shim-runtime")
        self.cli = os.path.join(venv_bin, "cdi-shim")
        self.hook_program = os.path.join(venv_bin, "cdi-shim-hook")
        for program in (self.runtime_binary, self.cli, self.hook_program):
            if not os.access(program, os.X_OK):
                raise LabError(f"{program} is not installed: run scripts/setup.sh")
        self.base = os.path.abspath(str(base))
        p = lambda *names: os.path.join(self.base, *names)  # noqa: E731
        self.containers_conf, self.storage_conf = p("containers.conf"), p("storage.conf")
        self.graph_root, self.run_root, self.tmp_dir = p("storage"), p("run"), p("tmp")
        self.spec_dir, self.rootfs = p("cdi"), p("rootfs")
        self.shim_config, self.cache_dir = p("cdi-shim.toml"), p("cache")
        self.ready = p("namespace-ready")
        self.holder = self.resident_process = None
        self.resident = resident
        # a unix socket's path is short: in a folder of its own under /tmp
        self.socket_dir = tempfile.mkdtemp(prefix="cdi-pm.", dir="/tmp")
        self.resident_socket = os.path.join(self.socket_dir, "r.sock" if resident else "no-resident.sock")

    # -- set-up --

    def env(self):
        env = dict(os.environ)
        env.update(CONTAINERS_CONF=self.containers_conf, CONTAINERS_STORAGE_CONF=self.storage_conf,
                   CDI_SHIM_CONFIG=self.shim_config, CDI_SHIM_CACHE_DIR=self.cache_dir,
                   PODMAN_IGNORE_CGROUPSV1_WARNING="1")
        return env

    def write_shim_config(self, **extra):
        values = {"runtime": self.runc, "spec-dirs": [self.spec_dir], "resident-socket": self.resident_socket}
        values.update(extra)
        with open(self.shim_config, "w") as stream:
            for key, value in values.items():
                stream.write(f"{key} = {json.dumps(value)}\n")

    def _write_engine_config(self):
        with open(self.storage_conf, "w") as stream:
            stream.write(f'[storage]\ndriver = "vfs"\ngraphroot = "{self.graph_root}"\nrunroot = "{self.run_root}"\n')
        path = "/usr/sbin:/usr/bin:/sbin:/bin"
        conmon_env = [f"PATH={path}", f"CDI_SHIM_CONFIG={self.shim_config}", f"CDI_SHIM_CACHE_DIR={self.cache_dir}"]
        lines = ["[engine]", 'cgroup_manager = "cgroupfs"', 'events_logger = "file"',
                 f"tmp_dir = {json.dumps(self.tmp_dir)}",
                 f"conmon_path = {json.dumps([self.conmon])}", f"conmon_env_vars = {json.dumps(conmon_env)}",
                 'runtime = "runc"']
        if self.helper_dir:
            lines.append(f"helper_binaries_dir = {json.dumps([self.helper_dir])}")
        lines += ["", "[engine.runtimes]", f"runc = {json.dumps([self.runc])}", ""]
        with open(self.containers_conf, "w") as stream:
            stream.write("\n".join(lines))

    def configure(self, *args, check=True):
        """The real `cdi-shim runtime configure --runtime=podman` on this lab's containers.conf."""
        command = [self.cli, "runtime", "configure", "--runtime=podman", "--config", self.containers_conf,
                   "--runtime-binary", self.runtime_binary, "--podman-binary", self.podman] + list(args)
        out = subprocess.run(command, capture_output=True, text=True, env=self.env(), timeout=CMD_TIMEOUT)
        if check and out.returncode != 0:
            raise LabError(f"cdi-shim runtime configure --runtime=podman failed: {out.stderr.strip()}")
        return out

    def build_rootfs(self):
        """busybox, the host's glibc loader and libc, /prog, and a linker cache of their own."""
        root = self.rootfs
        for sub in ("bin", "dev", "proc", "sys", "tmp", "etc/ld.so.conf.d", "lib64", LIBDIR.lstrip("/")):
            os.makedirs(os.path.join(root, sub), exist_ok=True)
        shutil.copy2(self.busybox, os.path.join(root, "bin", "busybox"))
        for applet in ("sh", "ls", "cat", "grep", "readlink", "true", "env", "stat"):
            os.symlink("busybox", os.path.join(root, "bin", applet))
        for name in ("libc.so.6",):
            shutil.copy2(os.path.realpath(f"{LIBDIR}/{name}"), root + f"{LIBDIR}/{name}")
        shutil.copy2(os.path.realpath("/lib64/ld-linux-x86-64.so.2"), root + "/lib64/ld-linux-x86-64.so.2")
        with open(root + "/etc/ld.so.conf", "w") as stream:
            stream.write("include /etc/ld.so.conf.d/*.conf\n")
        with open(root + "/etc/ld.so.conf.d/x86_64-linux-gnu.conf", "w") as stream:
            stream.write(LIBDIR + "\n")
        with open(root + "/etc/passwd", "w") as stream:
            stream.write("root:x:0:0:root:/:/bin/sh\n")
        with open(root + "/etc/group", "w") as stream:
            stream.write("root:x:0:\n")
        source = os.path.join(self.base, "prog.c")
        with open(source, "w") as stream:
            stream.write(PROGRAM)
        subprocess.run([self.gcc, "-O2", "-o", root + "/prog", source, "-ldl"], check=True, timeout=CMD_TIMEOUT,
                       capture_output=True)
        subprocess.run([self.ldconfig, "-r", root], check=True, timeout=CMD_TIMEOUT, capture_output=True)

    def setup(self):
        for directory in (self.graph_root, self.run_root, self.tmp_dir, self.spec_dir, self.cache_dir):
            os.makedirs(directory, exist_ok=True)
        self.write_shim_config()
        self._write_engine_config()
        self.build_rootfs()
        self.start()
        self.configure()
        return self

    def start(self):
        """The holder of the private mount namespace every podman command runs in."""
        script = ('mount -t tmpfs -o mode=0755 cdi-shim-podman /run && mkdir /run/cdi && mount --bind "$1" /run/cdi '
                  '&& { [ ! -d /etc/cdi ] || mount -t tmpfs -o mode=0755 cdi-shim-podman-etc-cdi /etc/cdi; } '
                  '&& touch "$2" && exec sleep 1000000')
        self.holder = subprocess.Popen(
            [self.unshare, "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, "sh",
             self.spec_dir, self.ready], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.monotonic() + 30
        while not os.path.exists(self.ready):
            if self.holder.poll() is not None or time.monotonic() > deadline:
                why = self.holder.stderr.read().decode().strip()
                raise LabError(f"the private mount namespace was not made: {why}")
            time.sleep(0.02)
        if self.resident:
            log_path = os.path.join(self.base, "resident.log")
            with open(log_path, "ab") as log:
                self.resident_process = subprocess.Popen(
                    [self.nsenter, f"--mount=/proc/{self.holder.pid}/ns/mnt", "--", self.cli, "runtime", "serve",
                     "--socket", self.resident_socket], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    env=self.env(), start_new_session=True)
            deadline = time.monotonic() + 60
            while not os.path.exists(self.resident_socket):
                if self.resident_process.poll() is not None or time.monotonic() > deadline:
                    with open(log_path, errors="replace") as stream:
                        raise LabError("cdi-shim runtime serve did not start: " + stream.read().strip()[-500:])
                time.sleep(0.05)

    # -- containers --

    def podman_argv(self, *args):
        return [self.nsenter, f"--mount=/proc/{self.holder.pid}/ns/mnt", "--", self.podman] + list(args)

    def podman_cmd(self, *args, check=True, timeout=CMD_TIMEOUT):
        out = subprocess.run(self.podman_argv(*args), capture_output=True, text=True, timeout=timeout, env=self.env())
        if check and out.returncode != 0:
            raise LabError(f"podman {shlex.join(args)} failed: {out.stderr.strip()}")
        return out

    def run_argv(self, *args, command=("true",)):
        """`podman run --rm --network none ULIMITS ARGS --rootfs ROOTFS:O COMMAND` (every flag before
        --rootfs: what follows its path is the command)."""
        return self.podman_argv("run", "--rm", "--network", "none", *ulimit_flags(), *args,
                                "--rootfs", f"{self.rootfs}:O", *command)

    def run(self, *args, command=("true",)):
        return subprocess.run(self.run_argv(*args, command=command), capture_output=True, text=True,
                              timeout=CMD_TIMEOUT, env=self.env())

    # -- tear-down --

    def stop(self):
        stop_process(self.resident_process, 15)
        self.resident_process = None
        shutil.rmtree(self.socket_dir, ignore_errors=True)
        if self.holder is not None:
            # containers of --rm runs are gone; the namespace (its tmpfs) goes with its last process
            stop_process(self.holder, 10)
            self.holder = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def ulimit_flags():
    """nofile and nproc at or below this process's hard limits: podman's defaults (1048576) need
    CAP_SYS_RESOURCE, which this machine's root lacks."""
    def capped(limit, wanted):
        hard = resource.getrlimit(limit)[1]
        return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    nofile, nproc = capped(resource.RLIMIT_NOFILE, 20000), capped(resource.RLIMIT_NPROC, 32768)
    return ("--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}")
