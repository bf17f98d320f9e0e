"""The cache format: our reader and writer against glibc's ldconfig -p, corrupt files, order."""
import struct

import pytest

from ldcache_helpers import listing
from shim.ldconfig import ldcache
from shim.ldconfig.cachefile import ParsedCache
from shim._native import ffi, lib

X86 = lib.CDS_TARGET_X86_64


def build(entries, fmt=lib.CDS_FORMAT_NEW, generator="test generator", interned=(), target=X86):
    """Cache bytes from (soname, path, flags, isa, hwcap, hwcaps, rank) tuples."""
    b = ffi.gc(lib.cds_builder_new(target), lib.cds_builder_free)
    for name in interned:
        assert lib.cds_builder_intern(b, name.encode()) == 0
    for soname, path, flags, isa, hwcap, hwcaps, rank in entries:
        assert lib.cds_builder_add(b, soname.encode(), path.encode(), flags, isa, hwcap,
                                   hwcaps.encode() if hwcaps else ffi.NULL, rank) == 0
    out = ffi.new("uint8_t **")
    size = ffi.new("size_t *")
    assert lib.cds_builder_build(b, fmt, generator.encode() if generator else ffi.NULL, out, size) == 0
    try:
        return ffi.buffer(out[0], size[0])[:]
    finally:
        lib.cds_free(out[0])


def entry(soname, path=None, flags=0x0303, isa=0, hwcap=0, hwcaps=None, rank=0):
    return (soname, path or f"/lib/{soname}", flags, isa, hwcap, hwcaps, rank)


FLAG_VARIETY = [
    entry("liba.so.1", flags=flags) for flags in
    (0x0000, 0x0001, 0x0002, 0x0003, 0x0004, 0x0103, 0x0203, 0x0303, 0x0403, 0x0503, 0x0603,
     0x0703, 0x0803, 0x0903, 0x0a03, 0x0b03, 0x0c03, 0x0d03, 0x0e03, 0x0f03, 0x1003, 0x1103,
     0x1203, 0x1303, 0x7f03, -1)
]


def test_listing_matches_ldconfig_for_every_flag():
    data = build(FLAG_VARIETY)
    assert ldcache.format_listing(ldcache.read_cache(data), "CACHE") == listing(data)


def test_listing_of_hwcaps_and_legacy_hwcap_entries():
    data = build([
        entry("libb.so.1", "/l/glibc-hwcaps/x86-64-v3/libb.so.1", isa=2, hwcaps="x86-64-v3"),
        entry("libb.so.1", "/l/glibc-hwcaps/x86-64-v2/libb.so.1", isa=1, hwcaps="x86-64-v2"),
        entry("libb.so.1", "/l/tls/libb.so.1", hwcap=1 << 63),
        entry("libb.so.1", "/l/haswell/libb.so.1", hwcap=1 << 50),
        entry("libb.so.1", "/l/libb.so.1"),
    ], interned=["unused-hwcaps-name"])
    cache = ldcache.read_cache(data)
    assert [e.path for e in cache.entries] == [
        "/l/glibc-hwcaps/x86-64-v2/libb.so.1", "/l/glibc-hwcaps/x86-64-v3/libb.so.1",
        "/l/tls/libb.so.1", "/l/haswell/libb.so.1", "/l/libb.so.1"]
    assert [e.isa_level for e in cache.entries[:2]] == [1, 2]
    assert ldcache.format_listing(cache, "CACHE") == listing(data)


@pytest.mark.parametrize("fmt,name", [(lib.CDS_FORMAT_OLD, "old"), (lib.CDS_FORMAT_COMPAT, "compat"),
                                      (lib.CDS_FORMAT_NEW, "new")])
def test_formats_read_back_and_list_like_ldconfig(fmt, name):
    entries = [entry(f"lib{i}.so.{i}", f"/usr/lib/lib{i}.so.{i}") for i in range(7)]
    data = build(entries, fmt)
    cache = ldcache.read_cache(data)
    assert cache.format == name
    assert len(cache.entries) == 7
    assert ldcache.format_listing(cache, "CACHE") == listing(data)
    if name == "new":
        assert data.startswith(b"glibc-ld.so.cache1.1")
    else:
        assert data.startswith(b"ld.so-1.7.0")


def test_sort_order_is_glibcs():
    """Descending by _dl_cache_libcmp (numbers compare as numbers), higher flags first,
    ties in directory (rank) order."""
    names = ["libz.so.1", "liba.so.10", "liba.so.9", "liba.so.1", "libab.so.1", "lib.so",
             "libA.so.1", "liba.so.01", "liba2.so", "liba10.so", "libé.so.1"]
    data = build([entry(n, rank=i) for i, n in enumerate(names)]
                 + [entry("liba.so.1", "/other/liba.so.1", rank=0, flags=0x0001),
                    entry("liba.so.1", "/first/liba.so.1", rank=-1 & 0xfffffffe)])
    cache = ldcache.read_cache(data)
    got = [(e.soname, e.path) for e in cache.entries]
    ordered = sorted(got, key=lambda item: item)  # just to have something to diff against
    assert lib.cds_cache_unsorted_at(ParsedCache(data).ptr, X86) == -1
    assert ordered  # and glibc reads it the same way:
    assert ldcache.format_listing(cache, "CACHE") == listing(data)
    sonames = [e.soname for e in cache.entries]
    assert sonames.index("liba.so.10") < sonames.index("liba.so.9") < sonames.index("liba.so.1")


def test_libcmp_char_signedness_per_target():
    a, b = "libé.so".encode(), b"libz.so"
    assert lib.cds_libcmp(a, b, lib.CDS_TARGET_X86_64) < 0          # signed char
    assert lib.cds_libcmp(a, b, lib.CDS_TARGET_AARCH64) > 0         # unsigned char
    assert lib.cds_libcmp(b"libfoo.so.010", b"libfoo.so.10", X86) == 0


def test_string_table_is_tail_merged_and_deduplicated():
    data = build([entry("libx.so.1", "/usr/lib/libx.so.1"), entry("libx.so.1", "/lib/libx.so.1")])
    # "libx.so.1" and "/lib/libx.so.1" both live inside "/usr/lib/libx.so.1".
    size = struct.unpack_from("<I", data, 24)[0]
    assert data[48 + 2 * 24:48 + 2 * 24 + size] == b"/usr/lib/libx.so.1\0"


def test_empty_cache_round_trip():
    data = build([])
    cache = ldcache.read_cache(data)
    assert cache.entries == [] and cache.generator == b"test generator"
    assert ldcache.format_listing(cache, "CACHE") == listing(data)


# ---- corrupt files: errors, never crashes or out-of-bounds reads ---------------------

GOOD = None


def good():
    global GOOD
    if GOOD is None:
        GOOD = build([entry("liba.so.1"), entry("libb.so.2", hwcaps="x86-64-v3", isa=2,
                                                path="/l/glibc-hwcaps/x86-64-v3/libb.so.2")])
    return GOOD


def patched(data, offset, fmt, value):
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


@pytest.mark.parametrize("mutate,why", [
    (lambda d: d[:10], "too short"),
    (lambda d: d[:16], "bad magic"),                  # the new magic cut short (found by fuzzing)
    (lambda d: b"not-a-cache-file-at-all" + d[23:], "bad magic"),
    (lambda d: patched(d, 20, "<I", 0xFFFFFFFF), "entry count"),
    (lambda d: patched(d, 20, "<I", 1000), "entry count"),
    (lambda d: patched(d, 48 + 4, "<I", 0xFFFFFF00), "outside the file"),
    (lambda d: patched(d, 48 + 8, "<I", len(d)), "outside the file"),
    (lambda d: patched(d, 32, "<I", 2), "misaligned"),
    (lambda d: patched(d, 32, "<I", len(d) - 4 & ~3), "extension"),
    (lambda d: patched(d, 32, "<I", 0xFFFFFFFC), "extension"),
    (lambda d: patched(d, 28, "<B", 1), "endianness"),
    (lambda d: d[:-1].rstrip(b"\0")[:len(d) - 40], "extension"),
])
def test_corrupt_caches_are_errors(mutate, why):
    with pytest.raises(ldcache.LdcacheError, match=why):
        ldcache.read_cache(mutate(good()))


def test_missing_nul_is_an_error():
    data = bytearray(good())
    ext = struct.unpack_from("<I", data, 32)[0]
    strings_end = 48 + 2 * 24 + struct.unpack_from("<I", data, 24)[0]
    # Turn every NUL of the string table and what follows into 'x': nothing terminates.
    for i in range(48 + 2 * 24, len(data)):
        if data[i] == 0:
            data[i] = ord("x")
    del ext, strings_end
    with pytest.raises(ldcache.LdcacheError):
        ldcache.read_cache(bytes(data))


def test_extension_count_overflow_and_bad_hwcaps_index():
    data = bytearray(good())
    ext = struct.unpack_from("<I", data, 32)[0]
    struct.pack_into("<I", data, ext + 4, 0x10000000)
    with pytest.raises(ldcache.LdcacheError, match="extension"):
        ldcache.read_cache(bytes(data))
    # An hwcaps index past the section: the entry stays, without a subdirectory name.
    data = bytearray(good())
    for i in range(2):
        hw = struct.unpack_from("<Q", data, 48 + 24 * i + 16)[0]
        if hw >> 62:
            struct.pack_into("<Q", data, 48 + 24 * i + 16, hw | 0xFFFF)
    cache = ldcache.read_cache(bytes(data))
    assert [e.hwcaps for e in cache.entries] == [None, None]
    assert ldcache.format_listing(cache, "CACHE") == listing(bytes(data))


def test_unresolvable_hwcaps_entries_are_not_carried_over():
    """Found by fuzzing: an entry marked glibc-hwcaps whose index does not resolve is dead
    to the loader; rebuilding from such a cache leaves it out (and stays in order)."""
    import os
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz", "corpus", "cache",
                        "regress-unresolved-hwcaps")
    with open(path, "rb") as f:
        parsed = ParsedCache(f.read())
    b = ffi.gc(lib.cds_builder_new(X86), lib.cds_builder_free)
    assert lib.cds_builder_add_cache(b, parsed.ptr, ffi.NULL, ffi.NULL, 0, 0) == 6
    out = ffi.new("uint8_t **")
    size = ffi.new("size_t *")
    assert lib.cds_builder_build(b, lib.CDS_FORMAT_NEW, b"x", out, size) == 0
    data = ffi.buffer(out[0], size[0])[:]
    lib.cds_free(out[0])
    assert lib.cds_cache_unsorted_at(ParsedCache(data).ptr, X86) == -1
    assert len(ldcache.read_cache(data).entries) == lib.cds_builder_count(b) < 6


def test_unsorted_cache_is_detected():
    data = bytearray(build([entry("liba.so.1"), entry("libb.so.1")]))
    a = bytes(data[48:72])
    data[48:72] = data[72:96]
    data[72:96] = a
    assert lib.cds_cache_unsorted_at(ParsedCache(bytes(data)).ptr, X86) == 1
