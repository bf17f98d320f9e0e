"""The resident process: `create`/`run` preparation without an interpreter start per container.

Starting Python costs a GPU container's create several times the work itself. The
resident process (`cdi-shim runtime serve`, run by systemd) imports everything once and forks
a few long-lived workers; a worker serves one request at a time with the caller's
environment, working directory and umask in place (its own cwd and umask restored afterwards;
the environment is made the next caller's in turn) and runs exactly the code the exec'd
interpreter would (`shim.runtime.main.decide`). The caller, the native front end, then execs
runc itself, so runc keeps containerd's pid, stdio and fds.

Protocol, one request per connection on a unix stream socket (mode 0600 in a 0700 directory);
its numbers are csrc/engine/resident.h's, shared with the front end:

  front end -> server   b"CDSHIM3\0", u32 little-endian body length, body; SCM_RIGHTS: the claim
                        body: NUL-terminated fields: version, cwd, umask (octal, at most 777),
                        argc, argv[1:] (argc fields), then the environment, one field per entry
  server -> front end   b"F<server version>\0": not for me (other version or protocol, mount
                        namespace or root): run the interpreter yourself; nothing was touched
                        b"A": claimed, the work starts; then "<status>\0<n>\0", n bytes of the
                        create's messages (its stderr, for the front end to write) and, when
                        status is 0, the argv to exec, NUL-terminated fields

The claim is the read end of a non-blocking pipe holding two bytes, CLAIM then PERMIT. A worker
reads CLAIM before it starts the work and PERMIT before its first write (bundle or rootfs);
the front end reads one byte, whichever is first, before it runs the interpreter instead. A
pipe read is atomic, so a create is never done twice, and no round trip is added: the front end
claims the request back when no worker has answered within CLAIM_WAIT (every worker busy), when
the connection closes or "F" comes, and when the whole answer is not there within ANSWER_WAIT
(a worker that stalls). Whichever byte it got, the worker cannot write: one that finds CLAIM
gone, or PERMIT gone, does nothing more. Only when both are gone (the work has begun writing)
does the front end fail the create instead: config.json may or may not be written.

Accepting and reading requests never holds a worker: each worker reads every connection it
accepted without blocking, within REQUEST_TIMEOUT as a whole (a caller sending a byte at a
time, or none, holds nothing but its descriptor), at most MAX_PENDING at once (the oldest
unfinished one is closed past that); only a complete request takes the worker. The create's
messages go to a memory file, never to the caller's stderr, so a full stderr pipe blocks only
the front end that owns it.
"""
import errno
import gc
import mmap
import os
import select
import signal
import socket
import struct
import sys
import time

from cdi import __version__
from cdi.safeio import private_dir_problem

from .._native import lib

PROTOCOL = lib.CDS_RESIDENT_PROTOCOL
MAGIC = b"CDSHIM%d\0" % PROTOCOL
_MAGIC_STEM = MAGIC[:6]      # another protocol's requests start the same: declined, and said so
MAX_REQUEST = lib.CDS_RESIDENT_MAX_REQUEST
REQUEST_TIMEOUT = lib.CDS_RESIDENT_REQUEST_TIMEOUT_MS / 1000   # seconds, a request's read as a whole
REPLY_TIMEOUT = REQUEST_TIMEOUT                                 # ... and an answer's hand-over
CLAIM_WAIT = lib.CDS_RESIDENT_CLAIM_WAIT_MS / 1000     # the front end's (seconds), for the docs and tests
ANSWER_WAIT = lib.CDS_RESIDENT_ANSWER_WAIT_MS / 1000
MAX_PENDING = lib.CDS_RESIDENT_MAX_PENDING
MAX_MESSAGES = lib.CDS_RESIDENT_MAX_MESSAGES
CLAIM, PERMIT = b"C", b"W"
# The version doctor's probe sends: declined like any other, but not logged as a stale front end.
PROBE_VERSION = "doctor-probe"
DEFAULT_SOCKET = "/run/cdi-shim/runtime.sock"
# The modules a create can need, imported once in the server so its workers start warm.
_WARM_MODULES = ("shim.runtime.main", "cdi.registry", "cdi.container_edits", "shim.linker.container",
                 "shim.ldconfig.ldcache", "shim.linker.stepmemo", "shim.linker.toolkit_hooks", "cdi.spec", "yaml")


class ResidentError(Exception):
    pass


class ForeignRequest(ResidentError):
    """A request of another protocol: declined with b"F" (its front end runs the interpreter)."""

    def __init__(self, version):
        super().__init__(f"a request of another protocol (front end {version})")
        self.version = version


class Request:
    __slots__ = ("version", "cwd", "umask", "argv", "env", "claim_fd")

    def __init__(self, version, cwd, umask, argv, env, claim_fd):
        self.version, self.cwd, self.umask = version, cwd, umask
        self.argv, self.env, self.claim_fd = argv, env, claim_fd


def _foreign_version(data):
    """What a request of another protocol says of its sender: the version field where the
    body starts with it (protocol 2 and ours), else the magic."""
    magic = data[:8].rstrip(b"\0").decode("ascii", "replace")
    version = data[12:12 + 64].split(b"\0", 1)[0].decode("ascii", "replace")
    if version and version.replace(".", "").replace("-", "").replace("+", "").isalnum():
        return f"version {version}, protocol {magic}"
    return f"protocol {magic}"


def parse_request(data, fds):
    """The Request in DATA (header included); raises ResidentError when malformed, ForeignRequest
    when of another protocol."""
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 4:
        if data.startswith(_MAGIC_STEM) and len(data) >= len(MAGIC) and not data.startswith(MAGIC):
            raise ForeignRequest(_foreign_version(data))
        raise ResidentError("not a cdi-shim request")
    (length,) = struct.unpack_from("<I", data, len(MAGIC))
    body = data[len(MAGIC) + 4:]
    if length != len(body) or not body.endswith(b"\0"):
        raise ResidentError("truncated request")
    if len(fds) != 1:
        raise ResidentError(f"expected the caller's claim, got {len(fds)} descriptors")
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
    return Request(version, cwd, umask, argv, env, fds[0])


class _Incoming:
    """One accepted connection whose request is being read, without blocking."""
    __slots__ = ("conn", "pid", "data", "fds", "deadline")

    def __init__(self, conn, pid):
        self.conn, self.pid, self.data, self.fds = conn, pid, bytearray(), []
        self.deadline = time.monotonic() + REQUEST_TIMEOUT

    def read(self):
        """Read what is there: True once the request is whole (or the sender closed); raises
        ResidentError past MAX_REQUEST."""
        while True:
            try:
                chunk, ancillary, _, _ = self.conn.recvmsg(65536, socket.CMSG_SPACE(4 * 4))
            except (BlockingIOError, InterruptedError):
                return False
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    self.fds.extend(struct.unpack(f"{len(payload) // 4}i", payload[:len(payload) - len(payload) % 4]))
            if not chunk:
                return True
            self.data += chunk
            if len(self.data) > MAX_REQUEST:
                raise ResidentError(f"request larger than {MAX_REQUEST} bytes")
            if len(self.data) >= len(MAGIC) + 4:
                (length,) = struct.unpack_from("<I", self.data, len(MAGIC))
                if len(self.data) >= len(MAGIC) + 4 + length:
                    return True

    def drop(self):
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        self.conn.close()


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
    same environment every time, and clearing and refilling it would cost each request more.
    Whatever an earlier caller set and this one did not is removed, so nothing leaks."""
    current = os.environ
    for key in [key for key in current if key not in env]:
        del current[key]
    for key, value in env.items():
        if current.get(key) != value:
            current[key] = value


class _CallerContext:
    """The caller's environment, working directory and umask for one request, with the
    create's stderr going to MESSAGES (a memory file: it never blocks) for the answer; the
    worker's own cwd, umask and stderr are restored afterwards. The environment stays the
    caller's until the next request replaces it (_take_environment): nothing in the worker
    reads it between requests."""

    def __init__(self, request, messages):
        self.request, self.messages, self.text = request, messages, b""

    def __enter__(self):
        """Raises OSError (with the worker's own state back in place) when the caller's
        cannot be set up, e.g. its working directory is gone."""
        request = self.request
        sys.stderr.flush()
        os.chdir(request.cwd)       # first: the step that can fail for the caller's reasons
        self.saved_umask = os.umask(request.umask)
        self.saved_stderr = os.dup(2)
        os.ftruncate(self.messages, 0)
        os.lseek(self.messages, 0, os.SEEK_SET)
        os.dup2(self.messages, 2)
        _take_environment(request.env)
        return self

    def __exit__(self, *exc):
        sys.stderr.flush()
        os.umask(self.saved_umask)
        os.chdir("/")
        os.dup2(self.saved_stderr, 2)
        os.close(self.saved_stderr)
        size = os.fstat(self.messages).st_size
        self.text = os.pread(self.messages, min(size, MAX_MESSAGES), 0)
        if size > MAX_MESSAGES:
            self.text += b"\ncdi-shim: (%d more bytes of messages not shown)\n" % (size - MAX_MESSAGES)
        os.ftruncate(self.messages, 0)


class _Worker:
    """What a worker keeps between requests: its mount namespace and root (_our_place), the
    memory file a create's messages go to, the server's shared record of the last front
    end version declined (so a stale front end is logged once, not once a create), and its
    memos (ldcache.Memos, in use for each create it serves and passed to it; dropped with the
    worker): it lives long, so it stats the host's driver libraries and the files of images seen
    before instead of reading them again for every container, takes a whole plan of an image seen
    before with the same driver files once its paths are found unchanged, and keeps its steps as
    recipes (a create given memos: shim.runtime.main.Create)."""

    def __init__(self, declined):
        from ..ldconfig.ldcache import Memos

        self.place = _our_place()
        self.messages = os.memfd_create("cdi-shim-messages", os.MFD_CLOEXEC)
        self.declined = declined
        self.memos = Memos().open()

    def decline(self, conn, version):
        """Answer b"F": the caller runs the interpreter. VERSION: the front end's, when that is
        why (logged once a server, for each new one), or None."""
        if version is not None and self.declined is not None:
            seen = self.declined[:].rstrip(b"\0")
            said = os.fsencode(version)[:len(self.declined) - 1]
            if seen != said:
                self.declined[:] = said.ljust(len(self.declined), b"\0")
                _complain(f"declined a create from a cdi-shim-runtime front end of {version}; this resident process "
                          f"is version {__version__}: such creates start the interpreter instead (slower) until "
                          "the resident process is restarted with the installed version "
                          "(systemctl restart cdi-shim-resident)")
        conn.sendall(b"F" + os.fsencode(__version__) + b"\0")


def handle(incoming, worker):
    """Serve one whole request (INCOMING, read) with WORKER's state. A request we will not serve is
    answered with b"F" before anything is touched; a malformed one raises ResidentError."""
    from .main import decide

    conn, fds = incoming.conn, incoming.fds
    incoming.fds = []
    conn.setblocking(True)
    conn.settimeout(REPLY_TIMEOUT)
    try:
        request = parse_request(bytes(incoming.data), fds)
    except ForeignRequest as err:
        for fd in fds:
            os.close(fd)
        worker.decline(conn, err.version)
        return
    except ResidentError:
        for fd in fds:
            os.close(fd)
        raise
    try:
        if request.version != __version__:
            worker.decline(conn, None if request.version == PROBE_VERSION else f"version {request.version}")
            return
        if not _same_place(incoming.pid, worker.place):
            worker.decline(conn, None)
            return
        context = _CallerContext(request, worker.messages)
        try:
            context.__enter__()
        except OSError:
            os.chdir("/")
            worker.decline(conn, None)   # nothing touched: the interpreter path will say what is wrong
            return
        try:
            if not _take(request.claim_fd, CLAIM):
                return      # the caller gave up waiting and runs the interpreter: not here
            conn.sendall(b"A")
            try:
                with worker.memos.using():
                    status, exec_argv = decide(request.argv, f" in resident process {os.getpid()}",
                                               commit=lambda: _take(request.claim_fd, PERMIT), memos=worker.memos)
            except Exception:  # noqa: BLE001 - decide has reported it; the caller must fail
                status, exec_argv = 1, None
        finally:
            context.__exit__(None, None, None)
        if status is None:
            _complain(f"resident worker {os.getpid()}: a create was taken back by its caller before anything was "
                      "written (it waited past its bound); nothing done here")
            return
        reply = b"%d\0%d\0" % (status, len(context.text)) + context.text
        if status == 0:
            reply += b"".join(os.fsencode(arg) + b"\0" for arg in exec_argv)
        conn.sendall(reply)
    finally:
        os.close(request.claim_fd)


def _take(fd, byte):
    """Take BYTE from the request's claim pipe FD: True when it was the byte there (CLAIM before
    the work, PERMIT before its first write); False when the caller took it, or the one before
    it, back (it gave up waiting and runs the interpreter itself)."""
    try:
        os.set_blocking(fd, False)      # whatever the caller passed: never wait on it
        return os.read(fd, 1) == byte
    except OSError:
        return False


def _die_with(parent):
    """SIGTERM when PARENT (the server) dies, so no orphaned worker keeps serving its socket."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # it died before the line above
        os._exit(0)


def _accept(listener, incoming, poller):
    """Accept one connection, if one is waiting, into INCOMING; False when the server shut the
    socket down. Connections of other users are closed unanswered (the socket's mode keeps
    them out anyway)."""
    try:
        conn, _ = listener.accept()
    except (BlockingIOError, InterruptedError):
        return True
    except OSError as err:
        if err.errno == errno.EINVAL:
            return False
        if err.errno in (errno.EMFILE, errno.ENFILE) and incoming:
            _drop(min(incoming.values(), key=lambda i: i.deadline), incoming, poller,
                  "out of descriptors: the oldest unfinished request dropped")
            return True
        if err.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
            time.sleep(0.05)     # nothing of ours to free: do not spin on the listener
            return True
        raise
    pid, uid = _peer(conn)
    if uid != os.geteuid():
        conn.close()
        return True
    if len(incoming) >= MAX_PENDING:
        _drop(min(incoming.values(), key=lambda i: i.deadline), incoming, poller,
              f"more than {MAX_PENDING} unfinished requests: the oldest dropped")
    conn.setblocking(False)
    entry = _Incoming(conn, pid)
    incoming[conn.fileno()] = entry
    poller.register(conn.fileno(), select.EPOLLIN)
    return True


def _drop(entry, incoming, poller, why):
    fd = entry.conn.fileno()
    poller.unregister(fd)
    del incoming[fd]
    entry.drop()
    _complain(f"resident request refused: {why}")


def _worker(listener, max_requests, parent, busy, stopping, declined=None):
    """Read requests from every accepted connection at once, without blocking, and serve each
    whole one in turn; exits after MAX_REQUESTS (bounds any leak), on SIGTERM once the request
    in hand is answered (see _spawn), and on any unexpected error (its state is then in doubt;
    the server starts a fresh worker)."""
    _die_with(parent)
    os.chdir("/")
    worker = _Worker(declined)
    incoming = {}
    poller = select.epoll()
    poller.register(listener.fileno(), select.EPOLLIN)
    served = 0
    while served < max_requests and not stopping[0]:
        now = time.monotonic()
        for entry in [entry for entry in incoming.values() if entry.deadline <= now]:
            _drop(entry, incoming, poller, f"request not complete within {REQUEST_TIMEOUT:g} s")
        wait = min(entry.deadline - now for entry in incoming.values()) if incoming else -1
        try:
            events = poller.poll(max(wait, 0.0) if incoming else -1)
        except InterruptedError:
            continue
        for fd, mask in events:
            if fd == listener.fileno():
                # the server shut the socket down (a non-blocking accept would only say EAGAIN)
                if mask & select.EPOLLHUP or not _accept(listener, incoming, poller):
                    return
                continue
            entry = incoming.get(fd)
            if entry is None:
                continue
            try:
                whole = entry.read()
            except (ResidentError, OSError) as err:
                _drop(entry, incoming, poller, str(err))
                continue
            if not whole:
                continue
            poller.unregister(fd)
            del incoming[fd]
            busy[0] = True
            try:
                handle(entry, worker)
            except (ResidentError, OSError) as err:  # this caller's problem, not ours
                _complain(f"resident request refused: {err}")
            finally:
                entry.drop()
            busy[0] = False
            served += 1
            if stopping[0] or served >= max_requests:
                break
    for entry in list(incoming.values()):
        entry.drop()


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
    sock.setblocking(False)     # every worker polls it and reads its connections without blocking
    return sock


def warm_up():
    import importlib

    for name in _WARM_MODULES:
        importlib.import_module(name)
    # (each worker holds its own memos, _Worker.memos, and passes them to each create: that it
    # keeps and replays steps, stepmemo.py, follows from them)


_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
# The server takes these synchronously (sigwaitinfo), so they stay blocked in it: a Python
# handler that raises can be lost around fork() (seen here: a SIGTERM during start-up that
# never ran its handler, the server then waiting forever).
_SERVER_SIGNALS = _STOP_SIGNALS | {signal.SIGCHLD}


def _spawn(listener, max_requests, pool, mask, declined=None):
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
            _worker(listener, max_requests, parent, busy, stopping, declined)
            status = 0
        except BaseException as err:  # noqa: BLE001 - report, then a fresh worker takes over
            _complain(f"resident worker {os.getpid()} failed: {type(err).__name__}: {err}")
        finally:
            os._exit(status)
    pool.add(pid)


def _stop_workers(listener, pool, grace=10.0):
    """Shut the listening socket down, which every worker's poll sees (EPOLLHUP): idle ones
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

    WORKERS forked processes accept connections and read them without blocking, and serve
    whole requests one at a time each; a worker that
    exits (after MAX_REQUESTS, or crashed) is replaced. Workers are long-lived because a
    fresh fork pays a copy-on-write fault for every page it touches, more than a warm worker
    spends preparing a container (docs/fast.md).
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
    declined = mmap.mmap(-1, 128)   # shared with every worker: see _Worker
    try:
        for _ in range(workers):
            _spawn(listener, max_requests, pool, mask, declined)
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
                    _spawn(listener, max_requests, pool, mask, declined)
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
