"""Regenerate the checked-in seed corpus (run from the repository root with the venv):
    .venv/bin/python tests/linker/fuzz/make_corpus.py
Small files on purpose: libFuzzer mutates them; size is not coverage."""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import elfgen  # noqa: E402
from shim._native import ffi, lib  # noqa: E402


def cache(entries, fmt, interned=()):
    b = ffi.gc(lib.cds_builder_new(lib.CDS_TARGET_X86_64), lib.cds_builder_free)
    for name in interned:
        lib.cds_builder_intern(b, name.encode())
    for soname, path, flags, isa, hwcap, hwcaps in entries:
        lib.cds_builder_add(b, soname.encode(), path.encode(), flags, isa, hwcap,
                            hwcaps.encode() if hwcaps else ffi.NULL, 0)
    out = ffi.new("uint8_t **")
    size = ffi.new("size_t *")
    lib.cds_builder_build(b, fmt, b"seed", out, size)
    data = ffi.buffer(out[0], size[0])[:]
    lib.cds_free(out[0])
    return data


def main():
    entries = [
        ("libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6", 0x303, 0, 0, None),
        ("libm.so.6", "/lib/x86_64-linux-gnu/libm.so.6", 0x303, 0, 0, None),
        ("libz.so.1", "/usr/lib/libz.so.1", 0x303, 0, 0, None),
        ("libz.so.1", "/lib/glibc-hwcaps/x86-64-v3/libz.so.1.3", 0x303, 2, 0, "x86-64-v3"),
        ("libz.so.1", "/lib/tls/libz.so.1", 0x303, 0, 1 << 63, None),
        ("libi.so.1", "/usr/lib/i386-linux-gnu/libi.so.1", 0x3, 0, 0, None),
    ]
    seeds = {
        "cache/new": cache(entries, lib.CDS_FORMAT_NEW, ["unused"]),
        "cache/compat": cache(entries[:3], lib.CDS_FORMAT_COMPAT),
        "cache/old": cache(entries[:3], lib.CDS_FORMAT_OLD),
        "cache/empty-new": cache([], lib.CDS_FORMAT_NEW),
        "elf/x86-64": elfgen.make_elf(soname="libx.so.1", needed=["libc.so.6"], abi_tag=(0, 3, 2, 0)),
        "elf/x86-64-isa": elfgen.make_elf(soname="libx.so.1", isa_needed=7),
        "elf/x32": elfgen.make_elf(soname="libx.so.1", elfclass=32),
        "elf/i386": elfgen.make_elf(soname="libi.so.1", elfclass=32, machine=elfgen.EM_386,
                                    interp="/lib/ld-linux.so.2"),
        "elf/i386-isa": elfgen.make_elf(soname="libi.so.1", elfclass=32, machine=elfgen.EM_386,
                                        isa_needed=3, needed=["libm.so.6"]),
        "elf/aarch64": elfgen.make_elf(soname="liba.so.1", machine=elfgen.EM_AARCH64),
        "elf/armhf": elfgen.make_elf(soname="liba.so.1", elfclass=32, machine=elfgen.EM_ARM,
                                     e_flags=0x05000400),
        "elf/nosoname": elfgen.make_elf(vaddr=0x1000),
        "elf/aout": b"\x0b\x01" + b"\0" * 62,
        "elf/script": b"/* GNU ld script */ GROUP ( libc.so.6 )" + b" " * 30,
    }
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "l.c")
        with open(src, "w") as out:
            out.write("int f(void) { return 1; }\n")
        lib_path = os.path.join(tmp, "libreal.so")
        subprocess.run(["gcc", "-shared", "-fPIC", "-Os", "-s", "-o", lib_path, src,
                        "-Wl,-soname,libreal.so.1"], check=True)
        with open(lib_path, "rb") as f:
            seeds["elf/gcc-real"] = f.read()
    for name, data in seeds.items():
        path = os.path.join(HERE, "corpus", name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as out:
            out.write(data)
    print(f"{len(seeds)} seeds written under {os.path.join(HERE, 'corpus')}")


if __name__ == "__main__":
    main()
