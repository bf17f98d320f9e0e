"""Helpers for the end-to-end tests of `cdi-shim-runtime` (issue 3) with real runc.

Everything goes through the installed executable (never `import shim.runtime`): today that is
the Python implementation, tomorrow a native front end that execs runc for passthrough
commands; the tests must hold for both.

A `World` is one private setup in a temp dir:

* fake GPUs: ``dev/nvidia0`` and ``dev/nvidia1`` (char 195:0 and 195:1, made with mknod),
  ``dev/nvidia-uvm`` (char 1:3, a /dev/null twin) and ``/dev/null`` itself as ``/dev/nvidiactl``;
* a CDI spec ``specs/nvidia-gpu.yaml`` (kind nvidia.com/gpu: devices ``0``, ``1``, one UUID name
  per GPU, ``all``) whose spec-wide edits add an env var, a bind mount of a host file and two
  hooks (createContainer: a host script that records the container state it gets on stdin;
  startContainer: runs inside the container and writes ``/hook-start``);
* a cdi-shim config.toml (``$CDI_SHIM_CONFIG``) naming those spec dirs and runc by absolute
  path, a private registry cache (``$CDI_SHIM_CACHE_DIR``) and a private runc ``--root``;
* bundles made from ``runc spec`` with a busybox-static rootfs.

Missing host tools make the tests FAIL with the apt-get line to install them (never skip).
"""
import itertools
import json
import os
import re
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import time

import pytest

from cdi_shim_lab import hosttools

VENV_BIN = os.path.dirname(sys.executable)
RUNTIME_NAME = "cdi-shim-runtime"
GPU_UUIDS = ("GPU-6f1c2a4e-0b7d-4c1e-9a53-2d8e6b1f0c01", "GPU-a83d9e17-5c2b-4f60-8e1a-7b4c3d2e1f02")
DEVICE_MOUNT_ROOT = "/var/run/nvidia-container-devices"
HOST_FILE_TEXT = "hello from the driver root\n"
CMD_TIMEOUT = 60

# What the container prints (one section per check), to stdout; see parse_report.
REPORT_SCRIPT = (
    "echo '== dev'; ls -l /dev/nvidia* 2>/dev/null; "
    "echo '== env'; env; "
    "echo '== mount'; cat /mounted/file; "
    "echo '== hook-start'; cat /hook-start; "
    "echo '== hook-create'; cat /hook-ran-createContainer; "
    "echo '== cgroup'; cat /sys/fs/cgroup/devices/devices.list; "
    "echo '== end'"
)

_ids = itertools.count()


# --- host tools ---------------------------------------------------------------------------

def runtime():
    """The installed `cdi-shim-runtime` next to the interpreter ($CDI_SHIM_E2E_RUNTIME names another
    executable to test, e.g. a script running the pure-Python implementation)."""
    path = os.environ.get("CDI_SHIM_E2E_RUNTIME") or os.path.join(VENV_BIN, RUNTIME_NAME)
    if not os.access(path, os.X_OK):
        pytest.fail(f"{RUNTIME_NAME} is not installed next to {sys.executable}: run `pip install -e '.[test]'`",
                    pytrace=False)
    return path


def need(name, package, extra=("/usr/sbin", "/sbin", "/usr/bin")):
    path = shutil.which(name) or next(
        (os.path.join(d, name) for d in extra if os.access(os.path.join(d, name), os.X_OK)), None)
    if path is None:
        pytest.fail(f"{name} not found: apt-get install {package}", pytrace=False)
    return path


def static_busybox():
    path = hosttools.static_busybox()
    if path is None:
        pytest.fail("no statically linked busybox: apt-get install busybox-static", pytrace=False)
    return path


def require_root():
    if os.geteuid() != 0:
        pytest.fail("these end-to-end tests run containers with runc and must run as root", pytrace=False)


# --- rootfs and bundles ---------------------------------------------------------------------

APPLETS = ("sh", "ls", "cat", "env", "sleep", "echo", "grep", "tty", "test", "true", "mkdir", "stat", "id")


def build_rootfs(root, busybox):
    for sub in ("bin", "dev", "proc", "sys", "etc", "tmp"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    target = os.path.join(root, "bin", "busybox")
    try:
        os.link(busybox, target)
    except OSError:
        shutil.copy2(busybox, target)
    for applet in APPLETS:
        os.symlink("busybox", os.path.join(root, "bin", applet))
    with open(os.path.join(root, "etc", "passwd"), "w") as out:
        out.write("root:x:0:0:root:/:/bin/sh\n")
    return root


class Bundle:
    def __init__(self, world, path, container_id):
        self.world, self.path, self.id = world, path, container_id
        self.rootfs = os.path.join(path, "rootfs")
        self.config_path = os.path.join(path, "config.json")
        self.original = self.read_bytes()
        self.original_stat = os.stat(self.config_path)

    def read_bytes(self):
        with open(self.config_path, "rb") as f:
            return f.read()

    def config(self):
        return json.loads(self.read_bytes())

    def unchanged(self):
        """True when config.json is byte-identical to what the test wrote."""
        return os.path.isfile(self.config_path) and not os.path.islink(self.config_path) \
            and self.read_bytes() == self.original

    def extra_files(self):
        """Names in the bundle that the test did not put there (temp files, leftovers)."""
        return sorted(set(os.listdir(self.path)) - self.world.expected_bundle_names)

    def host_file(self, name):
        path = os.path.join(self.path, name)
        with open(path) as f:
            return f.read()


class World:
    """One private runc + CDI setup in `base` (a temp dir)."""

    def __init__(self, base, log_level="info", resident=None):
        require_root()
        self.base = str(base)
        # the resident process to use, or none: a socket path where nothing listens, so a
        # server running on this machine at the default path cannot change the results
        self.resident_socket = resident.socket if resident else os.path.join(self.base, "no-resident.sock")
        self.runtime = runtime()
        self.runc = need("runc", "runc")
        self.busybox = static_busybox()
        self.spec_dir = os.path.join(self.base, "specs")
        self.spec_dir_low = os.path.join(self.base, "specs-low")
        self.dev_dir = os.path.join(self.base, "dev")
        self.runc_root = os.path.join(self.base, "runc-root")
        self.cache_dir = os.path.join(self.base, "cache")
        self.config_toml = os.path.join(self.base, "cdi-shim.toml")
        self.host_file = os.path.join(self.base, "driver", "file.txt")
        self.hook_script = os.path.join(self.base, "hook.sh")
        self.expected_bundle_names = {"config.json", "rootfs"}
        self.created = []
        for d in (self.spec_dir, self.spec_dir_low, self.dev_dir, self.runc_root, os.path.dirname(self.host_file)):
            os.makedirs(d, exist_ok=True)
        self._make_devices()
        with open(self.host_file, "w") as f:
            f.write(HOST_FILE_TEXT)
        self._make_hook()
        self.write_gpu_spec()
        self.write_config(log_level=log_level)
        self._template = self._runc_spec()

    # -- fixtures of the world --

    def _make_devices(self):
        for minor in (0, 1):
            os.mknod(os.path.join(self.dev_dir, f"nvidia{minor}"), 0o666 | stat.S_IFCHR, os.makedev(195, minor))
        os.mknod(os.path.join(self.dev_dir, "nvidia-uvm"), 0o666 | stat.S_IFCHR, os.makedev(1, 3))

    def _make_hook(self):
        # createContainer hook: runs in the container's mount namespace before pivot_root, with
        # the host's binaries and the container's rootfs as its working directory (runc chdirs
        # there first: libcontainer/rootfs_linux.go, prepareRootfs). It records the state JSON
        # from stdin in the bundle (on the host) and leaves a file the container can read.
        with open(self.hook_script, "w") as f:
            f.write("#!/bin/sh\n"
                    "state=$(cat)\n"
                    "bundle=$(printf '%s' \"$state\" | sed -n 's/.*\"bundle\":\"\\([^\"]*\\)\".*/\\1/p')\n"
                    "printf '%s\\n' \"$state\" > \"$bundle/hook-$1.json\"\n"
                    "printf 'ran %s mark=%s\\n' \"$1\" \"$HOOK_MARK\" > \"./hook-ran-$1\"\n")
        os.chmod(self.hook_script, 0o755)

    def node(self, minor):
        return os.path.join(self.dev_dir, f"nvidia{minor}")

    def gpu_spec_text(self):
        def device(name, minors, env):
            nodes = "".join(f"\n          - path: /dev/nvidia{m}\n            hostPath: {self.node(m)}" for m in minors)
            return (f'  - name: "{name}"\n    containerEdits:\n      env: ["{env}"]\n'
                    f"      deviceNodes:{nodes}\n")
        devices = (device("0", [0], "E2E_GPU_0=1") + device("1", [1], "E2E_GPU_1=1")
                   + device(GPU_UUIDS[0], [0], "E2E_GPU_UUID0=1") + device(GPU_UUIDS[1], [1], "E2E_GPU_UUID1=1")
                   + device("all", [0, 1], "E2E_GPU_ALL=1"))
        return (
            'cdiVersion: "0.5.0"\nkind: nvidia.com/gpu\ndevices:\n' + devices +
            "containerEdits:\n"
            '  env: ["E2E_COMMON=1"]\n'
            "  deviceNodes:\n"
            "    - path: /dev/nvidiactl\n      hostPath: /dev/null\n"
            f"    - path: /dev/nvidia-uvm\n      hostPath: {self.dev_dir}/nvidia-uvm\n"
            "  mounts:\n"
            f"    - hostPath: {self.host_file}\n      containerPath: /mounted/file\n"
            "      options: [ro, nosuid, nodev, bind]\n"
            "  hooks:\n"
            f"    - hookName: createContainer\n      path: {self.hook_script}\n"
            "      args: [hook.sh, createContainer]\n      env: [HOOK_MARK=e2e-mark]\n"
            "    - hookName: startContainer\n      path: /bin/sh\n"
            "      args: [sh, -c, 'echo start-hook-ran > /hook-start']\n"
        )

    def write_gpu_spec(self):
        self.write_spec("nvidia-gpu.yaml", self.gpu_spec_text())

    def write_spec(self, name, text, directory=None):
        path = os.path.join(directory or self.spec_dir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def write_config(self, **keys):
        """(Re)write the cdi-shim config.toml; keys use python names (spec_dirs -> spec-dirs)."""
        values = {"runtime": self.runc, "spec_dirs": [self.spec_dir_low, self.spec_dir],
                  "resident_socket": self.resident_socket}
        values.update(keys)
        lines = []
        for key, value in values.items():
            if value is None:
                continue
            lines.append(f"{key.replace('_', '-')} = {json.dumps(value)}")
        with open(self.config_toml, "w") as f:
            f.write("\n".join(lines) + "\n")

    def env(self, **extra):
        env = dict(os.environ)
        env["CDI_SHIM_CONFIG"] = self.config_toml
        env["CDI_SHIM_CACHE_DIR"] = self.cache_dir
        env.update(extra)
        return env

    def _runc_spec(self):
        tmp = os.path.join(self.base, "spec-template")
        os.makedirs(tmp)
        subprocess.run([self.runc, "spec", "--bundle", tmp], check=True, timeout=CMD_TIMEOUT)
        with open(os.path.join(tmp, "config.json")) as f:
            return json.load(f)

    # -- bundles --

    def new_id(self, tag="c"):
        return f"cdie2e-{os.getpid()}-{tag}-{next(_ids)}"

    def bundle(self, args=("sh", "-c", REPORT_SCRIPT), env=(), annotations=None, mounts=(), terminal=False,
               caps=None, tag="c", raw=None, mode=0o644, edit=None):
        """A new bundle with a fresh rootfs; `raw` (bytes) replaces the config.json text."""
        container_id = self.new_id(tag)
        path = os.path.join(self.base, "bundles", container_id)
        os.makedirs(path)
        build_rootfs(os.path.join(path, "rootfs"), self.busybox)
        config = json.loads(json.dumps(self._template))
        config["root"] = {"path": os.path.join(path, "rootfs"), "readonly": False}
        config["process"]["terminal"] = terminal
        config["process"]["args"] = list(args)
        config["process"]["env"] = ["PATH=/bin", "TERM=xterm"] + list(env)
        if caps is not None:
            for key in config["process"]["capabilities"]:
                config["process"]["capabilities"][key] = list(caps)
        if annotations is not None:
            config["annotations"] = dict(annotations)
        config["mounts"] = config["mounts"] + [dict(m) for m in mounts]
        if edit is not None:
            edit(config)
        data = raw if raw is not None else json.dumps(config, indent=2).encode()
        config_path = os.path.join(path, "config.json")
        with open(config_path, "wb") as f:
            f.write(data)
        os.chmod(config_path, mode)
        return Bundle(self, path, container_id)

    # -- commands --

    def shim(self, *argv, root=True, env=None, timeout=CMD_TIMEOUT, **kw):
        """Run cdi-shim-runtime [--root R] ARGV; returns a CompletedProcess with text output."""
        cmd = [self.runtime] + (["--root", self.runc_root] if root else []) + list(argv)
        self._note_created(argv)
        return run_captured(cmd, env=env or self.env(), timeout=timeout, **kw)

    def runc_cmd(self, *argv, root=True, timeout=CMD_TIMEOUT, **kw):
        cmd = [self.runc] + (["--root", self.runc_root] if root else []) + list(argv)
        self._note_created(argv)
        return run_captured(cmd, timeout=timeout, **kw)

    def _note_created(self, argv):
        argv = list(argv)
        for command in ("create", "run"):
            if command in argv and argv:
                self.created.append(argv[-1] if argv[-1] != command else "")
                break

    def state(self, container_id):
        out = self.runc_cmd("state", container_id)
        if out.returncode != 0:
            return None
        return json.loads(out.stdout)

    def wait_stopped(self, container_id, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.state(container_id)
            if state is None or state["status"] == "stopped":
                return state
            time.sleep(0.02)
        raise AssertionError(f"container {container_id} did not stop within {timeout}s")

    def cleanup(self):
        for container_id in self.created:
            if container_id:
                subprocess.run([self.runc, "--root", self.runc_root, "delete", "--force", container_id],
                               capture_output=True, timeout=CMD_TIMEOUT)


class ResidentServer:
    """`cdi-shim runtime serve` on a private socket, for the tests of a session."""

    def __init__(self, base):
        self.socket = os.path.join(base, "run", "runtime.sock")
        self.log = os.path.join(base, "serve.log")
        cli = os.path.join(VENV_BIN, "cdi-shim")
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen([cli, "runtime", "serve", "--socket", self.socket],
                                            stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 30
        while not os.path.exists(self.socket):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"cdi-shim runtime serve did not start:\n{self.output()}")
            time.sleep(0.01)

    def output(self):
        with open(self.log, encoding="utf-8", errors="replace") as f:
            return f.read()

    def check_alive(self):
        assert self.process.poll() is None, f"the resident process died:\n{self.output()}"

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)


def run_captured(cmd, timeout=CMD_TIMEOUT, text=True, capture_output=True, **kw):
    """subprocess.run whose stdout/stderr (unless given) go to temp files, not pipes: a detached
    container (create, run -d) inherits them and would hold a pipe open until it exits."""
    import tempfile
    if not capture_output:
        return subprocess.run(cmd, timeout=timeout, **kw)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        kw.setdefault("stdout", out)
        kw.setdefault("stderr", err)
        result = subprocess.run(cmd, timeout=timeout, **kw)
        captured = []
        for name, f in (("stdout", out), ("stderr", err)):
            if kw[name] is f:
                f.seek(0)
                data = f.read()
                captured.append(data.decode("utf-8", "replace") if text else data)
            else:
                captured.append(None)
    return subprocess.CompletedProcess(cmd, result.returncode, *captured)


# --- reading results --------------------------------------------------------------------------

_LS = re.compile(r"^([bcdlsp-])\S*\s+\d+\s+\S+\s+\S+\s+(\d+),\s*(\d+)\s+.*?\s(\S+)$")


def parse_report(text):
    """Sections of REPORT_SCRIPT's output: {'dev': {name: (type, major, minor)}, 'env': {...}, ...}."""
    sections, current = {}, None
    for line in text.splitlines():
        if line.startswith("== "):
            current = line[3:].strip()
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    devices = {}
    for line in sections.get("dev", ()):
        match = _LS.match(line.strip())
        if match:
            devices[match.group(4)] = (match.group(1), int(match.group(2)), int(match.group(3)))
    env = {}
    for line in sections.get("env", ()):
        key, sep, value = line.partition("=")
        if sep:
            env[key] = value
    return {"dev": devices, "env": env, "mount": "\n".join(sections.get("mount", ())),
            "hook-start": "\n".join(sections.get("hook-start", ())),
            "hook-create": "\n".join(sections.get("hook-create", ())),
            "cgroup": sections.get("cgroup", []), "complete": "end" in sections}


def format_runc_line(level, msg, log_format):
    """A line as runc (logrus) writes it to --log."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if log_format == "json":
        return json.dumps({"level": level, "msg": msg, "time": stamp}, separators=(",", ":")) + "\n"
    return f'time="{stamp}" level={level} msg={json.dumps(msg)}\n'


def read_log(path, log_format):
    """Records of a runc --log file: [(level, msg)]; asserts every line is well formed."""
    records = []
    if not os.path.exists(path):
        return records
    with open(path, encoding="utf-8") as f:
        text = f.read()
    assert text == "" or text.endswith("\n"), f"log {path} does not end with a newline: {text[-200:]!r}"
    for line in text.splitlines():
        if not line.strip():
            continue
        if log_format == "json":
            record = json.loads(line)
            assert isinstance(record, dict) and {"level", "msg", "time"} <= set(record), line
            assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$", record["time"]), line
            records.append((record["level"], record["msg"]))
        else:
            match = re.match(r'^time="?([^" ]+)"? level=(\w+) msg=("(?:[^"\\]|\\.)*"|\S+)(?: .*)?$', line)
            assert match, f"not a logrus text line: {line!r}"
            msg = match.group(3)
            records.append((match.group(2), json.loads(msg) if msg.startswith('"') else msg))
    return records


# --- console socket ---------------------------------------------------------------------------

class ConsoleSocket:
    """A --console-socket receiver: accepts one connection and takes the pty master via SCM_RIGHTS."""

    def __init__(self, path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(1)
        self.sock.settimeout(CMD_TIMEOUT)
        self.master = None

    def receive(self):
        conn, _ = self.sock.accept()
        with conn:
            conn.settimeout(CMD_TIMEOUT)
            fds = []
            msg, ancdata, _, _ = conn.recvmsg(4096, socket.CMSG_SPACE(struct.calcsize("i") * 4))
            for level, kind, data in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    usable = len(data) - len(data) % struct.calcsize("i")
                    fds += list(struct.unpack(f"{usable // 4}i", data[:usable]))
        assert len(fds) == 1, f"expected one fd over the console socket, got {fds} (msg {msg!r})"
        self.master = fds[0]
        return self.master

    def read_all(self, timeout=CMD_TIMEOUT):
        """Read the pty master until the container side closes (EIO) or the timeout."""
        import select
        chunks, deadline = [], time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if not ready:
                continue
            try:
                chunk = os.read(self.master, 4096)
            except OSError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)

    def close(self):
        if self.master is not None:
            os.close(self.master)
            self.master = None
        self.sock.close()


def kill_quietly(proc):
    if proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


GLIBC_LIBDIR = "/usr/lib/x86_64-linux-gnu"
DRIVER_VERSION = "550.54.15"   # the fake driver's libraries' version


def gcc(*args):
    subprocess.run([need("gcc", "gcc"), *args], check=True, capture_output=True, timeout=120)


def library(path, soname, body):
    """A shared library at PATH with SONAME, built from the C source BODY."""
    src = str(path) + ".c"
    with open(src, "w") as out:
        out.write(body)
    gcc("-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(path), src)
    os.unlink(src)


def glibc_image(rootfs, program, library, workdir, link_args=()):
    """ROOTFS made a small glibc image: /prog built from the C source PROGRAM against LIBRARY
    (a file whose SONAME is libnvidia-ml.so.1), and this host's libc, libm and loader, with an
    ld.so.conf naming GLIBC_LIBDIR. The caller adds what else it needs, then runs ldconfig."""
    program_src = os.path.join(workdir, "prog.c")
    with open(program_src, "w") as out:
        out.write(program)
    link_dir = os.path.join(workdir, "link")
    os.makedirs(link_dir, exist_ok=True)
    if not os.path.lexists(os.path.join(link_dir, "libnvidia-ml.so")):
        os.symlink(library, os.path.join(link_dir, "libnvidia-ml.so"))
    gcc("-o", os.path.join(rootfs, "prog"), program_src, f"-L{link_dir}", "-lnvidia-ml", *link_args)
    os.makedirs(rootfs + GLIBC_LIBDIR, exist_ok=True)
    os.makedirs(rootfs + "/lib64", exist_ok=True)
    for name in ("libc.so.6", "libm.so.6"):
        shutil.copy2(os.path.realpath(f"/lib/x86_64-linux-gnu/{name}"), rootfs + f"{GLIBC_LIBDIR}/{name}")
    shutil.copy2(os.path.realpath("/lib64/ld-linux-x86-64.so.2"), rootfs + "/lib64/ld-linux-x86-64.so.2")
    os.makedirs(rootfs + "/etc/ld.so.conf.d", exist_ok=True)
    with open(rootfs + "/etc/ld.so.conf", "w") as out:
        out.write("include /etc/ld.so.conf.d/*.conf\n")
    with open(rootfs + "/etc/ld.so.conf.d/x86_64-linux-gnu.conf", "w") as out:
        out.write(GLIBC_LIBDIR + "\n")
