/* In-root file access: see inroot.h. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cleanup.h"
#include "dirents.h"
#include "inroot.h"

#ifndef SYS_openat2
#define SYS_openat2 437
#endif

#define MAX_LINKS 40      /* as the kernel's path walk */
#define MAX_DEPTH 1024    /* directories held open during the fallback walk */
#define MAX_PENDING 65536 /* bytes of path still to resolve (after link expansion) */

static int resolve_mode = CDS_RESOLVE_AUTO;
static int openat2_missing; /* learned at run time: the kernel has no openat2 */

int cds_inroot_set_mode(int mode)
{
    int previous = resolve_mode;
    resolve_mode = mode;
    return previous;
}

void cds_free(void *p) { free(p); }

static int final_flags(int oflags)
{
    /* openat2 refuses O_PATH with anything but O_DIRECTORY, O_NOFOLLOW and O_CLOEXEC. */
    if (oflags & O_PATH)
        return (oflags & (O_PATH | O_DIRECTORY | O_NOFOLLOW)) | O_CLOEXEC;
    return oflags | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
}

static int open_with_openat2(int rootfd, const char *path, int oflags)
{
    struct open_how how = {
        .flags = (uint64_t)final_flags(oflags),
        .mode = 0,
        .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS,
    };
    long fd = -1;
    /* The kernel answers EAGAIN when a concurrent rename might have let ".." escape. */
    for (int attempt = 0; attempt < 16; attempt++) {
        fd = syscall(SYS_openat2, rootfd, path, &how, sizeof how);
        if (fd >= 0 || errno != EAGAIN)
            break;
    }
    return (int)fd;
}

/* The fallback: one component at a time, each opened O_PATH|O_NOFOLLOW relative to the
 * directory held open before it; symlinks are read and their text resolved the same way
 * (absolute ones from the root); ".." never goes above the root. */
struct walk {
    int rootfd;
    int stack[MAX_DEPTH]; /* ancestors of cur (not including the root's own fd) */
    int depth;
    int cur; /* current directory; == rootfd when at the root */
};

static void walk_reset(struct walk *w)
{
    if (w->cur != w->rootfd)
        close(w->cur);
    while (w->depth > 0)
        close(w->stack[--w->depth]);
    w->cur = w->rootfd;
}

static void walk_up(struct walk *w)
{
    if (w->cur == w->rootfd)
        return; /* ".." at the root is the root */
    close(w->cur);
    w->cur = w->depth > 0 ? w->stack[--w->depth] : w->rootfd;
}

static int walk_down(struct walk *w, int fd)
{
    if (w->cur != w->rootfd) {
        if (w->depth >= MAX_DEPTH) {
            errno = ENAMETOOLONG;
            return -1;
        }
        w->stack[w->depth++] = w->cur;
    }
    w->cur = fd;
    return 0;
}

/* Replace *PENDING (the rest of the path after the link) with TARGET + "/" + rest. */
static int splice_link(char **pending, const char *rest, const char *target)
{
    size_t target_len = strlen(target), rest_len = strlen(rest);
    if (target_len + rest_len + 2 > MAX_PENDING) {
        errno = ENAMETOOLONG;
        return -1;
    }
    char *joined = malloc(target_len + rest_len + 2);
    if (joined == NULL)
        return -1;
    memcpy(joined, target, target_len);
    joined[target_len] = '/';
    memcpy(joined + target_len + 1, rest, rest_len + 1);
    free(*pending);
    *pending = joined;
    return 0;
}

static int read_link_at(int fd, char *buf, size_t size)
{
    ssize_t n = readlinkat(fd, "", buf, size - 1);
    if (n < 0)
        return -1;
    if ((size_t)n >= size - 1) {
        errno = ENAMETOOLONG;
        return -1;
    }
    buf[n] = '\0';
    return 0;
}

/* Cut the next component off *CURSOR (past any slashes; empty at the end of the path): its
 * name, with *REST the path after it and *LAST whether nothing but slashes follows. */
static const char *next_component(char **cursor, char **rest, int *last)
{
    char *at = *cursor;
    while (*at == '/')
        at++;
    *cursor = at;
    char *slash = strchr(at, '/');
    *rest = slash != NULL ? slash + 1 : at + strlen(at);
    if (slash != NULL)
        *slash = '\0';
    *last = 1;
    for (const char *p = *rest; *p != '\0'; p++)
        if (*p != '/') {
            *last = 0;
            break;
        }
    return at;
}

/* FD is a link met on the walk: splice its text before REST into *PENDING (from the root
 * when it is absolute). 0, or -1 with errno (ELOOP past MAX_LINKS links). */
static int follow_link(struct walk *w, int fd, char **pending, const char *rest, int *links)
{
    char target[PATH_MAX + 1];
    if (++*links > MAX_LINKS) {
        errno = ELOOP;
        return -1;
    }
    if (read_link_at(fd, target, sizeof target) < 0)
        return -1;
    if (target[0] == '/')
        walk_reset(w);
    return splice_link(pending, rest, target);
}

/* The last component NAME, opened O_PATH as *FD (ST its stat) and not a link to follow: the
 * descriptor to return for OFLAGS, or -1 with errno. */
static int open_last(struct walk *w, int *fd, const char *name, const struct stat *st, int oflags)
{
    if (S_ISLNK(st->st_mode) && !(oflags & O_PATH)) {
        errno = ELOOP; /* O_NOFOLLOW on a link */
        return -1;
    }
    if ((oflags & O_DIRECTORY) && !S_ISDIR(st->st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    if (oflags & O_PATH)
        return cds_take_fd(fd);
    /* Reopened by name relative to its held parent and never followed: a swap to a link in
     * between fails with ELOOP instead of leaving the tree. */
    return openat(w->cur, name, final_flags(oflags) | O_NOFOLLOW);
}

static int open_with_walk(int rootfd, const char *path, int oflags)
{
    struct walk w = {.rootfd = rootfd, .depth = 0, .cur = rootfd};
    cleanup_free char *pending = strdup(path);
    int result = -1, links = 0;

    if (pending == NULL)
        return -1;
    if (strlen(pending) > MAX_PENDING) {
        errno = ENAMETOOLONG;
        return -1;
    }
    char *cursor = pending, *rest;
    for (;;) {
        int last;
        const char *name = next_component(&cursor, &rest, &last);
        if (*name == '\0') {
            /* Nothing left: the result is the current directory itself. */
            result = openat(w.cur, ".", final_flags(oflags & ~O_NOFOLLOW));
            break;
        }
        if (strcmp(name, ".") == 0) {
            cursor = rest;
            continue;
        }
        if (strcmp(name, "..") == 0) {
            walk_up(&w);
            cursor = rest;
            continue;
        }
        cleanup_fd int fd = openat(w.cur, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
            break;
        struct stat st;
        if (fstat(fd, &st) < 0)
            break;
        if (S_ISLNK(st.st_mode) && !(last && (oflags & O_NOFOLLOW))) {
            if (follow_link(&w, fd, &pending, rest, &links) < 0)
                break;
            cursor = pending;
            continue;
        }
        if (last) {
            result = open_last(&w, &fd, name, &st, oflags);
            break;
        }
        if (!S_ISDIR(st.st_mode)) {
            errno = ENOTDIR;
            break;
        }
        if (walk_down(&w, fd) < 0)
            break;
        fd = -1; /* now owned by the walk */
        cursor = rest;
    }
    walk_reset(&w);
    return result;
}

int cds_inroot_open(int rootfd, const char *path, int oflags)
{
    if (resolve_mode != CDS_RESOLVE_WALK && !openat2_missing) {
        int fd = open_with_openat2(rootfd, path, oflags);
        if (fd >= 0)
            return fd;
        if (resolve_mode == CDS_RESOLVE_OPENAT2)
            return -1;
        if (errno == ENOSYS) {
            openat2_missing = 1;
        } else if (errno != EAGAIN && errno != E2BIG) {
            return -1;
        }
    }
    if (resolve_mode == CDS_RESOLVE_OPENAT2) {
        errno = ENOSYS;
        return -1;
    }
    return open_with_walk(rootfd, path, oflags);
}

int cds_link_at(int dirfd, const char *name, const char *target)
{
    char text[PATH_MAX + 1], temp[NAME_MAX + 1];
    size_t len = strlen(target);
    ssize_t got = readlinkat(dirfd, name, text, sizeof text);
    if (got >= 0 && (size_t)got == len && memcmp(text, target, len) == 0)
        return 1;
    if (got < 0 && errno == ENOENT) {
        if (symlinkat(target, dirfd, name) == 0)
            return 0;
        if (errno != EEXIST)
            return -1;
    }
    /* (a temporary name of this process: one left by a killed run of ours is replaced too) */
    if (snprintf(temp, sizeof temp, ".%.200s.cdi-shim-%d", name, (int)getpid()) >= (int)sizeof temp) {
        errno = ENAMETOOLONG;
        return -1;
    }
    if (symlinkat(target, dirfd, temp) < 0) {
        if (errno != EEXIST || unlinkat(dirfd, temp, 0) < 0 || symlinkat(target, dirfd, temp) < 0)
            return -1;
    }
    if (renameat(dirfd, temp, dirfd, name) < 0) {
        int err = errno;
        unlinkat(dirfd, temp, 0);
        errno = err;
        return -1;
    }
    return 0;
}

int cds_inroot_open_dirs(int rootfd, const char *path, size_t *failed_at)
{
    char opened[PATH_MAX];
    size_t len = strlen(path);
    int fd = cds_inroot_open(rootfd, path, O_PATH | O_DIRECTORY);
    *failed_at = len;
    if (fd >= 0 || errno != ENOENT || len >= sizeof opened)
        return fd; /* the usual case: there, in one call */
    fd = dup(rootfd);
    for (size_t at = 0; fd >= 0;) {
        while (path[at] == '/')
            at++;
        size_t n = strcspn(path + at, "/");
        if (n == 0)
            return fd;
        memcpy(opened, path, at + n);
        opened[at + n] = '\0';
        *failed_at = at + n;
        int child = cds_inroot_open(rootfd, opened, O_PATH | O_DIRECTORY);
        if (child < 0 && errno == ENOENT) { /* made in the directory we hold */
            char part[NAME_MAX + 1];
            if (n > NAME_MAX) {
                close(fd);
                errno = ENAMETOOLONG;
                return -1;
            }
            memcpy(part, path + at, n);
            part[n] = '\0';
            if (mkdirat(fd, part, 0755) == 0)
                child = cds_inroot_open(rootfd, opened, O_PATH | O_DIRECTORY);
        }
        int saved = errno;
        close(fd);
        errno = saved;
        fd = child;
        at += n;
    }
    return -1;
}

int cds_fstat(int fd, struct cds_stat *out)
{
    struct stat st;
    if (fstat(fd, &st) < 0)
        return -1;
    out->dev = (uint64_t)st.st_dev;
    out->ino = (uint64_t)st.st_ino;
    out->size = (uint64_t)st.st_size;
    out->mtime_sec = (int64_t)st.st_mtim.tv_sec;
    out->mtime_nsec = (int64_t)st.st_mtim.tv_nsec;
    out->mode = (uint32_t)st.st_mode;
    out->nlink = (uint32_t)st.st_nlink;
    return 0;
}

int cds_inroot_stat(int rootfd, const char *path, int follow, struct cds_stat *st)
{
    cleanup_fd int fd = cds_inroot_open(rootfd, path, O_PATH | (follow ? 0 : O_NOFOLLOW));
    if (fd < 0)
        return -1;
    return cds_fstat(fd, st);
}

int cds_read_fd(int fd, size_t max, uint8_t **buf, size_t *len, struct cds_stat *st)
{
    if (cds_fstat(fd, st) < 0)
        return -1;
    if (S_ISDIR(st->mode)) {
        errno = EISDIR;
        return -1;
    }
    if (!S_ISREG(st->mode)) {
        errno = EINVAL;
        return -1;
    }
    if (st->size > (uint64_t)max) {
        errno = EFBIG;
        return -1;
    }
    size_t size = (size_t)st->size, done = 0;
    cleanup_free uint8_t *data = malloc(size + 1);
    if (data == NULL)
        return -1;
    while (done < size) {
        ssize_t n = pread(fd, data + done, size - done, (off_t)done);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (n == 0)
            break; /* shrank under us: keep what is there */
        done += (size_t)n;
    }
    data[done] = '\0';
    *len = done;
    *buf = cds_take_ptr(&data);
    return 0;
}

int cds_inroot_read(int rootfd, const char *path, size_t max, uint8_t **buf, size_t *len, struct cds_stat *st)
{
    cleanup_fd int fd = cds_inroot_open(rootfd, path, O_RDONLY);
    if (fd < 0)
        return -1;
    return cds_read_fd(fd, max, buf, len, st);
}

int cds_open_host(const char *path) { return open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC); }

static int write_all(int fd, const uint8_t *data, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, data, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        data += n;
        len -= (size_t)n;
    }
    return 0;
}

int cds_write_at(int dirfd, const char *name, const uint8_t *data, size_t len, uint32_t mode, int sync)
{
    static unsigned counter;
    char temp[NAME_MAX + 1];

    if (name[0] == '\0' || strchr(name, '/') != NULL || strcmp(name, ".") == 0 || strcmp(name, "..") == 0) {
        errno = EINVAL;
        return -1;
    }
    int n = snprintf(temp, sizeof temp, ".%.200s.cds-%d-%u~", name, (int)getpid(), counter++);
    if (n < 0 || (size_t)n >= sizeof temp) {
        errno = ENAMETOOLONG;
        return -1;
    }
    cleanup_fd int fd = openat(dirfd, temp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    int rc = -1;
    if (write_all(fd, data, len) == 0 && fchmod(fd, mode & 07777) == 0 && (!sync || fsync(fd) == 0)
        && renameat(dirfd, temp, dirfd, name) == 0)
        rc = 0;
    if (rc != 0) {
        int saved = errno;
        unlinkat(dirfd, temp, 0);
        errno = saved;
    }
    return rc;
}

/* Whether FD holds exactly LEN bytes DATA, as a regular file of ours with one name and MODE. */
static int holds(int fd, const uint8_t *data, size_t len, uint32_t mode)
{
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (st.st_mode & 07777) != (mode & 07777) || st.st_nlink != 1
        || st.st_uid != geteuid() || st.st_gid != getegid() || (uint64_t)st.st_size != (uint64_t)len)
        return 0;
    uint8_t buf[16384];
    size_t at = 0;
    while (at < len) {
        size_t want = len - at < sizeof buf ? len - at : sizeof buf;
        ssize_t n = pread(fd, buf, want, (off_t)at);
        if (n <= 0 || memcmp(buf, data + at, (size_t)n) != 0)
            return 0;
        at += (size_t)n;
    }
    return 1;
}

int cds_write_same_at(int dirfd, const char *name, const uint8_t *data, size_t len, uint32_t mode)
{
    if (strchr(name, '/') == NULL && name[0] != '\0') {
        cleanup_fd int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
        if (fd >= 0 && holds(fd, data, len, mode))
            return 0;
    }
    return cds_write_at(dirfd, name, data, len, mode, 0);
}

long cds_list_dir(int dirfd, char **names, uint8_t **types, size_t *names_len)
{
    struct cds_dirents dir;
    if (cds_dirents_open(&dir, dirfd) < 0) {
        cds_dirents_close(&dir);
        return -1;
    }
    size_t cap = 4096, used = 0, count = 0, type_cap = 256;
    cleanup_free char *buf = malloc(cap);
    cleanup_free uint8_t *kinds = malloc(type_cap);
    long rc = buf == NULL || kinds == NULL ? -1 : 0;
    const char *name;
    unsigned char type;
    while (rc == 0 && (rc = cds_dirents_next(&dir, &name, &type)) == 1) {
        rc = -1;
        size_t n = strlen(name) + 1;
        if (used + n > cap) {
            while (used + n > cap)
                cap *= 2;
            char *grown = realloc(buf, cap);
            if (grown == NULL)
                break;
            buf = grown;
        }
        if (count == type_cap) {
            type_cap *= 2;
            uint8_t *grown = realloc(kinds, type_cap);
            if (grown == NULL)
                break;
            kinds = grown;
        }
        memcpy(buf + used, name, n);
        used += n;
        kinds[count++] = type;
        rc = 0;
    }
    cds_dirents_close(&dir);
    if (rc < 0)
        return -1;
    *names = cds_take_ptr(&buf);
    *types = cds_take_ptr(&kinds);
    *names_len = used;
    return (long)count;
}
