/* ELF reader: see elf.h.
 *
 * glibc's ldconfig maps the file and checks only where a pointer starts, so it reads past the
 * end of a short file into the zeros that fill the mapping's last page; we read through
 * elf_source.h, which reproduces that view with pread, so every file ldconfig survives gets the
 * same answer, and a read where ldconfig would crash makes the file TRUNCATED. Every loop over
 * file-controlled counts is also capped. */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "elf.h"
#include "elf_source.h"

#define MAX_DYN_ENTRIES 65536u /* real objects have well under 100 */
#define MAX_NOTES 4096u

#define ET_DYN 3
#define EM_386 3
#define EM_X86_64 62
#define PT_LOAD 1
#define PT_DYNAMIC 2
#define PT_INTERP 3
#define PT_NOTE 4
#define PT_GNU_PROPERTY 0x6474e553u
#define DT_NULL 0
#define DT_NEEDED 1
#define DT_STRTAB 5
#define DT_SONAME 14
#define NT_GNU_ABI_TAG 1
#define NT_GNU_PROPERTY_TYPE_0 5
#define GNU_PROPERTY_X86_ISA_1_NEEDED 0xc0008002u

static int is_one_of(const char *value, const char *const *names)
{
    for (; *names != NULL; names++)
        if (strcmp(value, *names) == 0)
            return 1;
    return 0;
}

static const char *const interpreters_x86_64[] = {
    "/lib/ld-linux-x86-64.so.2", "/lib/ld-linux.so.2", "/libx32/ld-linux-x32.so.2", "/lib64/ld-linux-x86-64.so.2", NULL,
};
static const char *const interpreters_aarch64[] = {
    "/lib/ld-linux-aarch64.so.1",
    "/lib/ld-linux-aarch64_be.so.1",
    "/lib/ld-linux-aarch64_ilp32.so.1",
    "/lib/ld-linux-aarch64_be_ilp32.so.1",
    "/lib/ld-linux.so.3",
    "/lib/ld-linux-armhf.so.3",
    NULL,
};
static const char *const known_libs[] = {"libc.so.6", "libm.so.6", NULL};

static unsigned highest_bit(uint32_t v)
{
    unsigned bit = 0;
    while (v >>= 1)
        bit++;
    return bit;
}

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); }

/* x86's NT_GNU_PROPERTY_TYPE_0 walk for GNU_PROPERTY_X86_ISA_1_NEEDED (ldconfig's
 * read_gnu_property), inside PT_GNU_PROPERTY [start, start+size). */
static void read_isa_level(struct src *s, int bits, uint64_t start, uint64_t size, uint64_t align, uint32_t *isa_level)
{
    uint64_t note = start;
    uint32_t last_type = 0, word = (uint32_t)bits / 8;
    for (unsigned count = 0; count < MAX_NOTES && note + 12 - start < size; count++) {
        uint8_t nh[16];
        if (src_read(s, note, sizeof nh, nh) != READ_OK)
            return;
        uint32_t namesz = le32(nh), descsz = le32(nh + 4), type = le32(nh + 8);
        if (namesz == 4 && type == NT_GNU_PROPERTY_TYPE_0 && memcmp(nh + 12, "GNU", 4) == 0) {
            if (descsz < 8 || descsz % word != 0)
                return;
            uint64_t ptr = note + 16, end = ptr + descsz;
            unsigned props = 0;
            do {
                if (++props > MAX_NOTES)
                    return;
                uint8_t pr[8];
                if (src_read(s, ptr, 8, pr) != READ_OK)
                    return;
                uint32_t ptype = le32(pr), datasz = le32(pr + 4);
                if (ptype < last_type)
                    return;
                ptr += 8;
                if (ptr + datasz > end)
                    return;
                last_type = ptype;
                if (ptype > GNU_PROPERTY_X86_ISA_1_NEEDED)
                    return;
                if (ptype == GNU_PROPERTY_X86_ISA_1_NEEDED) {
                    uint8_t v[4];
                    if (datasz == 4 && src_read(s, ptr, 4, v) == READ_OK && le32(v) != 0)
                        *isa_level = highest_bit(le32(v));
                    return;
                }
                ptr += align_up(datasz, word);
            } while (ptr <= end && end - ptr >= 8);
            return; /* only the first NT_GNU_PROPERTY_TYPE_0 */
        }
        note += align_up(align_up(12 + (uint64_t)namesz, align) + descsz, align);
    }
}

/* The GNU ABI tag (informational; glibc 2.36's ldconfig stores no OS version). */
static void read_abi_tag(struct src *s, uint64_t start, uint64_t size, uint64_t align, uint32_t *osversion)
{
    if (align < 4)
        align = 4;
    if (align != 4 && align != 8)
        return;
    uint64_t note = start;
    for (unsigned count = 0; count < MAX_NOTES && size >= 12 && note - start <= size - 12; count++) {
        uint8_t nh[32];
        if (src_read(s, note, sizeof nh, nh) != READ_OK)
            return;
        uint32_t namesz = le32(nh), descsz = le32(nh + 4), type = le32(nh + 8);
        if (namesz == 4 && descsz == 16 && type == NT_GNU_ABI_TAG && memcmp(nh + 12, "GNU", 4) == 0) {
            *osversion = le32(nh + 16) << 24 | (le32(nh + 20) & 0xff) << 16 | (le32(nh + 24) & 0xff) << 8
                | (le32(nh + 28) & 0xff);
            return;
        }
        note += align_up(align_up(12 + (uint64_t)namesz, align) + descsz, align);
    }
}

struct load {
    uint64_t vaddr, offset, filesz;
};

/* ldconfig's check_ptr(): give up on the file when OFF is past its end. */
#define CHECK_PTR(off)                                                                                                 \
    do {                                                                                                               \
        int inside_ = within(s, (off));                                                                                \
        if (inside_ < 0)                                                                                               \
            return -1;                                                                                                 \
        if (!inside_)                                                                                                  \
            return CDS_ELF_TRUNCATED;                                                                                  \
    } while (0)

/* Entry N of the dynamic section at ADDR: 0 with *TAG and *VALUE, or what the caller
 * returns: -1 (I/O error) or CDS_ELF_TRUNCATED (past the file or too many entries). */
static int dyn_entry(struct src *s, uint32_t addr, uint32_t n, int is64, uint64_t *tag, uint64_t *value)
{
    uint32_t size = is64 ? 16 : 8;
    uint8_t dyn[16];
    if (n >= MAX_DYN_ENTRIES)
        return CDS_ELF_TRUNCATED;
    int rc = src_read(s, (uint64_t)addr + (uint64_t)n * size, size, dyn);
    if (rc == READ_IO)
        return -1;
    if (rc != READ_OK)
        return CDS_ELF_TRUNCATED;
    *tag = is64 ? le64(dyn) : le32(dyn);
    *value = is64 ? le64(dyn + 8) : le32(dyn + 4);
    return 0;
}

/* Copy the SONAME string at AT into INFO: 0, -1 (I/O error) or the classification. */
static int read_soname(struct src *s, uint64_t at, struct cds_elf_info *info)
{
    size_t len;
    int rc = src_string(s, at, info->soname, sizeof info->soname, &len);
    if (rc == READ_IO)
        return -1;
    if (rc == 2)
        return CDS_ELF_SONAME_TOO_LONG;
    if (rc != READ_OK)
        return CDS_ELF_TRUNCATED;
    info->soname_len = (uint16_t)len;
    info->has_soname = 1;
    return 0;
}

/* A program header's size (a constant of the class, not a field: the reads' sizes stay in a
 * range the compiler knows). */
#define PHDR_SIZE(is64) ((is64) ? 56u : 32u)

/* The program headers process() reads: where the dynamic section is and the PT_LOADs that
 * map the string table's address to a file offset. */
struct phdrs {
    int is64;
    uint64_t phoff;
    uint32_t phnum;
    uint32_t dynamic_addr; /* ldconfig keeps it in an unsigned int */
    uint64_t dynamic_size;
    struct load loads[64];
    unsigned nloads, nloads_seen;
    uint64_t loads_from; /* where the PT_LOADs not kept in loads[] start */
};

/* The fields of program header PH that process() uses. */
static inline void phdr_fields(const uint8_t *ph, int is64, uint64_t *offset, uint64_t *vaddr, uint64_t *filesz)
{
    *offset = is64 ? le64(ph + 8) : le32(ph + 4);
    *vaddr = is64 ? le64(ph + 16) : le32(ph + 8);
    *filesz = is64 ? le64(ph + 32) : le32(ph + 16);
}

/* Walk the program headers into P: the PT_LOADs and PT_DYNAMIC, and on the way INFO's flag
 * from PT_INTERP, its OS version from PT_NOTE and its ISA level from PT_GNU_PROPERTY. 0, -1
 * (I/O error) or CDS_ELF_TRUNCATED. */
static int read_phdrs(struct src *s, struct phdrs *p, int bits, int target, struct cds_elf_info *info)
{
    const char *const *interpreters = target == CDS_TARGET_AARCH64 ? interpreters_aarch64 : interpreters_x86_64;
    for (uint32_t i = 0; i < p->phnum; i++) {
        uint64_t at = p->phoff + (uint64_t)i * PHDR_SIZE(p->is64);
        uint8_t ph[56];
        CHECK_PTR(at);
        int rc = src_read(s, at, PHDR_SIZE(p->is64), ph);
        if (rc == READ_IO)
            return -1;
        if (rc != READ_OK)
            return CDS_ELF_TRUNCATED;
        uint64_t offset, vaddr, filesz;
        phdr_fields(ph, p->is64, &offset, &vaddr, &filesz);
        uint64_t palign = p->is64 ? le64(ph + 48) : le32(ph + 28);
        switch (le32(ph)) {
        case PT_LOAD:
            if (p->nloads < 64)
                p->loads[p->nloads++] = (struct load){vaddr, offset, filesz};
            else if (p->nloads_seen == 64)
                p->loads_from = at;
            p->nloads_seen++;
            break;
        case PT_DYNAMIC:
            p->dynamic_addr = (uint32_t)offset;
            p->dynamic_size = filesz;
            break;
        case PT_INTERP: {
            char name[64];
            size_t len;
            CHECK_PTR(offset);
            if (src_string(s, offset, name, sizeof name, &len) == READ_OK && is_one_of(name, interpreters))
                info->flags = CDS_FLAG_ELF_LIBC6;
            break;
        }
        case PT_NOTE: read_abi_tag(s, offset, filesz, palign, &info->osversion); break;
        case PT_GNU_PROPERTY:
            if (target == CDS_TARGET_X86_64 && palign == (uint64_t)bits / 8)
                read_isa_level(s, bits, offset, filesz, palign, &info->isa_level);
            break;
        default: break;
        }
    }
    return 0;
}

/* The load offset (vaddr - offset) of the PT_LOAD that maps address VALUE, 0 if none does. */
static uint64_t load_offset(struct src *s, const struct phdrs *p, uint64_t value)
{
    for (unsigned j = 0; j < p->nloads; j++)
        if (value >= p->loads[j].vaddr && value - p->loads[j].vaddr < p->loads[j].filesz)
            return p->loads[j].vaddr - p->loads[j].offset;
    /* More PT_LOADs than we keep: look through the rest in the file. */
    for (uint32_t i = 0; p->nloads_seen > 64 && i < p->phnum; i++) {
        uint64_t ph_at = p->phoff + (uint64_t)i * PHDR_SIZE(p->is64);
        uint8_t ph[56];
        if (ph_at < p->loads_from || src_read(s, ph_at, PHDR_SIZE(p->is64), ph) != READ_OK)
            continue;
        uint64_t offset, vaddr, filesz;
        phdr_fields(ph, p->is64, &offset, &vaddr, &filesz);
        if (le32(ph) == PT_LOAD && value >= vaddr && value - vaddr < filesz)
            return vaddr - offset;
    }
    return 0;
}

/* The file offset of the dynamic string table (the first DT_STRTAB) into *STRTAB: 0, -1 (I/O
 * error), CDS_ELF_TRUNCATED or CDS_ELF_NO_STRTAB. */
static int find_strtab(struct src *s, const struct phdrs *p, uint64_t *strtab)
{
    int is64 = p->is64;
    uint32_t dynsize = is64 ? 16 : 8;
    for (uint32_t n = 0;; n++) {
        uint64_t tag, value;
        int rc = dyn_entry(s, p->dynamic_addr, n, is64, &tag, &value);
        if (rc != 0)
            return rc;
        if (tag == DT_NULL)
            return CDS_ELF_NO_STRTAB;
        CHECK_PTR((uint64_t)p->dynamic_addr + (uint64_t)n * dynsize);
        if (tag != DT_STRTAB)
            continue;
        uint64_t loadoff = load_offset(s, p, value);
        if (!is64)
            loadoff &= 0xffffffffu;
        if (loadoff == (is64 ? UINT64_MAX : 0xffffffffu))
            loadoff = 0; /* ldconfig's "very strange" marker */
        *strtab = value - loadoff;
        if (!is64)
            *strtab &= 0xffffffffu; /* 32-bit address arithmetic */
        CHECK_PTR(*strtab);
        return 0;
    }
}

#define READ_ALL_NAMES (-2)

/* When the machine wrapper overrides the flag anyway (x86-64 objects for x86-64, 64-bit ones
 * for AArch64), DT_NEEDED names cannot change the answer as long as every name offset is in
 * range and there is at most one DT_SONAME: read just the SONAME. CDS_ELF_LIBRARY, -1,
 * another status, or READ_ALL_NAMES when the names must be read in full. */
static int read_soname_only(struct src *s, const struct phdrs *p, uint64_t strtab, struct cds_elf_info *info)
{
    uint64_t soname_at = 0;
    unsigned sonames = 0;
    for (uint32_t n = 0;; n++) {
        uint64_t tag, value;
        int rc = dyn_entry(s, p->dynamic_addr, n, p->is64, &tag, &value);
        if (rc != 0)
            return rc;
        if (tag == DT_NULL)
            break;
        if (tag != DT_NEEDED && tag != DT_SONAME)
            continue;
        uint64_t name = strtab + value;
        int inside = name < strtab ? 0 : within(s, name);
        if (inside < 0)
            return -1;
        if (!inside)
            return READ_ALL_NAMES;
        if (tag == DT_SONAME && sonames++ == 0)
            soname_at = name;
    }
    if (sonames > 1)
        return READ_ALL_NAMES;
    if (sonames == 1) {
        int rc = read_soname(s, soname_at, info);
        if (rc != 0)
            return rc;
    }
    return CDS_ELF_LIBRARY;
}

/* The DT_NEEDED and DT_SONAME names, as ldconfig reads them: the SONAME, and the libc6 flag
 * when a needed name is one of known_libs. A CDS_ELF_* status or -1. */
static int read_names(struct src *s, const struct phdrs *p, uint64_t strtab, struct cds_elf_info *info)
{
    for (uint32_t n = 0;; n++) {
        uint64_t tag, value;
        int rc = dyn_entry(s, p->dynamic_addr, n, p->is64, &tag, &value);
        if (rc != 0)
            return rc;
        if (tag == DT_NULL)
            break;
        if (tag != DT_NEEDED && tag != DT_SONAME)
            continue;
        uint64_t name = strtab + value;
        if (name < strtab)
            return CDS_ELF_TRUNCATED;
        CHECK_PTR(name);
        if (tag == DT_NEEDED) {
            char needed[16];
            size_t len;
            if (info->flags == CDS_FLAG_ELF && src_string(s, name, needed, sizeof needed, &len) == READ_OK
                && is_one_of(needed, known_libs))
                info->flags = CDS_FLAG_ELF_LIBC6;
        } else {
            rc = read_soname(s, name, info);
            if (rc != 0)
                return rc;
        }
        if (info->has_soname && info->flags != CDS_FLAG_ELF)
            break;
    }
    return CDS_ELF_LIBRARY;
}

/* elf/readelflib.c's process_elf_file for one class. */
static int process(struct src *s, const uint8_t *eh, int bits, int target, int flag_overridden,
                   struct cds_elf_info *info)
{
    struct phdrs p;
    p.is64 = bits == 64;
    if (eh[4] != (p.is64 ? 2 : 1))
        return CDS_ELF_WRONG_CLASS;
    if (le16(eh + 16) != ET_DYN)
        return CDS_ELF_NOT_DSO;
    p.phoff = p.is64 ? le64(eh + 32) : le32(eh + 28);
    p.phnum = le16(eh + (p.is64 ? 56 : 44));
    CHECK_PTR(p.phoff);

    info->flags = CDS_FLAG_ELF;
    p.dynamic_addr = 0;
    p.dynamic_size = 0;
    p.nloads = p.nloads_seen = 0;
    p.loads_from = 0;
    int rc = read_phdrs(s, &p, bits, target, info);
    if (rc != 0)
        return rc;
    if (p.dynamic_size == 0)
        return CDS_ELF_NO_DYNAMIC;
    CHECK_PTR(p.dynamic_addr);

    uint64_t strtab = 0;
    rc = find_strtab(s, &p, &strtab);
    if (rc != 0)
        return rc;
    if (flag_overridden) {
        rc = read_soname_only(s, &p, strtab, info);
        if (rc != READ_ALL_NAMES)
            return rc;
    }
    return read_names(s, &p, strtab, info);
}

static int classify(struct src *s, int target, struct cds_elf_info *info)
{
    memset(info, 0, offsetof(struct cds_elf_info, soname));
    info->soname[0] = '\0';
    if (s->size == 0)
        return CDS_ELF_EMPTY;
    if (s->size < 64) /* sizeof (struct exec), sizeof (Elf64_Ehdr) */
        return CDS_ELF_TOO_SMALL;
    uint8_t eh[64];
    int rc = src_read(s, 0, sizeof eh, eh);
    if (rc != READ_OK)
        return rc == READ_IO ? -1 : CDS_ELF_TRUNCATED;
    info->elfclass = eh[4] == 1 || eh[4] == 2 ? eh[4] : 0;
    info->type = le16(eh + 16);
    info->machine = le16(eh + 18);
    info->e_flags = le32(eh + (eh[4] == 1 ? 36 : 48));

    uint32_t magic = le32(eh) & 0xffff;
    if (magic == 0413 || magic == 0314) { /* a.out ZMAGIC / QMAGIC */
        info->flags = CDS_FLAG_LIBC4;
        return CDS_ELF_AOUT;
    }
    if (memcmp(eh, "\177ELF", 4) != 0)
        return CDS_ELF_NOT_ELF;
    if (info->type != ET_DYN)
        return CDS_ELF_NOT_DSO;

    int bits = eh[4] == 1 ? 32 : 64;
    if (target == CDS_TARGET_X86_64) {
        int32_t file_flag = -1;
        if (info->machine == EM_X86_64)
            file_flag =
                eh[4] == 2 ? (CDS_FLAG_X8664_LIB64 | CDS_FLAG_ELF_LIBC6) : (CDS_FLAG_X8664_LIBX32 | CDS_FLAG_ELF_LIBC6);
        else if (!(info->machine == EM_386 && eh[4] == 1))
            return CDS_ELF_UNKNOWN_MACHINE;
        rc = process(s, eh, bits, target, file_flag >= 0, info);
        if (rc == CDS_ELF_LIBRARY && file_flag >= 0)
            info->flags = file_flag;
        return rc;
    }
    /* AArch64 (sysdeps/unix/sysv/linux/arm/readelflib.c): no machine check at all. */
    rc = process(s, eh, bits, target, bits == 64, info);
    if (rc == CDS_ELF_LIBRARY) {
        if (bits == 32) {
            if ((info->e_flags & 0xff000000u) == 0x05000000u) {
                if (info->e_flags & 0x400)
                    info->flags = CDS_FLAG_ARM_LIBHF | CDS_FLAG_ELF_LIBC6;
                else if (info->e_flags & 0x200)
                    info->flags = CDS_FLAG_ARM_LIBSF | CDS_FLAG_ELF_LIBC6;
                else
                    info->flags = CDS_FLAG_ELF_LIBC6;
            }
        } else {
            info->flags = CDS_FLAG_AARCH64_LIB64 | CDS_FLAG_ELF_LIBC6;
        }
    }
    return rc;
}

int cds_elf_read_fd(int fd, uint64_t size, int target, struct cds_elf_info *info)
{
    struct src s;
    src_init(&s, fd, NULL, size);
    s.seen = 0;
    size_t want = size < HEAD ? (size_t)size : HEAD;
    if (pread_full(fd, s.head, want, 0, &s.head_len) < 0)
        return -1;
    s.seen = s.head_len;
    if (s.head_len < want || (size == SIZE_UNKNOWN && s.head_len < HEAD))
        set_size(&s, s.head_len); /* the end of the file (or it shrank since fstat) */
    return classify(&s, target, info);
}

int cds_elf_parse(const uint8_t *data, size_t len, int target, struct cds_elf_info *info)
{
    struct src s;
    src_init(&s, -1, data, len);
    return classify(&s, target, info);
}

const char *cds_elf_status_text(int status)
{
    switch (status) {
    case CDS_ELF_LIBRARY: return "shared library";
    case CDS_ELF_AOUT: return "a.out library";
    case CDS_ELF_EMPTY: return "empty file";
    case CDS_ELF_TOO_SMALL: return "too small for an ELF header";
    case CDS_ELF_NOT_ELF: return "not an ELF file";
    case CDS_ELF_NOT_DSO: return "not a shared object";
    case CDS_ELF_WRONG_CLASS: return "ELF class not handled";
    case CDS_ELF_UNKNOWN_MACHINE: return "unknown machine";
    case CDS_ELF_NO_DYNAMIC: return "no dynamic section";
    case CDS_ELF_NO_STRTAB: return "no dynamic string table";
    case CDS_ELF_TRUNCATED: return "offsets outside the file";
    case CDS_ELF_SONAME_TOO_LONG: return "SONAME too long";
    default: return "unknown status";
    }
}
