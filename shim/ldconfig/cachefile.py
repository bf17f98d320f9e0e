"""ld.so.cache files: parsed into entries, read from the host or inside a root, listed as
`ldconfig -p` lists them."""
import os

from .._native import ffi, lib
from .engine import (CACHE_PATH, FORMAT_NAMES, MAX_CACHE_SIZE, LdcacheError, Root, decode_cstr,
                     os_error, read_error, read_fd)


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


class ParsedCache:
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
            raise read_error(what, err, st, limit)
        self = cls.__new__(cls)
        self.ptr = ffi.gc(out[0], lib.cds_cache_free)
        return self, st.mtime_sec * 1000000000 + st.mtime_nsec


def _to_cache(parsed):
    ptr = parsed.ptr
    entries = []
    e = ffi.new("struct cds_cache_entry *")
    for i in range(lib.cds_cache_count(ptr)):
        lib.cds_cache_entry(ptr, i, e)
        hwcaps = decode_cstr(e.hwcaps) if e.hwcaps != ffi.NULL else None
        item = Entry(decode_cstr(e.key), decode_cstr(e.value), e.flags, e.hwcap, hwcaps,
                     (e.hwcap >> 32) & 0x3ff if hwcaps is not None else 0, e.osversion)
        item._hwcaps_print = decode_cstr(e.hwcaps_print) if e.hwcaps_print != ffi.NULL else None
        entries.append(item)
    size = ffi.new("size_t *")
    gen = lib.cds_cache_generator(ptr, size)
    generator = ffi.buffer(gen, size[0])[:] if gen != ffi.NULL else None
    return Cache(FORMAT_NAMES[lib.cds_cache_format(ptr)], generator, entries)


def read_cache(source):
    """Parse a cache from bytes, or from a host file named by SOURCE."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _to_cache(ParsedCache(bytes(source)))
    path = os.fspath(source)
    data = read_host_bytes(path)
    try:
        return _to_cache(ParsedCache(data))
    except LdcacheError as err:
        raise LdcacheError(f"{path}: {err}") from None


def read_host_bytes(path, limit=MAX_CACHE_SIZE):
    """The bytes of a host file: a regular file of at most LIMIT bytes, or LdcacheError."""
    path = os.fspath(path)
    fd = lib.cds_open_host(os.fsencode(path))
    if fd < 0:
        raise os_error(f"cannot open {path}")
    try:
        return read_fd(fd, path, limit)
    finally:
        os.close(fd)


def read_root_bytes(root, path, limit=MAX_CACHE_SIZE):
    """The bytes of PATH inside ROOT (resolved inside ROOT), or LdcacheError."""
    with Root(root) as tree:
        try:
            data, _ = tree.read(path, limit)
        except OSError as err:
            raise LdcacheError(f"cannot open {path} in {tree.path}: {err.strerror}") from None
    return data


def read_root_cache(root, path=CACHE_PATH):
    """Parse the cache at PATH inside ROOT (resolved inside ROOT; see read_cache())."""
    data = read_root_bytes(root, path)
    try:
        return _to_cache(ParsedCache(data))
    except LdcacheError as err:
        raise LdcacheError(f"{path}: {err}") from None


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
