"""enable-cuda-compat's decision, as nvidia-cdi-hook 1.20.0 makes it (cmd/nvidia-cdi-hook/cudacompat).

The hook does nothing without --host-driver-version and --host-cuda-version. Otherwise it
looks for exactly one regular file libcuda.so.*.* in /usr/local/cuda/compat (none or several:
nothing) and decides:

- the library's `.note.cuda.fwd_compatibility` ELF note (owner "NVIDIA Corporation", a JSON
  description {"CUDA Version": "12.8", "Driver": [535, 550], ...}), when it has one: with both
  the compat and the host driver versions, the compat libraries are used when the host driver's
  major is in "Driver" and the compat version is newer than the host's (newer minors of a
  listed major too); without a driver version to compare, when "CUDA Version" is newer than
  --host-cuda-version;
- no such note (or one that does not read): nothing with --host-cuda-version; else the compat
  libraries are used when their driver major is greater than the host's.

Versions are read as the hook's semver library reads them (Masterminds/semver v3's loose form,
v?MAJOR[.MINOR][.PATCH][-pre][+meta]); one that does not parse counts as not given. The
hook's drop-in only matters to an update-ldcache hook that runs after it (container.py).
"""
import json
import os
import struct

NOTE_SECTION = b".note.cuda.fwd_compatibility"
NOTE_OWNER = b"NVIDIA Corporation"
MAX_SECTIONS = 1 << 16
MAX_NOTE = 1 << 20
_DIGITS = frozenset("0123456789")
_IDENT = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-")


def version(text):
    """(major, minor, patch, prerelease) of a version as the hook's semver parses it, or None."""
    if not text or len(text) > 256:
        return None
    rest = text[1:] if text[0] == "v" else text
    rest, _, meta = rest.partition("+")
    if _ and not _dotted(meta):
        return None
    core, dash, pre = rest.partition("-")
    if dash and not _dotted(pre):
        return None
    if dash and any(len(p) > 1 and p[0] == "0" and set(p) <= _DIGITS for p in pre.split(".")):
        return None     # (a numeric prerelease part with a leading zero)
    parts = core.split(".")
    if len(parts) > 3 or not all(p and set(p) <= _DIGITS for p in parts):
        return None
    numbers = [int(p) for p in parts] + [0] * (3 - len(parts))
    if any(n >= 1 << 64 for n in numbers):
        return None
    return (*numbers, pre)


def _dotted(text):
    return all(part and set(part) <= _IDENT for part in text.split("."))


def newer(a, b):
    """True when version A is newer than B (semver's order, the prerelease included)."""
    if a[:3] != b[:3]:
        return a[:3] > b[:3]
    if a[3] == b[3]:
        return False
    if not a[3] or not b[3]:
        return not a[3]
    for x, y in zip(a[3].split("."), b[3].split(".")):
        if x != y:
            xn, yn = set(x) <= _DIGITS, set(y) <= _DIGITS
            if xn and yn:
                return int(x) > int(y)
            return yn if xn != yn else x > y
    return len(a[3].split(".")) > len(b[3].split("."))


def note_of(fd):
    """The compat library's fwd_compatibility note as {"cuda": str, "drivers": [int]}, or None
    (no note, one not of NVIDIA's, or one that does not read: the hook's fallback then)."""
    try:
        return _note(fd)
    except (OSError, ValueError, struct.error, UnicodeDecodeError):
        return None


def _pread(fd, size, offset):
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise ValueError("short read")
    return data


def _note(fd):
    ident = _pread(fd, 64, 0)
    if ident[:4] != b"\x7fELF" or ident[4] not in (1, 2) or ident[5] not in (1, 2):
        return None
    wide, order = ident[4] == 2, "<" if ident[5] == 1 else ">"
    if wide:
        shoff, = struct.unpack_from(order + "Q", ident, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from(order + "HHH", ident, 0x3A)
        layout = order + "IIQQQQIIQQ"
    else:
        shoff, = struct.unpack_from(order + "I", ident, 0x20)
        shentsize, shnum, shstrndx = struct.unpack_from(order + "HHH", ident, 0x2E)
        layout = order + "IIIIIIIIII"
    if not shnum or shnum > MAX_SECTIONS or shentsize < struct.calcsize(layout) or shstrndx >= shnum:
        return None
    table = _pread(fd, shentsize * shnum, shoff)
    sections = [struct.unpack_from(layout, table, i * shentsize) for i in range(shnum)]
    # (name, type, flags, addr, offset, size, link, info, addralign, entsize)
    strtab = sections[shstrndx]
    names = _pread(fd, min(strtab[5], MAX_NOTE), strtab[4])
    for section in sections:
        end = names.find(b"\0", section[0])
        if section[1] != 7 or names[section[0]:end if end >= 0 else None] != NOTE_SECTION:   # SHT_NOTE
            continue
        return _description(_pread(fd, min(section[5], MAX_NOTE), section[4]), order, section[8])
    return None


def _align(size, to):
    """The hook's alignUp of a 32-bit size (an alignment of 0 gives 0, as there)."""
    to &= 0xFFFFFFFF
    return ((size + to - 1) & 0xFFFFFFFF) & ~((to - 1) & 0xFFFFFFFF)


def _trim(data, start, count):
    if not data:
        return b""
    start = min(len(data) - 1, start)
    return data[start:min(len(data), start + count)].strip(b"\0")


def _description(data, order, addralign):
    namesz, descsz, _ = struct.unpack_from(order + "III", data, 0)
    if not namesz or not descsz:
        return None
    if _trim(data, 12, _align(namesz, addralign)) != NOTE_OWNER:
        return None
    text = _trim(data, 12 + _align(namesz, addralign), descsz).decode("utf-8", "replace")
    fields = json.loads(text, object_pairs_hook=_fields)
    if fields is None:
        return {"cuda": "", "drivers": []}      # (JSON null: the hook's header stays empty)
    if not isinstance(fields, dict):
        raise ValueError("not an object")
    return fields


def _fields(pairs):
    """The note's fields as Go's encoding/json fills the hook's struct: names matched exactly or
    case-insensitively, the last one given winning; a value of another type is an error."""
    known = {"format": "Format", "cuda version": "CUDA Version", "driver": "Driver", "device": "Device"}
    got = {}
    for key, value in pairs:
        name = known.get(key.lower())
        if name is None:
            continue
        if value is None:
            continue
        if name == "CUDA Version":
            if not isinstance(value, str):
                raise ValueError(name)
        elif name == "Format":
            _int(value)
        else:
            if not isinstance(value, list):
                raise ValueError(name)
            for item in value:
                if item is not None:
                    _int(item)
        got[name] = value
    return {"cuda": got.get("CUDA Version", ""), "drivers": [i for i in got.get("Driver") or () if i is not None]}


def _int(value):
    if isinstance(value, bool) or not isinstance(value, int) or not -(1 << 63) <= value < 1 << 63:
        raise ValueError("not an int")


def use_compat(library_name, fd, host_driver, host_cuda):
    """True when the hook would name the compat folder, for the one compat library LIBRARY_NAME
    (open as FD) and the hook's --host-driver-version / --host-cuda-version texts ('' if not given)."""
    compat = version(library_name[len("libcuda.so."):])
    driver, cuda = version(host_driver), version(host_cuda)
    note = note_of(fd)
    if note is not None:
        if compat is None or driver is None:
            wanted = version(note["cuda"]) if note["cuda"] else None
            return cuda is not None and wanted is not None and newer(wanted, cuda)
        return driver[0] in note["drivers"] and newer(compat, driver)
    if host_cuda:
        return False
    if driver is None or compat is None:
        return False
    return driver[0] < compat[0]
