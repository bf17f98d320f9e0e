"""What the last step in a root left there, shared by the resident workers (issue 47).

A plain-folder bundle run again and again (`cdi-shim-runtime --device ... run --bundle B`) keeps
its root: each create finds the files, links and mount points the step before it made, younger
than the settle window. The step memo trusts such a path while it shows the identity our own
step left (stepmemo.trusted). The server's workers take creates in turn, so what one worker's
step left must reach the next worker: each note is also a file in a folder beside the recipes
(``steps/.left/``, 0700, each file 0600, named by the root's device and inode), read back only
when it is a regular file of ours that no one else may write, in such a folder, of this
version, whole (its checksum) and of this very root. Roots on overlayfs (every engine's: a new
mount and an empty upper folder per container) are never reused, and their notes stay in the
worker's memory. At most MAX_NOTES files, the oldest removed.
"""
import os
import stat
import struct

MAGIC = b"cdi-shim left 1\n"
MAX_NOTES = 64
_shared = None       # the folder of the notes, or None (the memory alone)


def share(directory):
    """Keep the notes in DIRECTORY too (None: in memory alone); the resident server's, beside its
    socket's steps folder."""
    global _shared
    _shared = directory


def _name(root):
    from .._native import lib

    text = b"%d:%d" % root
    return f"{lib.cds_fnv1a(text, len(text)):016x}"


OVERLAYFS_MAGIC = 0x794C7630


def _on_overlay(rootfs):
    """True when ROOTFS is an overlayfs mount (statfs's f_type): an engine's container root."""
    from .etcfiles import _fs_type

    return _fs_type(rootfs) == OVERLAYFS_MAGIC


def _private(path):
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o077


def write(root, left, rootfs):
    """Note LEFT ({memo entry: identity bytes}) for ROOT ((device, inode) of ROOTFS) in the shared
    folder; nothing for a root on overlayfs (never reused)."""
    if _shared is None or not left or _on_overlay(rootfs):
        return
    from cdi import __version__
    from cdi.safeio import write_file_atomic

    from .._native import lib

    body = _block(__version__.encode()) + struct.pack("<QQ", *root)
    body += b"".join(_block(entry) + _block(identity) for entry, identity in sorted(left.items()))
    data = MAGIC + body
    data += struct.pack("<Q", lib.cds_fnv1a(data, len(data)))
    name = _name(root)
    try:
        os.makedirs(_shared, mode=0o700, exist_ok=True)
        if not _private(_shared) or not _private(os.path.dirname(_shared)):
            return
        write_file_atomic(os.path.join(_shared, name), data, 0o600, temp_name=f".{name}.{os.getpid()}")
        _prune()
    except OSError:
        return


def read(root):
    """The note for ROOT in the shared folder ({memo entry: identity bytes}), or {}."""
    if _shared is None or not _private(_shared) or not _private(os.path.dirname(_shared)):
        return {}
    try:
        fd = os.open(os.path.join(_shared, _name(root)), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077 \
                or info.st_size > 1 << 20:
            return {}
        data = os.read(fd, info.st_size + 1)
    except OSError:
        return {}
    finally:
        os.close(fd)
    return _parse(data, root)


def _parse(data, root):
    from cdi import __version__

    from .._native import ffi, lib

    size = ffi.sizeof("struct cds_identity")
    if len(data) < len(MAGIC) + 8 or not data.startswith(MAGIC) \
            or struct.unpack("<Q", data[-8:])[0] != lib.cds_fnv1a(data[:-8], len(data) - 8):
        return {}
    at, end = len(MAGIC), len(data) - 8
    try:
        version, at = _take(data, at, end)
        if version != __version__.encode() or struct.unpack_from("<QQ", data, at) != tuple(root):
            return {}
        at += 16
        left = {}
        while at < end:
            entry, at = _take(data, at, end)
            identity, at = _take(data, at, end)
            if len(identity) != size:
                return {}
            left[entry] = identity
    except (ValueError, struct.error):
        return {}
    return left


def _block(data):
    return struct.pack("<I", len(data)) + data


def _take(data, at, end):
    (length,) = struct.unpack_from("<I", data, at)
    if at + 4 + length > end:
        raise ValueError("cut")
    return data[at + 4:at + 4 + length], at + 4 + length


def _prune():
    names = [name for name in os.listdir(_shared) if not name.startswith(".")]
    for name in os.listdir(_shared):    # (a temp file of a writer that is gone)
        pid = name.rsplit(".", 1)[-1] if name.startswith(".") else ""
        if pid.isdigit() and int(pid) != os.getpid() and not os.path.exists(f"/proc/{pid}"):
            _unlink(os.path.join(_shared, name))
    if len(names) <= MAX_NOTES:
        return

    def age(name):
        try:
            return os.stat(os.path.join(_shared, name)).st_mtime_ns
        except OSError:
            return 0
    for name in sorted(names, key=age)[:len(names) - MAX_NOTES]:
        _unlink(os.path.join(_shared, name))


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass
