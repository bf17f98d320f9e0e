/* The memo of library files read before: see filememo.h. A chained hash table behind one
 * mutex (the scan's prefetch threads share it); emptied whole when it grows past
 * MAX_ENTRIES or MAX_LISTING_BYTES (a node's driver and a few dozen images). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/vfs.h>

#include "cleanup.h"
#include "filememo.h"
#include "inroot.h"
#include "memo_rules.h"
#include "scan.h"

#define BUCKETS 4096u
#define MAX_ENTRIES 32768u
#define MAX_LISTING_BYTES (16u << 20)

struct entry {
    struct entry *next;
    enum filememo_kind kind;
    int with_dev;
    struct stat id;
    struct filememo_value value;
    char name[];
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct entry *buckets[BUCKETS];
static uint32_t entries;
static size_t listing_bytes;
static int enabled;
static int64_t settle_ns = CDS_SETTLE_NS;
static uint64_t hits, misses;

int filememo_enabled(void) { return __atomic_load_n(&enabled, __ATOMIC_RELAXED); }

struct timespec filememo_clock(void)
{
    /* The clock the kernel stamps ctime with (coarse realtime). */
    struct timespec now;
    clock_gettime(CLOCK_REALTIME_COARSE, &now);
    return now;
}

static int same_identity(int with_dev, const struct stat *a, const struct stat *b)
{
    return (!with_dev || a->st_dev == b->st_dev) && a->st_ino == b->st_ino && a->st_size == b->st_size
        && a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec
        && a->st_ctim.tv_sec == b->st_ctim.tv_sec && a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

int filememo_same(const struct stat *a, const struct stat *b) { return same_identity(1, a, b); }

static uint32_t bucket_of(enum filememo_kind kind, const char *name, const struct stat *st)
{
    /* FNV-1a over the name, and for an image's file its inode (names repeat across
     * images; a host path has one entry, replaced when the file changes). */
    uint32_t h = 2166136261u ^ (uint32_t)kind;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 16777619u;
    if (kind != FILEMEMO_HOST)
        h = (h ^ (uint32_t)st->st_ino) * 16777619u;
    return h % BUCKETS;
}

static void free_entry(struct entry *e)
{
    listing_bytes -= e->value.listing != NULL ? e->value.listing_size : 0;
    free(e->value.soname);
    free(e->value.listing);
    free(e);
}

static void clear_locked(void)
{
    for (uint32_t b = 0; b < BUCKETS; b++) {
        while (buckets[b]) {
            struct entry *e = buckets[b];
            buckets[b] = e->next;
            free_entry(e);
        }
    }
    entries = 0;
}

static int matches(const struct entry *e, enum filememo_kind kind, const char *name, const struct stat *st,
                   int with_dev)
{
    return e->kind == kind && e->with_dev == with_dev && e->id.st_ino == st->st_ino && strcmp(e->name, name) == 0
        && same_identity(with_dev, &e->id, st);
}

/* Copy V's owned parts (soname, listing) into OUT; 0, or -1 on ENOMEM (nothing owned). */
static int copy_value(const struct filememo_value *v, struct filememo_value *out)
{
    *out = *v;
    out->soname = NULL;
    out->listing = NULL;
    if (v->soname != NULL && (out->soname = strdup(v->soname)) == NULL)
        return -1;
    if (v->listing != NULL) {
        out->listing = malloc(v->listing_size ? v->listing_size : 1);
        if (out->listing == NULL) {
            free(out->soname);
            out->soname = NULL;
            return -1;
        }
        memcpy(out->listing, v->listing, v->listing_size);
    }
    return 0;
}

int filememo_lookup(enum filememo_kind kind, const char *name, const struct stat *st, int with_dev,
                    struct filememo_value *v)
{
    int found = 0;
    pthread_mutex_lock(&lock);
    for (struct entry *e = buckets[bucket_of(kind, name, st)]; e; e = e->next) {
        if (!matches(e, kind, name, st, with_dev))
            continue;
        found = copy_value(&e->value, v) == 0;
        break;
    }
    if (found)
        hits++;
    else
        misses++;
    pthread_mutex_unlock(&lock);
    return found;
}

static int settled(const struct stat *st, struct timespec started)
{
    int64_t age =
        ((int64_t)started.tv_sec - (int64_t)st->st_ctim.tv_sec) * 1000000000 + (started.tv_nsec - st->st_ctim.tv_nsec);
    int64_t settle = __atomic_load_n(&settle_ns, __ATOMIC_RELAXED);
    return settle == 0 || age > settle; /* 0: keep however new (tests) */
}

void filememo_store(enum filememo_kind kind, const char *name, const struct stat *st, int with_dev,
                    const struct filememo_value *v, struct timespec started)
{
    if (!settled(st, started))
        return;
    size_t len = strlen(name) + 1;
    struct entry *e = malloc(sizeof *e + len);
    if (e == NULL)
        return;
    e->kind = kind;
    e->with_dev = with_dev;
    e->id = *st;
    if (copy_value(v, &e->value) < 0) {
        free(e);
        return;
    }
    memcpy(e->name, name, len);
    pthread_mutex_lock(&lock);
    uint32_t b = bucket_of(kind, name, st);
    for (struct entry **p = &buckets[b]; *p; p = &(*p)->next) {
        struct entry *old = *p;
        if (old->kind != kind || strcmp(old->name, name) != 0)
            continue;
        if (kind == FILEMEMO_HOST || matches(old, kind, name, st, with_dev)) {
            /* the host file changed (or two threads read one file): replace */
            *p = old->next;
            free_entry(old);
            entries--;
            break;
        }
    }
    if (entries >= MAX_ENTRIES || listing_bytes + e->value.listing_size > MAX_LISTING_BYTES)
        clear_locked();
    if (e->value.listing != NULL)
        listing_bytes += e->value.listing_size;
    e->next = buckets[b];
    buckets[b] = e;
    entries++;
    pthread_mutex_unlock(&lock);
}

int cds_scan_memo(int enable, int forget, int64_t settle, struct cds_memo_stats *stats)
{
    pthread_mutex_lock(&lock);
    int previous = enabled;
    if (enable >= 0)
        __atomic_store_n(&enabled, enable ? 1 : 0, __ATOMIC_RELAXED);
    if (settle >= 0)
        __atomic_store_n(&settle_ns, settle, __ATOMIC_RELAXED);
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

/* ---- identities for the memo of whole plans (scan.h) ---- */

int64_t cds_memo_clock_ns(void)
{
    struct timespec now = filememo_clock();
    return (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
}

/* The next entry of a cds_memo_* list at *AT (END its end): its kind, and its path in *PATH;
 * 0, or -1 when the list is malformed. */
static int next_entry(const char **at, const char *end, char *kind, const char **path)
{
    const char *p = *at;
    if (p >= end)
        return -1;
    *kind = *p++;
    const char *nul = memchr(p, '\0', (size_t)(end - p));
    if (nul == NULL || (*kind != 'f' && *kind != 'n' && *kind != 'h'))
        return -1;
    *path = p;
    *at = nul + 1;
    return 0;
}

static void identify(int rootfd, char kind, const char *path, int with_dev, struct stat *st, struct cds_identity *out)
{
    memset(out, 0, sizeof *out);
    int err = 0;
    if (kind == 'h') {
        err = stat(path, st) < 0 ? errno : 0;
        with_dev = 1;
    } else {
        cleanup_fd int fd = cds_inroot_open(rootfd, path, O_PATH | (kind == 'n' ? O_NOFOLLOW : 0));
        err = fd < 0 || fstat(fd, st) < 0 ? errno : 0;
    }
    if (err) {
        out->err = err;
        return;
    }
    out->mode = (uint32_t)st->st_mode;
    out->dev = with_dev ? (uint64_t)st->st_dev : 0;
    out->ino = (uint64_t)st->st_ino;
    out->size = (uint64_t)st->st_size;
    out->mtime_ns = (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
    out->ctime_ns = (int64_t)st->st_ctim.tv_sec * 1000000000 + st->st_ctim.tv_nsec;
}

static int tree_with_dev(int rootfd)
{
    struct statfs fs;
    return fstatfs(rootfd, &fs) < 0 || fs.f_type != OVERLAYFS_MAGIC;
}

/* Identify each entry of the list: into OUT (counting the unsettled ones at STARTED), or
 * against EXPECTED (stopping at the first that differs: 0). -1 with EINVAL when malformed. */
static int walk(int rootfd, const char *paths, size_t size, size_t count, struct timespec started,
                struct cds_identity *out, const struct cds_identity *expected)
{
    const char *at = paths, *end = paths + size, *path;
    int with_dev = tree_with_dev(rootfd), unsettled = 0;
    char kind;
    for (size_t i = 0; i < count; i++) {
        struct stat st;
        struct cds_identity now;
        if (next_entry(&at, end, &kind, &path) < 0) {
            errno = EINVAL;
            return -1;
        }
        identify(rootfd, kind, path, with_dev, &st, out ? &out[i] : &now);
        if (expected && memcmp(&now, &expected[i], sizeof now) != 0)
            return 0;
        if (out && out[i].err == 0 && !settled(&st, started))
            unsettled++;
    }
    return expected ? 1 : unsettled;
}

int cds_memo_identify(int rootfd, const char *paths, size_t size, size_t count, int64_t started_ns,
                      struct cds_identity *out)
{
    struct timespec started = {.tv_sec = started_ns / 1000000000, .tv_nsec = started_ns % 1000000000};
    return walk(rootfd, paths, size, count, started, out, NULL);
}

int cds_memo_same(int rootfd, const char *paths, size_t size, size_t count, const struct cds_identity *expected)
{
    return walk(rootfd, paths, size, count, (struct timespec){0}, NULL, expected);
}
