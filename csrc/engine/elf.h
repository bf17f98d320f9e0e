/* ELF reader: what glibc's ldconfig (2.36) records about a shared object, for the ldconfig
 * of a given target machine (x86-64 or AArch64). Plain values and errno. */
#ifndef CDI_SHIM_ELF_H
#define CDI_SHIM_ELF_H

#include <stddef.h>
#include <stdint.h>

/* The ldconfig being emulated, by its e_machine. */
enum { CDS_TARGET_X86_64 = 62, CDS_TARGET_AARCH64 = 183 };

/* ldconfig's library flags (elf/ldconfig.h); a cache entry's flags field. */
enum {
    CDS_FLAG_LIBC4 = 0x0000,
    CDS_FLAG_ELF = 0x0001,
    CDS_FLAG_ELF_LIBC5 = 0x0002,
    CDS_FLAG_ELF_LIBC6 = 0x0003,
    CDS_FLAG_TYPE_MASK = 0x00ff,
    CDS_FLAG_REQUIRED_MASK = 0xff00,
    CDS_FLAG_X8664_LIB64 = 0x0300,
    CDS_FLAG_X8664_LIBX32 = 0x0800,
    CDS_FLAG_ARM_LIBHF = 0x0900,
    CDS_FLAG_AARCH64_LIB64 = 0x0a00,
    CDS_FLAG_ARM_LIBSF = 0x0b00
};

/* What became of a file (the reasons ldconfig would skip it). */
enum {
    CDS_ELF_LIBRARY = 0,         /* a library ldconfig adds */
    CDS_ELF_AOUT = 1,            /* an a.out library: added as libc4, soname from its name */
    CDS_ELF_EMPTY = 2,           /* zero bytes */
    CDS_ELF_TOO_SMALL = 3,       /* smaller than an ELF header */
    CDS_ELF_NOT_ELF = 4,         /* wrong magic (linker scripts land here) */
    CDS_ELF_NOT_DSO = 5,         /* e_type is not ET_DYN */
    CDS_ELF_WRONG_CLASS = 6,     /* class not handled for this machine */
    CDS_ELF_UNKNOWN_MACHINE = 7, /* e_machine the target's ldconfig refuses */
    CDS_ELF_NO_DYNAMIC = 8,      /* no (or empty) PT_DYNAMIC */
    CDS_ELF_NO_STRTAB = 9,       /* no DT_STRTAB */
    CDS_ELF_TRUNCATED = 10,      /* an offset or count points outside the file */
    CDS_ELF_SONAME_TOO_LONG = 11 /* a SONAME longer than we keep */
};

struct cds_elf_info {
    int32_t flags;      /* ldconfig's flag (valid for LIBRARY and AOUT) */
    uint32_t isa_level; /* x86 ISA level needed (GNU property), 0 if none */
    uint32_t osversion; /* the GNU ABI tag note's OS version (0 if none); glibc
                                     2.36's ldconfig no longer stores it */
    uint32_t e_flags;
    uint16_t machine;
    uint16_t type;
    uint8_t elfclass; /* 1: 32-bit, 2: 64-bit, else 0 */
    uint8_t has_soname;
    uint16_t soname_len;
    char soname[1024];
};

/* Classify the file open at FD the way TARGET's ldconfig does. SIZE is its size as fstat
 * said, or UINT64_MAX to learn it from the reads (an fstat only when one finds nothing).
 * Reads only the headers and tables it needs (pread). Returns a CDS_ELF_* status, or -1
 * with errno on an I/O error. */
int cds_elf_read_fd(int fd, uint64_t size, int target, struct cds_elf_info *info);

/* The same on bytes in memory. */
int cds_elf_parse(const uint8_t *data, size_t len, int target, struct cds_elf_info *info);

/* A short English phrase for a CDS_ELF_* status. */
const char *cds_elf_status_text(int status);

#endif
