"""The resident process (`cdi-shim runtime serve`) and the front end's use of it, with real runc.

The modules test_runtime_runc/safety/linker run every test through a resident process as well
(RESIDENT_TOO); here: that the resident path is really taken, that it falls back to starting
the interpreter whenever the server is absent, stale, someone else's, of another version or in
another mount namespace, and that a server that stops mid-request fails the create cleanly.
"""
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

import pytest

import runtime_helpers as rh
from shim.runtime.resident import CLAIM, MAGIC, PERMIT
from test_runtime_linker import LIBDIR, _glibc_rootfs, _spec
from test_runtime_runc import SOURCES, check_injected, run_container
from tests.helpers import cli_with_settle

pytestmark = pytest.mark.runtime_e2e
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

GPU0 = {"cdi.k8s.io/e2e": "nvidia.com/gpu=0"}


def debug_world(world):
    log = os.path.join(world.base, "cdi-shim.log")
    world.write_config(log_level="debug", log_file=log)
    return log


def served_lines(log):
    with open(log) as f:
        return [line for line in f if "phase=total" in line]


@pytest.fixture
def resident_world(tmp_path, resident_server):
    w = rh.World(tmp_path, resident=resident_server)
    yield w
    w.cleanup()
    resident_server.check_alive()


@pytest.mark.parametrize("mode", ["run", "create-start"])
def test_create_goes_through_the_resident_process(resident_world, resident_server, mode):
    log = debug_world(resident_world)
    kwargs, opts, minors, env_var = SOURCES["annotation"]
    bundle = resident_world.bundle(mode=0o640, **kwargs)
    text = run_container(resident_world, bundle, mode, opts)
    check_injected(resident_world, bundle, rh.parse_report(text), minors, env_var)
    lines = served_lines(log)
    assert len(lines) == 1 and " in resident process " in lines[0], lines
    child = int(lines[0].split(" in resident process ")[1].split(";")[0])
    assert child != resident_server.process.pid, "the work must run in a child, not in the server"


def test_without_a_server_the_interpreter_does_it(world):
    """Nothing listens at the configured socket: same result, through the interpreter."""
    log = debug_world(world)
    kwargs, opts, minors, env_var = SOURCES["env-index"]
    bundle = world.bundle(mode=0o640, **kwargs)
    check_injected(world, bundle, rh.parse_report(run_container(world, bundle, "run", opts)), minors, env_var)
    lines = served_lines(log)
    assert len(lines) == 1 and "resident" not in lines[0], lines


def start_server(world, socket_path, workers=2, settle=None):
    """`cdi-shim runtime serve` at SOCKET_PATH; with SETTLE, its memos' settle window (seconds)."""
    argv = ["runtime", "serve", "--socket", socket_path, "--workers", str(workers)]
    command = [os.path.join(rh.VENV_BIN, "cdi-shim"), *argv] if settle is None else cli_with_settle(argv, settle)
    log = open(os.path.join(world.base, "serve.log"), "wb")
    process = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True, env=world.env())
    deadline = time.monotonic() + 30
    while not os.path.exists(socket_path):
        assert process.poll() is None and time.monotonic() < deadline, "serve did not start"
        time.sleep(0.01)
    return process


def test_stale_socket_of_a_killed_server_falls_back(world):
    socket_path = os.path.join(world.base, "run", "runtime.sock")
    process = start_server(world, socket_path)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert os.path.exists(socket_path), "SIGKILL leaves the socket file behind"
    world.resident_socket = socket_path
    log = debug_world(world)
    bundle = world.bundle(annotations=GPU0)
    result = world.shim("create", "--bundle", bundle.path, bundle.id)
    assert result.returncode == 0, result.stderr
    assert "/dev/nvidia0" in [d["path"] for d in bundle.config()["linux"]["devices"]]
    assert "resident" not in served_lines(log)[0]


def test_sigterm_removes_the_socket(world):
    socket_path = os.path.join(world.base, "run", "runtime.sock")
    process = start_server(world, socket_path)
    process.terminate()
    assert process.wait(timeout=30) == 0
    assert not os.path.exists(socket_path)


def test_sigterm_at_any_moment_stops_cleanly(world):
    """SIGTERM while the workers are being forked (right after the socket appears) or just
    after: the server and every worker end, exit 0 and the socket is gone. (A SIGTERM whose
    Python handler never ran, around fork, used to leave the server waiting forever.)"""
    cli = os.path.join(rh.VENV_BIN, "cdi-shim")
    for attempt in range(24):
        socket_path = os.path.join(world.base, f"run{attempt}", "runtime.sock")
        process = subprocess.Popen([cli, "runtime", "serve", "--socket", socket_path],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=world.env())
        deadline = time.monotonic() + 30
        while not os.path.exists(socket_path):  # spin: the moment it appears, workers are forked
            assert process.poll() is None and time.monotonic() < deadline, "serve did not start"
        time.sleep((attempt % 4) * 0.001)
        process.terminate()
        try:
            assert process.wait(timeout=30) == 0, f"attempt {attempt}"
        except subprocess.TimeoutExpired:
            process.kill()
            raise AssertionError(f"attempt {attempt}: the server did not stop on SIGTERM") from None
        assert not os.path.exists(socket_path), f"attempt {attempt}"


def test_serve_refuses_a_directory_others_can_write(world):
    directory = os.path.join(world.base, "open")
    os.makedirs(directory)
    os.chmod(directory, 0o777)
    result = subprocess.run([os.path.join(rh.VENV_BIN, "cdi-shim"), "runtime", "serve", "--socket",
                             os.path.join(directory, "r.sock")], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "not writable by group or others" in result.stderr and directory in result.stderr, result.stderr


def test_failure_through_the_resident_process(resident_world):
    """An unresolvable device: our message on stderr and in runc's json log, exit 1, config.json
    byte-identical, nothing left in the bundle."""
    bundle = resident_world.bundle(annotations={"cdi.k8s.io/e2e": "nvidia.com/gpu=7"})
    runc_log = os.path.join(resident_world.base, "runc.json")
    result = resident_world.shim("--log", runc_log, "--log-format", "json", "create", "--bundle", bundle.path,
                                 bundle.id)
    assert result.returncode == 1, result.stderr
    assert "nvidia.com/gpu=7" in result.stderr and "unresolvable" in result.stderr, result.stderr
    errors = [msg for level, msg in rh.read_log(runc_log, "json") if level == "error"]
    assert any("nvidia.com/gpu=7" in msg for msg in errors), errors
    assert bundle.unchanged() and bundle.extra_files() == []
    assert resident_world.state(bundle.id) is None


def test_other_mount_namespace_falls_back(resident_world):
    """Paths in a request from another mount namespace may name other files: the server
    declines and the front end starts the interpreter in its own namespace."""
    unshare = rh.need("unshare", "util-linux")
    log = debug_world(resident_world)
    bundle = resident_world.bundle(annotations=GPU0)
    cmd = [unshare, "--mount", "--propagation", "private", resident_world.runtime, "--root",
           resident_world.runc_root, "create", "--bundle", bundle.path, bundle.id]
    resident_world.created.append(bundle.id)
    result = rh.run_captured(cmd, env=resident_world.env())
    assert result.returncode == 0, result.stderr
    lines = served_lines(log)
    assert len(lines) == 1 and "resident" not in lines[0], lines


def new_claim():
    """The read end of a non-blocking pipe holding the claim and the write permit, as the
    front end makes it."""
    read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    os.write(write_end, CLAIM + PERMIT)
    os.close(write_end)
    return read_end


def take_claim(fd, byte=CLAIM):
    """Read the claim's next byte, as a worker does before it starts (CLAIM) and before its
    first write (PERMIT): whether it was BYTE."""
    try:
        return os.read(fd, 1) == byte
    except BlockingIOError:
        return False


def receive_request(conn):
    """(request bytes, [descriptors]) of one request, read at once."""
    data, ancillary, _, _ = conn.recvmsg(1 << 20, socket.CMSG_SPACE(16))
    fds = []
    for _, _, payload in ancillary:
        fds.extend(struct.unpack(f"{len(payload) // 4}i", payload))
    return data, fds


class FakeServer:
    """A socket that answers every connection with ANSWER, then closes; records the requests.
    An answer starting with "A" is given as a worker does: after taking the request's claim
    (recorded in .claimed) and, with PERMIT, its write permit (in .permitted), DELAY seconds
    later."""

    def __init__(self, path, answer, delay=0, permit=True):
        self.path, self.answer, self.delay, self.requests, self.claimed = path, answer, delay, [], []
        self.permit, self.permitted = permit, []
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(8)
        self.sock.settimeout(30)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        try:
            while True:
                conn, _ = self.sock.accept()
                with conn:
                    data, fds = receive_request(conn)
                    self.requests.append(data)
                    if self.answer.startswith(b"A"):
                        self.claimed.append(take_claim(fds[0]))
                        if self.permit:
                            self.permitted.append(take_claim(fds[0], PERMIT))
                        conn.sendall(b"A")
                        time.sleep(self.delay)
                    for fd in fds:
                        os.close(fd)
                    conn.sendall(self.answer[1:] if self.answer.startswith(b"A") else self.answer)
        except OSError:
            pass

    def close(self):
        self.sock.close()


@pytest.mark.parametrize("answer", [b"A", b"A0", b"Ajunk", b"A0\0", b"A0\0009\0short"])
def test_server_that_stops_mid_request_fails_the_create(world, answer):
    """Accepted but no status: the work may have started, so the front end must not start it
    again; it fails with a message naming the socket, in stderr and runc's log."""
    socket_path = os.path.join(world.base, "fake", "r.sock")
    fake = FakeServer(socket_path, answer)
    world.resident_socket = socket_path
    world.write_config()
    bundle = world.bundle(annotations=GPU0)
    runc_log = os.path.join(world.base, "runc.log")
    result = world.shim("--log", runc_log, "create", "--bundle", bundle.path, bundle.id)
    fake.close()
    assert result.returncode == 1, result.stderr
    assert f"the resident process at {socket_path} stopped before it answered" in result.stderr, result.stderr
    assert any(socket_path in msg for level, msg in rh.read_log(runc_log, "text") if level == "error")
    assert bundle.unchanged() and world.state(bundle.id) is None
    request = fake.requests[0]
    assert request.startswith(MAGIC) and bundle.path.encode() in request
    assert fake.claimed == [True] and fake.permitted == [True]


def test_a_claimed_request_is_waited_for_past_the_short_wait(world):
    """A worker that claimed the request but answers only after the front end's short wait
    (RESIDENT_WAIT_MS, 1 s): the front end cannot claim it back, so it waits for the answer
    and never runs the interpreter too (here the answer is status 1: the create fails)."""
    socket_path = os.path.join(world.base, "fake", "r.sock")
    fake = FakeServer(socket_path, b"A1\0000\0", delay=2)
    world.resident_socket = socket_path
    log = debug_world(world)
    bundle = world.bundle(annotations=GPU0)
    start = time.monotonic()
    result = world.shim("create", "--bundle", bundle.path, bundle.id)
    fake.close()
    assert result.returncode == 1, result.stderr
    assert time.monotonic() - start >= 2
    assert fake.claimed == [True] and not os.path.exists(log), "the interpreter ran too"
    assert bundle.unchanged() and world.state(bundle.id) is None


def test_declining_server_means_fallback(world):
    """b"F" (another version, another namespace): the interpreter does the work."""
    socket_path = os.path.join(world.base, "fake", "r.sock")
    fake = FakeServer(socket_path, b"F")
    world.resident_socket = socket_path
    log = debug_world(world)
    bundle = world.bundle(annotations=GPU0)
    result = world.shim("create", "--bundle", bundle.path, bundle.id)
    fake.close()
    assert result.returncode == 0, result.stderr
    assert len(fake.requests) == 1 and "resident" not in served_lines(log)[0]
    assert "/dev/nvidia0" in [d["path"] for d in bundle.config()["linux"]["devices"]]


def foreign_listener(socket_path, uid=65534):
    """A child process with another uid listening at SOCKET_PATH, answering "exec /bin/false"."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(socket_path)
            sock.listen(4)
            while True:
                conn, _ = sock.accept()
                conn.sendall(b"A0\0/bin/false\0")
                conn.close()
        finally:
            os._exit(1)
    return pid


def test_socket_of_another_user_is_ignored(world):
    """A listener that is not our uid could hand back any argv to exec: never use it."""
    directory = tempfile.mkdtemp(prefix="cdi-shim-foreign.")  # uid 65534 cannot reach world.base
    os.chmod(directory, 0o777)
    socket_path = os.path.join(directory, "r.sock")
    pid = foreign_listener(socket_path)
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(socket_path):
            assert time.monotonic() < deadline, "the foreign listener did not start"
            time.sleep(0.01)
        world.resident_socket = socket_path
        world.write_config()
        bundle = world.bundle(annotations=GPU0)
        result = world.shim("create", "--bundle", bundle.path, bundle.id)
        assert result.returncode == 0, result.stderr
        assert f"ignoring {socket_path}: served by uid 65534" in result.stderr, result.stderr
        assert world.state(bundle.id)["status"] == "created"
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        shutil.rmtree(directory)


def test_request_of_another_version_is_declined(resident_server):
    """Right after an upgrade the old server may still run: it must not do the new version's work."""
    from cdi import __version__

    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(resident_server.socket)
    body = b"\0".join([b"0.0.0-other", b"/", b"22", b"0"]) + b"\0"
    claim = new_claim()
    conn.sendmsg([MAGIC + struct.pack("<I", len(body)) + body],
                 [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", claim))])
    conn.settimeout(30)
    assert conn.recv(64) == b"F" + __version__.encode() + b"\0"
    conn.close()
    assert take_claim(claim), "a declining server must leave the claim to the caller"
    os.close(claim)


def _front_end_of_version(version):
    """The real front end built from this tree but saying VERSION, beside the venv's
    interpreter (where it finds the Python half); removed by the caller."""
    sys.path.insert(0, os.path.join(ROOT, "csrc"))
    try:
        import programs
    finally:
        sys.path.pop(0)
    path = os.path.join(rh.VENV_BIN, f".cdi-shim-runtime-{version}-{os.getpid()}")
    programs.build("cdi-shim-runtime", ROOT, path, version)
    return path


def test_front_ends_of_another_version_are_declined_and_said_once(world):
    """A front end of another version (here the real one, built saying 0.0.0-other; and a
    request of the previous protocol, CDSHIM2, whose front end sent two descriptors): each
    create falls back to the interpreter and succeeds, and the server's log says so once for
    each version, not once a create, and not for doctor's probe."""
    socket_path = os.path.join(world.base, "run", "runtime.sock")
    server = start_server(world, socket_path, workers=2)
    other = _front_end_of_version("0.0.0-other")
    try:
        wait_for(lambda: len(workers_of(server.pid)) == 2, "two workers")
        world.resident_socket = socket_path
        log = debug_world(world)
        for _ in range(3):
            bundle = world.bundle(annotations=GPU0)
            world.created.append(bundle.id)
            result = rh.run_captured([other, "--root", world.runc_root, "create", "--bundle", bundle.path, bundle.id],
                                     env=world.env())
            assert result.returncode == 0, result.stderr
            assert "/dev/nvidia0" in [d["path"] for d in bundle.config()["linux"]["devices"]]
        assert all("resident" not in line for line in served_lines(log))
        for _ in range(2):
            body = b"\0".join([b"0.1.9", b"/", b"22", b"0"]) + b"\0"
            claim = new_claim()
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(socket_path)
            _send_with_fd(conn, b"CDSHIM2\0" + struct.pack("<I", len(body)) + body, 2, claim)
            conn.settimeout(30)
            assert conn.recv(1) == b"F"
            conn.close()
            assert take_claim(claim)
            os.close(claim)
        from shim.node.doctor.runtime import probe_resident
        assert probe_resident(socket_path)[0]
    finally:
        os.unlink(other)
        server.terminate()
        server.wait(timeout=30)
    with open(os.path.join(world.base, "serve.log")) as f:
        text = f.read()
    assert text.count("front end of version 0.0.0-other") == 1, text
    assert text.count("front end of version 0.1.9, protocol CDSHIM2") == 1, text
    assert "doctor-probe" not in text and "restart" in text, text


def test_parallel_creates_through_the_resident_process(resident_world):
    bundles = [resident_world.bundle(annotations={"cdi.k8s.io/e2e": f"nvidia.com/gpu={i % 2}"}) for i in range(20)]
    procs = [subprocess.Popen([resident_world.runtime, "--root", resident_world.runc_root, "create", "--bundle",
                               b.path, b.id], env=resident_world.env(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE) for b in bundles]
    resident_world.created.extend(b.id for b in bundles)
    for proc in procs:
        assert proc.wait(timeout=120) == 0, proc.stderr.read()
    for i, bundle in enumerate(bundles):
        paths = [d["path"] for d in bundle.config()["linux"]["devices"]]
        assert f"/dev/nvidia{i % 2}" in paths and f"/dev/nvidia{1 - i % 2}" not in paths
        assert resident_world.state(bundle.id)["status"] == "created"


def workers_of(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return {int(child) for child in f.read().split()}


def wait_for(predicate, what, timeout=30):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_a_killed_worker_is_replaced(world):
    socket_path = os.path.join(world.base, "run", "runtime.sock")
    server = start_server(world, socket_path)
    try:
        wait_for(lambda: len(workers_of(server.pid)) == 2, "two workers")
        first = workers_of(server.pid)
        victim = min(first)
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: victim not in workers_of(server.pid) and len(workers_of(server.pid)) == 2,
                 "the killed worker was not replaced")
        world.resident_socket = socket_path
        log = debug_world(world)
        for _ in range(4):  # both workers serve
            bundle = world.bundle(annotations=GPU0)
            result = world.shim("create", "--bundle", bundle.path, bundle.id)
            assert result.returncode == 0, result.stderr
        assert all(" in resident process " in line for line in served_lines(log))
    finally:
        server.terminate()
        server.wait(timeout=30)
    with open(os.path.join(world.base, "serve.log")) as f:
        assert f"resident worker {victim} ended" in f.read()


def test_workers_end_with_a_killed_server(world):
    """No orphaned worker keeps serving the socket of a server that is gone."""
    server = start_server(world, os.path.join(world.base, "run", "runtime.sock"))
    wait_for(lambda: len(workers_of(server.pid)) == 2, "two workers")
    workers = workers_of(server.pid)
    server.kill()
    server.wait()

    def gone(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split(") ")[1].startswith("Z")
        except FileNotFoundError:
            return True
    wait_for(lambda: all(gone(pid) for pid in workers), f"workers {workers} outlived the server")


def test_caller_whose_working_directory_is_gone_falls_back(resident_world):
    """A caller without a working directory cannot hand it over: the front end does not ask
    the resident process, and the interpreter (which needs no cwd for an absolute bundle
    path) does the work. (A worker that cannot enter a caller's cwd declines the same way.)"""
    log = debug_world(resident_world)
    bundle = resident_world.bundle(annotations=GPU0)
    gone = os.path.join(resident_world.base, "gone")
    os.makedirs(gone)
    script = (f"import os, sys; os.chdir({gone!r}); os.rmdir({gone!r}); "
              f"os.execv(sys.argv[1], sys.argv[1:])")
    resident_world.created.append(bundle.id)
    result = rh.run_captured([sys.executable, "-c", script, resident_world.runtime, "--root",
                              resident_world.runc_root, "create", "--bundle", bundle.path, bundle.id],
                             env=resident_world.env())
    assert result.returncode == 0, result.stderr
    assert resident_world.state(bundle.id)["status"] == "created"
    lines = served_lines(log)
    assert len(lines) == 1 and "resident" not in lines[0], lines


def memo_counts(log):
    """(remembered, read) of each linker-cache line in the debug log, in order."""
    counts = []
    with open(log) as f:
        for line in f:
            if "linker cache:" in line and " entries (" in line:
                tail = line.split("; ", 1)[1] if "remembered" in line else "0 files or listings remembered, 0 read"
                remembered, read = tail.split(" files or listings remembered, ")
                counts.append((int(remembered.split()[-1]), int(read.split()[0])))
    return counts


def _two_containers_of_an_image(world, nvml_library, tmp_path, spec):
    """Run two containers of one image -- two overlay mounts of its layer, as containerd makes
    them -- with the same driver file through a one-worker resident server (one memo); the
    debug log's linker-cache lines, in order."""
    socket_path = os.path.join(world.base, "run", "runtime.sock")
    server = start_server(world, socket_path, workers=1, settle=0)
    mounts = []
    try:
        world.resident_socket = socket_path
        log = debug_world(world)
        world.write_spec("nvidia-gpu.yaml", spec)
        image = world.bundle(tag="image")
        layer = _glibc_rootfs(world, image, nvml_library, tmp_path)
        bundles = []
        for n in range(2):
            upper, work, merged = (str(tmp_path / f"c{n}" / d) for d in ("upper", "work", "rootfs"))
            for d in (upper, work, merged):
                os.makedirs(d)
            subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                            f"lowerdir={layer},upperdir={upper},workdir={work}", merged], check=True)
            mounts.append(merged)
            bundles.append(world.bundle(args=["/prog"], env=["NVIDIA_VISIBLE_DEVICES=0"],
                                        edit=lambda config, root=merged: config["root"].update(path=root)))
        for bundle in bundles:
            result = world.shim("run", "--bundle", bundle.path, bundle.id)
            assert result.returncode == 0, result.stderr
            assert result.stdout == "linked=42 dlopen=ok\n"
        assert all(" in resident process " in line for line in served_lines(log))
        with open(log) as f:
            return [line for line in f if ("linker cache:" in line and " entries (" in line) or "linker step" in line]
    finally:
        server.terminate()
        server.wait(timeout=30)
        for merged in mounts:
            subprocess.run(["umount", merged], check=False)


def test_a_link_made_before_planning_still_lets_the_second_container_take_the_step(world, nvml_library, tmp_path):
    """The spec's link is made in the library directory before the cache is planned, so the
    directory the plan scans is new in each container (the plan memo cannot keep that plan:
    the first container's read every file, from nothing remembered); the step memo keeps the
    whole step with the directory as it was before the link, so the second container, its
    directory found as the first one's was, gets the step replayed from its recipe (the
    device is asked for by request: the front end injects it from the worker's record of the
    first, then replays the step; its program runs)."""
    first, second = _two_containers_of_an_image(world, nvml_library, tmp_path, _spec(world, nvml_library))
    (_, read_first), = memo_counts(world.base + "/cdi-shim.log")
    assert "directories scanned" in first and read_first > 0, first
    assert "the linker step of an earlier container of this request, specs and files, replayed by the front end" \
        in second, second


def test_a_second_container_of_an_image_takes_the_first_ones_step(world, nvml_library, tmp_path):
    """Nothing written into the image's directories before the plan (no link to make): the
    first container's plan is kept (the worker's ldcache.Memos) and so is its whole linker step
    (stepmemo.py); the second container, every path of both found unchanged in its own root,
    gets the step replayed from its recipe, and its program still links and runs."""
    spec = _spec(world, nvml_library)
    links_hook = spec.index("    - hookName: createContainer\n")
    spec = spec[:links_hook] + spec[spec.index("    - hookName: createContainer\n", links_hook + 1):]
    assert "create-symlinks" not in spec and "update-ldcache" in spec
    first, second = _two_containers_of_an_image(world, nvml_library, tmp_path, spec)
    assert "(incremental, " in first and "earlier container" not in first, first
    assert "the linker step of an earlier container of this request, specs and files, replayed by the front end" \
        in second, second


def open_fds(pid):
    return sorted(os.listdir(f"/proc/{pid}/fd"), key=int)


def _dangling_library_dir(rootfs):
    """The library directory of the spec's mounts and links is a link to nowhere: making
    the create-symlinks hook's link there fails with EEXIST (issue 14, finding 5)."""
    os.makedirs(os.path.join(rootfs, "usr/lib"), exist_ok=True)
    os.symlink("/nonexistent-library-dir", rootfs + LIBDIR)


def _library_dir_is_a_file(rootfs):
    os.makedirs(os.path.join(rootfs, "usr/lib"), exist_ok=True)
    with open(rootfs + LIBDIR, "w") as out:
        out.write("not a directory\n")


def _fifo_cache_and_self_include(rootfs):
    os.makedirs(os.path.join(rootfs, "etc/ld.so.conf.d"), exist_ok=True)
    os.mkfifo(os.path.join(rootfs, "etc/ld.so.cache"))
    with open(os.path.join(rootfs, "etc/ld.so.conf"), "w") as out:
        out.write("include /etc/*.conf\ninclude /etc/ld.so.conf.d/*.conf\n")


HOSTILE_IMAGES = (_dangling_library_dir, _library_dir_is_a_file, _fifo_cache_and_self_include)


def test_worker_fds_do_not_grow_over_hostile_creates(world, nvml_library):
    """A resident worker serves many creates of hostile images (a dangling or non-directory
    library directory under the spec's links, a FIFO as ld.so.cache, an ld.so.conf that
    includes itself): its open descriptors stay what they were. (A descriptor leaked per
    create of the first kind; ~1,000 creates later every create on that worker failed with
    EMFILE.)"""
    socket_path = os.path.join(world.base, "run", "runtime.sock")
    server = start_server(world, socket_path, workers=1)
    try:
        wait_for(lambda: len(workers_of(server.pid)) == 1, "one worker")
        (worker,) = workers_of(server.pid)
        world.resident_socket = socket_path
        log = debug_world(world)
        world.write_spec("nvidia-gpu.yaml", _spec(world, nvml_library))

        def create(make_hostile):
            bundle = world.bundle(env=["NVIDIA_VISIBLE_DEVICES=0"])
            make_hostile(bundle.rootfs)
            world.shim("create", "--bundle", bundle.path, bundle.id)   # runc may refuse: not the point
            world.runc_cmd("delete", "--force", bundle.id)

        for make_hostile in HOSTILE_IMAGES:    # warm: everything a create opens once is open
            create(make_hostile)
        before = open_fds(worker)
        rounds = 8
        for _ in range(rounds):
            for make_hostile in HOSTILE_IMAGES:
                create(make_hostile)
        assert workers_of(server.pid) == {worker}, "the worker must have served them all"
        after = open_fds(worker)
        assert after == before, f"worker {worker} had {len(before)} descriptors, now {len(after)}"
        served = served_lines(log)
        assert len(served) == (rounds + 1) * len(HOSTILE_IMAGES), served
        assert all(f" in resident process {worker}" in line for line in served), served
    finally:
        server.terminate()
        server.wait(timeout=30)


# ---- requests that stall, are too large or malformed; busy workers (issue 14, finding 6) ----

def _send_with_fd(conn, data, *fds):
    conn.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))])


def _eof_within(fd, seconds):
    """Whether the pipe read end FD sees end-of-file (every write end closed) within SECONDS."""
    import select
    deadline = time.monotonic() + seconds
    while True:
        ready, _, _ = select.select([fd], [], [], max(0, deadline - time.monotonic()))
        if not ready:
            return False
        if os.read(fd, 4096) == b"":
            return True


def _one_worker_server(world):
    socket_path = os.path.join(world.base, "run", "runtime.sock")
    server = start_server(world, socket_path, workers=1)
    wait_for(lambda: len(workers_of(server.pid)) == 1, "one worker")
    (worker,) = workers_of(server.pid)
    return server, socket_path, worker


def _create_through(world, socket_path, worker):
    """A create through the server's worker WORKER succeeds."""
    world.resident_socket = socket_path
    log = debug_world(world)
    bundle = world.bundle(annotations=GPU0)
    result = world.shim("create", "--bundle", bundle.path, bundle.id, timeout=30)
    assert result.returncode == 0, result.stderr
    assert f" in resident process {worker};" in served_lines(log)[-1], served_lines(log)


@pytest.mark.parametrize("how", ["stalled", "too-large"])
def test_refused_request_releases_the_callers_descriptors(world, how):
    """A request that never completes (the whole read has a deadline, not each recv) or is
    over 4 MiB: the worker closes the descriptors that came with it, so the caller's stderr
    (here a pipe) sees end-of-file, and the worker serves the next create."""
    from shim.runtime.resident import MAGIC, MAX_REQUEST, REQUEST_TIMEOUT

    server, socket_path, worker = _one_worker_server(world)
    try:
        read_end, write_end = os.pipe()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(socket_path)
        start = time.monotonic()
        if how == "stalled":
            _send_with_fd(conn, MAGIC + struct.pack("<I", 100) + b"x", write_end)
        else:
            _send_with_fd(conn, MAGIC + struct.pack("<I", MAX_REQUEST + 65536), write_end)
            try:
                conn.sendall(b"x" * (MAX_REQUEST + 65536))
            except OSError:
                pass        # the worker stopped reading past the bound and closed
        os.close(write_end)
        assert _eof_within(read_end, REQUEST_TIMEOUT + 10), \
            f"the worker still holds the caller's stderr {time.monotonic() - start:.1f} s later"
        assert time.monotonic() - start < REQUEST_TIMEOUT + 5
        try:
            assert conn.recv(16) == b""
        except ConnectionResetError:
            pass            # closed with our bytes unread
        conn.close()
        os.close(read_end)
        _create_through(world, socket_path, worker)
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_slow_clients_cannot_hold_the_workers(world):
    """Two clients sending a byte every half second hold both workers no longer than the
    request deadline, and a create meanwhile does not wait for them: it is served by the
    interpreter when no worker takes it up within a short wait."""
    from shim.runtime.resident import MAGIC, REQUEST_TIMEOUT

    socket_path = os.path.join(world.base, "run", "runtime.sock")
    server = start_server(world, socket_path, workers=2)
    stop = threading.Event()
    cut_off = []

    def trickle():
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(socket_path)
        start = time.monotonic()
        try:
            _send_with_fd(conn, MAGIC[:1], 2)
            for byte in (MAGIC[1:] + struct.pack("<I", 1000) + b"x" * 1000):
                if stop.wait(0.5):
                    return
                conn.send(bytes([byte]))
        except OSError:
            cut_off.append(time.monotonic() - start)
        finally:
            conn.close()

    holders = [threading.Thread(target=trickle) for _ in range(2)]
    try:
        wait_for(lambda: len(workers_of(server.pid)) == 2, "two workers")
        for holder in holders:
            holder.start()
        time.sleep(0.3)
        world.resident_socket = socket_path
        log = debug_world(world)
        bundle = world.bundle(annotations=GPU0)
        start = time.monotonic()
        result = world.shim("create", "--bundle", bundle.path, bundle.id, timeout=30)
        took = time.monotonic() - start
        assert result.returncode == 0, result.stderr
        assert took < REQUEST_TIMEOUT + 5, took
        assert "/dev/nvidia0" in [d["path"] for d in bundle.config()["linux"]["devices"]]
        wait_for(lambda: len(cut_off) == 2, "the server did not cut the slow clients off", timeout=REQUEST_TIMEOUT + 10)
        assert all(t < REQUEST_TIMEOUT + 3 for t in cut_off), cut_off
        time.sleep(1)
        assert len(served_lines(log)) == 1, served_lines(log)     # done once, never twice
    finally:
        stop.set()
        for holder in holders:
            if holder.is_alive():
                holder.join(timeout=30)
        server.terminate()
        server.wait(timeout=30)


def test_no_worker_free_means_the_interpreter_and_never_a_second_run(world):
    """A server that does not take the request up (every worker busy: here it never
    accepts): after a short wait the front end claims its request back and runs the
    interpreter itself. When the server gets to the request later, the claim is gone:
    nothing runs twice."""
    socket_path = os.path.join(world.base, "busy", "r.sock")
    os.makedirs(os.path.dirname(socket_path))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(8)
    try:
        world.resident_socket = socket_path
        log = debug_world(world)
        bundle = world.bundle(annotations=GPU0)
        start = time.monotonic()
        result = world.shim("create", "--bundle", bundle.path, bundle.id, timeout=30)
        assert result.returncode == 0, result.stderr
        assert time.monotonic() - start < 10
        lines = served_lines(log)
        assert len(lines) == 1 and "resident" not in lines[0], lines
        assert world.state(bundle.id)["status"] == "created"
        # The server takes the request up only now, and offers to do it.
        listener.settimeout(5)
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(5)
            data, fds = receive_request(conn)
            assert bundle.path.encode() in data and len(fds) == 1
            claimed = take_claim(fds[0])
            for fd in fds:
                os.close(fd)
            assert not claimed, "a caller that ran the interpreter must never leave the claim to a worker"
    finally:
        listener.close()


def test_out_of_range_umask_is_refused_and_the_worker_lives(world):
    """A request whose umask field is out of range (it used to kill the worker with
    OverflowError): refused, and the same worker serves the next create."""
    from cdi import __version__
    from shim.runtime.resident import MAGIC

    server, socket_path, worker = _one_worker_server(world)
    try:
        for umask in (b"7" * 40, b"1000", b"-1"):
            body = b"\0".join([__version__.encode(), b"/", umask, b"0"]) + b"\0"
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(socket_path)
            claim = new_claim()
            _send_with_fd(conn, MAGIC + struct.pack("<I", len(body)) + body, claim)
            conn.settimeout(30)
            assert conn.recv(16) == b"", umask
            assert take_claim(claim), umask
            os.close(claim)
            conn.close()
        _create_through(world, socket_path, worker)
        assert workers_of(server.pid) == {worker}
    finally:
        server.terminate()
        server.wait(timeout=30)
    with open(os.path.join(world.base, "serve.log")) as f:
        text = f.read()
    assert "OverflowError" not in text and "umask" in text, text


def test_a_worker_takes_each_callers_environment_exactly():
    """The environment is made the caller's by a diff against the last one (the same every
    time from containerd's shims): a variable an earlier caller set and this one did not is
    gone, changed ones are changed, and the C library's environment (putenv) agrees."""
    import ctypes

    from shim.runtime.resident import _take_environment

    getenv = ctypes.CDLL(None).getenv
    getenv.restype = ctypes.c_char_p
    saved = dict(os.environ)
    try:
        first = {"PATH": "/usr/bin:/bin", "CDI_SHIM_NVIDIA_PARAMS": "/tmp/params", "KEEP": "1"}
        _take_environment(first)
        assert dict(os.environ) == first
        second = {"PATH": "/usr/bin:/bin", "KEEP": "2", "NEW": "x"}
        _take_environment(second)
        assert dict(os.environ) == second
        assert getenv(b"CDI_SHIM_NVIDIA_PARAMS") is None and getenv(b"KEEP") == b"2" and getenv(b"NEW") == b"x"
    finally:
        _take_environment(saved)
    assert dict(os.environ) == saved
