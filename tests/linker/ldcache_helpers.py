"""Shared pieces of the ldcache tests (imported by name: a module called `conftest` would
collide with the other test directories' when pytest collects them together): roots, the glibc
oracle, fake driver libraries, and a watcher that proves nothing outside a root was touched.

glibc is the oracle: Debian 12's ldconfig (2.36), run the way NVIDIA's update-ldcache hook
runs it -- the folders in /etc/ld.so.conf.d/00-nvcr-*.conf, the container's system
directories in zz-nvcr-*.conf, `ldconfig -f /etc/ld.so.conf -C /etc/ld.so.cache` chrooted
into the root -- on a hard-linked copy, so the root under test stays as it was.
"""
import ctypes
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import elfgen  # noqa: E402,F401  (re-exported: test_elf, test_equivalence import it from here)
import roots  # noqa: E402

from shim.ldconfig import ldcache  # noqa: E402

LDCONFIG = shutil.which("ldconfig") or "/usr/sbin/ldconfig"
GCC = shutil.which("gcc")
DEBIAN_SYSTEM = ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib", "/usr/lib"]
OTHER_SYSTEM = ["/lib", "/usr/lib", "/lib64", "/usr/lib64", "/libx32", "/usr/libx32"]


def require(binary, package):
    if shutil.which(binary) is None:
        pytest.fail(f"{binary} not found: apt-get install {package}")


# ---- the oracle -------------------------------------------------------------------

def toolkit_ldconfig(root, folders=(), workdir=None, extra_args=(), compat=(), in_place=False):
    """The cache glibc's ldconfig gives ROOT the toolkit's way, as bytes. ROOT itself is
    not changed (ldconfig runs on a hard-linked copy with -X: it creates no links), unless
    IN_PLACE: then it runs on ROOT as the toolkit's hook does (no -X: the soname links made,
    the drop-ins left). COMPAT: the folders enable-cuda-compat's
    /etc/ld.so.conf.d/00-compat-<random>.conf names."""
    tmp = tempfile.mkdtemp(prefix="oracle.", dir=workdir)
    try:
        copy = root if in_place else roots.copy_tree(root, os.path.join(tmp, "root"))
        etc = os.path.join(copy, "etc")
        conf_d = os.path.join(etc, "ld.so.conf.d")
        os.makedirs(conf_d, exist_ok=True)
        conf = os.path.join(etc, "ld.so.conf")
        if not os.path.lexists(conf):
            with open(conf, "w") as out:
                out.write("include /etc/ld.so.conf.d/*.conf\n")
        debian = os.path.isfile(os.path.join(etc, "debian_version"))
        system = DEBIAN_SYSTEM if debian else OTHER_SYSTEM
        configured = configured_dirs(copy) | set(system)
        first = [f for f in dict.fromkeys(folders) if f not in configured]
        for name, lines in (("00-compat-1876430922.conf", list(dict.fromkeys(compat))),
                            (ldcache.DROPIN_FIRST, first), (ldcache.DROPIN_LAST, system)):
            path = os.path.join(conf_d, name)
            if os.path.lexists(path):
                os.unlink(path)
            if lines:
                with open(path, "w") as out:
                    out.write("".join(line + "\n" for line in lines))
        out_name = "/.cdi-shim-oracle.cache"
        subprocess.run([LDCONFIG, *([] if in_place else ["-X"]), "-r", copy, "-C", out_name, *extra_args], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        with open(os.path.join(copy, out_name.lstrip("/")), "rb") as cache:
            return cache.read()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def configured_dirs(root):
    """Directory lines of ROOT's ld.so.conf (one level of includes), as the toolkit reads them."""
    import glob
    dirs = set()
    todo = [os.path.join(root, "etc/ld.so.conf")]
    seen = set()
    while todo:
        path = todo.pop()
        if path in seen or not os.path.isfile(path):
            continue
        seen.add(path)
        with open(path, errors="surrogateescape") as conf:
            for line in conf:
                line = line.split("#", 1)[0].strip()
                if not line:
                    continue
                if line.startswith("include "):
                    pattern = line[len("include "):].strip()
                    if not pattern.startswith("/"):     # (relative to the including file: Fedora's)
                        pattern = os.path.join(os.path.dirname(path)[len(root):] or "/", pattern)
                    todo.extend(glob.glob(os.path.join(root, pattern.lstrip("/"))))
                else:
                    dirs.add(line.split("=", 1)[0].rstrip("/"))
    return dirs


def listing(data, name="CACHE"):
    """`ldconfig -p -C FILE` of cache bytes, the file named NAME in the header."""
    with tempfile.NamedTemporaryFile(prefix="listing.", delete=False) as tmp:
        tmp.write(data)
    try:
        proc = subprocess.run([LDCONFIG, "-p", "-C", tmp.name], capture_output=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.replace(tmp.name.encode(), name.encode())
    finally:
        os.unlink(tmp.name)


def generator_of(data):
    return ldcache.read_cache(data).generator.decode()


def strip_generator(data):
    """The cache with its generator string and that string's size field removed: what must
    equal ldconfig's own file byte for byte when only the generator differs."""
    ext = struct.unpack_from("<I", data, 32)[0]
    count = struct.unpack_from("<I", data, ext + 4)[0]
    for i in range(count):
        tag, _flags, off, size = struct.unpack_from("<IIII", data, ext + 8 + 16 * i)
        if tag == 0:
            head = bytearray(data[:off])
            struct.pack_into("<I", head, ext + 8 + 16 * i + 12, 0)
            return bytes(head) + data[off + size:]
    return data


# ---- fake driver libraries ---------------------------------------------------------

FAKE_NVML_C = r"""
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned int *count) { *count = 1; return 0; }
const char *cdi_shim_fake_driver(void) { return "%(version)s"; }
"""


def build_library(path, soname, source="int cdi_shim_fake(void) { return 42; }\n", flags=()):
    """A real shared library built by gcc with SONAME, at PATH."""
    if GCC is None:
        pytest.fail("gcc not found: apt-get install gcc")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    src = path + ".c"
    with open(src, "w") as out:
        out.write(source)
    subprocess.run([GCC, "-shared", "-fPIC", "-O1", "-o", path, src, f"-Wl,-soname,{soname}",
                    *flags], check=True)
    os.unlink(src)
    return path


def fake_driver(directory, version="550.54.15", names=("nvidia-ml", "cuda", "nvidia-ptxjitcompiler"),
                links=False):
    """A fake driver directory: libNAME.so.VERSION with SONAME libNAME.so.1 (and, with LINKS,
    the libNAME.so.1 links a driver installation has)."""
    made = {}
    for name in names:
        file_name = f"lib{name}.so.{version}"
        source = FAKE_NVML_C % {"version": version} if name == "nvidia-ml" else \
            f"int cdi_shim_{name.replace('-', '_')}(void) {{ return 1; }}\n"
        made[f"lib{name}.so.1"] = build_library(os.path.join(directory, file_name),
                                                 f"lib{name}.so.1", source)
        if links:
            os.symlink(file_name, os.path.join(directory, f"lib{name}.so.1"))
    return made


# ---- proof that nothing outside a root was opened ------------------------------------

class _InotifyEvent(ctypes.Structure):
    _fields_ = [("wd", ctypes.c_int), ("mask", ctypes.c_uint32), ("cookie", ctypes.c_uint32),
                ("len", ctypes.c_uint32)]


IN_ACCESS, IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x1, 0x2, 0x4, 0x8
IN_CLOSE_NOWRITE, IN_OPEN, IN_MOVED_FROM, IN_MOVED_TO = 0x10, 0x20, 0x40, 0x80
IN_CREATE, IN_DELETE = 0x100, 0x200
IN_ALL = 0xFFF
IN_NONBLOCK = 0o4000


class Untouched:
    """inotify watches on decoy files and directories: any open, read, write, create or
    delete of them (or of anything in them) while active is recorded in .events."""

    def __init__(self, *paths):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(IN_NONBLOCK)
        assert self.fd >= 0, os.strerror(ctypes.get_errno())
        self.watches = {}
        for path in paths:
            wd = self.libc.inotify_add_watch(self.fd, os.fsencode(path), IN_ALL)
            assert wd >= 0, f"{path}: {os.strerror(ctypes.get_errno())}"
            self.watches[wd] = path
        self.events = []

    def __enter__(self):
        self.drain()
        self.events = []
        return self

    def drain(self):
        events = []
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            at = 0
            while at < len(data):
                ev = _InotifyEvent.from_buffer_copy(data, at)
                name = data[at + 16:at + 16 + ev.len].rstrip(b"\0").decode(errors="replace")
                events.append((self.watches.get(ev.wd, "?"), name, ev.mask))
                at += 16 + ev.len
        return events

    def __exit__(self, *exc):
        self.events = self.drain()
        os.close(self.fd)

    def assert_untouched(self):
        assert self.events == [], f"touched outside the root: {self.events}"
