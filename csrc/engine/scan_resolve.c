/* Where a scan's items end: reading one library file, learning an item's type, following a
 * link through the listing when it names this same directory (so the extras are seen where
 * they will be) or else inside the tree (never out of it), and only regular files opened. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "arena.h"
#include "cleanup.h"
#include "elf.h"
#include "inroot.h"
#include "scan_impl.h"

#define MAX_LINK_HOPS 40

/* Read the regular file open at FD into F (thread-safe: touches only F). With IDENTITY,
 * fstat it first (for its device and inode); otherwise trust that it was listed as a
 * regular file and let the reads find its size. */
void scan_read_file_into(struct file *f, int fd, int target, int identity)
{
    *f = (struct file){.status = 0, .soname = NULL};
    uint64_t size = UINT64_MAX;
    if (identity) {
        struct cds_stat st;
        if (cds_fstat(fd, &st) < 0) {
            f->status = -errno;
            return;
        }
        f->dev = st.dev;
        f->ino = st.ino;
        f->has_identity = 1;
        if (!S_ISREG(st.mode)) {
            f->status = S_ISDIR(st.mode) ? -EISDIR : -EINVAL;
            return;
        }
        size = st.size;
    }
    struct cds_elf_info info;
    int rc = cds_elf_read_fd(fd, size, target, &info);
    f->status = rc < 0 ? -errno : rc;
    f->flags = info.flags;
    f->isa_level = info.isa_level;
    if (rc == CDS_ELF_LIBRARY && info.has_soname) {
        f->soname = strndup(info.soname, info.soname_len);
        if (f->soname == NULL)
            f->status = -ENOMEM;
    }
}

/* Read the regular file open at FD; returns the files[] index or -1 (ENOMEM). */
static long read_file(struct cds_scan *s, int fd)
{
    if (grow((void **)&s->files, &s->files_cap, s->nfiles + 1, sizeof *s->files) < 0)
        return -1;
    scan_read_file_into(&s->files[s->nfiles], fd, s->target, 1);
    if (s->files[s->nfiles].status == -ENOMEM)
        return -1;
    return (long)s->nfiles++;
}

/* Open a regular listing item (not a link) for reading. */
int scan_open_item(struct cds_scan *s, const struct item *it)
{
    if (it->extra >= 0)
        return cds_open_host(s->extras[it->extra].host_path);
    if (s->dirfd < 0) {
        errno = ENOENT;
        return -1;
    }
    int flags = O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC;
    /* No atime updates (allowed to the file's owner and to root). */
    int fd = openat(s->dirfd, it->name, flags | O_NOATIME);
    if (fd < 0 && errno == EPERM)
        fd = openat(s->dirfd, it->name, flags);
    return fd;
}

/* Reopen an O_PATH descriptor for reading without resolving any path again. */
static int reopen_for_reading(int pathfd, const struct cds_stat *was)
{
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", pathfd);
    int fd = open(proc, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct cds_stat now;
    if (cds_fstat(fd, &now) < 0 || now.dev != was->dev || now.ino != was->ino) {
        close(fd);
        errno = ESTALE;
        return -1;
    }
    return fd;
}

/* Read a listed link's text into the item (thread-safe: touches only IT). */
void scan_read_link(const struct cds_scan *s, struct item *it)
{
    char target[PATH_MAX + 1];
    ssize_t len = readlinkat(s->dirfd, it->name, target, sizeof target - 1);
    if (len < 0 || (size_t)len >= sizeof target - 1) {
        it->link_err = len < 0 ? -errno : -ENAMETOOLONG;
        return;
    }
    target[len] = '\0';
    it->link_borrowed = 0;
    it->link_text = strdup(target);
    if (it->link_text == NULL)
        it->link_err = -ENOMEM;
}

/* Learn the type of an item listed as DT_UNKNOWN (lstat, once). 0 or -1 (lstat_err). */
int scan_lstat_item(struct cds_scan *s, struct item *it)
{
    if (it->lstat_done)
        return it->lstat_err_set ? -1 : 0;
    it->lstat_done = 1;
    if (it->type != DT_UNKNOWN || it->extra >= 0 || s->dirfd < 0)
        return 0;
    struct stat raw;
    if (fstatat(s->dirfd, it->name, &raw, AT_SYMLINK_NOFOLLOW) < 0) {
        it->lstat_err_set = 1;
        it->lstat_err = -errno;
        return -1;
    }
    it->type = (uint8_t)IFTODT(raw.st_mode);
    return 0;
}

/* Where a regular or unknown-type item ends (no link to follow, or a link resolved by
 * type): fills mode/dev/ino. Reads nothing. */
static int stat_item(struct cds_scan *s, struct item *it)
{
    struct cds_stat st;
    int rc;
    if (it->file >= 0 && s->files[it->file].has_identity && s->files[it->file].status >= 0) {
        it->mode = S_IFREG; /* read before: it was a regular file */
        it->dev = s->files[it->file].dev;
        it->ino = s->files[it->file].ino;
        it->state = RESOLVED;
        return 0;
    }
    if (it->extra < 0 && it->type == DT_REG) {
        /* Listed as a regular file: nothing to ask yet (its identity comes from reading
         * it, see scan_file_of()). */
        it->mode = S_IFREG;
        it->dev = it->ino = 0;
        it->state = RESOLVED;
        return 0;
    }
    if (it->extra >= 0) {
        cleanup_fd int fd = cds_open_host(s->extras[it->extra].host_path);
        rc = fd < 0 ? -1 : cds_fstat(fd, &st);
    } else if (s->dirfd < 0) {
        errno = ENOENT;
        rc = -1;
    } else {
        struct stat raw;
        rc = fstatat(s->dirfd, it->name, &raw, AT_SYMLINK_NOFOLLOW);
        if (rc == 0) {
            st.dev = (uint64_t)raw.st_dev;
            st.ino = (uint64_t)raw.st_ino;
            st.mode = (uint32_t)raw.st_mode;
        }
    }
    if (rc < 0) {
        it->state = FAILED;
        it->err = -errno;
        return -1;
    }
    it->mode = st.mode;
    it->dev = st.dev;
    it->ino = st.ino;
    it->state = RESOLVED;
    return 0;
}

/* A link whose text leaves the directory: resolve it inside the tree, read it if regular. */
static int resolve_in_tree(struct cds_scan *s, struct item *it)
{
    size_t n = strlen(s->dirpath) + strlen(it->name) + 2;
    cleanup_free char *path = malloc(n);
    if (path == NULL)
        return -1;
    snprintf(path, n, "%s/%s", s->dirpath, it->name);
    cleanup_fd int pathfd = cds_inroot_open(s->rootfd, path, O_PATH);
    struct cds_stat st;
    if (pathfd < 0 || cds_fstat(pathfd, &st) < 0) {
        it->state = FAILED;
        it->err = -errno;
        return 0;
    }
    it->mode = st.mode;
    it->dev = st.dev;
    it->ino = st.ino;
    it->state = RESOLVED;
    if (!S_ISREG(st.mode))
        return 0;
    for (uint32_t i = 0; i < s->nfiles; i++)
        if (s->files[i].has_identity && s->files[i].dev == st.dev && s->files[i].ino == st.ino
            && s->files[i].status >= 0) {
            it->file = (int32_t)i;
            return 0;
        }
    cleanup_fd int fd = reopen_for_reading(pathfd, &st);
    if (fd < 0 && errno != ESTALE)
        fd = cds_inroot_open(s->rootfd, path, O_RDONLY);
    if (fd < 0) {
        it->state = FAILED;
        it->err = -errno;
        return 0;
    }
    long f = read_file(s, fd);
    if (f < 0)
        return -1;
    it->file = (int32_t)f;
    return 0;
}

/* When a link's TARGET names something in this same directory -- a plain name, or a path
 * whose directory part leads (inside the tree) back here, like Debian's absolute
 * "/lib/x86_64-linux-gnu/libz.so.1.2.13" -- the name in it; else NULL. Resolving through
 * the listing sees what the extras will put there. */
static const char *same_dir_name(struct cds_scan *s, const char *target)
{
    const char *slash = strrchr(target, '/');
    const char *base = slash != NULL ? slash + 1 : target;
    if (base[0] == '\0' || strcmp(base, ".") == 0 || strcmp(base, "..") == 0)
        return NULL;
    if (slash == NULL)
        return base;
    if (s->dirfd < 0)
        return NULL;
    size_t dir_len = (size_t)(slash - target);
    if (s->same_dir_text != NULL && strlen(s->same_dir_text) == dir_len
        && memcmp(s->same_dir_text, target, dir_len) == 0)
        return s->same_dir_answer ? base : NULL;
    /* Where the directory part leads, from this directory (or the root, if absolute). */
    size_t n = strlen(s->dirpath) + dir_len + 3;
    cleanup_free char *path = malloc(n);
    if (path == NULL)
        return NULL;
    if (target[0] == '/')
        snprintf(path, n, "%.*s/", (int)dir_len, target);
    else
        snprintf(path, n, "%s/%.*s/", s->dirpath, (int)dir_len, target);
    struct cds_stat there, here;
    int same = cds_inroot_stat(s->rootfd, path, 1, &there) == 0 && cds_fstat(s->dirfd, &here) == 0
        && there.dev == here.dev && there.ino == here.ino;
    char *text = cds_arena_strndup(&s->arena, target, dir_len);
    if (text != NULL) {
        s->same_dir_text = text;
        s->same_dir_answer = same;
    }
    return same ? base : NULL;
}

/* Follow item INDEX to what it names. -1 only on ENOMEM; failures are recorded. */
int scan_resolve(struct cds_scan *s, uint32_t index, int hops)
{
    struct item *it = &s->items[index];
    if (it->state != UNRESOLVED)
        return 0;
    if (hops > MAX_LINK_HOPS) {
        it->state = FAILED;
        it->err = -ELOOP;
        return 0;
    }
    if (scan_lstat_item(s, it) < 0) {
        it->state = FAILED;
        it->err = it->lstat_err;
        return 0;
    }
    if (it->type != DT_LNK || it->extra >= 0) {
        stat_item(s, it); /* failures are recorded in the item */
        return 0;
    }
    if (it->link_text == NULL && it->link_err == 0)
        scan_read_link(s, it);
    if (it->link_text == NULL) {
        it->state = FAILED;
        it->err = it->link_err;
        return 0;
    }
    const char *target = it->link_text;
    const char *base = same_dir_name(s, target);
    if (base != NULL) {
        long next = scan_find_item(s, base);
        if (next < 0) {
            it->state = FAILED;
            it->err = -ENOENT;
            return 0;
        }
        it->state = FAILED; /* a loop back here stops at the hop limit */
        it->err = -ELOOP;
        if (scan_resolve(s, (uint32_t)next, hops + 1) < 0)
            return -1;
        it = &s->items[index];
        struct item *end = &s->items[next];
        it->state = end->state;
        it->err = end->err;
        it->mode = end->mode;
        it->dev = end->dev;
        it->ino = end->ino;
        it->file = end->file;
        it->target = end->target >= 0 ? end->target : (int32_t)next;
        return 0;
    }
    return resolve_in_tree(s, it);
}

/* Read what item INDEX ends at (resolved before); returns the files[] index or -1. */
long scan_file_of(struct cds_scan *s, uint32_t index)
{
    struct item *it = &s->items[index];
    if (it->file >= 0)
        return it->file;
    uint32_t at = it->target >= 0 ? (uint32_t)it->target : index;
    struct item *end = &s->items[at];
    if (end->file >= 0) {
        it->file = end->file;
        return it->file;
    }
    cleanup_fd int fd = scan_open_item(s, end);
    long f;
    if (fd < 0) {
        if (grow((void **)&s->files, &s->files_cap, s->nfiles + 1, sizeof *s->files) < 0)
            return -2;
        s->files[s->nfiles] = (struct file){.status = -errno, .soname = NULL};
        f = (long)s->nfiles++;
    } else {
        f = read_file(s, fd);
        if (f < 0)
            return -2;
    }
    end->file = (int32_t)f;
    s->items[index].file = (int32_t)f;
    return f;
}
