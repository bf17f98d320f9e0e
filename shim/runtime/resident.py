"""The resident process: `create`/`run` preparation without an interpreter start per container.

Starting Python costs ~8-12 ms on every GPU container create; the work itself is ~1-2 ms. The
resident process (`cdi-shim runtime serve`, run by systemd) imports everything once and forks
a few long-lived workers; a worker serves one request at a time with the caller's
environment, working directory, umask and stderr in place (its own cwd, umask and stderr
restored afterwards; the environment is made the next caller's in turn) and
runs exactly the code the exec'd interpreter would (`shim.runtime.main.decide`). The caller, the
native front end, then execs runc itself, so runc keeps containerd's pid, stdio and fds.

Protocol, one request per connection on a unix stream socket (mode 0600 in a 0700 directory):

  front end -> server   b"CDSHIM2\\0", u32 little-endian body length, body; SCM_RIGHTS: its
                        stderr and the claim (below)
                        body: NUL-terminated fields: version, cwd, umask (octal, at most 777),
                        argc, argv[1:] (argc fields), then the environment, one field per entry
  server -> front end   b"F": not for me (other version, mount namespace or root): run the
                        interpreter yourself; nothing was touched
                        b"A": claimed, the work starts; then "<status>\\0" and, when status is
                        0, the argv to exec, NUL-terminated fields

The claim is the read end of a non-blocking pipe holding one byte. A worker reads that byte
before it starts the work, and the front end reads it before it runs the interpreter instead;
only one of them can (a pipe read is atomic), so a create is never done twice, and no round
trip is added. The front end claims the request back (and runs the interpreter) when no worker
has answered within a short wait (every worker busy), and when the connection closes, or "F"
comes, without a worker's claim. A worker that finds the claim gone does nothing. A front end
whose request a worker claimed but that got no status reports the failure: config.json may
or may not be written. A worker reads a request within REQUEST_TIMEOUT seconds as a whole (a
caller sending a byte at a time cannot hold it), and closes the descriptors that came with a
request it refuses.
"""
import errno
import gc
import os
import signal
import socket
import struct
import sys
import time

from cdi import __version__
from cdi.safeio import private_dir_problem

MAGIC = b"CDSHIM2\0"
MAX_REQUEST = 4 << 20
REQUEST_TIMEOUT = 2     # seconds for the whole request (the front end sends it at once)
REPLY_TIMEOUT = 10      # seconds to hand an answer over
DEFAULT_SOCKET = "/run/cdi-shim/runtime.sock"
# The modules a create can need, imported once in the server so its workers start warm.
_WARM_MODULES = ("shim.runtime.main", "cdi.registry", "cdi.container_edits", "shim.linker.container",
                 "shim.linker.ldcache", "shim.linker.stepmemo", "shim.linker.toolkit_hooks", "cdi.spec", "yaml")


class ResidentError(Exception):
    pass


class Request:
    __slots__ = ("version", "cwd", "umask", "argv", "env", "stderr_fd", "claim_fd")

    def __init__(self, version, cwd, umask, argv, env, stderr_fd, claim_fd):
        self.version, self.cwd, self.umask = version, cwd, umask
        self.argv, self.env, self.stderr_fd, self.claim_fd = argv, env, stderr_fd, claim_fd


def parse_request(data, fds):
    """The Request in DATA (header included); raises ResidentError when malformed."""
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 4:
        raise ResidentError("not a cdi-shim request")
    (length,) = struct.unpack_from("<I", data, len(MAGIC))
    body = data[len(MAGIC) + 4:]
    if length != len(body) or not body.endswith(b"\0"):
        raise ResidentError("truncated request")
    if len(fds) != 2:
        raise ResidentError(f"expected the caller's stderr and its claim, got {len(fds)} descriptors")
    fields = [os.fsdecode(field) for field in body[:-1].split(b"\0")]
    try:
        version, cwd, umask, argc = fields[0], fields[1], int(fields[2], 8), int(fields[3])
    except (IndexError, ValueError):
        raise ResidentError("malformed request header") from None
    if not 0 <= umask <= 0o777:
        raise ResidentError(f"malformed request header: umask {fields[2]!r} out of range (0 to 777)")
    if argc < 0 or len(fields) < 4 + argc:
        raise ResidentError("malformed request argv")
    argv = fields[4:4 + argc]
    env = dict(entry.split("=", 1) for entry in fields[4 + argc:] if "=" in entry)
    return Request(version, cwd, umask, argv, env, fds[0], fds[1])


def _receive(conn):
    """The raw request bytes and the descriptors that came with them, read within
    REQUEST_TIMEOUT seconds as a whole; on any failure the descriptors are closed."""
    data, fds = bytearray(), []
    deadline = time.monotonic() + REQUEST_TIMEOUT
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ResidentError(f"request not complete within {REQUEST_TIMEOUT} s")
            conn.settimeout(left)
            try:
                chunk, ancillary, _, _ = conn.recvmsg(65536, socket.CMSG_SPACE(4 * 4))
            except TimeoutError:
                raise ResidentError(f"request not complete within {REQUEST_TIMEOUT} s") from None
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.extend(struct.unpack(f"{len(payload) // 4}i", payload[:len(payload) - len(payload) % 4]))
            if not chunk:
                break
            data += chunk
            if len(data) > MAX_REQUEST:
                raise ResidentError(f"request larger than {MAX_REQUEST} bytes")
            if len(data) >= len(MAGIC) + 4:
                (length,) = struct.unpack_from("<I", data, len(MAGIC))
                if len(data) >= len(MAGIC) + 4 + length:
                    break
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return bytes(data), fds


def _our_place():
    """Our mount namespace and root, as _same_place compares them (a worker never changes them)."""
    ours = os.stat("/")
    return os.readlink("/proc/self/ns/mnt"), (ours.st_dev, ours.st_ino)


def _same_place(pid, ours):
    """True when process PID sees the same mount namespace and root as we do (OURS, from
    _our_place), so the paths in its request mean the same files here."""
    try:
        if os.readlink(f"/proc/{pid}/ns/mnt") != ours[0]:
            return False
        theirs = os.stat(f"/proc/{pid}/root")
    except OSError:
        return False
    return (theirs.st_dev, theirs.st_ino) == ours[1]


def _peer(conn):
    pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return pid, uid


def _take_environment(env):
    """Make os.environ exactly ENV, touching only what differs: containerd's shims send the
    same environment every time, and clearing and refilling it cost each request ~0.6 ms.
    Whatever an earlier caller set and this one did not is removed, so nothing leaks."""
    current = os.environ
    for key in [key for key in current if key not in env]:
        del current[key]
    for key, value in env.items():
        if current.get(key) != value:
            current[key] = value


class _CallerContext:
    """The caller's environment, working directory, umask and stderr, for one request; the
    worker's own cwd, umask and stderr are restored afterwards. The environment stays the
    caller's until the next request replaces it (_take_environment): nothing in the worker
    reads it between requests."""

    def __init__(self, request):
        self.request = request

    def __enter__(self):
        """Raises OSError (with the worker's own state back in place) when the caller's
        cannot be set up, e.g. its working directory is gone."""
        request = self.request
        sys.stderr.flush()
        os.chdir(request.cwd)       # first: the step that can fail for the caller's reasons
        self.saved_umask = os.umask(request.umask)
        self.saved_stderr = os.dup(2)
        os.dup2(request.stderr_fd, 2)
        _take_environment(request.env)
        return self

    def __exit__(self, *exc):
        sys.stderr.flush()
        os.umask(self.saved_umask)
        os.chdir("/")
        os.dup2(self.saved_stderr, 2)
        os.close(self.saved_stderr)


def handle(conn, place):
    """Serve one connection (PLACE: _our_place()). A request we will not serve is answered with nothing or b"F"
    before anything is touched; a malformed one raises ResidentError."""
    from .main import decide

    pid, uid = _peer(conn)
    if uid != os.geteuid():
        return  # the socket's mode keeps others out; never answer them anyway
    data, fds = _receive(conn)
    conn.settimeout(REPLY_TIMEOUT)
    try:
        request = parse_request(data, fds)
    except ResidentError:
        for fd in fds:
            os.close(fd)
        raise
    try:
        if request.version != __version__ or not _same_place(pid, place):
            conn.sendall(b"F")
            return
        context = _CallerContext(request)
        try:
            context.__enter__()
        except OSError:
            os.chdir("/")
            conn.sendall(b"F")      # nothing touched: the interpreter path will say what is wrong
            return
        try:
            if not _claim(request.claim_fd):
                return      # the caller gave up waiting and runs the interpreter: not here
            conn.sendall(b"A")
            try:
                status, exec_argv = decide(request.argv, f" in resident process {os.getpid()}")
            except Exception:  # noqa: BLE001 - decide has reported it; the caller must fail
                status, exec_argv = 1, None
        finally:
            context.__exit__(None, None, None)
        reply = b"%d\0" % status
        if status == 0:
            reply += b"".join(os.fsencode(arg) + b"\0" for arg in exec_argv)
        conn.sendall(reply)
    finally:
        os.close(request.stderr_fd)
        os.close(request.claim_fd)


def _claim(fd):
    """Take the request's claim (the one byte in the caller's pipe): True when we got it, False
    when the caller took it back (it gave up waiting and runs the interpreter itself)."""
    try:
        os.set_blocking(fd, False)      # whatever the caller passed: never wait on it
        return len(os.read(fd, 1)) == 1
    except OSError:
        return False


def _die_with(parent):
    """SIGTERM when PARENT (the server) dies, so no orphaned worker keeps serving its socket."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # it died before the line above
        os._exit(0)


def _worker(listener, max_requests, parent, busy, stopping):
    """Accept and serve requests one at a time; exits after MAX_REQUESTS (bounds any leak),
    on SIGTERM once the request in hand is answered (see _spawn), and on any unexpected error
    (its state is then in doubt; the server starts a fresh worker)."""
    _die_with(parent)
    os.chdir("/")
    place = _our_place()
    for _ in range(max_requests):
        try:
            conn, _ = listener.accept()
        except OSError as err:
            if err.errno == errno.EINVAL:  # the server shut the socket down: stop
                return
            raise
        busy[0] = True
        with conn:
            try:
                handle(conn, place)
            except (ResidentError, OSError) as err:  # this caller's problem, not ours
                _complain(f"resident request refused: {err}")
        busy[0] = False
        if stopping[0]:
            break


def _complain(message):
    sys.stderr.write(f"cdi-shim: {message}\n")
    sys.stderr.flush()


def _listen(path):
    """A listening socket at PATH, replacing a stale one atomically; its directory is made
    0700 and must not be writable by others (whoever can write there can impersonate us)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, mode=0o700, exist_ok=True)
    problem = private_dir_problem(directory)  # one rule with the registry cache's directory
    if problem:
        raise ResidentError(f"{directory} must be owned by uid {os.geteuid()} (or root) and not writable by "
                            f"group or others, as must every directory above it: {problem}")
    temp = f"{path}.{os.getpid()}~"
    try:
        os.unlink(temp)
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(temp)
    finally:
        os.umask(old)
    os.replace(temp, path)
    sock.listen(256)
    return sock


def warm_up():
    import importlib

    for name in _WARM_MODULES:
        importlib.import_module(name)
    # Workers live long: let them stat the host's driver libraries and the files of images
    # seen before instead of reading them again for every container, and take a whole plan
    # of an image seen before with the same driver files once its paths are found unchanged
    # (shim.linker.ldcache.remember_files, remember_plans).
    ldcache = importlib.import_module("shim.linker.ldcache")
    ldcache.remember_files(True)
    ldcache.remember_plans(True)
    # ... and replay a whole linker step of an image and spec seen before (stepmemo.py)
    importlib.import_module("shim.linker.stepmemo").remember_steps(True)
    importlib.import_module("shim.config").remember_settings(True)   # and the settings, by identity


_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
# The server takes these synchronously (sigwaitinfo), so they stay blocked in it: a Python
# handler that raises can be lost around fork() (seen here: a SIGTERM during start-up that
# never ran its handler, the server then waiting forever).
_SERVER_SIGNALS = _STOP_SIGNALS | {signal.SIGCHLD}


def _spawn(listener, max_requests, pool, mask):
    """Fork a worker and add it to POOL. The worker inherits the server's blocked signals
    and restores MASK (the mask from before serve) only once it has its own handlers, so a
    SIGTERM sent to it early waits for them instead of being lost."""
    parent = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            busy, stopping = [False], [False]

            def stop(signum, frame):
                if not busy[0]:
                    os._exit(0)
                stopping[0] = True

            signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server stops us with SIGTERM
            signal.signal(signal.SIGTERM, stop)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            _worker(listener, max_requests, parent, busy, stopping)
            status = 0
        except BaseException as err:  # noqa: BLE001 - report, then a fresh worker takes over
            _complain(f"resident worker {os.getpid()} failed: {type(err).__name__}: {err}")
        finally:
            os._exit(status)
    pool.add(pid)


def _stop_workers(listener, pool, grace=10.0):
    """Shut the listening socket down, which ends every worker's accept (EINVAL): idle ones
    exit at once, busy ones after answering. No signal is involved, so none can be lost.
    Workers still there after GRACE seconds get SIGKILL."""
    try:
        listener.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    listener.close()
    deadline = time.monotonic() + grace
    while pool:
        for pid in list(pool):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done == pid:
                pool.discard(pid)
        if pool and time.monotonic() > deadline:
            for pid in pool:
                os.kill(pid, signal.SIGKILL)
            deadline = float("inf")
        if pool:
            time.sleep(0.01)


def serve(path=DEFAULT_SOCKET, ready=None, workers=2, max_requests=10000):
    """Accept requests at PATH until SIGTERM/SIGINT; READY(path) is called once listening.

    WORKERS forked processes accept and serve requests, one at a time each; a worker that
    exits (after MAX_REQUESTS, or crashed) is replaced. Workers are long-lived because a
    fresh fork pays a copy-on-write fault for every page it touches (~500 faults, ~2.5 ms on
    these VMs); a warm worker prepares a container in ~1 ms.
    """
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _SERVER_SIGNALS)
    try:
        warm_up()
        gc.freeze()  # the imported modules stay shared with the workers; the GC never walks them
        listener = _listen(path)
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        raise
    bound = os.stat(path).st_ino
    pool = set()
    try:
        for _ in range(workers):
            _spawn(listener, max_requests, pool, mask)
        if ready:
            ready(path)
        while True:
            # Reap every worker that ended, then wait for the next signal: a worker ending
            # in between leaves SIGCHLD pending, so nothing is missed.
            while pool:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                if pid in pool:
                    pool.discard(pid)
                    if status != 0:
                        _complain(f"resident worker {pid} ended with status {status:#x}; starting another")
                        time.sleep(0.1)  # a worker that dies at once must not make this loop spin
                    _spawn(listener, max_requests, pool, mask)
            if signal.sigwaitinfo(_SERVER_SIGNALS).si_signo in _STOP_SIGNALS:
                break
    finally:
        _stop_workers(listener, pool)
        try:
            if os.stat(path).st_ino == bound:  # not replaced by a newer server
                os.unlink(path)
        except OSError:
            pass
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
