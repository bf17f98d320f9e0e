"""The resident process under load (issue 31, item 8), with real runc and the real server: a
worker that stalls after taking a create is abandoned within the front end's bound; slow,
idle and half-open connections hold no worker, nor does a create whose stderr pipe is full; a
create that fails writing config.json (ENOSPC) leaves no file of ours in the bundle."""
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time

import pytest

from shim.runtime.resident import ANSWER_WAIT, CLAIM_WAIT, MAGIC
from test_runtime_linker import _spec
from test_runtime_resident import (GPU0, FakeServer, debug_world, served_lines, start_server,
                                   wait_for, workers_of)

pytestmark = pytest.mark.runtime_e2e


def _fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def _claim_bytes(pid):
    """The bytes left in the claim pipe the front end PID holds (a pipe it made, holding 1 or 2
    bytes); None before it exists."""
    import fcntl
    import termios

    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            if int(name) < 3 or not os.readlink(f"/proc/{pid}/fd/{name}").startswith("pipe:"):
                continue
            fd = os.open(f"/proc/{pid}/fd/{name}", os.O_RDONLY | os.O_NONBLOCK)
        except (OSError, ValueError):
            continue
        try:
            count = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
        finally:
            os.close(fd)
        if count in (1, 2):
            return count
    return None


def _big_spec(world, devices=30000):
    """A second spec whose first reading takes a fresh worker seconds: a stretch of the create
    before its first write in which to stop that worker."""
    entries = "".join(f'  - name: "d{i}"\n    containerEdits:\n      env: [BIG_{i}=1]\n' for i in range(devices))
    world.write_spec("big.yaml", 'cdiVersion: "0.5.0"\nkind: example.com/big\ndevices:\n' + entries)


def test_a_worker_stopped_before_writing_is_abandoned_and_the_interpreter_does_it(world):
    """A worker takes the create up, then is stopped (SIGSTOP) while it reads the specs, before
    any write: the front end waits no longer than its bound, takes the write permit back and
    runs the interpreter, so the create succeeds, done once. The worker, resumed, finds the
    permit gone and writes nothing."""
    _big_spec(world)
    socket_path = os.path.join(world.base, "run", "runtime.sock")
    server = start_server(world, socket_path, workers=1)
    worker = None
    try:
        wait_for(lambda: len(workers_of(server.pid)) == 1, "one worker")
        (worker,) = workers_of(server.pid)
        idle = _fds(worker)
        world.resident_socket = socket_path
        log = debug_world(world)
        bundle = world.bundle(annotations=GPU0)
        world.created.append(bundle.id)
        start = time.monotonic()
        errors = open(os.path.join(world.base, "front.err"), "w+")    # (runc init keeps a pipe open)
        front = subprocess.Popen([world.runtime, "--root", world.runc_root, "create", "--bundle", bundle.path,
                                  bundle.id], env=world.env(), stdout=subprocess.DEVNULL, stderr=errors)
        # stopped once it has taken the claim's first byte (it then reads the big spec for
        # seconds, before its first write): the front end's claim pipe tells
        wait_for(lambda: _fds(worker) >= idle + 2, "the worker did not take the request", timeout=10)
        wait_for(lambda: _claim_bytes(front.pid) == 1, "the worker did not take the claim", timeout=10)
        os.kill(worker, signal.SIGSTOP)
        try:
            front.wait(timeout=ANSWER_WAIT + 60)
        except subprocess.TimeoutExpired:
            front.kill()
            raise AssertionError("the front end waited for the stopped worker past its bound") from None
        took = time.monotonic() - start
        errors.seek(0)
        assert front.returncode == 0, errors.read()
        assert ANSWER_WAIT - 1 <= took, took
        written = bundle.read_bytes()
        assert "/dev/nvidia0" in [d["path"] for d in json.loads(written)["linux"]["devices"]]
        lines = served_lines(log)
        assert len(lines) == 1 and "resident" not in lines[0], lines
        os.kill(worker, signal.SIGCONT)
        serve_log = os.path.join(world.base, "serve.log")
        wait_for(lambda: "taken back by its caller" in open(serve_log).read(), "the resumed worker did not give up",
                 timeout=120)
        assert bundle.read_bytes() == written, "the abandoned worker wrote config.json after all"
        assert len(served_lines(log)) == 1
        assert world.state(bundle.id)["status"] == "created"
    finally:
        if worker:
            os.kill(worker, signal.SIGCONT)
        server.terminate()
        server.wait(timeout=60)


def test_a_worker_that_stalls_after_it_began_writing_fails_the_create_within_the_bound(world):
    """A worker that took the claim and the write permit, then says nothing: the front end
    cannot know what was written, so it fails the create -- within its bound, not the stall's
    length -- naming the socket."""
    socket_path = os.path.join(world.base, "fake", "r.sock")
    fake = FakeServer(socket_path, b"A0\0000\0/bin/false\0", delay=ANSWER_WAIT + 30)
    world.resident_socket = socket_path
    world.write_config()
    bundle = world.bundle(annotations=GPU0)
    start = time.monotonic()
    result = world.shim("create", "--bundle", bundle.path, bundle.id, timeout=ANSWER_WAIT + 25)
    took = time.monotonic() - start
    fake.close()
    assert result.returncode == 1, result.stderr
    assert ANSWER_WAIT - 1 <= took < ANSWER_WAIT + 10, took
    assert f"the resident process at {socket_path} stopped before it answered (no answer within the bound" \
        in result.stderr, result.stderr
    assert fake.claimed == [True] and fake.permitted == [True]
    assert bundle.unchanged() and world.state(bundle.id) is None


def _trickle(socket_path, stop, every=0.5):
    """A root client sending a request a byte at a time."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(socket_path)
    try:
        for byte in MAGIC + struct.pack("<I", 1000) + b"x" * 1000:
            if stop.wait(every):
                return
            conn.send(bytes([byte]))
    except OSError:
        pass
    finally:
        conn.close()


def test_idle_half_open_and_slow_connections_hold_no_worker(world):
    """200 connections that send nothing or half a header, and two that trickle a byte at a
    time, against two workers: every create meanwhile is still served by a worker, not after
    the front end's claim wait by the interpreter."""
    socket_path = os.path.join(world.base, "run", "runtime.sock")
    server = start_server(world, socket_path, workers=2)
    stop = threading.Event()
    idle, trickles = [], [threading.Thread(target=_trickle, args=(socket_path, stop)) for _ in range(2)]
    try:
        wait_for(lambda: len(workers_of(server.pid)) == 2, "two workers")
        for t in trickles:
            t.start()
        for n in range(200):
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(socket_path)
            if n % 2:
                conn.send(MAGIC[:5])
            idle.append(conn)
        world.resident_socket = socket_path
        log = debug_world(world)
        times = []
        for _ in range(6):
            bundle = world.bundle(annotations=GPU0)
            start = time.monotonic()
            result = world.shim("create", "--bundle", bundle.path, bundle.id, timeout=60)
            times.append(time.monotonic() - start)
            assert result.returncode == 0, result.stderr
        lines = served_lines(log)
        assert len(lines) == 6 and all(" in resident process " in line for line in lines), (lines, times)
    finally:
        stop.set()
        for conn in idle:
            conn.close()
        for t in trickles:
            t.join(timeout=30)
        server.terminate()
        server.wait(timeout=60)


def _full_pipe():
    """(read end, write end) of a pipe filled to its last byte; the write end blocks (as a
    caller's stderr does), the read end does not (the test never waits on it)."""
    read_end, write_end = os.pipe2(os.O_NONBLOCK)
    for chunk in (4096, 1):
        try:
            while True:
                os.write(write_end, b"." * chunk)
        except BlockingIOError:
            pass
    os.set_blocking(write_end, True)
    return read_end, write_end


def _blocked_writing_stderr(pid):
    """Whether process PID is in write(2) on its fd 2 (/proc/PID/syscall: number, then args)."""
    try:
        with open(f"/proc/{pid}/syscall") as f:
            fields = f.read().split()
    except OSError:
        return False
    return fields[:2] == ["1", "0x2"]


def test_a_create_whose_stderr_pipe_is_full_holds_no_worker(world):
    """A create that has messages to say (an unresolvable device) and whose stderr is a pipe
    nobody drains: its worker hands the messages back in the answer and goes on, so while
    that pipe stays full every other create through the one-worker server is still taken up
    by the worker within the claim wait, not by the interpreter after it. Only the full
    pipe's own front end waits; drained, it writes the messages and fails as it should."""
    socket_path = os.path.join(world.base, "run", "runtime.sock")
    server = start_server(world, socket_path, workers=1)
    read_end, write_end = _full_pipe()
    wedged = None
    try:
        wait_for(lambda: len(workers_of(server.pid)) == 1, "one worker")
        (worker,) = workers_of(server.pid)
        world.resident_socket = socket_path
        log = debug_world(world)
        failing = world.bundle(annotations={"cdi.k8s.io/e2e": "nvidia.com/gpu=7"})
        wedged = subprocess.Popen([world.runtime, "--root", world.runc_root, "create", "--bundle", failing.path,
                                   failing.id], env=world.env(), stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=write_end)
        os.close(write_end)
        write_end = None
        # its messages are being written: by its front end (now), or by the worker (before the fix)
        wait_for(lambda: _blocked_writing_stderr(wedged.pid) or _blocked_writing_stderr(worker),
                 "nobody is writing the full pipe", timeout=30)
        times = []
        for _ in range(3):
            bundle = world.bundle(annotations=GPU0)
            start = time.monotonic()
            result = world.shim("create", "--bundle", bundle.path, bundle.id, timeout=ANSWER_WAIT + 30)
            times.append(round(time.monotonic() - start, 3))
            assert result.returncode == 0, result.stderr
        lines = [line for line in served_lines(log) if "; exec " in line]     # the failed one's is "; failed"
        assert len(lines) == 3 and all(f" in resident process {worker};" in line for line in lines), \
            (f"with a full stderr pipe undrained, creates were not taken up by the worker within the claim "
             f"wait ({CLAIM_WAIT:g} s): {times}", lines)
        assert wedged.poll() is None, "the full pipe's own create did not wait for it"
        said = bytearray()
        deadline = time.monotonic() + 60
        while wedged.poll() is None and time.monotonic() < deadline:
            try:
                said += os.read(read_end, 65536)
            except BlockingIOError:
                time.sleep(0.01)
        assert wedged.poll() == 1, "the create did not end once its stderr was drained"
        try:
            said += os.read(read_end, 65536)
        except BlockingIOError:
            pass
        assert b"nvidia.com/gpu=7" in said and b"unresolvable" in said, bytes(said[-2000:])
    finally:
        if wedged is not None and wedged.poll() is None:
            wedged.kill()
            wedged.wait(timeout=30)
        for fd in (read_end, write_end):
            if fd is not None:
                os.close(fd)
        server.terminate()
        server.wait(timeout=60)


@pytest.mark.parametrize("via", ["interpreter", "resident"])
def test_a_config_write_that_fails_on_enospc_leaves_nothing_of_ours(world, nvml_library, tmp_path, via):
    """The bundle is on a full tmpfs: the linker files fit but the new config.json does not.
    The create fails naming config.json and ENOSPC, config.json is as it was, and the linker
    files written before into the bundle (a read-only root's /etc overlay) are gone."""
    world.write_spec("nvidia-gpu.yaml", _spec(world, nvml_library))
    if via == "resident":
        world.resident_socket = os.path.join(world.base, "run", "runtime.sock")
        server = start_server(world, world.resident_socket, workers=1)
    else:
        server = None
    world.write_config()
    small = str(tmp_path / "small")
    os.makedirs(small)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", small], check=True)
    try:
        # the same create in a roomy bundle first: the size of the cache it writes
        readonly = lambda config: config["root"].update(readonly=True)  # noqa: E731
        roomy = world.bundle(env=["NVIDIA_VISIBLE_DEVICES=0"], annotations={"pad": "p" * 300_000}, edit=readonly)
        result = world.shim("create", "--bundle", roomy.path, roomy.id)
        assert result.returncode == 0, result.stderr
        cache = sum(os.path.getsize(os.path.join(top, name)) + 4096 for top, _, names
                    in os.walk(os.path.join(roomy.path, "cdi-shim.etc")) for name in names)
        assert cache > 0
        world.runc_cmd("delete", "--force", roomy.id)
        bundle = world.bundle(env=["NVIDIA_VISIBLE_DEVICES=0"], annotations={"pad": "p" * 300_000}, edit=readonly)
        for name in os.listdir(bundle.path):
            if name != "rootfs":
                shutil.copy(os.path.join(bundle.path, name), small)
        original = open(os.path.join(small, "config.json"), "rb").read()
        free = os.statvfs(small).f_bavail * os.statvfs(small).f_bsize
        room = (cache // 4096 + 3) * 4096      # the cache and its temp file's rounding fit; 300 KB do not
        with open(os.path.join(small, "filler"), "wb") as out:
            out.write(b"\0" * (free - room))
        result = world.shim("create", "--bundle", small, bundle.id)
        assert result.returncode == 1, result.stderr
        assert f"cannot write {small}/config.json: No space left on device" in result.stderr, result.stderr
        assert open(os.path.join(small, "config.json"), "rb").read() == original
        assert sorted(os.listdir(small)) == ["config.json", "filler"], os.listdir(small)
        assert world.state(bundle.id) is None
    finally:
        subprocess.run(["umount", small], check=False)
        if server:
            server.terminate()
            server.wait(timeout=60)

