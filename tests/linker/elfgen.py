"""Synthetic ELF shared objects for tests: any class, machine, flags, SONAME and notes.

Just enough structure for ldconfig (and our reader) to classify a file: an ELF header, a
program header table with PT_LOAD (covering the whole file), PT_DYNAMIC, optional PT_NOTE
(ABI tag) and PT_GNU_PROPERTY (x86 ISA level), a dynamic string table and a dynamic section.
Nothing here is loadable code; the real loader test uses gcc-built libraries.
"""
import struct

EM_386, EM_ARM, EM_X86_64, EM_AARCH64 = 3, 40, 62, 183
ET_EXEC, ET_DYN = 2, 3
PT_LOAD, PT_DYNAMIC, PT_INTERP, PT_NOTE = 1, 2, 3, 4
PT_GNU_PROPERTY = 0x6474E553
DT_NULL, DT_NEEDED, DT_STRTAB, DT_SONAME = 0, 1, 5, 14
NT_GNU_ABI_TAG, NT_GNU_PROPERTY_TYPE_0 = 1, 5
GNU_PROPERTY_X86_ISA_1_NEEDED = 0xC0008002


def _note(name, ntype, desc, align):
    """An ELF note: header, name and descriptor, each start aligned to ALIGN."""
    name_b = name + b"\0"
    head = struct.pack("<III", len(name_b), len(desc), ntype) + name_b
    head += b"\0" * (-len(head) % align)
    body = head + desc
    return body + b"\0" * (-len(body) % align)


def make_elf(soname=None, elfclass=64, machine=EM_X86_64, etype=ET_DYN, e_flags=0,
             needed=(), abi_tag=None, isa_needed=None, vaddr=0x0, interp=None):
    """Return the bytes of a small ELF file. abi_tag: (os, major, minor, patch)."""
    is64 = elfclass == 64
    word = "Q" if is64 else "I"
    ehsize, phentsize = (64, 56) if is64 else (52, 32)
    align = 8 if is64 else 4

    strtab = b"\0"
    offsets = {}
    for name in ([soname] if soname else []) + list(needed) + ([interp] if interp else []):
        offsets[name] = len(strtab)
        strtab += name.encode() + b"\0"
    notes = b""
    if abi_tag is not None:
        notes += _note(b"GNU", NT_GNU_ABI_TAG, struct.pack("<IIII", *abi_tag), 4)
    prop = b""
    if isa_needed is not None:
        body = struct.pack("<III", GNU_PROPERTY_X86_ISA_1_NEEDED, 4, isa_needed)
        body += b"\0" * (-len(body) % align)
        prop = _note(b"GNU", NT_GNU_PROPERTY_TYPE_0, body, align)
    dyn = b""
    for name in needed:
        dyn += struct.pack("<" + word * 2, DT_NEEDED, offsets[name])
    if soname:
        dyn += struct.pack("<" + word * 2, DT_SONAME, offsets[soname])
    nph = 2 + (1 if notes else 0) + (1 if prop else 0) + (1 if interp else 0)
    layout_start = ehsize + nph * phentsize
    pos = layout_start
    pos += -pos % 8
    strtab_off = pos
    pos += len(strtab)
    pos += -pos % 8
    dyn_off = pos
    dyn += struct.pack("<" + word * 2, DT_STRTAB, vaddr + strtab_off)
    dyn += struct.pack("<" + word * 2, DT_NULL, 0)
    pos += len(dyn)
    pos += -pos % 8
    notes_off = pos
    pos += len(notes)
    pos += -pos % 8
    prop_off = pos
    pos += len(prop)
    total = pos

    def phdr(ptype, off, size, palign, flags=4):
        if is64:
            return struct.pack("<IIQQQQQQ", ptype, flags, off, vaddr + off, vaddr + off, size, size, palign)
        return struct.pack("<IIIIIIII", ptype, off, vaddr + off, vaddr + off, size, size, flags, palign)

    phdrs = phdr(PT_LOAD, 0, total, 0x1000, 5) + phdr(PT_DYNAMIC, dyn_off, len(dyn), align, 6)
    if interp:
        phdrs += phdr(PT_INTERP, strtab_off + offsets[interp], len(interp) + 1, 1)
    if notes:
        phdrs += phdr(PT_NOTE, notes_off, len(notes), 4)
    if prop:
        phdrs += phdr(PT_GNU_PROPERTY, prop_off, len(prop), align)
    ident = b"\x7fELF" + bytes([1 if not is64 else 2, 1, 1, 0]) + b"\0" * 8
    if is64:
        ehdr = ident + struct.pack("<HHIQQQIHHHHHH", etype, machine, 1, 0, ehsize, 0, e_flags,
                                   ehsize, phentsize, nph, 64, 0, 0)
    else:
        ehdr = ident + struct.pack("<HHIIIIIHHHHHH", etype, machine, 1, 0, ehsize, 0, e_flags,
                                   ehsize, phentsize, nph, 40, 0, 0)
    out = bytearray(total)
    out[0:len(ehdr)] = ehdr
    out[ehsize:ehsize + len(phdrs)] = phdrs
    out[strtab_off:strtab_off + len(strtab)] = strtab
    out[dyn_off:dyn_off + len(dyn)] = dyn
    out[notes_off:notes_off + len(notes)] = notes
    out[prop_off:prop_off + len(prop)] = prop
    return bytes(out)


def write_elf(path, **kwargs):
    with open(path, "wb") as out:
        out.write(make_elf(**kwargs))
    return path
