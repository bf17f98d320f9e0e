/* glibc ld.so.cache reader: see ldcache.h (the layout: ldcache_format.h). Also glibc's
 * comparisons, which order a cache for the loader's binary search; the writer is
 * ldcache_write.c. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cleanup.h"
#include "elf.h"
#include "inroot.h"
#include "ldcache.h"
#include "ldcache_format.h"

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
/* elf/cache.c's compare(): < 0 when A goes before B. */
int ldcache_compare_keys(const struct sortkey *e1, const struct sortkey *e2, int target)
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
        if (ldcache_compare_keys(&a, &b, target) > 0)
            return (long)i;
    }
    return -1;
}
