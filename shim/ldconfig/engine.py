"""The C engine's binding (shim._native): its limits and names, errors, and file access
inside a root.

Every path below a root is resolved inside it by the C code (openat2 RESOLVE_IN_ROOT, or an
O_NOFOLLOW walk): nothing is followed out of it. Files are read with a size limit, and
FIFOs, devices and sockets are refused before they are opened for reading.
"""
import os
import posixpath
import stat
import time
from errno import EFBIG, EINVAL

from .._native import ffi, lib

CACHE_PATH = "/etc/ld.so.cache"
CONF_PATH = "/etc/ld.so.conf"
CONF_DIR = "/etc/ld.so.conf.d"
MAX_CACHE_SIZE = 64 << 20          # real caches are well under 2 MiB
MAX_CONF_SIZE = 1 << 20
MAX_INCLUDE_DEPTH = 32
MAX_CONF_FILES = 4096
# Include globs of one plan: directories looked into and names matched. A real image's
# ld.so.conf looks into one or two directories of a few dozen names.
MAX_GLOB_DIRS = 4096
MAX_GLOB_NAMES = 1 << 20
# The runtime's whole linker step (and the update-ldcache hook): milliseconds for a real
# image, ~1 s for a full scan of thousands of libraries on a cold disk.
LINKER_TIME_LIMIT = 10
GENERATOR = "cdi-shim native ld.so.cache engine (glibc 2.36 layout)"

# The toolkit's drop-in names (it adds a random part; ours is fixed, so reruns replace).
DROPIN_COMPAT = "00-compat-cdi-shim.conf"   # enable-cuda-compat's 00-compat-<random>.conf
DROPIN_FIRST = "00-nvcr-cdi-shim.conf"
DROPIN_LAST = "zz-nvcr-cdi-shim.conf"

# machine name -> (ELF machine, multiarch triplet, the host ldconfig's built-in directories)
MACHINES = {
    "x86_64": (lib.CDS_TARGET_X86_64, "x86_64-linux-gnu"),
    "aarch64": (lib.CDS_TARGET_AARCH64, "aarch64-linux-gnu"),
}

FORMATS = {"old": lib.CDS_FORMAT_OLD, "new": lib.CDS_FORMAT_NEW, "compat": lib.CDS_FORMAT_COMPAT}
FORMAT_NAMES = {v: k for k, v in FORMATS.items()}
LINKS = {"ldconfig": lib.CDS_LINKS_LDCONFIG, "existing": lib.CDS_LINKS_EXISTING}

# A plan allocates and frees ~0.5 MiB (listings, string tables, the cache image). By default
# glibc gives freed heap back to the kernel once 128 KiB are free at its top, so every plan
# would fault its pages in again: ~40 page faults and 3 brk calls, 10-25 % of an incremental
# plan on our VMs. The processes that load the engine are ours (the CLI, the runtime, its
# resident workers): let them keep up to 8 MiB of freed heap.
lib.cds_keep_freed_heap(8 << 20)

O_PATH = getattr(os, "O_PATH", 0o10000000)
O_DIRECTORY = os.O_DIRECTORY
O_NOFOLLOW = os.O_NOFOLLOW


class LdcacheError(Exception):
    """A cache or root the engine cannot use; the message says which file and why."""


class LdcacheLimitError(LdcacheError):
    """A bound on the work for one root was reached (a hostile or pathological image): the
    message says which bound and where."""


class Deadline:
    """A wall-clock bound of SECONDS from START (time.monotonic(), default now)."""

    __slots__ = ("seconds", "at")

    def __init__(self, seconds, start=None):
        self.seconds = seconds
        self.at = (time.monotonic() if start is None else start) + seconds

    def check(self, what, path=""):
        """Raise LdcacheLimitError when the time is up; WHAT and PATH say where it was."""
        if time.monotonic() >= self.at:
            raise LdcacheLimitError(f"not done within {self.seconds:g} s (the bound on the linker step), "
                                    f"at {what}{path}")


def os_error(what, err=None):
    err = ffi.errno if err is None else err
    return LdcacheError(f"{what}: {os.strerror(err)}")


def decode_cstr(cstr):
    return os.fsdecode(ffi.string(cstr))


def _kind(mode):
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a regular file"


def read_error(what, err, st, limit):
    """The LdcacheError for cds_read_fd's refusal ERR (ST: what the file was)."""
    if err == EINVAL:
        return LdcacheError(f"{what}: {_kind(st.mode)}, refused")
    if err == EFBIG:
        return LdcacheError(f"{what}: {st.size} bytes, larger than the {limit} allowed")
    return os_error(what, err)


def read_fd(fd, what, limit, with_mtime=False):
    buf = ffi.new("uint8_t **")
    size = ffi.new("size_t *")
    st = ffi.new("struct cds_stat *")
    if lib.cds_read_fd(fd, limit, buf, size, st) != 0:
        raise read_error(what, ffi.errno, st, limit)
    try:
        data = ffi.buffer(buf[0], size[0])[:]
    finally:
        lib.cds_free(buf[0])
    if with_mtime:
        return data, st.mtime_sec * 1000000000 + st.mtime_nsec
    return data


# ---- the tree ----------------------------------------------------------------------

class Root:
    """A directory tree opened once; every path below is resolved inside it."""

    # A list while a memo of whole linker steps records one (stepmemo.py): every Root opened
    # meanwhile, observed unless told not to, joins it and keeps the paths it looks at.
    observers = None

    def __init__(self, root, observed=True):
        self.path = os.fspath(root)
        try:
            self.fd = os.open(self.path, O_PATH | O_DIRECTORY | os.O_CLOEXEC)
        except OSError as err:
            raise LdcacheError(f"cannot open root {self.path}: {err.strerror}") from None
        self._st = ffi.new("struct cds_stat *")
        self._stats = {}
        self._errnos = {}
        self._listings = {}
        self._canonical = {}
        # {(path, follow): None}, in order, of every path looked at, when a memo of whole
        # plans or steps asks (plan.py, stepmemo.py): the files whose identities its answer
        # depends on.
        self.seen = None
        if observed and Root.observers is not None:
            self.seen = {}
            Root.observers.append(self)

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def stat(self, path, follow=True):
        """(mode, dev, ino, mtime_ns) of PATH inside the tree, or None (with .errno).
        Remembered: the tree is taken not to change while it is planned for."""
        key = (path, follow)
        if self.seen is not None:
            self.seen[key] = None
        found = self._stats.get(key, self)
        if found is not self:
            if found is None:
                self.errno = self._errnos[key]
            return found
        st = self._st
        if lib.cds_inroot_stat(self.fd, os.fsencode(path), 1 if follow else 0, st) != 0:
            self.errno = self._errnos[key] = ffi.errno
            self._stats[key] = None
            return None
        found = self._stats[key] = (st.mode, st.dev, st.ino, st.mtime_sec * 1000000000 + st.mtime_nsec)
        return found

    def looked(self):
        """[(path, follow)] of what the memos must check of what was looked at (seen): all but
        the root itself where only stat'ed -- always a directory, and in a container its
        identity is the container's own new upper folder, so a step that looked up a folder
        missing up to / (an image without /lib) would never be kept."""
        if not self.seen:
            return []
        return [key for key in self.seen if key[0] != "/" or "/" in self._listings]

    def open(self, path, flags):
        if self.seen is not None:
            self.seen[(path, not flags & O_NOFOLLOW)] = None
        fd = lib.cds_inroot_open(self.fd, os.fsencode(path), flags)
        if fd < 0:
            self.errno = ffi.errno
        return fd

    def resolved(self, path):
        """PATH with every link on the way followed inside the tree (the kernel's own
        resolution, RESOLVE_IN_ROOT), as the tree names it; None where PATH leads nowhere."""
        fd = self.open(path, O_PATH)
        if fd < 0:
            return None
        try:
            inside, top = os.readlink(f"/proc/self/fd/{fd}"), os.readlink(f"/proc/self/fd/{self.fd}")
        finally:
            os.close(fd)
        if inside == top:
            return "/"
        return inside[len(top):] if inside.startswith(top.rstrip("/") + "/") else None

    def canonical(self, path):
        """PATH (absolute) spelled as the tree holds it: the links of its directories followed
        inside the tree, the missing rest (what a mount will make) and the last name kept as
        written. Two paths that name one place compare equal this way (merged /usr's
        /lib/x86_64-linux-gnu and /usr/lib/x86_64-linux-gnu), which their texts never do."""
        path = posixpath.normpath("/" + path.lstrip("/"))
        if path == "/":
            return path
        parent, name = posixpath.split(path)
        known = self._canonical.get(parent)
        if known is None:
            known = self.resolved(parent)
            if known is None:
                known = self.canonical(parent)
            self._canonical[parent] = known
        return posixpath.join(known, name)

    def place(self, path):
        """Where PATH leads in the tree: resolved() where it exists (runc follows a mount
        destination's links, ldconfig a folder's), canonical() where it does not yet."""
        return self.resolved(path) or self.canonical(path)

    def read(self, path, limit):
        """(bytes, mtime_ns) of a regular file inside the tree; raises OSError/LdcacheError."""
        fd = self.open(path, os.O_RDONLY)
        if fd < 0:
            raise OSError(self.errno, os.strerror(self.errno), path)
        try:
            return read_fd(fd, path, limit, with_mtime=True)
        finally:
            os.close(fd)

    def listdir(self, path, with_stat=False):
        """[(name, d_type)] of a directory inside the tree, or None; with WITH_STAT,
        (listing, stat tuple) from the same open. Remembered, as stat()."""
        found = self._listings.get(path)
        if found is None:
            found = self._listings[path] = self._read_dir(path)
        return found if with_stat else found[0]

    def _read_dir(self, path):
        fd = self.open(path, os.O_RDONLY | O_DIRECTORY)
        if fd < 0:
            return None, None
        try:
            listing = _list_fd(fd)
            st = os.fstat(fd)
            return listing, (st.st_mode, st.st_dev, st.st_ino, st.st_mtime_ns)
        finally:
            os.close(fd)


def _list_fd(fd):
    names = ffi.new("char **")
    types = ffi.new("uint8_t **")
    size = ffi.new("size_t *")
    count = lib.cds_list_dir(fd, names, types, size)
    if count < 0:
        return None
    try:
        raw = ffi.buffer(names[0], size[0])[:].split(b"\0")
        kinds = ffi.buffer(types[0], count)[:]
    finally:
        lib.cds_free(names[0])
        lib.cds_free(types[0])
    return [(os.fsdecode(raw[i]), kinds[i]) for i in range(count)]
