/* The string table of an ld.so.cache being written, as glibc 2.36 lays it out: each string
 * once, tail-merged (a string that ends another shares its bytes), in glibc's finalize
 * order, strings carried over from an existing cache kept in its order. Used by
 * ldcache_write.c; not part of the cffi surface. */
#ifndef CDI_SHIM_LDCACHE_STRTAB_H
#define CDI_SHIM_LDCACHE_STRTAB_H

#include <stddef.h>
#include <stdint.h>

#include "arena.h"

struct istr {
    const char *s;
    uint32_t len;
    uint32_t offset;
    uint64_t key;  /* the last 8 bytes, reversed, for sorting */
    uint32_t rank; /* where a cache we started from had it, or NO_RANK */
    uint32_t hash; /* hash_bytes(), kept for growing the table */
};

#define NO_RANK UINT32_MAX

struct strtab {
    struct istr *items;
    uint32_t count, cap;
    uint32_t *buckets; /* index + 1, 0 = empty */
    uint32_t nbuckets;
};

/* Make room for NEED strings in all (half the buckets used at most). */
int strtab_reserve(struct strtab *t, uint32_t need);
/* Intern S (copied into ARENA when new); returns its index or -1. RANK: its position in
 * the string table of a cache being carried over (NO_RANK for a new string). */
long strtab_add(struct strtab *t, struct cds_arena *arena, const char *s, size_t len, uint32_t rank);
/* Assign offsets and lay the strings out: *OUT (malloc'd, NULL when empty), *SIZE bytes. */
int strtab_finalize(struct strtab *t, uint8_t **out, size_t *size);

#endif
