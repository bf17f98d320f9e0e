"""cffi (API mode) build script for shim._native, run by `pip install .`.

The C sources and the headers that make up the Python-visible surface are listed here;
each header is written so cffi can read it as it is (preprocessor lines are dropped).
"""
import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))

# Headers in dependency order: their declarations are the cffi surface.
HEADERS = ["native.h", "inroot.h", "elf.h", "ldcache.h", "scan.h", "ociconf.h", "resident.h", "request.h", "recipe.h",
           "replay.h", "devlinks.h"]
SOURCES = ["native.c", "inroot.c", "elf.c", "ldcache.c", "ldcache_write.c", "ldcache_strtab.c", "scan.c",
           "scan_listing.c", "scan_resolve.c", "scan_prefetch.c", "hwcaps.c", "filememo.c", "ociconf.c",
           "recipe.c", "replay.c", "replay_etc.c", "request.c", "devlinks.c"]


def _cdef_text():
    text = []
    for name in HEADERS:
        with open(os.path.join(HERE, name)) as header:
            text.append("".join(line for line in header if not line.lstrip().startswith("#")))
    return "\n".join(text)


ffibuilder = FFI()
ffibuilder.cdef(_cdef_text())
ffibuilder.set_source(
    "shim._native",
    "\n".join(f'#include "{name}"' for name in HEADERS),
    sources=[os.path.relpath(os.path.join(HERE, name)) for name in SOURCES],
    include_dirs=[os.path.relpath(HERE)],
    extra_compile_args=["-O2", "-g0", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror",
                        "-std=gnu11", "-fno-strict-aliasing"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
