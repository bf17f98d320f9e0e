/* glibc ld.so.cache reader and writer: see ldcache.h.
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
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "cleanup.h"
#include "elf.h"
#include "inroot.h"
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

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }
static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}
static void put64(uint8_t *p, uint64_t v)
{
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}

/* ---- glibc's comparisons ---------------------------------------------------------- */

int cds_libcmp(const char *a, const char *b, int target)
{
    /* char is signed on x86-64 and unsigned on AArch64: the loader's binary search uses
     * the same function, so the cache must be sorted the way the target compares. */
    int is_signed = target != CDS_TARGET_AARCH64;
#define CH(p) (is_signed ? (int)(signed char)*(p) : (int)(unsigned char)*(p))
    while (*a != '\0') {
        if (*a >= '0' && *a <= '9') {
            if (*b >= '0' && *b <= '9') {
                /* Numbers compare numerically, in int arithmetic as glibc's does. */
                unsigned va = (unsigned)(*a++ - '0'), vb = (unsigned)(*b++ - '0');
                while (*a >= '0' && *a <= '9')
                    va = va * 10u + (unsigned)(*a++ - '0');
                while (*b >= '0' && *b <= '9')
                    vb = vb * 10u + (unsigned)(*b++ - '0');
                if (va != vb)
                    return (int)(va - vb);
            } else {
                return 1;
            }
        } else if (*b >= '0' && *b <= '9') {
            return -1;
        } else if (*a != *b) {
            return CH(a) - CH(b);
        } else {
            a++;
            b++;
        }
    }
    return CH(a) - CH(b);
#undef CH
}

struct sortkey {
    const char *soname;
    const char *hwcaps;
    uint64_t hwcap;
    int32_t flags;
    int bits;
};

static int popcount64(uint64_t v) { return __builtin_popcountll(v); }

/* elf/cache.c's compare(): < 0 when A goes before B. */
static int compare_keys(const struct sortkey *e1, const struct sortkey *e2, int target)
{
    int res = cds_libcmp(e2->soname, e1->soname, target);
    if (res != 0)
        return res;
    if (e1->flags < e2->flags)
        return 1;
    if (e1->flags > e2->flags)
        return -1;
    if (e1->hwcaps != NULL && e2->hwcaps == NULL)
        return -1;
    if (e1->hwcaps == NULL && e2->hwcaps != NULL)
        return 1;
    if (e1->hwcaps != NULL && e2->hwcaps != NULL) {
        res = strcmp(e1->hwcaps, e2->hwcaps);
        if (res != 0)
            return res;
    }
    if (e2->bits > e1->bits)
        return 1;
    if (e2->bits < e1->bits)
        return -1;
    if (e2->hwcap > e1->hwcap)
        return 1;
    if (e2->hwcap < e1->hwcap)
        return -1;
    return 0;
}

/* ---- reader ----------------------------------------------------------------------- */

struct cds_cache {
    uint8_t *data;
    size_t len;
    int format;
    uint32_t count;
    struct cds_cache_entry *entries;
    char *generator;
    size_t generator_len;
};

static int string_at(const struct cds_cache *c, uint64_t off, const char **out)
{
    if (off >= c->len || memchr(c->data + off, '\0', c->len - off) == NULL)
        return -1;
    *out = (const char *)c->data + off;
    return 0;
}

static int fail(const char **why, const char *text, int err)
{
    *why = text;
    errno = err;
    return -1;
}

static int parse_new(struct cds_cache *c, size_t base, const char **why)
{
    const uint8_t *h = c->data + base;
    if (c->len - base < NEW_HEADER)
        return fail(why, "file too short for the new-format header", EINVAL);
    uint32_t nlibs = le32(h + 20);
    uint8_t endian = h[28];
    uint32_t ext_off = le32(h + 32);
    if (endian != 0 && (endian & 3u) != ENDIAN_LITTLE)
        return fail(why, "cache file has the wrong endianness", EINVAL);
    if ((c->len - base - NEW_HEADER) / NEW_ENTRY < nlibs)
        return fail(why, "entry count runs past the end of the file", EINVAL);

    uint64_t hw_off = 0, hw_size = 0, gen_off = 0, gen_size = 0;
    int have_hw = 0, have_gen = 0;
    if (ext_off != 0) {
        if (ext_off % 4 != 0)
            return fail(why, "misaligned extension directory", EINVAL);
        if ((uint64_t)ext_off + 8 > c->len)
            return fail(why, "extension directory runs past the end of the file", EINVAL);
        if (le32(c->data + ext_off) != EXT_MAGIC)
            return fail(why, "bad extension directory magic", EINVAL);
        uint64_t count = le32(c->data + ext_off + 4);
        if ((uint64_t)ext_off + 8 + count * 16 > c->len)
            return fail(why, "extension sections run past the end of the file", EINVAL);
        for (uint64_t i = 0; i < count; i++) {
            const uint8_t *s = c->data + ext_off + 8 + i * 16;
            uint64_t tag = le32(s), off = le32(s + 8), size = le32(s + 12);
            if (off + size > c->len)
                return fail(why, "extension data runs past the end of the file", EINVAL);
            if (tag == EXT_TAG_GENERATOR) {
                gen_off = off;
                gen_size = size;
                have_gen = 1;
            } else if (tag == EXT_TAG_HWCAPS) {
                hw_off = off;
                hw_size = size;
                have_hw = 1;
            }
        }
        if (have_hw && (hw_off % 4 != 0 || hw_size % 4 != 0))
            have_hw = 0; /* glibc ignores a malformed index */
    }
    if (have_gen) {
        c->generator = malloc(gen_size + 1);
        if (c->generator == NULL)
            return fail(why, "out of memory", ENOMEM);
        memcpy(c->generator, c->data + gen_off, gen_size);
        c->generator[gen_size] = '\0';
        c->generator_len = gen_size;
    }

    c->entries = calloc(nlibs ? nlibs : 1, sizeof *c->entries);
    if (c->entries == NULL)
        return fail(why, "out of memory", ENOMEM);
    for (uint32_t i = 0; i < nlibs; i++) {
        const uint8_t *e = h + NEW_HEADER + (size_t)i * NEW_ENTRY;
        struct cds_cache_entry *out = &c->entries[i];
        out->flags = (int32_t)le32(e);
        out->osversion = le32(e + 12);
        out->hwcap = le64(e + 16);
        if (string_at(c, base + (uint64_t)le32(e + 4), &out->key) < 0)
            return fail(why, "an entry's name is outside the file or unterminated", EINVAL);
        if (string_at(c, base + (uint64_t)le32(e + 8), &out->value) < 0)
            return fail(why, "an entry's path is outside the file or unterminated", EINVAL);
        if (have_hw && ((out->hwcap >> 32) & ~(uint64_t)ISA_LEVEL_MASK) == (HWCAP_EXTENSION >> 32)) {
            uint32_t index = (uint32_t)out->hwcap;
            if (index < hw_size / 4) {
                uint32_t name = le32(c->data + hw_off + 4u * index);
                if (string_at(c, base + (uint64_t)name, &out->hwcaps) < 0)
                    out->hwcaps = NULL;
                if (string_at(c, name, &out->hwcaps_print) < 0)
                    out->hwcaps_print = NULL;
            }
        }
    }
    c->count = nlibs;
    return 0;
}

static int parse_old(struct cds_cache *c, const char **why)
{
    uint32_t nlibs = le32(c->data + 12);
    if ((c->len - OLD_HEADER) / OLD_ENTRY < nlibs)
        return fail(why, "entry count runs past the end of the file", EINVAL);
    uint64_t strings = OLD_HEADER + (uint64_t)nlibs * OLD_ENTRY;
    uint64_t new_at = (strings + 7) & ~(uint64_t)7;
    if (c->len > new_at + NEW_HEADER && memcmp(c->data + new_at, NEW_MAGIC, 20) == 0) {
        c->format = CDS_FORMAT_COMPAT;
        return parse_new(c, (size_t)new_at, why);
    }
    c->format = CDS_FORMAT_OLD;
    c->entries = calloc(nlibs ? nlibs : 1, sizeof *c->entries);
    if (c->entries == NULL)
        return fail(why, "out of memory", ENOMEM);
    for (uint32_t i = 0; i < nlibs; i++) {
        const uint8_t *e = c->data + OLD_HEADER + (size_t)i * OLD_ENTRY;
        struct cds_cache_entry *out = &c->entries[i];
        out->flags = (int32_t)le32(e);
        if (string_at(c, strings + le32(e + 4), &out->key) < 0)
            return fail(why, "an entry's name is outside the file or unterminated", EINVAL);
        if (string_at(c, strings + le32(e + 8), &out->value) < 0)
            return fail(why, "an entry's path is outside the file or unterminated", EINVAL);
    }
    c->count = nlibs;
    return 0;
}

void cds_cache_free(struct cds_cache *c)
{
    if (c == NULL)
        return;
    free(c->data);
    free(c->entries);
    free(c->generator);
    free(c);
}

/* Parse DATA (LEN bytes, malloc'd), which the new cache owns, or frees on failure. */
static int parse_owned(uint8_t *data, size_t len, struct cds_cache **out, const char **why)
{
    static const char *none = "";
    *why = none;
    *out = NULL;
    if (len < OLD_HEADER) {
        free(data);
        return fail(why, "file too short to be a cache", EINVAL);
    }
    struct cds_cache *c = calloc(1, sizeof *c);
    if (c == NULL) {
        free(data);
        return fail(why, "out of memory", ENOMEM);
    }
    c->data = data;
    c->len = len;
    int rc;
    if (memcmp(data, OLD_MAGIC, 11) == 0) {
        rc = parse_old(c, why);
    } else if (len >= 20 && memcmp(data, NEW_MAGIC, 20) == 0) {
        c->format = CDS_FORMAT_NEW;
        rc = parse_new(c, 0, why);
    } else {
        rc = fail(why, "not a cache file (bad magic)", EBADMSG);
    }
    if (rc < 0) {
        int saved = errno;
        cds_cache_free(c);
        errno = saved;
        return -1;
    }
    *out = c;
    return 0;
}

int cds_cache_parse(const uint8_t *data, size_t len, struct cds_cache **out, const char **why)
{
    uint8_t *copy = malloc(len ? len : 1);
    if (copy == NULL) {
        *out = NULL;
        return fail(why, "out of memory", ENOMEM);
    }
    memcpy(copy, data, len);
    return parse_owned(copy, len, out, why);
}

int cds_cache_read_fd(int fd, size_t max, struct cds_cache **out, const char **why, struct cds_stat *st)
{
    static const char *none = "";
    uint8_t *data;
    size_t len;
    *why = none;
    *out = NULL;
    if (cds_read_fd(fd, max, &data, &len, st) < 0)
        return -1;
    return parse_owned(data, len, out, why);
}

int cds_cache_format(const struct cds_cache *c) { return c->format; }
uint32_t cds_cache_count(const struct cds_cache *c) { return c->count; }

int cds_cache_entry(const struct cds_cache *c, uint32_t index, struct cds_cache_entry *entry)
{
    if (index >= c->count) {
        errno = ERANGE;
        return -1;
    }
    *entry = c->entries[index];
    return 0;
}

const char *cds_cache_generator(const struct cds_cache *c, size_t *len)
{
    *len = c->generator_len;
    return c->generator;
}

long cds_cache_dirs(const struct cds_cache *c, char **names, uint32_t **counts, size_t *names_len)
{
    size_t cap = 16, used = 0, bytes_cap = 1024, bytes = 0;
    cleanup_free uint32_t *count = malloc(cap * sizeof *count);
    cleanup_free size_t *starts = malloc(cap * sizeof *starts);
    cleanup_free size_t *lens = malloc(cap * sizeof *lens);
    cleanup_free char *buf = malloc(bytes_cap);
    if (count == NULL || starts == NULL || lens == NULL || buf == NULL)
        return -1;
    for (uint32_t i = 0; i < c->count; i++) {
        const char *value = c->entries[i].value;
        const char *slash = strrchr(value, '/');
        size_t len = slash != NULL ? (size_t)(slash - value) : 0;
        size_t d = 0;
        /* Entries of a directory are rarely far apart: look from the last one back. */
        for (d = used; d > 0; d--)
            if (lens[d - 1] == len && memcmp(buf + starts[d - 1], value, len) == 0)
                break;
        if (d > 0) {
            count[d - 1]++;
            continue;
        }
        if (used == cap) {
            cap *= 2;
            uint32_t *c2 = realloc(count, cap * sizeof *c2);
            if (c2 == NULL)
                return -1;
            count = c2;
            size_t *s2 = realloc(starts, cap * sizeof *s2);
            if (s2 == NULL)
                return -1;
            starts = s2;
            size_t *l2 = realloc(lens, cap * sizeof *l2);
            if (l2 == NULL)
                return -1;
            lens = l2;
        }
        while (bytes + len + 1 > bytes_cap) {
            bytes_cap *= 2;
            char *b2 = realloc(buf, bytes_cap);
            if (b2 == NULL)
                return -1;
            buf = b2;
        }
        memcpy(buf + bytes, value, len);
        buf[bytes + len] = '\0';
        starts[used] = bytes;
        lens[used] = len;
        count[used++] = 1;
        bytes += len + 1;
    }
    *names = cds_take_ptr(&buf);
    *counts = cds_take_ptr(&count);
    *names_len = bytes;
    return (long)used;
}

int cds_cache_has(const struct cds_cache *c, const char *soname, const char *dir, int target)
{
    /* Sorted by descending name: find the first entry not above SONAME. */
    uint32_t lo = 0, hi = c->count;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (cds_libcmp(c->entries[mid].key, soname, target) > 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    size_t dir_len = strlen(dir);
    for (uint32_t i = lo; i < c->count && cds_libcmp(c->entries[i].key, soname, target) == 0; i++) {
        const char *value = c->entries[i].value;
        const char *slash = strrchr(value, '/');
        if (slash != NULL && (size_t)(slash - value) == dir_len && memcmp(value, dir, dir_len) == 0)
            return 1;
    }
    return 0;
}

static void cache_sortkey(const struct cds_cache_entry *e, struct sortkey *k)
{
    k->soname = e->key;
    k->flags = e->flags;
    k->hwcaps = e->hwcaps;
    k->hwcap = e->hwcaps != NULL ? 0 : e->hwcap;
    k->bits = popcount64(k->hwcap);
}

long cds_cache_unsorted_at(const struct cds_cache *c, int target)
{
    for (uint32_t i = 1; i < c->count; i++) {
        struct sortkey a, b;
        cache_sortkey(&c->entries[i - 1], &a);
        cache_sortkey(&c->entries[i], &b);
        if (compare_keys(&a, &b, target) > 0)
            return (long)i;
    }
    return -1;
}

/* ---- string table ----------------------------------------------------------------- */

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

/* A quick 64-bit-at-a-time string hash (the table only needs a good spread). */
static uint32_t hash_bytes(const char *s, size_t len)
{
    uint64_t h = 0x9e3779b97f4a7c15ull ^ len;
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
        s += 8;
        len -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, len);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 29;
    return (uint32_t)h;
}

/* Make room for NEED strings in all (half the buckets used at most). */
static int strtab_reserve(struct strtab *t, uint32_t need)
{
    if (need > (1u << 28)) {
        errno = ENOMEM;
        return -1;
    }
    uint32_t n = t->nbuckets ? t->nbuckets : 1024;
    while (n / 2 < need)
        n *= 2;
    if (n == t->nbuckets)
        return 0;
    uint32_t *b = calloc(n, sizeof *b);
    if (b == NULL)
        return -1;
    for (uint32_t i = 0; i < t->count; i++) {
        uint32_t slot = t->items[i].hash & (n - 1);
        while (b[slot] != 0)
            slot = (slot + 1) & (n - 1);
        b[slot] = i + 1;
    }
    free(t->buckets);
    t->buckets = b;
    t->nbuckets = n;
    return 0;
}

/* Intern S (copied into ARENA when new); returns its index or -1. RANK: its position in
 * the string table of a cache being carried over (NO_RANK for a new string). */
static long strtab_add(struct strtab *t, struct cds_arena *arena, const char *s, size_t len, uint32_t rank)
{
    if (len > (1u << 30)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    if ((t->count + 1) * 2 > t->nbuckets && strtab_reserve(t, t->count + 1) < 0)
        return -1;
    uint32_t hash = hash_bytes(s, len);
    uint32_t slot = hash & (t->nbuckets - 1);
    while (t->buckets[slot] != 0) {
        struct istr *it = &t->items[t->buckets[slot] - 1];
        if (it->len == len && memcmp(it->s, s, len) == 0) {
            if (it->rank == NO_RANK)
                it->rank = rank;
            return (long)(t->buckets[slot] - 1);
        }
        slot = (slot + 1) & (t->nbuckets - 1);
    }
    if (t->count == t->cap) {
        uint32_t cap = t->cap ? t->cap * 2 : (t->nbuckets / 2 > 1024 ? t->nbuckets / 2 : 1024);
        struct istr *items = realloc(t->items, cap * sizeof *items);
        if (items == NULL)
            return -1;
        t->items = items;
        t->cap = cap;
    }
    char *copy = cds_arena_strndup(arena, s, len);
    if (copy == NULL)
        return -1;
    struct istr *it = &t->items[t->count];
    it->s = copy;
    it->len = (uint32_t)len;
    it->offset = 0;
    it->rank = rank;
    it->hash = hash;
    it->key = 0;
    for (uint32_t j = 0; j < 8; j++)
        it->key = it->key << 8 | (j < len ? (unsigned char)s[len - 1 - j] : 0u);
    t->buckets[slot] = t->count + 1;
    return (long)t->count++;
}

/* glibc's finalize_compare: reversed strings, descending; a suffix after the longer one. */
static int finalize_compare(const void *l, const void *r, void *ctx)
{
    const struct istr *items = ctx;
    const struct istr *a = &items[*(const uint32_t *)l], *b = &items[*(const uint32_t *)r];
    if (a->key != b->key)
        return a->key < b->key ? 1 : -1;
    uint32_t n = a->len < b->len ? a->len : b->len;
    for (uint32_t i = 9; i <= n; i++) {
        unsigned char ca = (unsigned char)a->s[a->len - i], cb = (unsigned char)b->s[b->len - i];
        if (ca != cb)
            return (int)cb - (int)ca;
    }
    if (a->len == b->len)
        return 0;
    return a->len < b->len ? 1 : -1;
}

/* Sort string indices by rank (LSD radix, 8 bits a pass). */
static int sort_by_rank(uint32_t *ids, uint32_t n, const struct istr *items)
{
    cleanup_free uint32_t *tmp = malloc((n ? n : 1) * sizeof *tmp);
    if (tmp == NULL)
        return -1;
    uint32_t *from = ids, *to = tmp;
    for (int shift = 0; shift < 32; shift += 8) {
        uint32_t count[257] = {0};
        for (uint32_t i = 0; i < n; i++)
            count[((items[from[i]].rank >> shift) & 0xff) + 1]++;
        for (int b = 0; b < 256; b++)
            count[b + 1] += count[b];
        for (uint32_t i = 0; i < n; i++)
            to[count[(items[from[i]].rank >> shift) & 0xff]++] = from[i];
        uint32_t *swap = from;
        from = to;
        to = swap;
    }
    return 0; /* four passes: the result is back in IDS */
}

/* The finalize order: strings carried over from a cache keep that cache's order (checked),
 * new ones are sorted and merged in. */
static int strtab_order(struct strtab *t, uint32_t *order)
{
    cleanup_free uint32_t *fresh = malloc(t->count * sizeof *fresh);
    if (fresh == NULL)
        return -1;
    uint32_t nold = 0, nnew = 0;
    for (uint32_t i = 0; i < t->count; i++) {
        if (t->items[i].rank != NO_RANK)
            order[nold++] = i;
        else
            fresh[nnew++] = i;
    }
    if (sort_by_rank(order, nold, t->items) < 0)
        return -1;
    for (uint32_t i = 1; i < nold; i++)
        if (finalize_compare(&order[i - 1], &order[i], t->items) >= 0) {
            qsort_r(order, nold, sizeof *order, finalize_compare, t->items);
            break;
        }
    qsort_r(fresh, nnew, sizeof *fresh, finalize_compare, t->items);
    if (nnew == 0)
        return 0;
    cleanup_free uint32_t *old = malloc((nold ? nold : 1) * sizeof *old);
    if (old == NULL)
        return -1;
    memcpy(old, order, nold * sizeof *old);
    uint32_t i = 0, j = 0, k = 0;
    while (i < nold && j < nnew)
        order[k++] = finalize_compare(&old[i], &fresh[j], t->items) < 0 ? old[i++] : fresh[j++];
    while (i < nold)
        order[k++] = old[i++];
    while (j < nnew)
        order[k++] = fresh[j++];
    return 0;
}

/* Assign offsets and lay the strings out. */
static int strtab_finalize(struct strtab *t, uint8_t **out, size_t *size)
{
    *out = NULL;
    *size = 0;
    if (t->count == 0)
        return 0;
    cleanup_free uint32_t *order = malloc(t->count * sizeof *order);
    if (order == NULL || strtab_order(t, order) < 0)
        return -1;
    t->items[order[0]].offset = 0;
    for (uint32_t j = 1; j < t->count; j++) {
        struct istr *prev = &t->items[order[j - 1]], *cur = &t->items[order[j]];
        if (prev->len >= cur->len && memcmp(prev->s + prev->len - cur->len, cur->s, cur->len) == 0)
            cur->offset = prev->offset + prev->len - cur->len;
        else if ((uint64_t)prev->offset + prev->len + 1 > UINT32_MAX) {
            errno = EFBIG;
            return -1;
        } else
            cur->offset = prev->offset + prev->len + 1;
    }
    struct istr *last = &t->items[order[t->count - 1]];
    size_t total = (size_t)last->offset + last->len + 1;
    uint8_t *buf = calloc(total, 1);
    if (buf == NULL)
        return -1;
    for (uint32_t i = 0; i < t->count; i++)
        if (buf[t->items[i].offset] == '\0')
            memcpy(buf + t->items[i].offset, t->items[i].s, t->items[i].len + 1);
    *out = buf;
    *size = total;
    return 0;
}

/* ---- builder ---------------------------------------------------------------------- */

struct bentry {
    struct sortkey k;
    uint32_t isa_level;
    uint32_t rank, seq;
    uint32_t soname_id, path_id;
    int32_t hwcaps_id; /* string index of the glibc-hwcaps name, or -1 */
};

struct cds_builder {
    int target;
    struct cds_arena arena;
    struct strtab strings;
    struct bentry *entries;
    uint32_t count, cap, seq;
};

struct cds_builder *cds_builder_new(int target)
{
    struct cds_builder *b = calloc(1, sizeof *b);
    if (b != NULL)
        b->target = target;
    return b;
}

void cds_builder_free(struct cds_builder *b)
{
    if (b == NULL)
        return;
    cds_arena_free(&b->arena);
    free(b->strings.items);
    free(b->strings.buckets);
    free(b->entries);
    free(b);
}

static long intern(struct cds_builder *b, const char *s, size_t len)
{
    return strtab_add(&b->strings, &b->arena, s, len, NO_RANK);
}

int cds_builder_intern(struct cds_builder *b, const char *string)
{
    return intern(b, string, strlen(string)) < 0 ? -1 : 0;
}

static int add_entry(struct cds_builder *b, const char *soname, size_t soname_len, const char *path, size_t path_len,
                     int32_t flags, uint32_t isa_level, uint64_t hwcap, const char *hwcaps, uint32_t rank,
                     const uint32_t *srank)
{
    if (isa_level > ISA_LEVEL_MASK) {
        errno = EOVERFLOW;
        return -1;
    }
    /* glibc interns the path first, then the name: the order does not change the table. */
    long path_id = strtab_add(&b->strings, &b->arena, path, path_len, srank ? srank[1] : NO_RANK);
    long soname_id =
        path_id < 0 ? -1 : strtab_add(&b->strings, &b->arena, soname, soname_len, srank ? srank[0] : NO_RANK);
    long hwcaps_id = -1;
    if (soname_id < 0)
        return -1;
    if (hwcaps != NULL
        && (hwcaps_id = strtab_add(&b->strings, &b->arena, hwcaps, strlen(hwcaps), srank ? srank[2] : NO_RANK)) < 0)
        return -1;
    if (b->count == b->cap) {
        uint32_t cap = b->cap ? b->cap * 2 : 1024;
        struct bentry *grown = realloc(b->entries, cap * sizeof *grown);
        if (grown == NULL)
            return -1;
        b->entries = grown;
        b->cap = cap;
    }
    struct bentry *e = &b->entries[b->count++];
    e->soname_id = (uint32_t)soname_id;
    e->path_id = (uint32_t)path_id;
    e->hwcaps_id = (int32_t)hwcaps_id;
    e->k.flags = flags;
    e->k.hwcap = hwcaps != NULL ? 0 : hwcap;
    e->k.bits = popcount64(e->k.hwcap);
    e->k.soname = NULL; /* resolved at build: item arrays may move */
    e->k.hwcaps = NULL;
    e->isa_level = isa_level;
    e->rank = rank;
    e->seq = b->seq++;
    return 0;
}

int cds_builder_add(struct cds_builder *b, const char *soname, const char *path, int32_t flags, uint32_t isa_level,
                    uint64_t hwcap, const char *hwcaps, uint32_t rank)
{
    return add_entry(b, soname, strlen(soname), path, strlen(path), flags, isa_level, hwcap, hwcaps, rank, NULL);
}

long cds_builder_add_cache(struct cds_builder *b, const struct cds_cache *c, const char **dirs, const uint32_t *ranks,
                           size_t ndirs, uint32_t unknown_rank)
{
    long unknown = 0;
    cleanup_free size_t *lens = malloc((ndirs ? ndirs : 1) * sizeof *lens);
    if (lens == NULL)
        return -1;
    for (size_t i = 0; i < ndirs; i++)
        lens[i] = strlen(dirs[i]);
    /* Every entry brings a path and a soname (most sonames are shared with no other): size
     * the table once instead of growing it twice. */
    if (strtab_reserve(&b->strings, b->strings.count + 2 * c->count) < 0)
        return -1;
    for (uint32_t i = 0; i < c->count; i++) {
        const struct cds_cache_entry *e = &c->entries[i];
        const char *slash = strrchr(e->value, '/');
        size_t dir_len = slash != NULL ? (size_t)(slash - e->value) : 0;
        uint32_t rank = unknown_rank;
        int known = 0;
        for (size_t d = 0; d < ndirs; d++)
            if (lens[d] == dir_len && memcmp(dirs[d], e->value, dir_len) == 0) {
                rank = ranks[d];
                known = 1;
                break;
            }
        if (!known)
            unknown++;
        if (rank == CDS_RANK_DROP)
            continue;
        /* A glibc-hwcaps entry whose subdirectory name does not resolve is dead to the
         * loader (and no ldconfig writes one): leave it out. */
        if (e->hwcaps == NULL && ((e->hwcap >> 32) & ~(uint64_t)ISA_LEVEL_MASK) == (HWCAP_EXTENSION >> 32))
            continue;
        int is_ext = e->hwcaps != NULL;
        uint32_t isa = is_ext ? (uint32_t)(e->hwcap >> 32) & ISA_LEVEL_MASK : 0;
        /* The strings' places in this cache's table: its finalize order, if glibc made it. */
        uint32_t srank[3] = {
            (uint32_t)((const uint8_t *)e->key - c->data),
            (uint32_t)((const uint8_t *)e->value - c->data),
            is_ext ? (uint32_t)((const uint8_t *)e->hwcaps - c->data) : NO_RANK,
        };
        if (add_entry(b, e->key, strlen(e->key), e->value, strlen(e->value), e->flags, isa, is_ext ? 0 : e->hwcap,
                      e->hwcaps, rank, srank)
            < 0)
            return -1;
    }
    return unknown;
}

uint32_t cds_builder_count(const struct cds_builder *b) { return b->count; }

static int entry_compare(const void *l, const void *r, void *ctx)
{
    const struct bentry *a = l, *b = r;
    int res = compare_keys(&a->k, &b->k, *(const int *)ctx);
    if (res != 0)
        return res;
    if (a->rank != b->rank)
        return a->rank < b->rank ? -1 : 1;
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

/* Sort: entries from a cache come first and in order; sort the rest and merge. */
static int sort_entries(struct cds_builder *b)
{
    struct bentry *e = b->entries;
    uint32_t n = b->count, run = 1;
    while (run < n && entry_compare(&e[run - 1], &e[run], &b->target) < 0)
        run++;
    if (run >= n)
        return 0;
    qsort_r(e + run, n - run, sizeof *e, entry_compare, &b->target);
    if (entry_compare(&e[run - 1], &e[run], &b->target) < 0)
        return 0;
    cleanup_free struct bentry *merged = malloc(n * sizeof *merged);
    if (merged == NULL)
        return -1;
    uint32_t i = 0, j = run, k = 0;
    while (i < run && j < n)
        merged[k++] = entry_compare(&e[i], &e[j], &b->target) <= 0 ? e[i++] : e[j++];
    while (i < run)
        merged[k++] = e[i++];
    while (j < n)
        merged[k++] = e[j++];
    memcpy(e, merged, n * sizeof *e);
    return 0;
}

static int compare_names(const void *l, const void *r, void *ctx)
{
    const struct istr *items = ctx;
    return strcmp(items[*(const uint32_t *)l].s, items[*(const uint32_t *)r].s);
}

int cds_builder_build(struct cds_builder *b, int format, const char *generator, uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    if (format != CDS_FORMAT_OLD && format != CDS_FORMAT_NEW && format != CDS_FORMAT_COMPAT) {
        errno = EINVAL;
        return -1;
    }
    for (uint32_t i = 0; i < b->count; i++) {
        struct bentry *e = &b->entries[i];
        e->k.soname = b->strings.items[e->soname_id].s;
        e->k.hwcaps = e->hwcaps_id >= 0 ? b->strings.items[e->hwcaps_id].s : NULL;
    }
    if (sort_entries(b) < 0)
        return -1;

    /* The glibc-hwcaps index: the names in use, sorted. */
    uint32_t nstrings = b->strings.count;
    cleanup_free int32_t *hw_index = malloc((nstrings ? nstrings : 1) * sizeof *hw_index);
    cleanup_free uint32_t *hw_names = malloc((nstrings ? nstrings : 1) * sizeof *hw_names);
    if (hw_index == NULL || hw_names == NULL)
        return -1;
    for (uint32_t i = 0; i < nstrings; i++)
        hw_index[i] = -1;
    uint32_t nhw = 0;
    for (uint32_t i = 0; i < b->count; i++) {
        int32_t id = b->entries[i].hwcaps_id;
        if (id >= 0 && hw_index[id] < 0) {
            hw_index[id] = 0;
            hw_names[nhw++] = (uint32_t)id;
        }
    }
    qsort_r(hw_names, nhw, sizeof *hw_names, compare_names, b->strings.items);
    for (uint32_t i = 0; i < nhw; i++)
        hw_index[hw_names[i]] = (int32_t)i;

    cleanup_free uint8_t *strings = NULL;
    size_t strings_size;
    if (strtab_finalize(&b->strings, &strings, &strings_size) < 0)
        return -1;

    uint64_t n = b->count, old_count = 0;
    for (uint32_t i = 0; i < b->count; i++)
        if (b->entries[i].k.hwcap == 0)
            old_count++;
    uint64_t old_size = 0, pad = 0, new_size = 0;
    if (format != CDS_FORMAT_NEW) {
        if (format == CDS_FORMAT_COMPAT)
            old_count = (old_count + 1) & ~(uint64_t)1;
        old_size = OLD_HEADER + old_count * OLD_ENTRY;
    }
    if (format != CDS_FORMAT_OLD) {
        new_size = NEW_HEADER + n * NEW_ENTRY;
        if (format == CDS_FORMAT_COMPAT)
            pad = ((old_size + 7) & ~(uint64_t)7) - old_size;
    }
    uint64_t str_offset = format != CDS_FORMAT_OLD ? new_size : 0;
    uint64_t strings_at = old_size + pad + new_size;
    uint64_t ext_off = 0, gen_len = 0, gen_off = 0, hw_off = 0, total;
    if (format != CDS_FORMAT_OLD) {
        gen_len = generator != NULL ? strlen(generator) : 0;
        ext_off = (strings_at + strings_size + 3) & ~(uint64_t)3;
        hw_off = ext_off + 8 + 2 * 16;
        gen_off = nhw == 0 ? hw_off - 16 : hw_off + 4ull * nhw;
        total = gen_off + gen_len;
    } else {
        total = strings_at + strings_size;
    }
    if (total > UINT32_MAX) {
        errno = EFBIG;
        return -1;
    }

    uint8_t *file = calloc(total ? total : 1, 1);
    if (file == NULL)
        return -1;
    if (format != CDS_FORMAT_NEW) {
        memcpy(file, OLD_MAGIC, 11);
        put32(file + 12, (uint32_t)old_count);
        uint64_t idx = 0;
        for (uint32_t i = 0; i < b->count; i++) {
            struct bentry *e = &b->entries[i];
            if (e->k.hwcap != 0)
                continue; /* the old format has no hwcap entries */
            uint8_t *o = file + OLD_HEADER + idx * OLD_ENTRY;
            put32(o, (uint32_t)e->k.flags);
            put32(o + 4, (uint32_t)(str_offset + b->strings.items[e->soname_id].offset));
            put32(o + 8, (uint32_t)(str_offset + b->strings.items[e->path_id].offset));
            idx++;
        }
        if (idx > 0 && idx < old_count)
            memcpy(file + OLD_HEADER + idx * OLD_ENTRY, file + OLD_HEADER + (idx - 1) * OLD_ENTRY, OLD_ENTRY);
    }
    if (format != CDS_FORMAT_OLD) {
        uint8_t *h = file + old_size + pad;
        memcpy(h, NEW_MAGIC, 20);
        put32(h + 20, (uint32_t)n);
        put32(h + 24, (uint32_t)strings_size);
        h[28] = ENDIAN_LITTLE;
        put32(h + 32, (uint32_t)ext_off);
        for (uint32_t i = 0; i < b->count; i++) {
            struct bentry *e = &b->entries[i];
            uint8_t *o = h + NEW_HEADER + (uint64_t)i * NEW_ENTRY;
            uint64_t hwcap = e->k.hwcap;
            if (e->hwcaps_id >= 0)
                hwcap = HWCAP_EXTENSION | (uint64_t)e->isa_level << 32 | (uint32_t)hw_index[e->hwcaps_id];
            put32(o, (uint32_t)e->k.flags);
            put32(o + 4, (uint32_t)(str_offset + b->strings.items[e->soname_id].offset));
            put32(o + 8, (uint32_t)(str_offset + b->strings.items[e->path_id].offset));
            put32(o + 12, 0);
            put64(o + 16, hwcap);
        }
    }
    if (strings_size > 0)
        memcpy(file + strings_at, strings, strings_size);
    if (format != CDS_FORMAT_OLD) {
        uint8_t *x = file + ext_off;
        put32(x, EXT_MAGIC);
        put32(x + 4, nhw ? 2 : 1);
        put32(x + 8, EXT_TAG_GENERATOR);
        put32(x + 12, 0);
        put32(x + 16, (uint32_t)gen_off);
        put32(x + 20, (uint32_t)gen_len);
        if (nhw) {
            put32(x + 24, EXT_TAG_HWCAPS);
            put32(x + 28, 0);
            put32(x + 32, (uint32_t)hw_off);
            put32(x + 36, 4u * nhw);
            for (uint32_t i = 0; i < nhw; i++)
                put32(file + hw_off + 4ull * i, (uint32_t)(str_offset + b->strings.items[hw_names[i]].offset));
        }
        if (gen_len)
            memcpy(file + gen_off, generator, gen_len);
    }
    *out = file;
    *len = (size_t)total;
    return 0;
}
