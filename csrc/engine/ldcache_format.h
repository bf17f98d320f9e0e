/* What the ld.so.cache reader (ldcache.c) and writer (ldcache_write.c) share: the file's
 * layout, little-endian access, glibc's order of entries and the parsed cache. Not part of the
 * cffi surface.
 *
 * Layout facts (glibc 2.36, elf/cache.c and sysdeps/generic/dl-cache.h):
 *   old   "ld.so-1.7.0", pad, nlibs, then nlibs x {flags, key, value}, then strings
 *   new   "glibc-ld.so.cache" "1.1", nlibs, len_strings, flags (endianness), 3 pad bytes,
 *         extension_offset, 3 unused words (48 bytes), nlibs x {flags, key, value,
 *         osversion, hwcap} (24 bytes), the string table, then at a 4-byte boundary the
 *         extension directory: magic, count, count x {tag, flags, offset, size}, the
 *         glibc-hwcaps index (uint32 string offsets, names sorted) and the generator.
 *   compat the old table (rounded to an even count), the new cache inside its strings.
 * String offsets of the new format count from the new header; the extension offsets
 * count from the start of the file. The string table is deduplicated and tail-merged:
 * strings sorted by their reversed bytes, each one that ends the one before it shares it.
 * Entries are sorted by glibc's compare(), ties kept in directory order. */
#ifndef CDI_SHIM_LDCACHE_FORMAT_H
#define CDI_SHIM_LDCACHE_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "ldcache.h"

#define OLD_MAGIC "ld.so-1.7.0"
#define NEW_MAGIC "glibc-ld.so.cache1.1"
#define OLD_HEADER 16u
#define OLD_ENTRY 12u
#define NEW_HEADER 48u
#define NEW_ENTRY 24u
#define EXT_MAGIC 0xeaa42174u
#define EXT_TAG_GENERATOR 0u
#define EXT_TAG_HWCAPS 1u
#define HWCAP_EXTENSION (1ull << 62)
#define ISA_LEVEL_MASK 0x3ffu
#define ENDIAN_LITTLE 2u

static inline uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }
static inline void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}
static inline void put64(uint8_t *p, uint64_t v)
{
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}

struct sortkey {
    const char *soname;
    const char *hwcaps;
    uint64_t hwcap;
    int32_t flags;
    int bits;
};

static inline int popcount64(uint64_t v) { return __builtin_popcountll(v); }

/* elf/cache.c's compare(): < 0 when A goes before B. */
int ldcache_compare_keys(const struct sortkey *e1, const struct sortkey *e2, int target);

struct cds_cache {
    uint8_t *data;
    size_t len;
    int format;
    uint32_t count;
    struct cds_cache_entry *entries;
    char *generator;
    size_t generator_len;
};

#endif
