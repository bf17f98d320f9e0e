"""Host programs the test bench (CRI lab, end-to-end tests) builds container images from."""
import os
import struct

BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")


def is_static_elf(path):
    """True for an ELF executable without a PT_INTERP program header (statically linked)."""
    with open(path, "rb") as stream:
        head = stream.read(64)
        if head[:4] != b"\x7fELF":
            return False
        end = "<" if head[5] == 1 else ">"
        if head[4] == 2:
            phoff, = struct.unpack(end + "Q", head[32:40])
            phentsize, phnum = struct.unpack(end + "HH", head[54:58])
        else:
            phoff, = struct.unpack(end + "I", head[28:32])
            phentsize, phnum = struct.unpack(end + "HH", head[42:46])
        for index in range(phnum):
            stream.seek(phoff + index * phentsize)
            if struct.unpack(end + "I", stream.read(4))[0] == 3:  # PT_INTERP
                return False
    return True


def static_busybox():
    """Path of a statically linked busybox (a rootfs in one file), or None."""
    for candidate in BUSYBOX_CANDIDATES:
        if os.path.exists(candidate) and is_static_elf(candidate):
            return candidate
    return None
