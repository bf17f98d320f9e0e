/* The memo of host files read as extras: see hostmemo.h. A chained hash table behind one
 * mutex (the scan's prefetch threads share it); emptied whole when it grows past
 * MAX_ENTRIES, which no node's driver needs. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "hostmemo.h"
#include "scan.h"

#define BUCKETS 1024u
#define MAX_ENTRIES 8192u

struct entry {
    struct entry *next;
    struct stat id;
    struct hostmemo_value value;
    char path[];
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct entry *buckets[BUCKETS];
static uint32_t entries;
static int enabled;
static uint64_t hits, misses;

int hostmemo_enabled(void)
{
    return __atomic_load_n(&enabled, __ATOMIC_RELAXED);
}

int hostmemo_same(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size
           && a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec
           && a->st_ctim.tv_sec == b->st_ctim.tv_sec && a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

static uint32_t bucket_of(const char *path)
{
    uint32_t h = 2166136261u;         /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)path; *p; p++)
        h = (h ^ *p) * 16777619u;
    return h % BUCKETS;
}

static void clear_locked(void)
{
    for (uint32_t b = 0; b < BUCKETS; b++) {
        while (buckets[b]) {
            struct entry *e = buckets[b];
            buckets[b] = e->next;
            free(e->value.soname);
            free(e);
        }
    }
    entries = 0;
}

int hostmemo_lookup(const char *path, const struct stat *st, struct hostmemo_value *v)
{
    int found = 0;
    pthread_mutex_lock(&lock);
    for (struct entry *e = buckets[bucket_of(path)]; e; e = e->next) {
        if (strcmp(e->path, path) != 0 || !hostmemo_same(&e->id, st))
            continue;
        *v = e->value;
        v->soname = e->value.soname ? strdup(e->value.soname) : NULL;
        found = e->value.soname == NULL || v->soname != NULL;
        break;
    }
    if (found)
        hits++;
    else
        misses++;
    pthread_mutex_unlock(&lock);
    return found;
}

void hostmemo_store(const char *path, const struct stat *st, const struct hostmemo_value *v)
{
    size_t len = strlen(path) + 1;
    struct entry *e = malloc(sizeof *e + len);
    if (e == NULL)
        return;
    e->id = *st;
    e->value = *v;
    e->value.soname = v->soname ? strdup(v->soname) : NULL;
    if (v->soname && e->value.soname == NULL) {
        free(e);
        return;
    }
    memcpy(e->path, path, len);
    pthread_mutex_lock(&lock);
    uint32_t b = bucket_of(path);
    for (struct entry **p = &buckets[b]; *p; p = &(*p)->next) {
        if (strcmp((*p)->path, path) == 0) {     /* the file changed: replace what we had */
            struct entry *old = *p;
            *p = old->next;
            free(old->value.soname);
            free(old);
            entries--;
            break;
        }
    }
    if (entries >= MAX_ENTRIES)
        clear_locked();
    e->next = buckets[b];
    buckets[b] = e;
    entries++;
    pthread_mutex_unlock(&lock);
}

int cds_scan_host_memo(int enable, int forget, struct cds_memo_stats *stats)
{
    pthread_mutex_lock(&lock);
    int previous = enabled;
    if (enable >= 0)
        __atomic_store_n(&enabled, enable ? 1 : 0, __ATOMIC_RELAXED);
    if (forget)
        clear_locked();
    if (stats != NULL) {
        stats->hits = hits;
        stats->misses = misses;
        stats->entries = entries;
    }
    pthread_mutex_unlock(&lock);
    return previous;
}
