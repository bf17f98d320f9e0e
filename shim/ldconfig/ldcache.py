"""The container's dynamic-linker cache, computed natively: glibc's ldconfig without ldconfig.

What this module answers: "which /etc/ld.so.cache would ROOT have after the NVIDIA toolkit's
update-ldcache hook ran the host's ldconfig in it with FOLDERS added?" -- and, for libraries
that are not in ROOT yet (host files a container will get as bind mounts), "... once those
files are mounted where the spec puts them". The C library (csrc/engine: ldcache.c, scan.c,
elf.c, inroot.c) does the format and file work; this package holds the policy: which
directories, in which order (ldconf), when the image's own cache can be trusted (plan), what is
refused. This module is its public face: import the engine from here.

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
         format="new", generator=None, deadline=None) -> Plan
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
        Bounded work: include globs look into at most MAX_GLOB_DIRS directories and match
        at most MAX_GLOB_NAMES names per plan; DEADLINE (Deadline(seconds)) bounds the
        time. Past a bound: LdcacheLimitError (a subclass of LdcacheError) saying which
        bound and where (the configuration file and its include line).
    plan_cache(root, folders=(), extra=None, **options) -> bytes
        plan(...).cache.
    write_cache(path, data, sync=False, mode=0o644)
        Write a host file atomically (temporary file, rename).
    write_in_root(root, path, data, mode=0o644)
        Write a file inside ROOT atomically, its directory resolved inside ROOT.
    update(root, folders=(), extra=None, output=None, **options) -> Plan
        plan() and write: the cache to OUTPUT (a host path), or into ROOT's
        /etc/ld.so.cache (and a musl image's .path file) when OUTPUT is None.
    Memos() -> .open() / .using() / .close()
        For long-lived processes (the resident worker, the NRI hook server), one object
        holding both memos below from open() to close() (dropped with it): the file memo is on
        while it is open; its plan memo is consulted within using() (one create, one answer).
    remember_files(enabled=True, forget=None, settle=None) / memo_stats()
        The file memo (Memos holds it): keep what reading library files and listing library
        directories gave, by stat identity, so that the next plan for the same image (or with
        the same driver files) stats instead of reading -- what ldconfig's aux cache does, in
        memory (csrc/engine/filememo.h). One in a process.
    PlanMemo() / PlanMemo.using()
        The plan memo (Memos holds one): keep whole plans that read nothing of the image but
        its configuration, its cache and directory identities, and give a later plan with
        the same arguments whose paths all have the same identities a copy (Plan.remembered;
        plan.py says when one is kept and why it is safe). Two share nothing.

Emulated: glibc 2.36's ldconfig as Debian 12 builds it (x86-64 and AArch64): ld.so.conf
parsing (include globs, "hwcap" lines, "=libc6" types), glibc-hwcaps subdirectories and the
legacy hwcap subdirectories (tls, x86_64, haswell, ...), the soname/link rules of
search_dir(), ELF classification, entry order, string table and extension layout. Known,
deliberate differences: include loops stop after 32 levels (ldconfig recurses until it
crashes), files ldconfig would crash or hang on (a link to a FIFO, headers past the mapped
end) are skipped, links are never created or removed, an include glob looks into a directory
it reaches by several paths (links) once, by the first of them (glob(3) lists every path: over
self-referencing links, exponentially many), and its results are computed once per pattern.
"""
import os

from .._native import ffi, lib
from .cachefile import Cache, Entry, format_listing, read_cache, read_host_bytes, read_root_bytes, read_root_cache
from .engine import (CACHE_PATH, DROPIN_FIRST, DROPIN_LAST, GENERATOR, LINKER_TIME_LIMIT, MACHINES,
                     MAX_GLOB_DIRS, MAX_GLOB_NAMES, O_DIRECTORY, O_PATH, Deadline, LdcacheError,
                     LdcacheLimitError, Root, os_error)
from .plan import Plan, PlanMemo, plan, plan_cache

__all__ = [
    "LdcacheError", "LdcacheLimitError", "Deadline", "MAX_GLOB_DIRS", "MAX_GLOB_NAMES",
    "LINKER_TIME_LIMIT", "Cache", "Entry", "Plan", "read_cache", "read_root_cache", "read_host_bytes",
    "read_root_bytes", "format_listing", "plan", "plan_cache", "write_cache", "write_in_root", "update",
    "Memos", "PlanMemo", "remember_files", "memo_stats", "MACHINES", "CACHE_PATH", "DROPIN_FIRST", "DROPIN_LAST",
    "GENERATOR",
]


# ---- the file memo (csrc/engine/filememo.h) ------------------------------------------

def remember_files(enabled=True, forget=None, settle=None):
    """Keep what reading library files and listing library directories gave (SONAME and
    flags; names, types and link texts), keyed by stat identity, and stat instead of
    reading on later plans in this process: host files given as EXTRA by path, device,
    inode, size, mtime and ctime; the image's files and directories by name and the same,
    without the device on overlayfs, where it changes with every container's mount while
    the layer files keep the rest (csrc/engine/filememo.h). ldconfig's aux cache, in memory, for
    long-lived processes (the resident worker): every GPU container mounts the same driver
    files, and a node starts the same images again and again.

    Only files whose ctime is SETTLE seconds older than the plan are kept (default the one
    settle window, cdi.safeio.RACY_WINDOW_NS: a change within one tick of a filesystem's
    clock would not change the key). Off by
    default; turning it off forgets everything unless FORGET is False. Returns the previous
    setting."""
    forget = not enabled if forget is None else forget
    settle_ns = -1 if settle is None else int(settle * 1e9)
    return bool(lib.cds_scan_memo(1 if enabled else 0, 1 if forget else 0, settle_ns, ffi.NULL))


class Memos:
    """The memos of one long-lived process (a resident worker, the NRI hook server), held from
    open() to close(), and dropped with this object: a plan memo of its own (PLANS, a PlanMemo),
    consulted by the plans within using() (a create, an answer), and the file memo
    (remember_files). The file memo is one in a process, shared by whatever plans in it (it
    keeps file reads by identity, whoever reads): the Memos that turned it on turns it off,
    forgetting it, when it closes."""

    __slots__ = ("plans", "files")

    def __init__(self):
        self.plans = None       # the PlanMemo while open
        self.files = False      # whether this one turned the file memo on (and turns it off)

    def open(self):
        if self.plans is None:
            self.files = not remember_files(True, forget=False)
            self.plans = PlanMemo()
        return self

    def close(self):
        """Forget the plans; turn the file memo off (forgetting it) where this one turned it on."""
        if self.plans is not None:
            self.plans = None
            if self.files:
                self.files = False
                remember_files(False)

    def using(self):
        """A context in which plans keep and recall plans in this object's plan memo (open), or
        in none (closed)."""
        return PlanMemo.using(self.plans)

    __enter__ = open

    def __exit__(self, *exc):
        self.close()


def memo_stats():
    """(hits, misses, entries) of the file memo since the process started."""
    stats = ffi.new("struct cds_memo_stats *")
    lib.cds_scan_memo(-1, 0, -1, stats)
    return stats.hits, stats.misses, stats.entries


# ---- writing -----------------------------------------------------------------------

def write_cache(path, data, sync=False, mode=0o644):
    """Write DATA to the host file PATH atomically, with MODE."""
    path = os.fspath(path)
    directory, name = os.path.split(os.path.abspath(path))
    fd = os.open(directory, O_PATH | O_DIRECTORY | os.O_CLOEXEC)
    try:
        if lib.cds_write_at(fd, os.fsencode(name), data, len(data), mode, 1 if sync else 0) != 0:
            raise os_error(f"cannot write {path}")
    finally:
        os.close(fd)


def write_in_root(root, path, data, mode=0o644):
    """Write DATA to PATH inside ROOT atomically; the directory is resolved inside ROOT."""
    directory, name = path.rsplit("/", 1) if "/" in path else ("", path)
    with Root(root) as tree:
        fd = tree.open(directory or "/", O_PATH | O_DIRECTORY)
        if fd < 0:
            raise os_error(f"cannot open {directory or '/'} in {tree.path}", tree.errno)
        try:
            if lib.cds_write_at(fd, os.fsencode(name), data, len(data), mode, 0) != 0:
                raise os_error(f"cannot write {path} in {tree.path}")
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
