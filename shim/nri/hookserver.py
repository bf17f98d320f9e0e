"""The NRI plugin's side of its hook (csrc/hooks/nrihook.c): the linker cache, written by the
plugin's own long-running process, so that no interpreter starts per container.

The hook (`cdi-shim-nshook nri`, run by runc in the container's mount namespace after its
mounts) opens the container's rootfs there and sends the descriptor over this unix socket
(SCM_RIGHTS) with "update-ldcache\\0ITEM\\0ITEM\\0...", each ITEM a folder (update-ldcache's
--folder) or "cuda-compat:DRIVER:CUDA" (an enable-cuda-compat hook's host versions), in the
spec's hook order. The descriptor names the rootfs with the container's mounts under it,
whatever this process's mount namespace: the work (cache.py: the compat folder decided as the
runtime decides it, the cache written with the runtime's engine, the compat drop-in first) is
done inside it as in any root (`/proc/self/fd/N`; every path resolved inside, no link followed
out). With `remember` (the plugin's own process, long-lived as the resident worker is) the
engine keeps what it read of library files and whole plans between containers
(ldcache.remember_files, remember_plans): a node starts the same images with the same driver
files again and again. The memo is the process's own, so one container's work is done at a
time. The answer is "ok", or the reason, which
the hook prints and runc shows. Only root (or this process's user) may connect; the socket's
folder is made 0700.
"""
import os
import socket
import stat
import struct
import threading

MAX_REQUEST = 256 << 10
VERB = b"update-ldcache"


class HookServer:
    """Serve the hook at PATH in threads of this process; LOG(level, message)."""

    def __init__(self, path, log, remember=False):
        self.path = path
        self.log = log
        self.sock = None
        self.served = 0
        self.remember = remember
        self._work = threading.Lock()

    def start(self):
        if self.remember:
            from ..ldconfig import ldcache

            ldcache.remember_files(True)
            ldcache.remember_plans(True)
        folder = os.path.dirname(self.path)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        try:
            if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                os.unlink(self.path)        # a stale socket of an earlier run
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old = os.umask(0o177)
        try:
            sock.bind(self.path)
        finally:
            os.umask(old)
        sock.listen(64)
        self.sock = sock
        threading.Thread(target=self._accept, name="nri-hook-server", daemon=True).start()
        return self

    def close(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def _accept(self):
        while self.sock is not None:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        fds = []
        with conn:
            try:
                conn.settimeout(60)
                uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
                if uid not in (0, os.getuid()):
                    conn.sendall(f"nri: uid {uid} may not ask the NRI plugin".encode())
                    return
                data, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 1)
                while len(data) <= MAX_REQUEST:
                    more = conn.recv(MAX_REQUEST)
                    if not more:
                        break
                    data += more
                conn.sendall(self.answer(data, fds).encode())
            except OSError as err:
                self.log("warning", f"the hook's request failed: {err}")
            finally:
                for fd in fds:
                    os.close(fd)

    def answer(self, data, fds):
        """"ok", or what went wrong, for the request DATA with the descriptors FDS."""
        from ..ldconfig.ldcache import LdcacheError
        from ..linker.toolkit_hooks import HookFailure
        from .cache import COMPAT, update

        parts = data.split(b"\0")
        if len(data) > MAX_REQUEST or parts[0] != VERB or parts[-1] != b"" or len(fds) != 1:
            return "nri: a malformed request to the NRI plugin"
        items = []
        for part in (os.fsdecode(part) for part in parts[1:-1]):
            items.append(("compat", part[len(COMPAT):]) if part.startswith(COMPAT) else ("folder", part))
        if not items or not all(value.startswith("/") for kind, value in items if kind == "folder"):
            return "nri: a malformed request to the NRI plugin (folders)"
        if not stat.S_ISDIR(os.fstat(fds[0]).st_mode):
            return "nri: the hook's rootfs is not a folder"
        try:
            with self._work:
                folders, first, alone = update(f"/proc/self/fd/{fds[0]}", items)
        except HookFailure as err:
            return str(err)
        except (LdcacheError, OSError, ValueError) as err:
            return f"update-ldcache: {err}"
        self.served += 1
        try:
            where = os.readlink(f"/proc/self/fd/{fds[0]}")
        except OSError:
            where = "a container's rootfs"
        if folders:
            compat = f"; enable-cuda-compat: {', '.join(first)} first" if first else ""
            self.log("info", f"hook: the linker cache of {where} written ({', '.join(folders)}){compat}")
        if alone:
            self.log("info", f"hook: enable-cuda-compat's drop-in of {where} written ({', '.join(alone)})")
        return "ok"
