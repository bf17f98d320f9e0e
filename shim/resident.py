"""The resident process: `create`/`run` preparation without an interpreter start per container.

Starting Python costs ~8-12 ms on every GPU container create; the work itself is ~2 ms. The
resident process (`cdi-shim runtime serve`, run by systemd) imports everything once and forks
a child per request, so each create gets a fresh process with the caller's environment,
working directory, umask and stderr, and runs exactly the code the exec'd interpreter would
(`shim.runtime.decide`). The caller, the native front end, then execs runc itself, so runc
keeps containerd's pid, stdio and fds.

Protocol, one request per connection on a unix stream socket (mode 0600 in a 0700 directory):

  front end -> server   b"CDSHIM1\\0", u32 little-endian body length, body; SCM_RIGHTS: stderr
                        body: NUL-terminated fields: version, cwd, umask (octal), argc,
                        argv[1:] (argc fields), then the environment, one field per entry
  server -> front end   b"F": not for me (other version, mount namespace or root): run the
                        interpreter yourself; nothing was touched
                        b"A": accepted, the work starts; then "<status>\\0" and, when status
                        is 0, the argv to exec, NUL-terminated fields

A front end that cannot connect, or reads nothing at all, falls back to the interpreter; one
that got "A" but no status reports the failure (config.json may or may not have been written).
"""
import os
import signal
import socket
import struct
import sys

from cdi import __version__

MAGIC = b"CDSHIM1\0"
MAX_REQUEST = 4 << 20
DEFAULT_SOCKET = "/run/cdi-shim/runtime.sock"
# The modules a create can need, imported once in the server so children start warm.
_WARM_MODULES = ("shim.runtime", "cdi.registry", "cdi.container_edits", "shim.linker",
                 "shim.ldcache", "cdi.spec", "yaml")


class ResidentError(Exception):
    pass


class Request:
    __slots__ = ("version", "cwd", "umask", "argv", "env", "stderr_fd")

    def __init__(self, version, cwd, umask, argv, env, stderr_fd):
        self.version, self.cwd, self.umask = version, cwd, umask
        self.argv, self.env, self.stderr_fd = argv, env, stderr_fd


def parse_request(data, fds):
    """The Request in DATA (header included); raises ResidentError when malformed."""
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 4:
        raise ResidentError("not a cdi-shim request")
    (length,) = struct.unpack_from("<I", data, len(MAGIC))
    body = data[len(MAGIC) + 4:]
    if length != len(body) or not body.endswith(b"\0"):
        raise ResidentError("truncated request")
    if len(fds) != 1:
        raise ResidentError(f"expected the caller's stderr, got {len(fds)} descriptors")
    fields = [os.fsdecode(field) for field in body[:-1].split(b"\0")]
    try:
        version, cwd, umask, argc = fields[0], fields[1], int(fields[2], 8), int(fields[3])
    except (IndexError, ValueError):
        raise ResidentError("malformed request header") from None
    if argc < 0 or len(fields) < 4 + argc:
        raise ResidentError("malformed request argv")
    argv = fields[4:4 + argc]
    env = dict(entry.split("=", 1) for entry in fields[4 + argc:] if "=" in entry)
    return Request(version, cwd, umask, argv, env, fds[0])


def _receive(conn):
    """The raw request bytes and the descriptors that came with them."""
    data, fds = b"", []
    while True:
        chunk, ancillary, _, _ = conn.recvmsg(65536, socket.CMSG_SPACE(4 * 4))
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(struct.unpack(f"{len(payload) // 4}i", payload[:len(payload) - len(payload) % 4]))
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_REQUEST:
            raise ResidentError("request too large")
        if len(data) >= len(MAGIC) + 4:
            (length,) = struct.unpack_from("<I", data, len(MAGIC))
            if len(data) >= len(MAGIC) + 4 + length:
                break
    return data, fds


def _same_place(pid):
    """True when process PID sees the same mount namespace and root as we do, so the paths
    in its request mean the same files here."""
    try:
        if os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt"):
            return False
        theirs, ours = os.stat(f"/proc/{pid}/root"), os.stat("/")
    except OSError:
        return False
    return (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino)


def _peer(conn):
    pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return pid, uid


def _child(conn):
    """Serve one connection in a forked child; never returns."""
    status = 1
    try:
        conn.settimeout(10)
        pid, uid = _peer(conn)
        if uid != os.geteuid():
            os._exit(1)  # the socket's mode keeps others out; never answer them anyway
        data, fds = _receive(conn)
        request = parse_request(data, fds)
        if request.version != __version__ or not _same_place(pid):
            conn.sendall(b"F")
            os._exit(0)
        conn.sendall(b"A")
        os.dup2(request.stderr_fd, 2)
        os.close(request.stderr_fd)
        os.chdir(request.cwd)
        os.umask(request.umask)
        os.environ.clear()
        os.environ.update(request.env)
        from .runtime import decide

        try:
            status, exec_argv = decide(request.argv, f" in resident process {os.getpid()}")
        except Exception:  # noqa: BLE001 - decide has reported it; the caller must fail
            status, exec_argv = 1, None
        sys.stderr.flush()
        reply = b"%d\0" % status
        if status == 0:
            reply += b"".join(os.fsencode(arg) + b"\0" for arg in exec_argv)
        conn.sendall(reply)
        status = 0
    except Exception as err:  # noqa: BLE001 - a child must never return into the accept loop
        try:
            os.write(2, f"cdi-shim: resident request failed: {err}\n".encode())
        except OSError:
            pass
    finally:
        os._exit(status)


def _listen(path):
    """A listening socket at PATH, replacing a stale one atomically; its directory is made
    0700 and must not be writable by others (whoever can write there can impersonate us)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, mode=0o700, exist_ok=True)
    info = os.stat(directory)
    if info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise ResidentError(f"{directory} must be owned by uid {os.geteuid()} and not writable by "
                            f"group or others (mode {info.st_mode & 0o777:o})")
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


def serve(path=DEFAULT_SOCKET, ready=None):
    """Accept requests at PATH until SIGTERM/SIGINT; READY(path) is called once listening."""
    warm_up()
    listener = _listen(path)
    bound = os.stat(path).st_ino
    server = os.getpid()

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if ready:
        ready(path)
    try:
        while True:
            conn, _ = listener.accept()
            sys.stdout.flush()
            sys.stderr.flush()
            if os.fork() == 0:
                try:
                    listener.close()
                    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
                        signal.signal(signum, signal.SIG_DFL)
                    _child(conn)
                finally:
                    os._exit(1)
            conn.close()
    except KeyboardInterrupt:
        pass
    finally:
        if os.getpid() == server:
            listener.close()
            try:
                if os.stat(path).st_ino == bound:  # not replaced by a newer server
                    os.unlink(path)
            except OSError:
                pass
