"""Issue 12, freshness: a spec generated for one driver version, then the driver upgraded under
it (the fake driver root's libraries rebuilt by gcc for a new version, the fake
/proc/driver/nvidia/version rewritten). `cdi validate` and a create through cdi-shim-runtime
(real runc) report the stale spec; `cdi generate --watch` (a subprocess, short interval) waits
for the new user-space libraries and then replaces the spec within a bounded time."""
import os
import stat
import subprocess
import sys
import time

import pytest
import yaml

import fakedriver
from fakedriver import node_cli

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runtime"))
import runtime_helpers as rh  # noqa: E402

from shim.driver_version import VERSION_FILE_ENV, host_driver_version, parse_module_version  # noqa: E402
from shim.driver_version import recorded_driver_version  # noqa: E402
from shim.node.units import NODE_CDI_SHIM  # noqa: E402

OLD = fakedriver.VERSION
NEW = "590.10.01"
WATCH_BOUND = 30.0     # seconds --watch may take to replace a stale spec once the driver is complete

PROPRIETARY = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  {v}  Fri Jan 24 19:52:49 UTC 2025\n"
               "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
OPEN = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {v}  Release Build  "
        "(dvs-builder@U16-I3-B03-4-3)  Tue Jul  1 20:12:11 UTC 2025\nGCC version:  gcc version 12.2.0\n")


def test_module_version_from_both_module_flavours(tmp_path):
    assert parse_module_version(PROPRIETARY.format(v="570.86.10")) == "570.86.10"
    assert parse_module_version(OPEN.format(v="580.65.06")) == "580.65.06"
    assert parse_module_version("NVRM version: something else\n") is None
    path = tmp_path / "version"
    path.write_text(OPEN.format(v="575.51.03"))
    assert host_driver_version(str(path)) == "575.51.03"
    assert host_driver_version(str(tmp_path / "absent")) is None


class Node:
    """A fake driver of its own (it gets upgraded), a fake /proc, a runc World whose spec
    directory holds the generated spec."""

    def __init__(self, base):
        self.base = str(base)
        self.driver = fakedriver.FakeDriver(os.path.join(self.base, "driver"), gpus=2)
        self.proc = os.path.join(self.base, "proc")
        os.makedirs(self.proc + "/driver/nvidia")
        fakedriver.write_proc_devices(self.proc)
        self.version_file = self.proc + "/driver/nvidia/version"
        self.module(OLD)
        self.world = rh.World(os.path.join(self.base, "world"))
        os.unlink(os.path.join(self.world.spec_dir, "nvidia-gpu.yaml"))   # the world's own nvidia.com/gpu spec
        self.spec = os.path.join(self.world.spec_dir, "nvidia.yaml")

    def module(self, version):
        """The kernel module of VERSION is loaded (as /proc says)."""
        with open(self.version_file + ".new", "w") as out:
            out.write(OPEN.format(v=version))
        os.replace(self.version_file + ".new", self.version_file)

    def env(self, **extra):
        env = self.world.env(**{VERSION_FILE_ENV: self.version_file, **extra})
        env.pop("FAKE_NVML_CONFIG", None)    # the fake NVML reads the conf beside the library
        return env

    def roots(self):
        return ["--driver-root", self.driver.root, "--dev-root", self.driver.dev_root, "--proc-root", self.proc]

    def cli(self, *argv, env=None):
        return subprocess.run([node_cli(), *argv], capture_output=True, text=True, env=env or self.env(), timeout=120)

    def generate(self, *extra):
        done = self.cli("cdi", "generate", *self.roots(), "--output", self.spec, *extra)
        assert done.returncode == 0, done.stderr
        return done

    def validate(self, env=None):
        return self.cli("cdi", "validate", "--spec-dir", self.world.spec_dir, self.spec, env=env)

    def recorded(self):
        with open(self.spec) as stream:
            return recorded_driver_version(yaml.safe_load(stream))

    def container(self, mode="run"):
        """(create/run result, the container's output): nvidia-smi in a container with GPU 1."""
        uuid = self.driver.uuids(2)[1]
        bundle = self.world.bundle(args=("sh", "-c", "/usr/bin/nvidia-smi"))
        out = os.path.join(self.base, f"out-{bundle.id}.txt")
        with open(out, "wb") as stream, open(out + ".err", "w+") as err:
            done = self.world.shim("--device", f"nvidia.com/gpu={uuid}", mode, "--bundle", bundle.path, bundle.id,
                                   env=self.env(), stdout=stream, stderr=err, capture_output=False)
            err.seek(0)
            done.stderr = err.read()
        if mode == "create" and done.returncode == 0:
            assert self.world.shim("start", bundle.id).returncode == 0
            self.world.wait_stopped(bundle.id)
            assert self.world.shim("delete", bundle.id).returncode == 0
        with open(out) as stream:
            return done, stream.read(), bundle

    def watch(self, *extra):
        argv = [node_cli(), "cdi", "generate", "--watch", *self.roots(), "--output", self.spec,
                "--proc-root", self.proc, "--interval", "0.2", "--nvml-interval", "60", "--max-backoff", "1", *extra]
        log = open(os.path.join(self.base, "watch.log"), "w+")
        env = self.env()
        env.pop(VERSION_FILE_ENV)          # --proc-root's version file
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log, env=env, text=True), log

    def close(self):
        self.world.cleanup()
        self.driver.close()


@pytest.fixture
def node(tmp_path):
    node = Node(tmp_path)
    yield node
    node.close()


def stop(proc):
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def read_log(log):
    log.flush()
    log.seek(0)
    return log.read()


def wait_for(predicate, timeout, what, log=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return time.monotonic()
        time.sleep(0.1)
    raise AssertionError(f"{what} not within {timeout} s" + (f"; watch log:\n{read_log(log)}" if log else ""))


@pytest.mark.runtime_e2e
def test_upgrade_is_reported_then_watch_replaces_the_spec(node):
    node.generate()
    assert node.recorded() == OLD
    done = node.validate()
    assert done.returncode == 0 and "stale" not in done.stdout + done.stderr and "generated for" not in done.stdout
    done, out, _ = node.container("run")
    assert done.returncode == 0 and out.strip() == f"nvidia-smi {OLD}"

    watch, log = node.watch()
    try:
        wait_for(lambda: "is up to date" in read_log(log), 20, "the watcher's first check", log)
        with open(node.spec, "rb") as stream:
            before = stream.read()

        # The upgrade, first half: the old user-space files are gone, the new module is loaded.
        node.driver.remove_userspace()
        node.module(NEW)
        message = (f"the CDI spec {node.spec} was generated for NVIDIA driver {OLD}; the host has {NEW}; "
                   "run `cdi-shim cdi generate`")
        done = node.validate()
        assert done.returncode == 1, (done.stdout, done.stderr)
        assert f"error: {message} (missing: " in done.stdout, done.stdout
        assert "(mount source)" in done.stdout

        done, out, bundle = node.container("create")
        assert done.returncode != 0
        assert message in done.stderr and "cannot inject" in done.stderr, done.stderr
        assert bundle.unchanged()
        # No version file (nothing known of the driver): the missing files are named all the same,
        # with the spec and the device, before runc's obscure `error mounting` (issue 31).
        node.version_file, real = os.path.join(node.base, "absent"), node.version_file
        done, out, bundle = node.container("create")
        node.version_file = real
        assert done.returncode != 0 and "generated for" not in done.stderr
        assert f"the CDI spec {node.spec} names host files that do not exist: " in done.stderr, done.stderr
        assert "(mount source of nvidia.com/gpu=" in done.stderr and "error mounting" not in done.stderr
        assert bundle.unchanged()

        # The watcher cannot make a spec without the libraries: it retries and keeps the old one.
        wait_for(lambda: read_log(log).count("cannot generate") >= 2, 20, "two failed attempts", log)
        with open(node.spec, "rb") as stream:
            assert stream.read() == before
        assert watch.poll() is None

        # Second half: the new libraries (and the root's ld.so.cache) are installed.
        started = time.monotonic()
        node.driver.upgrade(NEW, remove=False)
        fresh = node.cli("cdi", "generate", *node.roots(), "--output", node.spec, "--dry-run")
        assert fresh.returncode == 0, fresh.stderr

        def replaced():
            with open(node.spec) as stream:
                return stream.read() == fresh.stdout
        took = wait_for(replaced, WATCH_BOUND, "the watcher's new spec", log) - started
        wait_for(lambda: f"driver {OLD} -> {NEW}" in read_log(log), 5, "the line saying so", log)
        assert watch.poll() is None
        print(f"--watch replaced the stale spec {took:.2f} s after the new libraries were installed")
    finally:
        stop(watch)
        text = read_log(log)
        log.close()
    assert "Traceback" not in text, text
    assert all(line.startswith("cdi-shim cdi generate --watch: ") for line in text.splitlines()), text

    assert node.recorded() == NEW
    done = node.validate()
    assert done.returncode == 0 and "generated for" not in done.stdout, done.stdout
    done, out, _ = node.container("create")
    assert done.returncode == 0, done.stderr
    assert "generated for" not in done.stderr
    assert out.strip() == f"nvidia-smi {NEW}"


@pytest.mark.runtime_e2e
def test_stale_spec_whose_files_exist_warns_and_watch_waits_for_the_libraries(node):
    node.generate()
    node.module(NEW)                  # the new module is loaded; the old libraries are still there
    message = (f"the CDI spec {node.spec} was generated for NVIDIA driver {OLD}; the host has {NEW}; "
               "run `cdi-shim cdi generate`")
    done = node.validate()
    assert done.returncode == 0, done.stdout
    assert f"warning: {message}\n" in done.stdout

    done, out, _ = node.container("run")
    assert done.returncode == 0, done.stderr
    assert message in done.stderr and "its files are still there" in done.stderr
    assert out.strip() == f"nvidia-smi {OLD}"

    # No /proc/driver/nvidia/version (no module loaded): nothing is reported.
    absent = node.env(**{VERSION_FILE_ENV: os.path.join(node.base, "absent")})
    done = node.validate(env=absent)
    assert done.returncode == 0 and "generated for" not in done.stdout

    # --watch --once: the libraries are not the module's yet: not ready (75), nothing written.
    with open(node.spec, "rb") as stream:
        before = stream.read()
    once = [*node.roots(), "--output", node.spec, "--proc-root", node.proc]
    env = node.env()
    env.pop(VERSION_FILE_ENV)
    done = node.cli("cdi", "generate", "--watch", "--once", *once, env=env)
    assert done.returncode == 75, (done.returncode, done.stderr)
    assert f"waiting for the user-space libraries of driver {NEW}" in done.stderr
    with open(node.spec, "rb") as stream:
        assert stream.read() == before

    node.driver.upgrade(NEW)
    done = node.cli("cdi", "generate", "--watch", "--once", *once, env=env)
    assert done.returncode == 0, done.stderr
    assert f"driver {OLD} -> {NEW}" in done.stderr
    assert node.recorded() == NEW
    done = node.cli("cdi", "generate", "--watch", "--once", *once, env=env)
    assert done.returncode == 0 and "wrote" not in done.stderr, done.stderr


def test_watch_sees_a_mig_change_through_nvml(node):
    """MIG devices come and go without a file the cheap poll looks at changing: the periodic
    NVML generation (--nvml-interval) sees them."""
    from test_generate import MIG_MINORS

    caps = os.path.join(node.proc, "driver/nvidia-caps")
    os.makedirs(caps)
    with open(os.path.join(caps, "mig-minors"), "w") as out:
        out.write("\n".join(MIG_MINORS) + "\n")
    nodes = os.path.join(node.driver.dev_root, "dev", "nvidia-caps")
    os.makedirs(nodes)
    for minor in (12, 13):
        os.mknod(os.path.join(nodes, f"nvidia-cap{minor}"), 0o444 | stat.S_IFCHR,
                 os.makedev(fakedriver.CAPS_MAJOR, minor))
    node.generate("--proc-root", node.proc)
    watch, log = node.watch("--nvml-interval", "0.5")
    try:
        wait_for(lambda: "is up to date" in read_log(log), 20, "the watcher's first check", log)
        lines = fakedriver.gpu_lines(2)
        lines[0] += " mig=1 migs=0"
        node.driver.set_gpus(lines=[f"driver {OLD}"] + lines)
        wait_for(lambda: "devices changed" in read_log(log), WATCH_BOUND, "the MIG spec", log)
        assert watch.poll() is None
    finally:
        stop(watch)
        log.close()
    assert watch.returncode == 0         # SIGTERM (systemd's stop) is a clean exit
    with open(node.spec) as stream:
        names = [d["name"] for d in yaml.safe_load(stream)["devices"]]
    assert "0:0" in names and "0" not in names and "1" in names


def test_watch_refuses_a_spec_that_does_not_validate_or_names_missing_files(tmp_path):
    """The check --watch runs before it replaces the spec: the text as any reader decodes it,
    and every mount source and device node present (not transient: an "error:" line)."""
    from shim.generate.watch import Failure, validate_text

    present = tmp_path / "lib.so"
    present.write_text("")
    good = (f"cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: '0'\n  containerEdits:\n"
            f"    deviceNodes:\n    - path: /dev/null\ncontainerEdits:\n  mounts:\n"
            f"  - hostPath: {present}\n    containerPath: /lib.so\n")
    validate_text(good, str(tmp_path / "nvidia.yaml"))
    for text, expected in ((good.replace(str(present), str(tmp_path / "gone.so")), "do not exist, e.g."),
                           (good.replace("nvidia.com/gpu", "nvidia.com/"), "does not validate")):
        with pytest.raises(Failure) as raised:
            validate_text(text, str(tmp_path / "nvidia.yaml"))
        assert expected in str(raised.value) and not raised.value.transient


CONTRIB = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "contrib")
UNITS = ("cdi-shim-generate.service", "cdi-shim-generate-once.service", "cdi-shim-generate.timer")


PREFIX_CLI = NODE_CDI_SHIM     # the node prefix's (docs/install.md)


def test_generate_units_verify_and_name_options_that_exist(tmp_path):
    """systemd-analyze verify accepts the units (ExecStart pointed at this cdi-shim), and the
    command lines they run parse (--help appended: click checks every option first). contrib/
    holds the package's units (shim/node/units, in the wheel) rendered for the node prefix."""
    from shim.node.units import NAMES, render

    assert NAMES == UNITS
    analyze = fakedriver.need("systemd-analyze", "systemd")
    for name in UNITS:
        with open(os.path.join(CONTRIB, name)) as stream:
            text = stream.read()
        assert text == render(name, PREFIX_CLI), name
        (tmp_path / name).write_text(text.replace(PREFIX_CLI, node_cli()))
        for line in text.splitlines():
            if line.startswith("ExecStart="):
                argv = line[len("ExecStart="):].split()
                assert argv[0] == PREFIX_CLI
                done = subprocess.run([node_cli(), *argv[1:], "--help"], capture_output=True, text=True, timeout=60)
                assert done.returncode == 0, (line, done.stderr)
    done = subprocess.run([analyze, "verify", *[str(tmp_path / name) for name in UNITS]], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr


def test_watch_usage_errors_stop_it_before_it_starts(tmp_path):
    """What retrying cannot fix is a usage error (exit 2, which the service does not restart)."""
    def cli(*argv):
        return subprocess.run([node_cli(), "cdi", "generate", "--output", str(tmp_path / "nvidia.yaml"), *argv],
                              capture_output=True, text=True, timeout=60)
    for argv, expected in ((["--once"], "--once goes with --watch"),
                           (["--watch", "--dry-run"], "--dry-run does not go with it"),
                           (["--watch", "--vendor", "nvidia com"], "nvidia com"),
                           (["--watch", "--spec-version", "9.9"], "not a CDI version"),
                           (["--watch", "--interval", "0"], "--interval")):
        done = cli(*argv)
        assert done.returncode == 2 and expected in done.stderr, (argv, done.stderr)
    assert not os.path.exists(tmp_path / "nvidia.yaml")


def test_watch_backs_off_and_a_file_change_retries_at_once(tmp_path):
    """The loop alone (a fake clock; attempts stubbed): failures wait interval x 2, x 4, ...
    up to --max-backoff, and never end the loop; a change of a polled file retries at the next
    poll; a success ends the retries until the next change or periodic NVML check."""
    from shim.generate import Options
    from shim.generate.watch import Failure, Watcher

    version = tmp_path / "proc" / "driver" / "nvidia" / "version"
    version.parent.mkdir(parents=True)
    version.write_text(OPEN.format(v=OLD))
    now, log, attempts = [0.0], [], []
    outcomes = iter(["fail"] * 6 + ["ok"])

    def attempt(reason):
        attempts.append((now[0], reason))
        if next(outcomes) == "fail":
            raise Failure("cannot generate: NVML says no")
        return "current", {"doc": {}, "version": OLD}

    def sleep(seconds):
        now[0] += seconds
        if now[0] >= 25 and version.read_text() == OPEN.format(v=OLD):
            version.write_text(OPEN.format(v=NEW))          # the poll sees it at once

    options = Options(output=str(tmp_path / "nvidia.yaml"), driver_root=str(tmp_path), proc=str(tmp_path / "proc"))
    env = os.environ.pop(VERSION_FILE_ENV, None)
    try:
        watcher = Watcher(options, interval=1, nvml_interval=1000, max_backoff=8, log=log.append,
                          clock=lambda: now[0], sleep=sleep)
    finally:
        if env is not None:
            os.environ[VERSION_FILE_ENV] = env
    watcher.attempt = attempt
    watcher.run(stop=lambda: now[0] > 60)
    assert attempts == [(0, "start"), (2, "retry"), (6, "retry"), (14, "retry"), (22, "retry"),   # waits 2, 4, 8, 8
                        (25, "driver files changed"),     # the module changed: at once, not at 30
                        (33, "retry")], attempts          # 8 (the cap) after the 6th failure; then success
    assert any("again (2 attempts); retry in 4 s" in line for line in log), log
    assert sum("is up to date" in line for line in log) == 1 and "up to date" in log[-1]


@pytest.mark.runtime_e2e
def test_the_installed_refresh_unit_regenerates_the_spec_after_a_driver_upgrade(node, tmp_path):
    """Issue 46, item 2: `install --node` installs cdi-shim-generate.service; its ExecStart line,
    run as systemd would run it (one test-only addition: --proc-root, the fake procfs of the
    kernel module's version), writes /var/run/cdi/nvidia.yaml (a private /run: a mount namespace
    of its own) and replaces it after a driver upgrade, once the new libraries are there."""
    import shlex

    root = tmp_path / "node-root"
    (root / "etc" / "containerd").mkdir(parents=True)
    runtime = tmp_path / "cdi-shim-runtime"
    runtime.write_text("#!/bin/sh\nexit 0\n")
    runtime.chmod(0o755)
    done = subprocess.run([node_cli(), "install", "--node", "--root", str(root), "--runtime-binary", str(runtime),
                           "--cdi-shim-binary", node_cli(), "--driver-root", node.driver.root, "--dev-root",
                           node.driver.dev_root, "--containerd-binary", fakedriver.need("containerd", "containerd")],
                          capture_output=True, text=True, env=node.env(), timeout=120)
    assert "spec-refresh: changed: wrote " in done.stderr, done.stderr
    unit = (root / "etc/systemd/system/cdi-shim-generate.service").read_text()
    assert os.path.islink(root / "etc/systemd/system/multi-user.target.wants/cdi-shim-generate.service")
    [exec_start] = [line[len("ExecStart="):] for line in unit.splitlines() if line.startswith("ExecStart=")]
    argv = shlex.split(exec_start)
    assert argv[:3] == [node_cli(), "cdi", "generate"] and "--watch" in argv
    assert argv[argv.index("--driver-root") + 1] == node.driver.root
    assert argv[argv.index("--dev-root") + 1] == node.driver.dev_root

    env = node.env()
    env.pop(VERSION_FILE_ENV)          # --proc-root's version file
    log = open(os.path.join(node.base, "unit.log"), "w+")
    script = 'mount -t tmpfs -o mode=755 tmpfs /run && exec "$@"'
    watch = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *argv,
                              "--proc-root", node.proc], stdout=subprocess.DEVNULL, stderr=log, env=env)
    # the unit's default output, /var/run/cdi/nvidia.yaml, in its namespace (/var/run is a link to /run,
    # which would resolve in ours)
    spec = f"/proc/{watch.pid}/root/run/cdi/nvidia.yaml"

    def recorded():
        try:
            with open(spec) as stream:
                return recorded_driver_version(yaml.safe_load(stream))
        except (OSError, yaml.YAMLError):
            return None
    try:
        wait_for(lambda: recorded() == OLD, 30, "the unit's first spec", log)
        node.driver.remove_userspace()
        node.module(NEW)
        node.driver.upgrade(NEW, remove=False)
        started = time.monotonic()
        took = wait_for(lambda: recorded() == NEW, WATCH_BOUND, "the unit's spec for the new driver", log) - started
        assert watch.poll() is None
        print(f"the installed unit's watcher wrote the new driver's spec {took:.2f} s after its libraries")
    finally:
        stop(watch)
        text = read_log(log)
        log.close()
    assert "Traceback" not in text, text
