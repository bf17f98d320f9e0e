"""A private Docker daemon with its own containerd, for the Docker e2e tests and benchmark.

Debian's docker.io 20.10 / 26.1 / 28.5 (releases.fetch_docker) runs with the containerd of its
suite (the system's 1.6, trixie's 1.7, forky's 2.1), each with a data-root, exec-root, pidfile,
socket and daemon.json under one directory, ``--iptables=false --bridge=none`` (containers use
no network: nothing on this machine changes). Both run in a private mount namespace with a tmpfs
of their own at /run (containerd 2.x keeps state there whatever its config says), and the
daemon.json is the one ``cdi-shim runtime configure --runtime=docker`` writes.

The runtime's config comes from ``$CDI_SHIM_CONFIG`` in containerd's environment: containerd
starts the shims that run the runtime, so that is the environment the runtime gets.
Images: a docker-archive tarball (manifest.json + repositories: every version's ``docker load``
reads it; 20.10 cannot read an OCI layout) of busybox-static.
"""
import hashlib
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

from . import releases
from .hosttools import CMD_TIMEOUT, LabError, find_tool, kill_processes_naming, need_static_busybox, stop_process
from .images import _layer, _oci_arch, make_char_device

IMAGE = "localhost/busybox:local"
RUNTIME_NAME = "cdi-shim"


def build_docker_archive(path, busybox, reference=IMAGE):
    """A `docker save`-format tarball of one image: the busybox layer, /bin/sh as its command."""
    layer = _layer(busybox)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps({
        "architecture": _oci_arch(), "os": "linux", "created": "1970-01-01T00:00:00Z",
        "config": {"Env": ["PATH=/bin"], "Cmd": ["/bin/sh"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }, sort_keys=True).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    layer_name = diff_id.split(":", 1)[1] + "/layer.tar"
    repository, tag = reference.rsplit(":", 1)
    manifest = json.dumps([{"Config": config_name, "RepoTags": [reference], "Layers": [layer_name]}]).encode()
    with tarfile.open(path, "w") as tar:
        def add(name, data):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))

        add(config_name, config)
        add(layer_name, layer)
        add("manifest.json", manifest)
        add("repositories", json.dumps({repository: {tag: diff_id.split(":", 1)[1]}}).encode())
    return path


class DockerLab:
    def __init__(self, base, version, cdi=False, runtime_binary=None, gpus=True, resident=False):
        """`version`: "20.10", "26.1" or "28.5". `cdi`: configure with --cdi (the daemon's own CDI).
        `runtime_binary`: what daemon.json names (default: cdi-shim-runtime beside this interpreter).
        `gpus`: cdi-shim's nvidia-container-runtime-hook on dockerd's PATH (what offers --gpus).
        `resident`: the runtime's resident process (`cdi-shim runtime serve`) runs, in containerd's
        mount namespace (the server declines callers of another one)."""
        if os.geteuid() != 0:
            raise LabError("a private dockerd runs containers with runc and needs root")
        if version not in releases.DOCKER_SUITES:
            raise LabError(f"Docker {version}: the lab runs {', '.join(releases.DOCKER_VERSIONS)}")
        self.version, self.cdi = version, cdi
        try:
            tools = releases.docker_binaries(releases.fetch_docker(version))
        except releases.ReleaseError as err:
            raise LabError(f"cannot fetch Docker {version} (Debian's docker.io): {err}") from None
        self.dockerd, self.docker = tools["dockerd"], tools["docker"]
        containerd_version = releases.DOCKER_SUITES[version][1]
        self.bin_dir = None
        if containerd_version == releases.SYSTEM:
            self.containerd = find_tool("containerd", "containerd")
        else:
            try:
                self.containerd = releases.binaries(releases.fetch(containerd_version))["containerd"]
            except releases.ReleaseError as err:
                raise LabError(f"cannot fetch containerd {containerd_version}: {err}") from None
            self.bin_dir = os.path.dirname(self.containerd)  # its containerd-shim-runc-v2 first on PATH
        self.containerd_version = containerd_version
        self.runc = find_tool("runc", "runc")
        self.unshare = find_tool("unshare", "util-linux")
        self.nsenter = find_tool("nsenter", "util-linux")
        self.busybox = need_static_busybox()
        venv_bin = os.path.dirname(os.path.abspath(sys.executable))
        self.runtime_binary = runtime_binary or os.path.join(venv_bin, "cdi-shim-runtime")
        self.cli = os.path.join(venv_bin, "cdi-shim")
        for program in (self.runtime_binary, self.cli):
            if not os.access(program, os.X_OK):
                raise LabError(f"{program} is not installed: run scripts/setup.sh")
        self.base = os.path.abspath(str(base))
        p = lambda *names: os.path.join(self.base, *names)  # noqa: E731
        self.hook = os.path.join(venv_bin, "nvidia-container-runtime-hook")
        if gpus and not os.access(self.hook, os.X_OK):
            raise LabError(f"{self.hook} is not installed: run scripts/setup.sh")
        # a folder holding only the hook, first on dockerd's PATH (as /usr/local/bin would be)
        self.daemon_path = [p("hook-bin")] if gpus else []
        self.gpus = gpus
        # unix socket paths are short: a directory of their own under /tmp
        self.socket_dir = tempfile.mkdtemp(prefix="cdi-dk.", dir="/tmp")
        self.socket = os.path.join(self.socket_dir, "d.sock")
        self.containerd_socket = os.path.join(self.socket_dir, "c.sock")
        self.data_root, self.exec_root = p("data"), os.path.join(self.socket_dir, "x")
        self.pidfile, self.daemon_json = p("dockerd.pid"), p("daemon.json")
        self.containerd_config, self.containerd_root, self.containerd_state = (
            p("containerd.toml"), p("containerd-root"), p("containerd-state"))
        self.spec_dir, self.dev_dir, self.driver_dir = p("cdi"), p("dev"), p("driver")
        self.shim_config, self.cache_dir = p("cdi-shim.toml"), p("cache")
        self.log = p("daemon.log")
        self.resident = resident
        self.resident_socket = os.path.join(self.socket_dir, "r.sock" if resident else "no-resident.sock")
        self.containerd_process = self.process = self.resident_process = None

    # -- set-up --

    def env(self):
        env = dict(os.environ)
        env["CDI_SHIM_CONFIG"] = self.shim_config
        env["CDI_SHIM_CACHE_DIR"] = self.cache_dir
        path = [d for d in env.get("PATH", "").split(":") if d]
        for directory in ("/usr/sbin", "/sbin", "/usr/bin", "/bin"):
            if directory not in path:
                path.append(directory)
        # its docker-proxy (dockerd --validate wants it even with the userland proxy off) and containerd's shim
        front = self.daemon_path + [os.path.dirname(self.dockerd)] + ([self.bin_dir] if self.bin_dir else [])
        env["PATH"] = ":".join(front + [d for d in path if d not in front])
        return env

    def write_shim_config(self, **extra):
        values = {"runtime": self.runc, "spec-dirs": [self.spec_dir],
                  "resident-socket": self.resident_socket}
        values.update(extra)
        with open(self.shim_config, "w") as stream:
            for key, value in values.items():
                stream.write(f"{key} = {json.dumps(value)}\n")

    def write_gpu_spec(self):
        """nvidia.com/gpu=0, =1 and =all (as `nvidia-ctk cdi generate` writes: what --gpus all asks
        for): two fake GPUs (char 195:0 and 195:1 made with mknod), an env var each, and a spec-wide
        env var and bind mount."""
        for index in (0, 1):
            make_char_device(os.path.join(self.dev_dir, f"nvidia{index}"), 195, index)
        with open(os.path.join(self.driver_dir, "version.txt"), "w") as stream:
            stream.write("fake driver 555.42\n")

        def node(index):
            return f"        - path: /dev/nvidia{index}\n          hostPath: {self.dev_dir}/nvidia{index}\n"

        def device(name, index_env, indexes):
            return (f'  - name: "{name}"\n'
                    "    containerEdits:\n"
                    f'      env: ["FAKE_GPU_INDEX={index_env}"]\n'
                    "      deviceNodes:\n" + "".join(node(i) for i in indexes))

        with open(os.path.join(self.spec_dir, "nvidia-gpu.yaml"), "w") as stream:
            stream.write('cdiVersion: "0.5.0"\n'
                         "kind: nvidia.com/gpu\n"
                         "devices:\n" + device("0", "0", [0]) + device("1", "1", [1]) + device("all", "0", [0, 1]) +
                         "containerEdits:\n"
                         '  env: ["FAKE_DRIVER=555.42"]\n'
                         "  mounts:\n"
                         f"    - hostPath: {self.driver_dir}\n      containerPath: /usr/local/fake-driver\n"
                         "      options: [ro, nosuid, nodev, bind]\n")

    def write_hooked_spec(self):
        """cdi-shim.dev/hooked=0: the fake GPU plus a toolkit create-symlinks hook whose program (a
        script named nvidia-cdi-hook) only appends to the returned log and fails: where cdi-shim is the
        runtime it makes the link itself and drops the hook; under plain runc the container fails."""
        hooks_dir = os.path.join(self.base, "hooks")
        os.makedirs(hooks_dir, exist_ok=True)
        log, program = os.path.join(hooks_dir, "ran.log"), os.path.join(hooks_dir, "nvidia-cdi-hook")
        with open(program, "w") as stream:
            stream.write(f"#!/bin/sh\necho \"$@\" >> {log}\nexit 1\n")
        os.chmod(program, 0o755)
        with open(os.path.join(self.spec_dir, "hooked.yaml"), "w") as stream:
            stream.write('cdiVersion: "0.5.0"\n'
                         "kind: cdi-shim.dev/hooked\n"
                         "devices:\n"
                         '  - name: "0"\n'
                         "    containerEdits:\n"
                         "      deviceNodes:\n"
                         f"        - path: /dev/nvidia0\n          hostPath: {self.dev_dir}/nvidia0\n"
                         "containerEdits:\n"
                         "  hooks:\n"
                         f"    - hookName: createContainer\n      path: {program}\n"
                         "      args: [nvidia-cdi-hook, create-symlinks, --link, "
                         "'libnvidia-fake.so.1::/usr/lib/libnvidia-fake.so']\n")
        return log

    def configure(self, *args, check=True):
        """The real `cdi-shim runtime configure --runtime=docker` on this lab's daemon.json."""
        command = [self.cli, "runtime", "configure", "--runtime=docker", "--config", self.daemon_json,
                   "--runtime-binary", self.runtime_binary, "--dockerd-binary", self.dockerd] + list(args)
        out = subprocess.run(command, capture_output=True, text=True, env=self.env(), timeout=CMD_TIMEOUT)
        if check and out.returncode != 0:
            raise LabError(f"cdi-shim runtime configure --runtime=docker failed: {out.stderr.strip()}")
        return out

    def setup(self):
        for directory in (self.data_root, self.containerd_root, self.containerd_state, self.spec_dir,
                          self.dev_dir, self.driver_dir, self.cache_dir):
            os.makedirs(directory, exist_ok=True)
        self.write_shim_config()
        self.write_gpu_spec()
        self.hook_log = self.write_hooked_spec()
        if self.gpus:
            os.makedirs(self.daemon_path[0], exist_ok=True)
            link = os.path.join(self.daemon_path[0], os.path.basename(self.hook))
            if not os.path.lexists(link):
                os.symlink(self.hook, link)
        with open(self.daemon_json, "w") as stream:
            json.dump({"cdi-spec-dirs": [self.spec_dir]} if self.cdi else {}, stream)
        self.configure(*(["--cdi"] if self.cdi else []))
        self.start()
        archive = build_docker_archive(os.path.join(self.base, "image.tar"), self.busybox)
        self.docker_cmd("load", "-i", archive)
        return self

    def _containerd_config_text(self):
        # no CRI: dockerd needs only the containers, tasks, images and snapshots services
        if self.containerd_version.startswith("1."):
            return (f'version = 2\nroot = "{self.containerd_root}"\nstate = "{self.containerd_state}"\n'
                    'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
                    f'[grpc]\n  address = "{self.containerd_socket}"\n')
        return (f'version = 3\nroot = "{self.containerd_root}"\nstate = "{self.containerd_state}"\n'
                'disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", '
                '"io.containerd.cri.v1.images"]\n'
                f'[grpc]\n  address = "{self.containerd_socket}"\n')

    def start(self):
        with open(self.containerd_config, "w") as stream:
            stream.write(self._containerd_config_text())
        log = open(self.log, "ab")
        try:
            script = "mount -t tmpfs -o mode=0755 cdi-shim-docker-run /run && exec \"$@\""
            self.containerd_process = subprocess.Popen(
                [self.unshare, "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, "sh",
                 self.containerd, "--config", self.containerd_config],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env(),
                start_new_session=True)
            self._wait_for(self.containerd_socket, self.containerd_process, "containerd")
            if self.resident:
                self.resident_process = subprocess.Popen(
                    [self.nsenter, f"--mount=/proc/{self.containerd_process.pid}/ns/mnt", "--", self.cli, "runtime",
                     "serve", "--socket", self.resident_socket],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env(),
                    start_new_session=True)
                self._wait_for(self.resident_socket, self.resident_process, "cdi-shim runtime serve")
        finally:
            log.close()
        self._start_daemon()

    def _wait_for(self, path, process, what):
        deadline = time.monotonic() + 60
        while not os.path.exists(path):
            if process.poll() is not None or time.monotonic() > deadline:
                raise LabError(f"{what} did not start: {self.log_tail()}")
            time.sleep(0.05)

    def _start_daemon(self):
        """dockerd in containerd's mount namespace (its /run), with this lab's paths and daemon.json."""
        command = [self.nsenter, f"--mount=/proc/{self.containerd_process.pid}/ns/mnt", "--",
                   self.dockerd, "--config-file", self.daemon_json, "--data-root", self.data_root,
                   "--exec-root", self.exec_root, "--pidfile", self.pidfile, "-H", f"unix://{self.socket}",
                   "--containerd", self.containerd_socket, "--iptables=false", "--bridge=none",
                   "--userland-proxy=false", "--storage-driver=vfs"]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=self.env(), start_new_session=True)
        self._wait_for(self.socket, self.process, f"dockerd {self.version}")
        deadline = time.monotonic() + 60
        while subprocess.run(self.docker_argv("version"), capture_output=True, timeout=CMD_TIMEOUT).returncode != 0:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise LabError(f"dockerd {self.version} does not answer: {self.log_tail()}")
            time.sleep(0.1)

    def restart_daemon(self):
        """Stop dockerd and start it again (after a daemon.json change), with the same containerd."""
        self._stop_daemon()
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        self._start_daemon()

    def log_tail(self, lines=15):
        try:
            with open(self.log, errors="replace") as stream:
                return "daemon log: " + " | ".join(stream.read().strip().splitlines()[-lines:])
        except OSError:
            return "(no daemon log)"

    # -- containers --

    def docker_argv(self, *args):
        return [self.docker, "-H", f"unix://{self.socket}"] + list(args)

    def docker_cmd(self, *args, check=True):
        out = subprocess.run(self.docker_argv(*args), capture_output=True, text=True, timeout=CMD_TIMEOUT,
                             env=dict(os.environ, DOCKER_CONFIG=os.path.join(self.base, "client")))
        if check and out.returncode != 0:
            raise LabError(f"docker {shlex.join(args)} failed: {out.stderr.strip()}")
        return out

    def run(self, *args, command=("true",)):
        """`docker run --rm --network=none ARGS IMAGE COMMAND`; the CompletedProcess."""
        return self.docker_cmd("run", "--rm", "--network=none", *args, IMAGE, *command, check=False)

    # -- tear-down --

    def _stop_daemon(self):
        stop_process(self.process, 30)
        self.process = None

    def stop(self):
        self._stop_daemon()
        stop_process(self.containerd_process, 15)
        self.containerd_process = None
        stop_process(self.resident_process, 15)
        self.resident_process = None
        kill_processes_naming(self.containerd_socket)    # shims of this lab's containerd
        shutil.rmtree(self.socket_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
