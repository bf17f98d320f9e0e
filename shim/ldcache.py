"""The container's dynamic-linker cache, computed natively: glibc's ldconfig without ldconfig.

What this module answers: "which /etc/ld.so.cache would ROOT have after the NVIDIA toolkit's
update-ldcache hook ran the host's ldconfig in it with FOLDERS added?" -- and, for libraries
that are not in ROOT yet (host files a container will get as bind mounts), "... once those
files are mounted where the spec puts them". The C library (csrc/: ldcache.c, scan.c, elf.c,
inroot.c) does the format and file work; this module holds the policy: which directories,
in which order, when the image's own cache can be trusted, what is refused.

API (all paths inside ROOT are container paths, resolved inside ROOT; nothing is followed
out of it, nothing is written into it unless a function says so):

    read_cache(source) -> Cache
        Parse a cache from bytes or a host file. Cache.format ("new", "old", "compat"),
        Cache.generator (bytes or None), Cache.entries (list of Entry: soname, path, flags,
        hwcap, hwcaps, isa_level, osversion). Raises LdcacheError on a malformed file.
    read_root_cache(root, path="/etc/ld.so.cache") -> Cache
        The same for the image's cache, read inside ROOT (FIFOs, devices, files over 64 MiB
        and links out of ROOT are refused or stay inside ROOT).
    read_host_bytes(path) / read_root_bytes(root, path) -> bytes
        The raw file, with the same refusals.
    format_listing(cache, name) -> bytes
        Exactly what `ldconfig -p` prints for that cache (NAME as it names the file).
    plan(root, folders=(), extra=None, *, machine=None, mode="auto", links="existing",
         format="new", generator=None) -> Plan
        The cache ROOT would have after the toolkit's update-ldcache with FOLDERS: FOLDERS
        go in a drop-in read where the toolkit's /etc/ld.so.conf.d/00-nvcr-*.conf is (or
        first, if the image's ld.so.conf never reads that directory), folders the image
        already configures stay where they are, the toolkit's zz-nvcr drop-in adds the
        container's system directories, and the host ldconfig's built-in directories come
        last. EXTRA maps container paths to host files that will be bind-mounted there; they
        count as present (hiding what ROOT has at those paths). mode "auto" starts from the
        image's cache when it is valid (it parses, is in ldconfig's order, is no older than
        the configuration files) and uses it as a memo per directory: kept for each
        directory no newer than the cache (and, where it lists nothing of a directory, only
        if that directory has no libraries), scanned again otherwise; extra files are added
        to the entries of the directory they go to (which is scanned again when they hide a
        file of it or share a soname with it); entries of directories no longer configured
        are left out. Without a valid cache, every directory is scanned ("full"). "full" and
        "incremental" force one (incremental raises LdcacheError when it cannot).
        links "existing" names DIR/SONAME only where that name is the library itself (no
        links are created, so the loader must find the file under the name the cache
        gives), "ldconfig" always names DIR/SONAME as ldconfig does (it creates the links).
        Plan.cache (bytes), Plan.mode, Plan.reason (why a full scan), Plan.entries,
        Plan.musl ({container path: bytes} for /etc/ld-musl-<arch>.path on musl images),
        Plan.files (both together), Plan.warnings, Plan.skipped.
    plan_cache(root, folders=(), extra=None, **options) -> bytes
        plan(...).cache.
    write_cache(path, data, sync=False)
        Write a host file atomically (temporary file, rename).
    write_in_root(root, path, data, mode=0o644)
        Write a file inside ROOT atomically, its directory resolved inside ROOT.
    update(root, folders=(), extra=None, output=None, **options) -> Plan
        plan() and write: the cache to OUTPUT (a host path), or into ROOT's
        /etc/ld.so.cache (and a musl image's .path file) when OUTPUT is None.
    remember_files(enabled=True, forget=None, settle=None) / memo_stats()
        For long-lived processes (the resident worker): keep what reading library files
        and listing library directories gave, by stat identity, so that the next plan for
        the same image (or with the same driver files) stats instead of reading -- what
        ldconfig's aux cache does, in memory (csrc/filememo.h).

Emulated: glibc 2.36's ldconfig as Debian 12 builds it (x86-64 and AArch64): ld.so.conf
parsing (include globs, "hwcap" lines, "=libc6" types), glibc-hwcaps subdirectories and the
legacy hwcap subdirectories (tls, x86_64, haswell, ...), the soname/link rules of
search_dir(), ELF classification, entry order, string table and extension layout. Known,
deliberate differences: include loops stop after 32 levels (ldconfig recurses until it
crashes), files ldconfig would crash or hang on (a link to a FIFO, headers past the mapped
end) are skipped, and links are never created or removed.
"""
import os
import stat
from errno import EFBIG as _EFBIG, EINVAL as _EINVAL, ENOENT as _ENOENT

from ._native import ffi, lib

__all__ = [
    "LdcacheError", "Cache", "Entry", "Plan", "read_cache", "read_root_cache", "read_host_bytes",
    "read_root_bytes", "format_listing",
    "plan", "plan_cache", "write_cache", "write_in_root", "update", "MACHINES",
]

CACHE_PATH = "/etc/ld.so.cache"
CONF_PATH = "/etc/ld.so.conf"
CONF_DIR = "/etc/ld.so.conf.d"
MAX_CACHE_SIZE = 64 << 20          # real caches are well under 2 MiB
MAX_CONF_SIZE = 1 << 20
MAX_INCLUDE_DEPTH = 32
MAX_CONF_FILES = 4096
GENERATOR = "cdi-shim native ld.so.cache engine (glibc 2.36 layout)"

# The toolkit's drop-in names (it adds a random part; ours is fixed, so reruns replace).
DROPIN_FIRST = "00-nvcr-cdi-shim.conf"
DROPIN_LAST = "zz-nvcr-cdi-shim.conf"

# machine name -> (ELF machine, multiarch triplet, the host ldconfig's built-in directories)
MACHINES = {
    "x86_64": (lib.CDS_TARGET_X86_64, "x86_64-linux-gnu"),
    "aarch64": (lib.CDS_TARGET_AARCH64, "aarch64-linux-gnu"),
}
_MUSL_ARCH = {"x86_64": ("x86_64", "i386"), "aarch64": ("aarch64", "armhf")}
_MUSL_DEFAULT_PATH = ["/lib", "/usr/local/lib", "/usr/lib"]

_FORMATS = {"old": lib.CDS_FORMAT_OLD, "new": lib.CDS_FORMAT_NEW, "compat": lib.CDS_FORMAT_COMPAT}
_FORMAT_NAMES = {v: k for k, v in _FORMATS.items()}
_LINKS = {"ldconfig": lib.CDS_LINKS_LDCONFIG, "existing": lib.CDS_LINKS_EXISTING}
_LIB_TYPES = {"libc4": 0x0000, "libc5": 0x0002, "libc6": 0x0003, "glibc2": 0x0003}
_DT_REG, _DT_DIR, _DT_LNK, _DT_UNKNOWN = 8, 4, 10, 0
_SPACE = " \t\n\v\f\r"

# A plan allocates and frees ~0.5 MiB (listings, string tables, the cache image). By default
# glibc gives freed heap back to the kernel once 128 KiB are free at its top, so every plan
# would fault its pages in again: ~40 page faults and 3 brk calls, 10-25 % of an incremental
# plan on our VMs. The processes that load the engine are ours (the CLI, the runtime, its
# resident workers): let them keep up to 8 MiB of freed heap.
lib.cds_keep_freed_heap(8 << 20)

_O_PATH = getattr(os, "O_PATH", 0o10000000)
_O_DIRECTORY = os.O_DIRECTORY
_O_NOFOLLOW = os.O_NOFOLLOW


class LdcacheError(Exception):
    """A cache or root the engine cannot use; the message says which file and why."""


def _errno_text(err):
    return os.strerror(err)


def _os_error(what, err=None):
    err = ffi.errno if err is None else err
    return LdcacheError(f"{what}: {_errno_text(err)}")


# ---- caches ------------------------------------------------------------------------

class Entry:
    """One cache entry as stored."""

    __slots__ = ("soname", "path", "flags", "hwcap", "hwcaps", "isa_level", "osversion",
                 "_hwcaps_print")

    def __init__(self, soname, path, flags, hwcap=0, hwcaps=None, isa_level=0, osversion=0):
        self.soname = soname
        self.path = path
        self.flags = flags
        self.hwcap = hwcap
        self.hwcaps = hwcaps
        self.isa_level = isa_level
        self.osversion = osversion
        self._hwcaps_print = hwcaps

    def __repr__(self):
        extra = f", hwcaps={self.hwcaps!r}" if self.hwcaps else (
            f", hwcap={self.hwcap:#x}" if self.hwcap else "")
        return f"Entry({self.soname!r}, {self.path!r}, flags={self.flags:#x}{extra})"

    def __eq__(self, other):
        return isinstance(other, Entry) and all(
            getattr(self, k) == getattr(other, k) for k in self.__slots__[:-1])


class Cache:
    """A parsed ld.so.cache."""

    __slots__ = ("format", "generator", "entries")

    def __init__(self, fmt, generator, entries):
        self.format = fmt
        self.generator = generator
        self.entries = entries

    def __len__(self):
        return len(self.entries)

    def lookup(self, soname):
        """Paths the cache gives for SONAME, in the order the loader tries them."""
        return [e.path for e in self.entries if e.soname == soname]


class _Parsed:
    """Owns a cds_cache."""

    def __init__(self, data):
        out = ffi.new("struct cds_cache **")
        why = ffi.new("const char **")
        if lib.cds_cache_parse(data, len(data), out, why) != 0:
            raise LdcacheError(ffi.string(why[0]).decode() or os.strerror(ffi.errno))
        self.ptr = ffi.gc(out[0], lib.cds_cache_free)

    @classmethod
    def from_fd(cls, fd, what, limit):
        """Read and parse the file open at FD in one step (the bytes are not copied)."""
        out = ffi.new("struct cds_cache **")
        why = ffi.new("const char **")
        st = ffi.new("struct cds_stat *")
        if lib.cds_cache_read_fd(fd, limit, out, why, st) != 0:
            err = ffi.errno
            text = ffi.string(why[0]).decode()
            if text:
                raise LdcacheError(f"{what}: {text}")
            raise _read_error(what, err, st, limit)
        self = cls.__new__(cls)
        self.ptr = ffi.gc(out[0], lib.cds_cache_free)
        return self, st.mtime_sec * 1000000000 + st.mtime_nsec


def _decode(cstr):
    return os.fsdecode(ffi.string(cstr))


def _to_cache(parsed):
    ptr = parsed.ptr
    entries = []
    e = ffi.new("struct cds_cache_entry *")
    for i in range(lib.cds_cache_count(ptr)):
        lib.cds_cache_entry(ptr, i, e)
        hwcaps = _decode(e.hwcaps) if e.hwcaps != ffi.NULL else None
        item = Entry(_decode(e.key), _decode(e.value), e.flags, e.hwcap, hwcaps,
                     (e.hwcap >> 32) & 0x3ff if hwcaps is not None else 0, e.osversion)
        item._hwcaps_print = _decode(e.hwcaps_print) if e.hwcaps_print != ffi.NULL else None
        entries.append(item)
    size = ffi.new("size_t *")
    gen = lib.cds_cache_generator(ptr, size)
    generator = ffi.buffer(gen, size[0])[:] if gen != ffi.NULL else None
    return Cache(_FORMAT_NAMES[lib.cds_cache_format(ptr)], generator, entries)


def read_cache(source):
    """Parse a cache from bytes, or from a host file named by SOURCE."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _to_cache(_Parsed(bytes(source)))
    path = os.fspath(source)
    data = read_host_bytes(path)
    try:
        return _to_cache(_Parsed(data))
    except LdcacheError as err:
        raise LdcacheError(f"{path}: {err}") from None


def read_host_bytes(path, limit=MAX_CACHE_SIZE):
    """The bytes of a host file: a regular file of at most LIMIT bytes, or LdcacheError."""
    path = os.fspath(path)
    fd = lib.cds_open_host(os.fsencode(path))
    if fd < 0:
        raise _os_error(f"cannot open {path}")
    try:
        return _read_fd(fd, path, limit)
    finally:
        os.close(fd)


def read_root_bytes(root, path, limit=MAX_CACHE_SIZE):
    """The bytes of PATH inside ROOT (resolved inside ROOT), or LdcacheError."""
    with _Root(root) as tree:
        try:
            data, _ = tree.read(path, limit)
        except OSError as err:
            raise LdcacheError(f"cannot open {path} in {tree.path}: {err.strerror}") from None
    return data


def read_root_cache(root, path=CACHE_PATH):
    """Parse the cache at PATH inside ROOT (resolved inside ROOT; see read_cache())."""
    data = read_root_bytes(root, path)
    try:
        return _to_cache(_Parsed(data))
    except LdcacheError as err:
        raise LdcacheError(f"{path}: {err}") from None


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


def _read_error(what, err, st, limit):
    """The LdcacheError for cds_read_fd's refusal ERR (ST: what the file was)."""
    if err == _EINVAL:
        return LdcacheError(f"{what}: {_kind(st.mode)}, refused")
    if err == _EFBIG:
        return LdcacheError(f"{what}: {st.size} bytes, larger than the {limit} allowed")
    return _os_error(what, err)


def _read_fd(fd, what, limit, with_mtime=False):
    buf = ffi.new("uint8_t **")
    size = ffi.new("size_t *")
    st = ffi.new("struct cds_stat *")
    if lib.cds_read_fd(fd, limit, buf, size, st) != 0:
        raise _read_error(what, ffi.errno, st, limit)
    try:
        data = ffi.buffer(buf[0], size[0])[:]
    finally:
        lib.cds_free(buf[0])
    if with_mtime:
        return data, st.mtime_sec * 1000000000 + st.mtime_nsec
    return data


_FLAG_TYPES = {0: b"libc4", 1: b"ELF", 2: b"libc5", 3: b"libc6"}
_FLAG_REQUIRED = {
    0x0000: b"", 0x0100: b",64bit", 0x0200: b",IA-64", 0x0300: b",x86-64", 0x0400: b",64bit",
    0x0500: b",64bit", 0x0600: b",N32", 0x0700: b",64bit", 0x0800: b",x32",
    0x0900: b",hard-float", 0x0a00: b",AArch64", 0x0b00: b",soft-float", 0x0c00: b",nan2008",
    0x0d00: b",N32,nan2008", 0x0e00: b",64bit,nan2008", 0x0f00: b",soft-float",
    0x1000: b",double-float",        # glibc 2.36 has no names for LoongArch's 0x1100, 0x1200
}


def format_listing(cache, name):
    """What `ldconfig -p` prints for CACHE, naming the file NAME."""
    fs = os.fsencode
    out = [b"%d libs found in cache `%s'\n" % (len(cache.entries), fs(name))]
    for e in cache.entries:
        flags = e.flags & 0xffffffff
        kind = _FLAG_TYPES.get(flags & 0xff, b"unknown")
        required = _FLAG_REQUIRED.get(flags & 0xff00)
        if required is None:
            required = b",%d" % (flags & 0xff00)
        if e._hwcaps_print is not None:
            hw = b', hwcap: "%s"' % fs(e._hwcaps_print)
        elif e.hwcap:
            hw = b", hwcap: 0x%016x" % e.hwcap
        else:
            hw = b""
        out.append(b"\t%s (%s%s%s) => %s\n" % (fs(e.soname), kind, required, hw, fs(e.path)))
    if cache.generator is not None:
        out.append(b"Cache generated by: " + cache.generator + b"\n")
    return b"".join(out)


# ---- the tree ----------------------------------------------------------------------

class _Root:
    """A directory tree opened once; every path below is resolved inside it."""

    def __init__(self, root):
        self.path = os.fspath(root)
        try:
            self.fd = os.open(self.path, _O_PATH | _O_DIRECTORY | os.O_CLOEXEC)
        except OSError as err:
            raise LdcacheError(f"cannot open root {self.path}: {err.strerror}") from None
        self._st = ffi.new("struct cds_stat *")
        self._stats = {}
        self._errnos = {}
        self._listings = {}

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

    def open(self, path, flags):
        fd = lib.cds_inroot_open(self.fd, os.fsencode(path), flags)
        if fd < 0:
            self.errno = ffi.errno
        return fd

    def read(self, path, limit):
        """(bytes, mtime_ns) of a regular file inside the tree; raises OSError/LdcacheError."""
        fd = self.open(path, os.O_RDONLY)
        if fd < 0:
            raise OSError(self.errno, os.strerror(self.errno), path)
        try:
            return _read_fd(fd, path, limit, with_mtime=True)
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
        fd = self.open(path, os.O_RDONLY | _O_DIRECTORY)
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


_HOST_MACHINE = os.uname().machine


def _machine(machine):
    machine = machine or _HOST_MACHINE
    if machine not in MACHINES:
        raise LdcacheError(f"unsupported machine {machine!r} (known: {', '.join(MACHINES)})")
    return machine


def _builtin_dirs(machine):
    """The host ldconfig's own directories (Debian's glibc 2.36: multiarch, then plain)."""
    triplet = MACHINES[machine][1]
    return [f"/lib/{triplet}", f"/usr/lib/{triplet}", "/lib", "/usr/lib"]


def _container_system_dirs(root, machine):
    """The toolkit's zz-nvcr directories: by the container's flavour."""
    st = root.stat("/etc/debian_version")
    if st is not None and not stat.S_ISDIR(st[0]):
        return _builtin_dirs(machine)
    if machine == "x86_64":
        return ["/lib", "/usr/lib", "/lib64", "/usr/lib64", "/libx32", "/usr/libx32"]
    return ["/lib", "/usr/lib", "/lib64", "/usr/lib64"]


# ---- glob, the way glibc's glob(3) does it for ldconfig's include lines ------------

def _has_meta(text):
    return "*" in text or "?" in text or "[" in text


def _match_class(pattern, i, ch):
    """Match CH against the bracket expression at PATTERN[i] ('['); (matched, next index)
    or None when the bracket is not closed (then '[' is literal)."""
    j = i + 1
    negate = j < len(pattern) and pattern[j] in "!^"
    if negate:
        j += 1
    matched = False
    first = True
    while j < len(pattern) and (first or pattern[j] != "]"):
        first = False
        lo = pattern[j]
        if lo == "\\" and j + 1 < len(pattern):
            j += 1
            lo = pattern[j]
        if j + 2 < len(pattern) and pattern[j + 1] == "-" and pattern[j + 2] != "]":
            hi = pattern[j + 2]
            if lo <= ch <= hi:
                matched = True
            j += 3
        else:
            if ch == lo:
                matched = True
            j += 1
    if j >= len(pattern):
        return None
    return matched != negate, j + 1


def _fnmatch(pattern, name):
    """fnmatch(3) with FNM_PERIOD semantics for one path component."""
    if name.startswith(".") and not pattern.startswith("."):
        return False
    if pattern.startswith("*") and not _has_meta(pattern[1:]) and "\\" not in pattern:
        return name.endswith(pattern[1:])           # the common "*.conf"
    p = n = 0
    star_p = star_n = -1
    while n < len(name):
        if p < len(pattern):
            c = pattern[p]
            if c == "*":
                star_p, star_n = p, n
                p += 1
                continue
            if c == "?":
                p += 1
                n += 1
                continue
            if c == "[":
                res = _match_class(pattern, p, name[n])
                if res is not None:
                    if res[0]:
                        p = res[1]
                        n += 1
                        continue
                elif name[n] == "[":
                    p += 1
                    n += 1
                    continue
            else:
                if c == "\\" and p + 1 < len(pattern):
                    p += 1
                    c = pattern[p]
                if c == name[n]:
                    p += 1
                    n += 1
                    continue
        if star_p >= 0:
            p = star_p + 1
            star_n += 1
            n = star_n
            continue
        return False
    while p < len(pattern) and pattern[p] == "*":
        p += 1
    return p == len(pattern)


def _join(directory, name):
    if directory == "":
        return name
    if directory.endswith("/"):
        return directory + name
    return directory + "/" + name


# ---- the directory list ------------------------------------------------------------

class _Dir:
    __slots__ = ("path", "flag", "ident", "hwcaps", "real", "mtime", "base")

    def __init__(self, path, flag, ident, hwcaps=None, real=True, mtime=0, base=None):
        self.path = path            # as the configuration spells it (and the cache will)
        self.flag = flag            # "=libc6" type, -1 for none
        self.ident = ident          # see _Extras
        self.hwcaps = hwcaps        # glibc-hwcaps subdirectory name
        self.real = real            # exists in the tree (else only through extras)
        self.mtime = mtime
        self.base = base if base is not None else ident   # the directory it belongs to


class _Extras:
    """Host files to be bind-mounted into the tree: where each will appear.

    Directory identities: ("d", dev, ino) for a directory of the tree, ("v", dev, ino, rest)
    for one that exists only once the mounts are made (REST below the deepest existing one).
    """

    def __init__(self, root, extra):
        self.by_dir = {}            # directory identity -> [(name, host path)]
        self.children = {}          # directory identity -> {names of virtual subdirectories}
        self.paths = {}             # directory identity -> its path as the extras name it
        self._root = root
        self._located = {}          # driver files come 30 to a directory: locate it once
        for container_path, host_path in (extra or {}).items():
            container_path = os.fspath(container_path)
            host_path = os.fspath(host_path)
            if "\0" in container_path or "\0" in host_path:
                raise LdcacheError(f"extra library path {container_path!r} has a NUL byte")
            directory, _, name = container_path.rpartition("/")
            ident = self._located.get(directory)
            if ident is None or name in ("", ".", ".."):
                ident, name = self._place(container_path)
            self.by_dir.setdefault(ident, []).append((name, host_path))

    def _place(self, container_path):
        """(directory identity, name) of an extra's path (normalized, checked), and the
        directory noted with its virtual parents."""
        if not container_path.startswith("/"):
            raise LdcacheError(f"extra library path {container_path!r} is not absolute")
        parts = [p for p in container_path.split("/") if p not in ("", ".")]
        if not parts or ".." in parts:
            raise LdcacheError(f"extra library path {container_path!r} is not a file path")
        ident = _locate(self._root, parts[:-1])
        if container_path.endswith("/" + parts[-1]):
            self._located[container_path[:-len(parts[-1]) - 1]] = ident
        self.paths.setdefault(ident, "/" + "/".join(parts[:-1]))
        child = ident
        while child[0] == "v":
            rest = child[3]
            parent = ("d",) + child[1:3] if len(rest) == 1 else child[:3] + (rest[:-1],)
            self.children.setdefault(parent, set()).add(rest[-1])
            child = parent
        return ident, parts[-1]

    def exists(self, ident):
        return ident in self.by_dir or ident in self.children

    def packed(self, ident):
        """(b"name\\0host\\0...", count) of the files going to directory IDENT."""
        files = self.by_dir.get(ident, ())
        if not files:
            return b"", 0
        text = "\0".join(f"{name}\0{host}" for name, host in files) + "\0"
        return os.fsencode(text), len(files)


def _parts(path):
    """Components of PATH, or None when it climbs ("..": not a place a mount creates)."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    return None if ".." in parts else parts


def _child(ident, name):
    return ("v",) + ident[1:3] + ((name,) if ident[0] == "d" else ident[3] + (name,),)


def _locate(root, parts):
    """Identity of the directory PARTS (components from /), see _Extras."""
    for i in range(len(parts), -1, -1):
        st = root.stat("/" + "/".join(parts[:i]))
        if st is not None and stat.S_ISDIR(st[0]):
            if i == len(parts):
                return ("d", st[1], st[2])
            return ("v", st[1], st[2], tuple(parts[i:]))
    raise LdcacheError("the root is not a directory")


def _dir_text(line):
    """A directory line as ldconfig keeps it: no type, no trailing blanks or slashes."""
    return line.split("=", 1)[0].rstrip(_SPACE).rstrip("/")


class _Config:
    """ldconfig's directory list for a root: its conf files with the toolkit's drop-ins,
    then the host ldconfig's built-in directories."""

    def __init__(self, root, machine, folders, extras):
        self.root = root
        self.machine = machine
        self.target = MACHINES[machine][0]
        self.extras = extras
        self.dirs = []
        self.by_ident = {}
        self.hwcaps_names = set()
        self.warnings = []
        self.conf_mtime = 0         # newest configuration file read
        self._items = []            # ("dir", line) and ("dropin", name), in ldconfig's order
        self._files_read = 0
        _, conf_d = root.listdir(CONF_DIR, with_stat=True)     # listed again for its includes
        self._conf_d_ident = ("d", conf_d[1], conf_d[2]) if conf_d is not None else None
        if not self._parse_conf(CONF_PATH, 0):
            # The toolkit writes a minimal ld.so.conf where there is none.
            self._parse_lines(b"include /etc/ld.so.conf.d/*.conf\n", CONF_PATH, 0)

        # The toolkit's drop-ins: folders not configured yet, and the container's system
        # directories (its "zz" file).
        system = _container_system_dirs(root, machine)
        configured = {_dir_text(line) for kind, line in self._items if kind == "dir"}
        configured.update(system)
        first = []
        for folder in folders:
            if folder not in configured and folder not in first:
                first.append(folder)
        self.dropins = {DROPIN_FIRST: first, DROPIN_LAST: system}

    def build(self):
        items = self._items
        if not any(kind == "dropin" for kind, _ in items):
            # The image never reads ld.so.conf.d: the folders go first all the same.
            items = [("dropin", DROPIN_FIRST)] + items + [("dropin", DROPIN_LAST)]
        for kind, value in items:
            if kind == "dir":
                self._add_dir(value)
            else:
                for line in self.dropins[value]:
                    self._add_dir(line)
        for d in _builtin_dirs(self.machine):
            self._add_dir(d)
        return self

    def _parse_conf(self, filename, depth):
        if depth > MAX_INCLUDE_DEPTH:
            self.warnings.append(
                f"{filename}: includes nested deeper than {MAX_INCLUDE_DEPTH}, ignored")
            return True
        if self._files_read >= MAX_CONF_FILES:
            self.warnings.append(
                f"{filename}: more than {MAX_CONF_FILES} configuration files, ignored")
            return True
        self._files_read += 1
        try:
            data, mtime = self.root.read(filename, MAX_CONF_SIZE)
        except OSError as err:
            if err.errno != _ENOENT:
                self.warnings.append(f"ignoring configuration file {filename}: {err.strerror}")
                return True
            return False
        except LdcacheError as err:
            self.warnings.append(f"ignoring configuration file {err}")
            return True
        if mtime > self.conf_mtime:
            self.conf_mtime = mtime
        self._parse_lines(data, filename, depth)
        return True

    def _parse_lines(self, data, filename, depth):
        for raw in data.split(b"\n"):
            line = os.fsdecode(raw.split(b"\0", 1)[0].split(b"#", 1)[0])
            cp = line.lstrip(_SPACE)
            if not cp:
                continue
            if cp.startswith("include") and len(cp) > 7 and cp[7] in " \t":
                for word in cp[8:].replace("\t", " ").split(" "):
                    if word:
                        self._include(filename, word, depth)
            elif cp[:5].lower() == "hwcap" and len(cp) > 5 and cp[5] in " \t":
                self.warnings.append(f"{filename}: hwcap directive ignored")
            else:
                self._items.append(("dir", cp))

    def _include(self, config_file, pattern, depth):
        if not pattern.startswith("/") and "/" in config_file:
            pattern = os.path.dirname(config_file) + "/" + pattern
        for path, dropin in self._glob(pattern):
            if dropin:
                self._items.append(("dropin", dropin))
            else:
                self._parse_conf(path, depth + 1)

    def _glob(self, pattern):
        """[(path, drop-in name or None)] matching PATTERN inside the tree, sorted."""
        cut = pattern.rfind("/")
        if cut < 0:
            dirname, fpat = "", pattern
        else:
            dirname, fpat = pattern[:cut] or "/", pattern[cut + 1:]
        if not fpat:
            return []
        if _has_meta(dirname):
            dirs = []
            for d, _ in self._glob(dirname):
                st = self.root.stat(d)
                if st is not None and stat.S_ISDIR(st[0]):
                    dirs.append(d)
        else:
            dirs = [dirname]
        out = []
        for d in dirs:
            names, virtual = self._conf_listing(d)
            if not _has_meta(fpat):
                if fpat in virtual:
                    out.append((_join(d, fpat), fpat))
                elif self.root.stat(_join(d, fpat), follow=False) is not None:
                    out.append((_join(d, fpat), None))
                continue
            for name in names:
                if _fnmatch(fpat, name):
                    out.append((_join(d, name), name if name in virtual else None))
        out.sort(key=lambda item: os.fsencode(item[0]))
        return out

    def _conf_listing(self, directory):
        """Names in DIRECTORY, with the toolkit's drop-ins when it is ld.so.conf.d."""
        listing, st = self.root.listdir(directory or "/", with_stat=True)
        names = [n for n, _ in listing] if listing is not None else []
        if st is None:
            st = self.root.stat(directory or "/")
        if st is not None:
            is_conf_d = ("d", st[1], st[2]) == self._conf_d_ident
        else:
            # The toolkit creates the directory.
            is_conf_d = self._conf_d_ident is None and \
                os.path.normpath("/" + directory) == CONF_DIR
        if not is_conf_d:
            return names, ()
        virtual = (DROPIN_FIRST, DROPIN_LAST)
        return [n for n in names if n not in virtual] + list(virtual), virtual

    def _add_dir(self, line):
        flag = -1
        if "=" in line:
            line, kind = line.split("=", 1)
            flag = _LIB_TYPES.get(kind, -1)
            if flag == -1:
                self.warnings.append(f"{kind} is not a known library type")
        path = _dir_text(line)
        if not path:
            return
        st = self.root.stat(path)
        if st is not None:
            d = _Dir(path, flag, ("d", st[1], st[2]), real=stat.S_ISDIR(st[0]),
                     mtime=st[3] if stat.S_ISDIR(st[0]) else 0)
        else:
            parts = _parts(path) if self.extras.children else None
            if parts is None:
                return
            ident = _locate(self.root, parts)
            if ident[0] != "v" or not self.extras.exists(ident):
                return
            d = _Dir(path, flag, ident, real=False)
        if self._add_single(d):
            self._add_hwcaps_subdirs(d)

    def _add_single(self, d):
        at = self.by_ident.get(d.ident)
        if at is not None:
            self.dirs[at].flag = d.flag     # "Use the newer information"
            return False
        self.by_ident[d.ident] = len(self.dirs)
        self.dirs.append(d)
        return True

    def _add_hwcaps_subdirs(self, d):
        sub = d.path + "/glibc-hwcaps"
        names = []
        sub_ident = None
        if d.real:
            listing = self.root.listdir(sub)
            if listing is not None:
                names = listing
                st = self.root.stat(sub)
                if st is not None:
                    sub_ident = ("d", st[1], st[2])
                    if st[3] > d.mtime:
                        d.mtime = st[3]     # a new subdirectory there is a change of D
            elif self.extras.children:
                sub_ident = _child(d.ident, "glibc-hwcaps")
        else:
            sub_ident = _child(d.ident, "glibc-hwcaps")
        if sub_ident is not None and sub_ident in self.extras.children:
            known = {n for n, _ in names}
            names = list(names) + [(c, _DT_DIR) for c in sorted(self.extras.children[sub_ident])
                                   if c not in known]
        for name, dtype in names:
            if name.startswith(".") or dtype == _DT_REG or ":" in name:
                continue
            path = sub + "/" + name
            st = self.root.stat(path)
            if st is not None:
                if not stat.S_ISDIR(st[0]):
                    continue
                ident, real, mtime = ("d", st[1], st[2]), True, st[3]
            else:
                if sub_ident is None:
                    continue
                ident, real, mtime = _child(sub_ident, name), False, 0
                if not self.extras.exists(ident):
                    continue
            self.hwcaps_names.add(name)
            self._add_single(_Dir(d.path + "/glibc-hwcaps/" + name, d.flag, ident, name, real,
                                  mtime, base=d.ident))


# ---- planning ----------------------------------------------------------------------

class Plan:
    """What plan() computed."""

    __slots__ = ("cache", "mode", "reason", "entries", "musl", "warnings", "skipped", "dirs")

    def __init__(self):
        self.cache = b""
        self.mode = ""
        self.reason = ""
        self.entries = 0
        self.musl = {}
        self.warnings = []
        self.skipped = []
        self.dirs = []

    @property
    def files(self):
        files = {CACHE_PATH: self.cache}
        files.update(self.musl)
        return files


class _Builder:
    def __init__(self, target):
        self.keep = None
        self.ptr = ffi.gc(lib.cds_builder_new(target), lib.cds_builder_free)
        if self.ptr == ffi.NULL:
            raise MemoryError("cds_builder_new")

    def build(self, fmt, generator):
        out = ffi.new("uint8_t **")
        size = ffi.new("size_t *")
        gen = os.fsencode(generator) if generator is not None else ffi.NULL
        if lib.cds_builder_build(self.ptr, fmt, gen, out, size) != 0:
            raise _os_error("cannot lay out the cache")
        try:
            return ffi.buffer(out[0], size[0])[:]
        finally:
            lib.cds_free(out[0])


class _Scanner:
    """Runs the C directory scan over _Config's list, appending legacy subdirectories."""

    def __init__(self, root, config, builder, links, plan):
        self.root = root
        self.config = config
        self.builder = builder
        self.links = links
        self.plan = plan
        self.opts = ffi.new("struct cds_scan_opts *")
        self.opts.target = config.target
        self.opts.links = links

    def scan(self, index, extras_only=False):
        """Scan directory INDEX (with its extras) and add its libraries; with EXTRAS_ONLY,
        read just the extras and return the scan without adding it (see add())."""
        config = self.config
        d = config.dirs[index]
        packed, count = config.extras.packed(d.ident)
        dirfd = -1
        if d.real:
            dirfd = self.root.open(d.path, os.O_RDONLY | _O_DIRECTORY)
            if dirfd < 0 and not count:
                return None
        opts = self.opts
        opts.in_hwcaps = 1 if d.hwcaps is not None else 0
        opts.dir_flag = d.flag
        opts.extras_only = 1 if extras_only else 0
        out = ffi.new("struct cds_scan **")
        try:
            rc = lib.cds_scan_dir(self.root.fd, os.fsencode(d.path), dirfd, packed, len(packed),
                                  count, opts, out)
        finally:
            if dirfd >= 0:
                os.close(dirfd)
        if rc != 0:
            raise _os_error(f"cannot read {d.path}")
        scan = ffi.gc(out[0], lib.cds_scan_free)
        if extras_only:
            return scan
        self.add(index, scan)
        if d.hwcaps is None:
            name = ffi.new("const char **")
            dev = ffi.new("uint64_t *")
            ino = ffi.new("uint64_t *")
            for i in range(lib.cds_scan_subdir_count(scan)):
                lib.cds_scan_subdir(scan, i, name, dev, ino)
                config._add_single(_Dir(d.path + "/" + _decode(name[0]), d.flag,
                                        ("d", dev[0], ino[0])))
            self.add_virtual_subdirs(index)
        return scan

    def add(self, index, scan):
        """Add a scan's libraries as directory INDEX's."""
        config = self.config
        d = config.dirs[index]
        path = os.fsencode(d.path)
        hwcap = 0 if d.hwcaps is not None else lib.cds_path_hwcap(config.target, path)
        hwcaps = os.fsencode(d.hwcaps) if d.hwcaps is not None else ffi.NULL
        if lib.cds_builder_add_scan(self.builder.ptr, scan, path, index, hwcaps, hwcap,
                                    self.links) != 0:
            raise _os_error("cannot add entries")
        skip = ffi.new("struct cds_skip *")
        for i in range(lib.cds_scan_skip_count(scan)):
            lib.cds_scan_skip(scan, i, skip)
            status = skip.status
            why = (os.strerror(-status) if status < 0
                   else ffi.string(lib.cds_elf_status_text(status)).decode())
            self.plan.skipped.append((_join(d.path, _decode(skip.name)), why))

    def add_virtual_subdirs(self, index):
        """Legacy hwcap subdirectories of directory INDEX that only the extras will create."""
        config = self.config
        d = config.dirs[index]
        for child in sorted(config.extras.children.get(d.ident, ())):
            if lib.cds_is_hwcap_subdir(config.target, os.fsencode(child)):
                sub = _child(d.ident, child)
                if sub not in config.by_ident and self.root.stat(d.path + "/" + child) is None:
                    config._add_single(_Dir(d.path + "/" + child, d.flag, sub, real=False))


def _read_image_cache(root):
    """(parsed, mtime_ns) of ROOT's /etc/ld.so.cache, or (None, reason)."""
    fd = root.open(CACHE_PATH, os.O_RDONLY)
    if fd < 0:
        return None, f"{CACHE_PATH}: {os.strerror(root.errno)}"
    try:
        return _Parsed.from_fd(fd, CACHE_PATH, MAX_CACHE_SIZE)
    except LdcacheError as err:
        return None, str(err)
    finally:
        os.close(fd)


def _is_musl(root, machine):
    native = _MUSL_ARCH[machine][0]
    for path in (f"/lib/ld-musl-{native}.so.1", "/etc/alpine-release"):
        st = root.stat(path)
        if st is not None and not stat.S_ISDIR(st[0]):
            return True
    return False


def _plan_musl(root, machine, folders, extras):
    native, compat32 = _MUSL_ARCH[machine]
    path = f"/etc/ld-musl-{native}.path"
    try:
        data, _ = root.read(path, MAX_CONF_SIZE)
        existing = [p for p in os.fsdecode(data).replace("\n", ":").split(":") if p]
    except OSError as err:
        if err.errno != _ENOENT:
            raise LdcacheError(f"{path}: {err.strerror}") from None
        existing = list(_MUSL_DEFAULT_PATH)
    dirs = [f for f in folders if f not in existing]
    dirs = list(dict.fromkeys(dirs))
    return {path: ("\n".join(dirs + existing) + "\n").encode()}


def plan(root, folders=(), extra=None, *, machine=None, mode="auto", links="existing",
         format="new", generator=None):
    """The cache ROOT would have after the toolkit's update-ldcache with FOLDERS (and EXTRA
    files mounted). See the module docstring."""
    machine = _machine(machine)
    if mode not in ("auto", "full", "incremental"):
        raise ValueError(f"mode must be auto, full or incremental, not {mode!r}")
    if links not in _LINKS:
        raise ValueError(f"links must be one of {', '.join(_LINKS)}, not {links!r}")
    if format not in _FORMATS:
        raise ValueError(f"format must be one of {', '.join(_FORMATS)}, not {format!r}")
    folders = [os.fspath(f) for f in folders]
    result = Plan()
    with _Root(root) as tree:
        extras = _Extras(tree, extra)
        config = _Config(tree, machine, folders, extras).build()
        target = config.target
        result.warnings = config.warnings
        builder = _Builder(target)
        scanner = _Scanner(tree, config, builder, _LINKS[links], result)

        reason = ""
        if mode != "full":
            reason = _incremental(tree, config, builder, scanner, folders, extras)
            if reason and mode == "incremental":
                raise LdcacheError(f"incremental update impossible: {reason}")
        if mode == "full" or reason:
            builder = _Builder(target)
            scanner.builder = builder
            result.skipped = []
            i = 0
            while i < len(config.dirs):
                scanner.scan(i)
                i += 1
            result.mode = "full"
            result.reason = reason or "full scan requested"
        else:
            result.mode = "incremental"
        for name in sorted(config.hwcaps_names):
            lib.cds_builder_intern(builder.ptr, os.fsencode(name))
        result.entries = lib.cds_builder_count(builder.ptr)
        result.cache = builder.build(_FORMATS[format],
                                     GENERATOR if generator is None else generator)
        result.dirs = [d.path for d in config.dirs]
        if _is_musl(tree, machine):
            result.musl = _plan_musl(tree, machine, folders, extras)
    return result


def _cache_dirs(ptr):
    """[(directory, entries)] of a parsed cache, in order of first appearance."""
    names = ffi.new("char **")
    counts = ffi.new("uint32_t **")
    size = ffi.new("size_t *")
    n = lib.cds_cache_dirs(ptr, names, counts, size)
    if n < 0:
        raise MemoryError("cds_cache_dirs")
    try:
        raw = ffi.buffer(names[0], size[0])[:].split(b"\0")
        return [(os.fsdecode(raw[i]), counts[0][i]) for i in range(n)]
    finally:
        lib.cds_free(names[0])
        lib.cds_free(counts[0])


def _legacy_parent(config, path):
    """The configured directory PATH is a legacy hwcap subdirectory of (tls, x86_64, ...),
    with the components below it; or (None, None)."""
    best = None
    for d in config.dirs:
        if d.hwcaps is None and path.startswith(d.path + "/") and \
                (best is None or len(d.path) > len(best.path)):
            best = d
    if best is None:
        return None, None
    rest = path[len(best.path) + 1:].split("/")
    if all(part and lib.cds_is_hwcap_subdir(config.target, os.fsencode(part)) for part in rest):
        return best, rest
    return None, None


def _is_dso_name(name):
    """glibc's _dl_is_dso(): lib*.so*, ld-*.so*, ld.so.*, ld64.so.*."""
    return ((name.startswith("lib") or name.startswith("ld-")) and ".so" in name) \
        or name.startswith("ld.so.") or name.startswith("ld64.so.")


def _overlaps(scan, ptr, path, target):
    """Whether a scan of extras has a soname the cache already has in directory PATH."""
    lib_ = ffi.new("struct cds_dlib *")
    directory = os.fsencode(path)
    for i in range(lib.cds_scan_count(scan)):
        lib.cds_scan_lib(scan, i, lib_)
        if lib.cds_cache_has(ptr, lib_.soname, directory, target):
            return True
    return False


def _incremental(tree, config, builder, scanner, folders, extras):
    """Fill BUILDER from the image's cache plus rescans; '' on success, else why not.

    The image's cache is used when it parses, is in ldconfig's order and is no older than the
    configuration files. It then stands for each configured directory that is no newer than
    it (and, where it lists nothing of a directory, that directory has no libraries); the
    other directories are scanned again where they are in the list, extra files are added
    to the entries of the directory they go to (or it is scanned again when they collide
    with its files), and entries of directories no longer configured are left out."""
    parsed, mtime = _read_image_cache(tree)
    if parsed is None:
        return mtime
    ptr = parsed.ptr
    if lib.cds_cache_format(ptr) == lib.CDS_FORMAT_OLD:
        return f"{CACHE_PATH} is in the old format only"
    at = lib.cds_cache_unsorted_at(ptr, config.target)
    if at >= 0:
        return f"{CACHE_PATH} is not in ldconfig's order (entry {at})"
    if config.conf_mtime > mtime:
        return f"{CACHE_PATH} is older than the configuration"
    # Legacy hwcap subdirectories are found by scanning their parents; take the ones the
    # cache names from it (ldconfig appends them after every configured directory).
    by_path = {d.path: i for i, d in enumerate(config.dirs)}
    counts = {}
    legacy = []
    for path, count in _cache_dirs(ptr):
        at = by_path.get(path)
        if at is not None:
            counts[at] = count
            continue
        parent, rest = _legacy_parent(config, path)
        if parent is not None:
            legacy.append((len(rest), config.by_ident[parent.ident], path, count, parent))
    for _depth, _rank, path, count, parent in sorted(legacy, key=lambda item: item[:3]):
        st = tree.stat(path)
        if st is None or not stat.S_ISDIR(st[0]):
            continue                  # gone: its entries go with it
        d = _Dir(path, parent.flag, ("d", st[1], st[2]), mtime=st[3], base=parent.ident)
        if config._add_single(d):
            counts[len(config.dirs) - 1] = count

    # Extras under a legacy hwcap subdirectory the cache knows nothing of (an empty tls/):
    # ldconfig would find it scanning its parent.
    for ident, where in extras.paths.items():
        if ident not in config.by_ident:
            parent, _rest = _legacy_parent(config, where)
            if parent is not None:
                config._add_single(_Dir(where, parent.flag, ident, real=ident[0] == "d",
                                        base=parent.ident))

    # The cache as a memo per directory: kept where it is fresh (the directory no newer than
    # the cache) and complete (a directory it has nothing of has no libraries); the rest is
    # scanned again, in place.
    rescan = set()
    rescanned = set()
    overlays = {}
    for i, d in enumerate(config.dirs):
        if not d.real or d.base in rescanned or d.mtime > mtime:
            rescan.add(i)
        elif i not in counts:
            listing = tree.listdir(d.path)
            if d.ident in extras.by_dir or (listing and any(_is_dso_name(n) for n, _ in listing)):
                rescan.add(i)
        elif d.ident in extras.by_dir:
            # Files to be mounted into a directory the cache covers: add them to its entries,
            # unless one hides a name of the directory or shares a soname with its libraries
            # (then which file ldconfig would keep depends on files we did not read).
            scan = scanner.scan(i, extras_only=True)
            if lib.cds_scan_shadowing(scan) or _overlaps(scan, ptr, d.path, config.target):
                rescan.add(i)
            else:
                overlays[i] = scan
        if i in rescan:
            rescanned.add(d.ident)
    dirs = [os.fsencode(d.path) for d in config.dirs]
    c_dirs = [ffi.new("char[]", p) for p in dirs]
    ranks = ffi.new("uint32_t[]", [lib.CDS_RANK_DROP if i in rescan else i
                                   for i in range(len(dirs))] or [0])
    unknown = lib.cds_builder_add_cache(builder.ptr, ptr,
                                        ffi.new("const char *[]", c_dirs or [ffi.NULL]),
                                        ranks, len(dirs), lib.CDS_RANK_DROP)
    if unknown < 0:
        raise _os_error("cannot merge the image's cache")
    if unknown > 0:
        # Directories no longer configured (or named otherwise): ldconfig would not list them.
        scanner.plan.warnings.append(
            f"{CACHE_PATH}: {unknown} entries of directories not configured, left out")
    for i, scan in overlays.items():
        scanner.add(i, scan)
        scanner.add_virtual_subdirs(i)
    builder.keep = parsed
    i = 0
    while i < len(config.dirs):
        if i in rescan or i >= len(dirs):
            scanner.scan(i)
        i += 1
    return ""


def plan_cache(root, folders=(), extra=None, **options):
    """The bytes of the cache ROOT would have (see plan())."""
    return plan(root, folders, extra, **options).cache


def remember_files(enabled=True, forget=None, settle=None):
    """Keep what reading library files and listing library directories gave (SONAME and
    flags; names, types and link texts), keyed by stat identity, and stat instead of
    reading on later plans in this process: host files given as EXTRA by path, device,
    inode, size, mtime and ctime; the image's files and directories by name and the same,
    without the device on overlayfs, where it changes with every container's mount while
    the layer files keep the rest (csrc/filememo.h). ldconfig's aux cache, in memory, for
    long-lived processes (the resident worker): every GPU container mounts the same driver
    files, and a node starts the same images again and again.

    Only files whose ctime is SETTLE seconds older than the plan are kept (default 1: a
    change within one tick of the kernel's clock would not change the key). Off by
    default; turning it off forgets everything unless FORGET is False. Returns the previous
    setting."""
    forget = not enabled if forget is None else forget
    settle_ns = -1 if settle is None else int(settle * 1e9)
    return bool(lib.cds_scan_memo(1 if enabled else 0, 1 if forget else 0, settle_ns, ffi.NULL))


def memo_stats():
    """(hits, misses, entries) of the file memo since the process started."""
    stats = ffi.new("struct cds_memo_stats *")
    lib.cds_scan_memo(-1, 0, -1, stats)
    return stats.hits, stats.misses, stats.entries


# ---- writing -----------------------------------------------------------------------

def write_cache(path, data, sync=False):
    """Write DATA to the host file PATH atomically."""
    path = os.fspath(path)
    directory, name = os.path.split(os.path.abspath(path))
    fd = os.open(directory, _O_PATH | _O_DIRECTORY | os.O_CLOEXEC)
    try:
        if lib.cds_write_at(fd, os.fsencode(name), data, len(data), 0o644, 1 if sync else 0) != 0:
            raise _os_error(f"cannot write {path}")
    finally:
        os.close(fd)


def write_in_root(root, path, data, mode=0o644):
    """Write DATA to PATH inside ROOT atomically; the directory is resolved inside ROOT."""
    directory, name = path.rsplit("/", 1) if "/" in path else ("", path)
    with _Root(root) as tree:
        fd = tree.open(directory or "/", _O_PATH | _O_DIRECTORY)
        if fd < 0:
            raise _os_error(f"cannot open {directory or '/'} in {tree.path}", tree.errno)
        try:
            if lib.cds_write_at(fd, os.fsencode(name), data, len(data), mode, 0) != 0:
                raise _os_error(f"cannot write {path} in {tree.path}")
        finally:
            os.close(fd)


def update(root, folders=(), extra=None, output=None, **options):
    """plan() and write the result: to OUTPUT, or into ROOT when OUTPUT is None."""
    result = plan(root, folders, extra, **options)
    if output is not None:
        write_cache(output, result.cache)
    else:
        for path, data in result.files.items():
            write_in_root(root, path, data)
    return result
