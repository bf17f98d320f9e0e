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
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

import tomlkit

from shim.bench.cri import CRIClient, CRIError, read_container_log

from . import releases
from .hosttools import (CMD_TIMEOUT, LabError, build_runc_timer, find_tool, kill_processes_naming,
                        need_static_busybox, stop_process)
from .images import (DRIVER_FOLDER, HOOK_SCRIPT, build_driver_libraries, build_fake_libraries, build_oci_archive,
                     library_layer, make_char_device, toolkit_hooks)

IMAGE = "localhost/busybox:local"
PAUSE_IMAGE = "localhost/pause:local"
LIB_IMAGE = "localhost/busybox-libs:local"  # busybox + the ldcache tests' library tree (Lab.setup)
NAMESPACE = "k8s.io"
RUNTIME_NAME = "nvidia"
ONE_MOUNT_KIND = "bench.cdi-shim.dev/onemount"   # Lab.write_one_mount_spec's device kind


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
        self.busybox = need_static_busybox()
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
        self.fake_driver = None     # write_one_mount_spec's
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

    def write_one_mount_spec(self):
        """ONE_MOUNT_KIND=0: GPU 0 of the tests' fake driver (tests/generate/fakedriver.py: its
        libraries, fake NVML, tools, graphics files, firmware and device nodes), its spec written by
        the real `cdi-shim cdi generate --layout one-mount` with the host directory under BASE. The
        spec's hook program is HOOK_SCRIPT installed as <lab>/onemount-hooks/nvidia-cdi-hook, which logs
        a line per run: whoever runs a hook of this spec shows in the log. Returns {"device",
        "spec", "hook_log", "host_dir"}; the driver is closed by stop()."""
        from tests.generate.fakedriver import FakeDriver    # the lab and the tests share one fake driver

        ldconfig = find_tool("ldconfig", "libc-bin")
        self.fake_driver = FakeDriver(os.path.join(self.base, "fake-driver"), gpus=1)
        hooks_dir = os.path.join(self.base, "onemount-hooks")
        os.makedirs(hooks_dir, exist_ok=True)
        hook_log = os.path.join(hooks_dir, "hook.log")
        open(hook_log, "a").close()
        program = os.path.join(hooks_dir, "nvidia-cdi-hook")
        with open(program, "w") as stream:
            stream.write(HOOK_SCRIPT.replace("@LOG@", hook_log).replace("@LDCONFIG@", ldconfig))
        os.chmod(program, 0o755)
        driver = self.fake_driver
        vendor, klass = ONE_MOUNT_KIND.split("/")
        spec = os.path.join(self.spec_dir, "bench-one-mount.yaml")
        env = self.env()
        env.pop("XDG_DATA_DIRS", None)   # (where the generator looks for its config files: its default here)
        host_dirs = os.path.join(self.base, "driver-dirs")
        out = subprocess.run([self.cli, "cdi", "generate", "--layout", "one-mount", "--driver-dir", host_dirs,
                              "--driver-root", driver.root, "--dev-root", driver.dev_root, "--sysfs-root",
                              driver.sysfs, "--proc-root", driver.proc, "--vendor", vendor, "--class", klass,
                              "--hook-program", program, "--output", spec],
                             capture_output=True, text=True, env=env, timeout=CMD_TIMEOUT)
        if out.returncode != 0:
            raise LabError(f"cdi-shim cdi generate --layout one-mount failed: {out.stderr.strip()}")
        (host_dir,) = os.listdir(host_dirs)
        return {"device": f"{ONE_MOUNT_KIND}=0", "spec": spec, "hook_log": hook_log,
                "host_dir": os.path.join(host_dirs, host_dir)}

    def cri_equivalent_of_spec(self, spec, device="0"):
        """A spec's edits for one device, its hooks left out, as CRI fields (mounts, devices, envs):
        what plain runc is given when the kubelet asks for the same nodes, binds and env."""
        import yaml

        with open(spec) as stream:
            doc = yaml.safe_load(stream)
        (edits,) = [d["containerEdits"] for d in doc["devices"] if d["name"] == device]
        pb = self.client.pb
        mounts, devices, envs = [], [], {}
        for part in (edits, doc.get("containerEdits") or {}):
            for node in part.get("deviceNodes") or ():
                devices.append(pb.Device(container_path=node["path"], host_path=node.get("hostPath") or node["path"],
                                         permissions=node.get("permissions") or "rwm"))
            for mount in part.get("mounts") or ():
                mounts.append(pb.Mount(container_path=mount["containerPath"], host_path=mount["hostPath"],
                                       readonly="ro" in (mount.get("options") or ())))
            envs.update(entry.split("=", 1) for entry in part.get("env") or ())
        return mounts, devices, envs

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
                keep_configs=False, remove=True, timeout=60, mounts=(), devices=(), cdi_devices=(), image=IMAGE,
                namespace="default"):
        """runp -> create -> start -> wait for exit -> stop -> remove; returns a PodRun.

        CRI errors propagate as CRIError (after the pod is cleaned up)."""
        self._count += 1
        name = name or f"pod{self._count}"
        run = PodRun()
        client = self.client
        log_dir = os.path.join(self.logs, f"{name}-{self._count}")
        os.makedirs(log_dir, exist_ok=True)
        pod = client.pod_config(name, str(uuid.uuid4()), log_dir, namespace=namespace, annotations=pod_annotations)
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
        if self.fake_driver is not None:
            self.fake_driver.close()
            self.fake_driver = None
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

