/* The reads a scan needs, done before its loop: the links' texts and the regular files, on a
 * few threads for big directories, each file read through the file memo (filememo.h) when it
 * is on: a stat where the memo knows the file, else a read kept for the next scan. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cleanup.h"
#include "elf.h"
#include "filememo.h"
#include "inroot.h"
#include "scan_impl.h"

/* Fill F from the memo's value V for the file ST identifies. */
static void file_from_memo(struct file *f, const struct filememo_value *v, const struct stat *st)
{
    *f = (struct file){.status = v->status,
                       .flags = v->flags,
                       .isa_level = v->isa_level,
                       .soname = v->soname,
                       .dev = (uint64_t)st->st_dev,
                       .ino = (uint64_t)st->st_ino,
                       .has_identity = 1};
}

/* After reading the file open at FD (stat'ed as BEFORE when the scan was at STARTED): keep
 * what F holds when a stat now shows the same unchanged file. */
static void remember(const struct file *f, int fd, enum filememo_kind kind, const char *name, int with_dev,
                     const struct stat *before, struct timespec started)
{
    struct stat after;
    if (f->status < 0 || fstat(fd, &after) < 0 || !filememo_same(before, &after))
        return;
    struct filememo_value v = {.status = f->status, .flags = f->flags, .isa_level = f->isa_level, .soname = f->soname};
    filememo_store(kind, name, &after, with_dev, &v, started);
}

/* Read the host file PATH into F through the memo (filememo.h): a stat when it is known
 * unchanged; otherwise read, and kept when a stat after the read shows the same file. */
static void read_host_file(struct cds_scan *s, struct file *f, const char *path)
{
    struct stat before;
    if (stat(path, &before) < 0) {
        *f = (struct file){.status = -errno, .soname = NULL};
        return;
    }
    struct filememo_value v;
    if (S_ISREG(before.st_mode) && filememo_lookup(FILEMEMO_HOST, path, &before, 1, &v)) {
        file_from_memo(f, &v, &before);
        return;
    }
    int fd = cds_open_host(path);
    if (fd < 0) {
        *f = (struct file){.status = -errno, .soname = NULL};
        return;
    }
    scan_read_file_into(f, fd, s->target, 1);
    remember(f, fd, FILEMEMO_HOST, path, 1, &before, s->started);
    close(fd);
}

/* The same for a regular file listed in the directory: lstat'ed (never followed), looked up
 * by name and identity (see filememo.h). */
static void read_listed_file(struct cds_scan *s, struct file *f, const struct item *it)
{
    struct stat before;
    if (fstatat(s->dirfd, it->name, &before, AT_SYMLINK_NOFOLLOW) < 0) {
        *f = (struct file){.status = -errno, .soname = NULL};
        return;
    }
    if (!S_ISREG(before.st_mode)) { /* replaced since it was listed */
        *f = (struct file){.status = S_ISDIR(before.st_mode) ? -EISDIR : -EINVAL};
        return;
    }
    struct filememo_value v;
    if (filememo_lookup(FILEMEMO_IMAGE, it->name, &before, s->memo_with_dev, &v)) {
        file_from_memo(f, &v, &before);
        return;
    }
    int fd = scan_open_item(s, it);
    if (fd < 0) {
        *f = (struct file){.status = -errno, .soname = NULL};
        return;
    }
    scan_read_file_into(f, fd, s->target, 0);
    f->dev = (uint64_t)before.st_dev;
    f->ino = (uint64_t)before.st_ino;
    remember(f, fd, FILEMEMO_IMAGE, it->name, s->memo_with_dev, &before, s->started);
    f->has_identity = f->status >= 0;
    close(fd);
}

/* Read every regular file the loop will need, on a few threads for big directories. */
struct prefetch {
    struct cds_scan *s;
    const uint32_t *list;
    uint32_t n;
    uint32_t next;
};

static void *prefetch_worker(void *arg)
{
    struct prefetch *job = arg;
    struct cds_scan *s = job->s;
    for (;;) {
        uint32_t k = __atomic_fetch_add(&job->next, 1, __ATOMIC_RELAXED);
        if (k >= job->n)
            break;
        struct item *it = &s->items[job->list[k]];
        if (it->type == DT_LNK && it->extra < 0) {
            scan_read_link(s, it);
            continue;
        }
        struct file *f = &s->files[it->file];
        if (s->memo && it->extra >= 0) {
            read_host_file(s, f, s->extras[it->extra].host_path);
            continue;
        }
        if (s->memo) {
            read_listed_file(s, f, it);
            continue;
        }
        int fd = scan_open_item(s, it);
        if (fd < 0) {
            *f = (struct file){.status = -errno, .soname = NULL};
            continue;
        }
        scan_read_file_into(f, fd, s->target, it->extra >= 0);
        close(fd);
    }
    return NULL;
}

#define PREFETCH_THREADED 128 /* below this many reads, one thread is quicker */
#define PREFETCH_THREADS 4

static int max_threads = 0; /* 0: as many as CPUs (up to PREFETCH_THREADS) */

int cds_scan_set_threads(int n)
{
    int previous = max_threads;
    max_threads = n;
    return previous;
}

static int run_jobs(struct cds_scan *s, const uint32_t *list, uint32_t n)
{
    struct prefetch job = {.s = s, .list = list, .n = n, .next = 0};
    pthread_t threads[PREFETCH_THREADS];
    int started = 0;
    if (n >= PREFETCH_THREADED) {
        long cpus = max_threads > 0 ? max_threads : sysconf(_SC_NPROCESSORS_ONLN);
        int want = cpus > PREFETCH_THREADS ? PREFETCH_THREADS : (int)cpus;
        for (int t = 1; t < want; t++)
            if (pthread_create(&threads[started], NULL, prefetch_worker, &job) == 0)
                started++;
    }
    prefetch_worker(&job);
    for (int t = 0; t < started; t++)
        pthread_join(threads[t], NULL);
    for (uint32_t k = 0; k < n; k++) {
        const struct item *it = &s->items[list[k]];
        if (it->link_err == -ENOMEM || (it->file >= 0 && s->files[it->file].status == -ENOMEM)) {
            errno = ENOMEM;
            return -1;
        }
    }
    return 0;
}

/* Queue a regular item for reading (a files[] slot of its own). */
static int queue_file(struct cds_scan *s, uint32_t *list, uint32_t *n, uint32_t index)
{
    struct item *it = &s->items[index];
    if (it->file != -1 || it->type != DT_REG)
        return 0;
    if (grow((void **)&s->files, &s->files_cap, s->nfiles + 1, sizeof *s->files) < 0)
        return -1;
    s->files[s->nfiles] = (struct file){.status = -EAGAIN, .soname = NULL};
    it->file = (int32_t)s->nfiles++;
    list[(*n)++] = index;
    return 0;
}

/* Do every read the loop will need up front, on a few threads for big directories: the
 * links' texts and the regular files, then the link targets nothing read yet. */
int scan_prefetch(struct cds_scan *s, const struct cds_scan_opts *opts)
{
    cleanup_free uint32_t *list = malloc((s->nitems ? s->nitems : 1) * sizeof *list);
    if (list == NULL)
        return -1;
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->nitems; i++) {
        struct item *it = &s->items[i];
        if (!scan_is_candidate(s, it, opts) || scan_lstat_item(s, it) < 0)
            continue;
        if (it->type == DT_LNK && it->extra < 0) {
            if (it->link_text == NULL)
                list[n++] = i;
        } else if (queue_file(s, list, &n, i) < 0)
            return -1;
    }
    if (run_jobs(s, list, n) < 0)
        return -1;
    n = 0;
    for (uint32_t i = 0; i < s->nitems; i++) {
        struct item *it = &s->items[i];
        if (it->type != DT_LNK || it->extra >= 0 || (it->link_text == NULL && it->link_err == 0))
            continue;
        if (scan_resolve(s, i, 0) < 0)
            return -1;
        it = &s->items[i];
        if (it->state == RESOLVED && it->file < 0 && it->target >= 0
            && queue_file(s, list, &n, (uint32_t)it->target) < 0)
            return -1;
    }
    return run_jobs(s, list, n);
}
