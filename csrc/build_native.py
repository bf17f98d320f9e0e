"""cffi (API mode) build script for shim._native, run by `pip install .`."""
import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))

ffibuilder = FFI()
with open(os.path.join(HERE, "native.h")) as header:
    ffibuilder.cdef("".join(line for line in header if not line.startswith("#")))
ffibuilder.set_source(
    "shim._native",
    '#include "native.h"',
    sources=[os.path.relpath(os.path.join(HERE, "native.c"))],
    include_dirs=[os.path.relpath(HERE)],
    extra_compile_args=["-O2", "-Wall", "-Werror", "-std=gnu11"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
