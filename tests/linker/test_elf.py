"""The ELF reader against glibc's: what ldconfig records for each file (SONAME, flags, ISA
level) or that it skips it, on a matrix of well-formed objects and on seeded random
corruptions of them. Where ldconfig itself crashes on a file (it reads past its mapping),
we only require a clean skip."""
import os
import random
import struct
import subprocess

import pytest

from ldcache_helpers import LDCONFIG, elfgen
from shim.ldconfig import ldcache
from shim._native import ffi, lib

LIB = "/usr/lib/x86_64-linux-gnu"

MATRIX = [
    dict(soname="libm64.so.1"),
    dict(soname="libm64n.so.1", needed=["libc.so.6", "libfoo.so.1"]),
    dict(),                                                        # no SONAME: the file name
    dict(soname="libtwo.so.1", needed=["libm.so.6"]),
    dict(soname="libx32.so.1", elfclass=32),
    dict(soname="lib386.so.1", elfclass=32, machine=elfgen.EM_386),
    dict(soname="lib386c.so.1", elfclass=32, machine=elfgen.EM_386, needed=["libc.so.6"]),
    dict(soname="lib386m.so.1", elfclass=32, machine=elfgen.EM_386, needed=["libm.so.6"]),
    dict(soname="lib386i.so.1", elfclass=32, machine=elfgen.EM_386, interp="/lib/ld-linux.so.2"),
    dict(soname="lib386x.so.1", elfclass=32, machine=elfgen.EM_386, interp="/lib/ld-other.so.2"),
    dict(soname="lib386_64.so.1", elfclass=64, machine=elfgen.EM_386),
    dict(soname="libarm64.so.1", machine=elfgen.EM_AARCH64),
    dict(soname="libarm.so.1", elfclass=32, machine=elfgen.EM_ARM, e_flags=0x05000400),
    dict(soname="libexec.so.1", etype=elfgen.ET_EXEC),
    dict(soname="libisa.so.1", isa_needed=0x7),
    dict(soname="libisa0.so.1", isa_needed=0),
    dict(soname="libabi.so.1", abi_tag=(0, 2, 6, 32)),
    dict(soname="libhurd.so.1", abi_tag=(1, 0, 0, 0)),
    dict(soname="libvaddr.so.1", vaddr=0x400000),
    dict(soname="x" * 300 + ".so.1"),
]


def _oracle(directory):
    """ldconfig's cache for a root holding DIRECTORY's files in /usr/lib/x86_64-linux-gnu,
    as (soname, flags, hwcap, path) tuples; None when ldconfig crashed."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(directory.rstrip("/"))))
    proc = subprocess.run([LDCONFIG, "-X", "-r", root, "-C", "/oracle.cache"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    if proc.returncode != 0:
        return None
    cache = ldcache.read_cache(os.path.join(root, "oracle.cache"))
    os.unlink(os.path.join(root, "oracle.cache"))
    return [(e.soname, e.flags, e.hwcap, e.path) for e in cache.entries]


def _ours(root):
    plan = ldcache.plan(root, [], mode="full", links="ldconfig")
    return [(e.soname, e.flags, e.hwcap, e.path) for e in ldcache.read_cache(plan.cache).entries]


def _make_root(base, files):
    root = os.path.join(base, "root")
    libdir = os.path.join(root, LIB.lstrip("/"))
    os.makedirs(libdir)
    os.makedirs(os.path.join(root, "etc"))
    for name, data in files.items():
        with open(os.path.join(libdir, name), "wb") as out:
            out.write(data)
    return root, libdir


def test_matrix_matches_ldconfig(scratch):
    files = {f"libt{i:03d}.so.1": elfgen.make_elf(**kw) for i, kw in enumerate(MATRIX)}
    root, libdir = _make_root(scratch, files)
    expected = _oracle(libdir)
    assert expected is not None
    assert _ours(root) == expected
    flags = {soname: f for soname, f, _, _ in expected}
    assert flags["libx32.so.1"] == 0x0803 and flags["lib386.so.1"] == 0x0001
    assert flags["lib386c.so.1"] == flags["lib386i.so.1"] == 0x0003


def _mutations(seed, count):
    rng = random.Random(seed)
    bases = [elfgen.make_elf(**kw) for kw in MATRIX[:10] + MATRIX[14:16]]
    for i in range(count):
        data = bytearray(rng.choice(bases))
        kind = rng.randrange(6)
        if kind == 0:                                   # flip bytes in the headers
            for _ in range(rng.randint(1, 6)):
                data[rng.randrange(min(len(data), 300))] = rng.randrange(256)
        elif kind == 1:                                 # truncate
            del data[rng.randrange(16, len(data)):]
        elif kind == 2:                                 # a 32/64-bit field set to an extreme
            at = rng.randrange(16, min(len(data), 240)) & ~3
            data[at:at + 4] = struct.pack("<I", rng.choice([0, 1, 0x7fffffff, 0xffffffff, len(data)]))
        elif kind == 3:                                 # the string table overwritten
            tail = data.rfind(b".so")
            if tail > 0:
                data[tail:] = b"\xff" * (len(data) - tail)
        elif kind == 4:                                 # phnum / phoff extremes
            is64 = data[4] == 2
            struct.pack_into("<H", data, 56 if is64 else 44, rng.choice([0, 1, 0xffff, 100]))
        else:                                           # grow with junk
            data += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 5000)))
        yield f"libm{i:04d}.so.1", bytes(data)


@pytest.mark.parametrize("seed", [1234, 9, 7])
def test_seeded_corruptions_match_ldconfig(scratch, seed):
    files = dict(_mutations(seed=seed, count=300))
    root, libdir = _make_root(scratch, files)
    expected = _oracle(libdir)
    ours = _ours(root)
    if expected is not None:
        assert ours == expected
        return
    # ldconfig crashed on some file: compare file by file, skipping the ones it dies on.
    crashed = 0
    for name, data in files.items():
        one = os.path.join(scratch, name)
        r, d = _make_root(one, {name: data})
        exp = _oracle(d)
        got = _ours(r)
        if exp is None:
            crashed += 1
            continue
        assert got == exp, name
    assert crashed < len(files)


def _fd_and_bytes_agree(data, target):
    info_mem = ffi.new("struct cds_elf_info *")
    rc_mem = lib.cds_elf_parse(data, len(data), target, info_mem)
    r, w = os.pipe()
    os.close(r)
    os.close(w)
    import tempfile
    with tempfile.TemporaryFile() as tmp:
        tmp.write(data)
        tmp.flush()
        for size in (len(data), 2**64 - 1):            # known size, size learnt from reads
            info_fd = ffi.new("struct cds_elf_info *")
            rc_fd = lib.cds_elf_read_fd(tmp.fileno(), size, target, info_fd)
            assert rc_fd == rc_mem
            if rc_mem == lib.CDS_ELF_LIBRARY:
                assert info_fd.flags == info_mem.flags
                assert info_fd.isa_level == info_mem.isa_level
                assert ffi.string(info_fd.soname) == ffi.string(info_mem.soname)


@pytest.mark.parametrize("target", [lib.CDS_TARGET_X86_64, lib.CDS_TARGET_AARCH64])
def test_descriptor_and_memory_readers_agree(target):
    for kw in MATRIX:
        _fd_and_bytes_agree(elfgen.make_elf(**kw), target)
    corpus = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz", "corpus", "elf")
    for name in sorted(os.listdir(corpus)):          # includes what the fuzzer found once
        with open(os.path.join(corpus, name), "rb") as f:
            _fd_and_bytes_agree(f.read(), target)
    for _name, data in _mutations(seed=99, count=150):
        _fd_and_bytes_agree(data, target)


def _classify(data, target):
    info = ffi.new("struct cds_elf_info *")
    rc = lib.cds_elf_parse(data, len(data), target, info)
    return rc, info.flags, ffi.string(info.soname).decode()


def test_aarch64_flags():
    """sysdeps/unix/sysv/linux/arm/readelflib.c: no machine check for 64-bit objects, ARM
    EABI5 float ABI for 32-bit ones (no AArch64 ldconfig here to compare with)."""
    a64 = lib.CDS_TARGET_AARCH64
    assert _classify(elfgen.make_elf(soname="a.so", machine=elfgen.EM_AARCH64), a64)[:2] == (0, 0x0a03)
    assert _classify(elfgen.make_elf(soname="b.so"), a64)[:2] == (0, 0x0a03)
    assert _classify(elfgen.make_elf(soname="c.so", elfclass=32, machine=elfgen.EM_ARM,
                                     e_flags=0x05000400), a64)[:2] == (0, 0x0903)
    assert _classify(elfgen.make_elf(soname="d.so", elfclass=32, machine=elfgen.EM_ARM,
                                     e_flags=0x05000200), a64)[:2] == (0, 0x0b03)
    assert _classify(elfgen.make_elf(soname="e.so", elfclass=32, machine=elfgen.EM_ARM,
                                     e_flags=0x05000000), a64)[:2] == (0, 0x0003)
    assert _classify(elfgen.make_elf(soname="f.so", elfclass=32, machine=elfgen.EM_ARM,
                                     interp="/lib/ld-linux-armhf.so.3"), a64)[:2] == (0, 0x0003)
    assert _classify(elfgen.make_elf(soname="g.so", elfclass=32, machine=elfgen.EM_ARM), a64)[:2] \
        == (0, 0x0001)
    # The x86 ISA-level property means nothing there.
    info = ffi.new("struct cds_elf_info *")
    data = elfgen.make_elf(soname="h.so", isa_needed=0x7)
    lib.cds_elf_parse(data, len(data), a64, info)
    assert info.isa_level == 0


def test_abi_tag_is_read_but_not_used():
    info = ffi.new("struct cds_elf_info *")
    data = elfgen.make_elf(soname="libabi.so.1", abi_tag=(0, 3, 2, 0))
    assert lib.cds_elf_parse(data, len(data), lib.CDS_TARGET_X86_64, info) == 0
    assert info.osversion == 0x030200


@pytest.mark.parametrize("data,status", [
    (b"", lib.CDS_ELF_EMPTY),
    (b"\x7fELF", lib.CDS_ELF_TOO_SMALL),
    (b"GROUP ( libc.so.6 )" + b" " * 100, lib.CDS_ELF_NOT_ELF),
    (b"\x0b\x01" + b"\0" * 100, lib.CDS_ELF_AOUT),
])
def test_non_elf_files(data, status):
    assert _classify(data, lib.CDS_TARGET_X86_64)[0] == status


def test_bogus_headers_never_read_out_of_bounds():
    """Offsets and counts far outside the file: a skip, with a status saying so."""
    base = bytearray(elfgen.make_elf(soname="libb.so.1"))
    cases = []
    for field, fmt in ((32, "<Q"), (56, "<H")):                 # e_phoff, e_phnum
        for value in (2**16 - 1, 2**32, 2**63, len(base) + 1):
            data = bytearray(base)
            try:
                struct.pack_into(fmt, data, field, value)
            except struct.error:
                continue
            cases.append(bytes(data))
    for case in cases:
        rc, _, _ = _classify(case, lib.CDS_TARGET_X86_64)
        assert rc in (lib.CDS_ELF_TRUNCATED, lib.CDS_ELF_NO_DYNAMIC, lib.CDS_ELF_LIBRARY)
