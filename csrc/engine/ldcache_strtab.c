/* The string table of a cache being written: see ldcache_strtab.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "cleanup.h"
#include "ldcache_strtab.h"

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
int strtab_reserve(struct strtab *t, uint32_t need)
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
long strtab_add(struct strtab *t, struct cds_arena *arena, const char *s, size_t len, uint32_t rank)
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
int strtab_finalize(struct strtab *t, uint8_t **out, size_t *size)
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
