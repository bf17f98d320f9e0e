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
(ldcache.Memos, the server's from start() to close()): a node starts the same images with the same driver
files again and again. It keeps whole answers too, by the image's layers (layers.py): the
peer's pid (SO_PEERCRED) names the hook's mount namespace, whose mountinfo gives the rootfs's
overlay layers and the mounts below it; a container whose layers, upper layer and mounts put
the same where the linker reads gets the files of the first without a plan (runc's mount
points make the library folder new in every container's upper layer, so each plan would
rescan it). The memos are the process's own, so one container's work is done at a time.
Each answer's log line says how long it took and whether it was planned or kept. The answer
is "ok", or the reason, which the hook prints and runc shows. Only root (or this process's
user) may connect; the socket's folder is made 0700.
"""
import os
import socket
import stat
import struct
import threading
import time

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
        self.answers = None         # layers.AnswerMemo, with remember
        self.memos = None           # ldcache.Memos, open with remember
        self._unkept = None         # why the last answer was not kept (logged when it changes)
        self._work = threading.Lock()

    def start(self):
        if self.remember:
            from ..ldconfig.ldcache import Memos

            from .layers import AnswerMemo

            self.memos = Memos().open()
            self.answers = AnswerMemo()
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
        if self.memos is not None:
            with self._work:    # (not under an answer's plan)
                self.memos.close()

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
                pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
                if uid not in (0, os.getuid()):
                    conn.sendall(f"nri: uid {uid} may not ask the NRI plugin".encode())
                    return
                data, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 1)
                while len(data) <= MAX_REQUEST:
                    more = conn.recv(MAX_REQUEST)
                    if not more:
                        break
                    data += more
                conn.sendall(self.answer(data, fds, pid).encode())
            except OSError as err:
                self.log("warning", f"the hook's request failed: {err}")
            finally:
                for fd in fds:
                    os.close(fd)

    def answer(self, data, fds, pid=0):
        """"ok", or what went wrong, for the request DATA with the descriptors FDS (from the
        hook process PID, 0: not known)."""
        from ..ldconfig.ldcache import LdcacheError, PlanMemo
        from ..linker.toolkit_hooks import HookFailure
        from .cache import COMPAT

        parts = data.split(b"\0")
        if len(data) > MAX_REQUEST or parts[0] != VERB or parts[-1] != b"" or len(fds) != 1:
            return "nri: a malformed request to the NRI plugin"
        items = []
        for part in (os.fsdecode(part) for part in parts[1:-1]):
            items.append(("compat", part[len(COMPAT):]) if part.startswith(COMPAT) else ("folder", part))
        if not items or not all(value.startswith("/") or not value for kind, value in items if kind == "folder"):
            return "nri: a malformed request to the NRI plugin (folders)"
        if not stat.S_ISDIR(os.fstat(fds[0]).st_mode):
            return "nri: the hook's rootfs is not a folder"
        try:
            with self._work, self.memos.using() if self.memos else PlanMemo.using(None):
                started = time.perf_counter()
                folders, first, alone, kept = self._update(f"/proc/self/fd/{fds[0]}", items, fds[0], pid)
                took = (time.perf_counter() - started) * 1000
        except HookFailure as err:
            return str(err)
        except (LdcacheError, OSError, ValueError) as err:
            return f"update-ldcache: {err}"
        self.served += 1
        try:
            where = os.readlink(f"/proc/self/fd/{fds[0]}")
        except OSError:
            where = "a container's rootfs"
        if folders is not None:
            compat = f"; enable-cuda-compat: {', '.join(first)} first" if first else ""
            kept = ", the answer kept for its image's layers" if kept else ", planned"
            self.log("info", f"hook: the linker cache of {where} written ({', '.join(folders) or 'no folder'}){compat} "
                             f"({took:.1f} ms{kept})")
        if alone:
            self.log("info", f"hook: enable-cuda-compat's drop-in of {where} written ({', '.join(alone)})")
        return "ok"

    def _update(self, rootfs, items, rootfd, pid):
        """cache.update(ROOTFS, ITEMS), the answer kept by the image's layers where the memo is
        on and the hook's namespace accounts for the container (layers.py); and whether the
        answer was a kept one."""
        from .cache import update, work, write
        from .layers import Container, Unaccounted, roots_of

        if self.answers is None or pid <= 0:
            return (*update(rootfs, items, _mounted(pid, rootfd)), False)
        answer = key = container = None
        kept = False
        # (the memo's own failures, a bug included, never fail a container: the work is done)
        try:
            container = Container(pid, rootfd, rootfs)
            key = (tuple(items), container.lower)
            answer = self.answers.recall(key, container)
            kept = answer is not None
        except Unaccounted as why:
            self._not_kept(why)
        except Exception as err:  # noqa: BLE001
            key = None
            self._not_kept(f"unexpected {type(err).__name__}: {err}")
        if answer is None:     # (the mounts read once: the container's, where its layers were)
            answer = work(rootfs, items, [path for path, _ in container.mounts] if container is not None
                          else _mounted(pid, rootfd))
            if key is not None:
                try:   # (the state before anything is written)
                    roots = roots_of(rootfs, items, answer.dirs, answer.first + answer.alone)
                    self.answers.keep(key, roots, container.state(roots), answer)
                except Unaccounted as why:
                    self._not_kept(why)
                except Exception as err:  # noqa: BLE001
                    self._not_kept(f"unexpected {type(err).__name__}: {err}")
        write(rootfs, answer.files, answer.links)
        return answer.folders, answer.first, answer.alone, kept

    def _not_kept(self, why):
        if str(why) != self._unkept:
            self._unkept = str(why)
            self.log("info", f"hook: answers are not kept by the image's layers here ({why})")


def _mounted(pid, rootfd):
    """The container paths of the mounts below the rootfs ROOTFD in the hook PID's namespace (the
    spec's library files among them: their soname links, cache.py); none where unknown."""
    from .layers import Unaccounted, mounts_below

    try:
        return [path for path, _ in mounts_below(pid, rootfd)] if pid > 0 else []
    except Unaccounted:
        return []
