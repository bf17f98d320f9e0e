"""cdi-shim-runtime driven by a real containerd 1.6 (containerd-shim-runc-v2), as in production.

A private containerd (own socket, root, state and opt dirs under a temp dir; config from
`containerd config default` with the CRI plugin disabled — ctr needs no CRI, so neither CNI nor
restrict_oom_score_adj matter here) runs with $CDI_SHIM_CONFIG / $CDI_SHIM_CACHE_DIR in its
environment, which containerd hands to its shims and they to the runtime. Containers are
started with `ctr run --runc-binary <cdi-shim-runtime> --runc-root R --rootfs DIR ID ...`;
ctr 1.6 has `--annotation K=V` on `run`, so the request is a real OCI annotation
(`cdi.k8s.io/e2e=nvidia.com/gpu=0`); the env-var request (`--env NVIDIA_VISIBLE_DEVICES=1`) is
tested too.

Run these alone with `-m containerd`; leave them out with `-m "not containerd"`.
"""
import os
import signal
import subprocess
import time

import pytest

import runtime_helpers as rh

pytestmark = [pytest.mark.containerd, pytest.mark.runtime_e2e]

NAMESPACE = "cdie2e"


class Containerd:
    def __init__(self, world):
        self.world = world
        self.binary = rh.need("containerd", "containerd")
        self.ctr_binary = rh.need("ctr", "containerd")
        self.dir = os.path.join(world.base, "containerd")
        self.address = os.path.join(self.dir, "containerd.sock")
        self.runc_root = os.path.join(self.dir, "runc")
        os.makedirs(self.runc_root)
        self.config = os.path.join(self.dir, "config.toml")
        self._write_config()
        self.log_path = os.path.join(self.dir, "containerd.log")
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([self.binary, "--config", self.config], env=world.env(),
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"containerd exited {self.proc.returncode}:\n{self.log_text()[-3000:]}")
            if os.path.exists(self.address) and self.ctr("version", check=False).returncode == 0:
                break
            if time.monotonic() > deadline:
                pytest.fail(f"containerd did not come up:\n{self.log_text()[-3000:]}")
            time.sleep(0.05)

    def _write_config(self):
        import tomlkit

        text = subprocess.run([self.binary, "config", "default"], capture_output=True, text=True, check=True,
                              timeout=rh.CMD_TIMEOUT).stdout
        doc = tomlkit.parse(text)
        doc["root"] = os.path.join(self.dir, "root")
        doc["state"] = os.path.join(self.dir, "state")
        doc["grpc"]["address"] = self.address
        doc["disabled_plugins"] = ["io.containerd.grpc.v1.cri"]
        doc["plugins"]["io.containerd.internal.v1.opt"]["path"] = os.path.join(self.dir, "opt")
        with open(self.config, "w") as f:
            f.write(tomlkit.dumps(doc))

    def log_text(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def ctr(self, *argv, check=False, timeout=rh.CMD_TIMEOUT, **kw):
        cmd = [self.ctr_binary, "--address", self.address, "-n", NAMESPACE] + list(argv)
        result = rh.run_captured(cmd, timeout=timeout, **kw)
        if check:
            assert result.returncode == 0, f"{' '.join(argv)}: {result.stderr}"
        return result

    def run_args(self, rootfs, container_id, *extra):
        return ["run", "--runc-binary", self.world.runtime, "--runc-root", self.runc_root, "--env", "PATH=/bin",
                *extra, "--rootfs", rootfs, container_id]

    def rootfs(self, tag):
        path = os.path.join(self.dir, "rootfs", tag)
        rh.build_rootfs(path, self.world.busybox)
        return path

    def close(self):
        listing = self.ctr("containers", "list", "-q")
        for container_id in listing.stdout.split():
            self.ctr("tasks", "kill", "-s", "KILL", container_id)
            self.ctr("tasks", "delete", "-f", container_id)
            self.ctr("containers", "delete", container_id)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        # Shims this containerd started (identified by our private socket) must not outlive it.
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read().split(b"\0")
            except OSError:
                continue
            if b"containerd-shim-runc-v2" in os.path.basename(cmdline[0]) and self.address.encode() in cmdline:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass


@pytest.fixture(scope="module")
def ctd(tmp_path_factory):
    world = rh.World(tmp_path_factory.mktemp("containerd-world"))
    daemon = Containerd(world)
    yield daemon
    daemon.close()
    world.cleanup()


def test_ctr_annotation_request(ctd):
    cid = ctd.world.new_id("ctd")
    rootfs = ctd.rootfs(cid)
    result = ctd.ctr(*ctd.run_args(rootfs, cid, "--rm", "--annotation", "cdi.k8s.io/e2e=nvidia.com/gpu=0"),
                     "sh", "-c", rh.REPORT_SCRIPT)
    assert result.returncode == 0, result.stderr
    report = rh.parse_report(result.stdout)
    assert report["complete"], result.stdout
    assert report["dev"].get("/dev/nvidia0") == ("c", 195, 0), report["dev"]
    assert "/dev/nvidia1" not in report["dev"]
    assert report["dev"].get("/dev/nvidiactl") == ("c", 1, 3)
    assert report["env"].get("E2E_GPU_0") == "1" and report["env"].get("E2E_COMMON") == "1"
    assert report["mount"] == rh.HOST_FILE_TEXT.strip()
    assert report["hook-start"] == "start-hook-ran"
    assert report["hook-create"] == "ran createContainer mark=e2e-mark"


def test_ctr_env_request(ctd):
    cid = ctd.world.new_id("ctd")
    rootfs = ctd.rootfs(cid)
    result = ctd.ctr(*ctd.run_args(rootfs, cid, "--rm", "--env", "NVIDIA_VISIBLE_DEVICES=1"),
                     "sh", "-c", rh.REPORT_SCRIPT)
    assert result.returncode == 0, result.stderr
    report = rh.parse_report(result.stdout)
    assert report["dev"].get("/dev/nvidia1") == ("c", 195, 1), report["dev"]
    assert "/dev/nvidia0" not in report["dev"]
    assert report["env"].get("E2E_GPU_1") == "1"


def test_ctr_no_request_exit_code(ctd):
    cid = ctd.world.new_id("ctd")
    rootfs = ctd.rootfs(cid)
    result = ctd.ctr(*ctd.run_args(rootfs, cid, "--rm"), "sh", "-c", "ls /dev/nvidia0 2>/dev/null; echo out; exit 4")
    assert result.returncode == 4, result.stderr
    assert result.stdout == "out\n"


def test_ctr_unresolvable_fails_with_our_message(ctd):
    cid = ctd.world.new_id("ctd")
    rootfs = ctd.rootfs(cid)
    result = ctd.ctr(*ctd.run_args(rootfs, cid, "--rm", "--annotation", "cdi.k8s.io/e2e=nvidia.com/gpu=9"),
                     "sh", "-c", "echo should-not-run")
    assert result.returncode != 0
    assert "should-not-run" not in result.stdout
    assert "unresolvable CDI devices nvidia.com/gpu=9" in result.stderr, result.stderr
    assert ctd.world.spec_dir in result.stderr, result.stderr
    assert cid not in ctd.ctr("tasks", "list", "-q").stdout.split()


def test_ctr_detached_exec_kill_delete(ctd):
    """The passthrough commands containerd's shim issues (start, exec, kill, delete, state) work
    through the runtime, and --runc-root is honoured."""
    cid = ctd.world.new_id("ctd")
    rootfs = ctd.rootfs(cid)
    started = ctd.ctr(*ctd.run_args(rootfs, cid, "--detach", "--annotation", "cdi.k8s.io/e2e=nvidia.com/gpu=1"),
                      "sleep", "60")
    assert started.returncode == 0, started.stderr
    try:
        assert os.path.isdir(os.path.join(ctd.runc_root, NAMESPACE, cid)), "runc state not under --runc-root"
        executed = ctd.ctr("tasks", "exec", "--exec-id", "probe", cid, "sh", "-c", "ls -l /dev/nvidia1; exit 6")
        assert executed.returncode == 6, executed.stderr
        assert rh.parse_report("== dev\n" + executed.stdout)["dev"] == {"/dev/nvidia1": ("c", 195, 1)}
        tasks = ctd.ctr("tasks", "list")
        assert cid in tasks.stdout and "RUNNING" in tasks.stdout, tasks.stdout
        ctd.ctr("tasks", "kill", "-s", "KILL", cid, check=True)
        deadline = time.monotonic() + 20
        while "STOPPED" not in ctd.ctr("tasks", "list").stdout:
            assert time.monotonic() < deadline, ctd.ctr("tasks", "list").stdout
            time.sleep(0.05)
        ctd.ctr("tasks", "delete", cid, check=True)
    finally:
        ctd.ctr("tasks", "delete", "-f", cid)
        ctd.ctr("containers", "delete", cid)
    assert not os.path.exists(os.path.join(ctd.runc_root, NAMESPACE, cid))
