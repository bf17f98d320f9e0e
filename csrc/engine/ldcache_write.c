/* glibc ld.so.cache writer: see ldcache.h (the layout: ldcache_format.h). Entries are added
 * one by one or carried over from an existing cache, sorted as glibc's ldconfig sorts them,
 * and laid out in any of the three formats with the string table of ldcache_strtab.c. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "cleanup.h"
#include "ldcache.h"
#include "ldcache_format.h"
#include "ldcache_strtab.h"

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
    return cds_builder_add_cache_except(b, c, dirs, ranks, ndirs, unknown_rank, NULL, 0, 0);
}

/* Whether PATH is one of the NPATHS NUL-terminated strings packed in PATHS (LEN bytes). */
static int is_one_of(const char *path, const char *paths, size_t len, size_t npaths)
{
    const char *at = paths, *end = paths + len;
    for (size_t i = 0; i < npaths && at < end; i++) {
        size_t n = strnlen(at, (size_t)(end - at));
        if (n == (size_t)(end - at))
            return 0; /* not terminated: refused by the caller's count */
        if (strcmp(at, path) == 0)
            return 1;
        at += n + 1;
    }
    return 0;
}

long cds_builder_add_cache_except(struct cds_builder *b, const struct cds_cache *c, const char **dirs,
                                  const uint32_t *ranks, size_t ndirs, uint32_t unknown_rank, const char *except,
                                  size_t except_len, size_t nexcept)
{
    long unknown = 0;
    if (nexcept > 0 && (except == NULL || except_len == 0 || except[except_len - 1] != '\0')) {
        errno = EINVAL;
        return -1;
    }
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
        if (rank == CDS_RANK_DROP || (nexcept > 0 && is_one_of(e->value, except, except_len, nexcept)))
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
    int res = ldcache_compare_keys(&a->k, &b->k, *(const int *)ctx);
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

/* The glibc-hwcaps index: the subdirectory names in use into HW_NAMES (string ids), sorted,
 * with HW_INDEX[id] each one's place there. Returns how many. */
static uint32_t index_hwcaps(const struct cds_builder *b, int32_t *hw_index, uint32_t *hw_names)
{
    for (uint32_t i = 0; i < b->strings.count; i++)
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
    return nhw;
}

/* Where each part of the file goes. */
struct layout {
    uint64_t old_count, old_size, pad, new_size;
    uint64_t str_offset; /* what string offsets in entries count from */
    uint64_t strings_at, strings_size;
    uint64_t ext_off, gen_len, gen_off, hw_off, total;
};

/* Lay out a FORMAT file of B's entries, STRINGS_SIZE bytes of strings, NHW hwcaps names and
 * GENERATOR: 0, or -1 with EFBIG when it would pass 4 GiB. */
static int lay_out(const struct cds_builder *b, int format, const char *generator, size_t strings_size, uint32_t nhw,
                   struct layout *l)
{
    *l = (struct layout){.strings_size = strings_size};
    for (uint32_t i = 0; i < b->count; i++)
        if (b->entries[i].k.hwcap == 0)
            l->old_count++;
    if (format != CDS_FORMAT_NEW) {
        if (format == CDS_FORMAT_COMPAT)
            l->old_count = (l->old_count + 1) & ~(uint64_t)1;
        l->old_size = OLD_HEADER + l->old_count * OLD_ENTRY;
    }
    if (format != CDS_FORMAT_OLD) {
        l->new_size = NEW_HEADER + (uint64_t)b->count * NEW_ENTRY;
        if (format == CDS_FORMAT_COMPAT)
            l->pad = ((l->old_size + 7) & ~(uint64_t)7) - l->old_size;
    }
    l->str_offset = format != CDS_FORMAT_OLD ? l->new_size : 0;
    l->strings_at = l->old_size + l->pad + l->new_size;
    if (format != CDS_FORMAT_OLD) {
        l->gen_len = generator != NULL ? strlen(generator) : 0;
        l->ext_off = (l->strings_at + strings_size + 3) & ~(uint64_t)3;
        l->hw_off = l->ext_off + 8 + 2 * 16;
        l->gen_off = nhw == 0 ? l->hw_off - 16 : l->hw_off + 4ull * nhw;
        l->total = l->gen_off + l->gen_len;
    } else {
        l->total = l->strings_at + strings_size;
    }
    if (l->total > UINT32_MAX) {
        errno = EFBIG;
        return -1;
    }
    return 0;
}

/* The old format's header and entries (no hwcap entries: it has none). */
static void write_old(const struct cds_builder *b, const struct layout *l, uint8_t *file)
{
    uint64_t str_offset = l->str_offset; /* (a local: the stores below may alias *L) */
    memcpy(file, OLD_MAGIC, 11);
    put32(file + 12, (uint32_t)l->old_count);
    uint64_t idx = 0;
    for (uint32_t i = 0; i < b->count; i++) {
        const struct bentry *e = &b->entries[i];
        if (e->k.hwcap != 0)
            continue;
        uint8_t *o = file + OLD_HEADER + idx * OLD_ENTRY;
        put32(o, (uint32_t)e->k.flags);
        put32(o + 4, (uint32_t)(str_offset + b->strings.items[e->soname_id].offset));
        put32(o + 8, (uint32_t)(str_offset + b->strings.items[e->path_id].offset));
        idx++;
    }
    if (idx > 0 && idx < l->old_count)
        memcpy(file + OLD_HEADER + idx * OLD_ENTRY, file + OLD_HEADER + (idx - 1) * OLD_ENTRY, OLD_ENTRY);
}

/* The new format's header and entries; HW_INDEX places each hwcaps subdirectory's name. */
static void write_new(const struct cds_builder *b, const struct layout *l, const int32_t *hw_index, uint8_t *file)
{
    uint64_t str_offset = l->str_offset; /* (a local: the stores below may alias *L) */
    uint8_t *h = file + l->old_size + l->pad;
    memcpy(h, NEW_MAGIC, 20);
    put32(h + 20, b->count);
    put32(h + 24, (uint32_t)l->strings_size);
    h[28] = ENDIAN_LITTLE;
    put32(h + 32, (uint32_t)l->ext_off);
    for (uint32_t i = 0; i < b->count; i++) {
        const struct bentry *e = &b->entries[i];
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

/* The new format's extensions: the generator, and the hwcaps names HW_NAMES when any. */
static void write_extensions(const struct cds_builder *b, const struct layout *l, const char *generator,
                             const uint32_t *hw_names, uint32_t nhw, uint8_t *file)
{
    uint8_t *x = file + l->ext_off;
    put32(x, EXT_MAGIC);
    put32(x + 4, nhw ? 2 : 1);
    put32(x + 8, EXT_TAG_GENERATOR);
    put32(x + 12, 0);
    put32(x + 16, (uint32_t)l->gen_off);
    put32(x + 20, (uint32_t)l->gen_len);
    if (nhw) {
        put32(x + 24, EXT_TAG_HWCAPS);
        put32(x + 28, 0);
        put32(x + 32, (uint32_t)l->hw_off);
        put32(x + 36, 4u * nhw);
        for (uint32_t i = 0; i < nhw; i++)
            put32(file + l->hw_off + 4ull * i, (uint32_t)(l->str_offset + b->strings.items[hw_names[i]].offset));
    }
    if (l->gen_len)
        memcpy(file + l->gen_off, generator, l->gen_len);
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

    uint32_t nstrings = b->strings.count;
    cleanup_free int32_t *hw_index = malloc((nstrings ? nstrings : 1) * sizeof *hw_index);
    cleanup_free uint32_t *hw_names = malloc((nstrings ? nstrings : 1) * sizeof *hw_names);
    if (hw_index == NULL || hw_names == NULL)
        return -1;
    uint32_t nhw = index_hwcaps(b, hw_index, hw_names);

    cleanup_free uint8_t *strings = NULL;
    size_t strings_size;
    if (strtab_finalize(&b->strings, &strings, &strings_size) < 0)
        return -1;
    struct layout l;
    if (lay_out(b, format, generator, strings_size, nhw, &l) < 0)
        return -1;

    uint8_t *file = calloc(l.total ? l.total : 1, 1);
    if (file == NULL)
        return -1;
    if (format != CDS_FORMAT_NEW)
        write_old(b, &l, file);
    if (format != CDS_FORMAT_OLD)
        write_new(b, &l, hw_index, file);
    if (strings_size > 0)
        memcpy(file + l.strings_at, strings, strings_size);
    if (format != CDS_FORMAT_OLD)
        write_extensions(b, &l, generator, hw_names, nhw, file);
    *out = file;
    *len = (size_t)l.total;
    return 0;
}
