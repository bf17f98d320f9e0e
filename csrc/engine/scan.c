/* One library directory as ldconfig's search_dir() reads it: see scan.h.
 *
 * Differences from ldconfig, all on the safe side: nothing is ever followed out of the
 * tree (links resolve inside it, as under ldconfig's chroot), only regular files are
 * opened (ldconfig blocks forever on a link to a FIFO), and no link is created or removed.
 * Links to a plain name in the same directory are resolved through the listing, so extra
 * files (bind mounts to come) are seen where they will be. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "arena.h"
#include "cleanup.h"
#include "dirents.h"
#include "elf.h"
#include "filememo.h"
#include "inroot.h"
#include "ldcache.h"
#include "scan.h"

#define MAX_LINK_HOPS 40

enum { UNRESOLVED = 0, RESOLVED = 1, FAILED = -1 };

/* A file that is not in the tree yet: NAME in the directory, read from HOST_PATH; IS_LINK
 * when NAME is a link there (a directory mount's entry: ldconfig keys a link by its name). */
struct cds_extra {
    const char *name;
    const char *host_path;
    int is_link;
};

struct item {
    const char *name;
    uint8_t dtype; /* d_type as listed (extras: DT_REG, or DT_LNK for a link) */
    uint8_t type;  /* DT_* after lstat when dtype was DT_UNKNOWN */
    uint8_t lstat_done;
    int8_t lstat_err_set;
    int32_t lstat_err;
    int32_t extra;
    /* Following links: what the name ends at. */
    int8_t state;
    int32_t err; /* -errno when FAILED */
    uint32_t mode;
    uint64_t dev, ino;
    int32_t file;          /* index into files[] once read, -1 before */
    int32_t target;        /* the listing item a same-directory link ends at, or -1 */
    char *link_text;       /* a link's text once read (malloc'd unless borrowed) */
    int32_t link_err;      /* -errno of reading it */
    uint8_t link_borrowed; /* link_text lies in the memo's listing text */
};

struct file {   /* one regular file read */
    int status; /* CDS_ELF_* or -errno */
    int32_t flags;
    uint32_t isa_level;
    char *soname;      /* malloc'd; NULL when the file has none */
    uint64_t dev, ino; /* when has_identity */
    int has_identity;
};

struct dlib {
    const char *name;
    const char *soname;
    int32_t file; /* files[] index of what was read */
    int32_t flags;
    uint32_t isa_level;
    int32_t is_link;
    int32_t extra;
    int32_t soname_link_ok;
    uint64_t dev, ino;
};

struct subdir {
    const char *name;
    uint64_t dev, ino;
};

struct cds_scan {
    struct cds_arena arena;
    int rootfd, dirfd, target;
    const char *dirpath;
    const struct cds_extra *extras;
    struct item *items;
    uint32_t nitems;
    uint32_t *name_index; /* open addressing: item index + 1 */
    uint32_t name_slots;
    struct file *files;
    uint32_t nfiles, files_cap;
    struct dlib *dlibs;
    uint32_t ndlibs, dlibs_cap;
    uint32_t *soname_index; /* dlib index + 1 */
    uint32_t soname_slots;
    struct subdir *subdirs;
    uint32_t nsubdirs, subdirs_cap;
    struct cds_skip *skips;
    uint32_t nskips, skips_cap;
    int extras_only;
    uint32_t shadowing;
    const char *same_dir_text; /* the last link directory part asked about */
    int same_dir_answer;
    int memo;                /* files go through filememo.h */
    int memo_with_dev;       /* the device is part of the image's keys (not overlayfs) */
    struct timespec started; /* filememo_clock() when the scan began */
    struct stat dir_id;      /* the directory's identity when listed (memo on) */
    int listed_from_memo;    /* the listing came from the memo: */
    char *memo_listing;      /* its text, which names and link texts point into */
    int remember_listing;    /* keep the listing when done (read, or texts gained) */
    /* With extras only and the memo on: the directory's own listing, for the names the
     * extras would hide and the links to them (instead of a stat and a readlink each). */
    int have_listed;
    struct item *listed;
    uint32_t nlisted;
    uint32_t *listed_index; /* open addressing: listed index + 1 */
    uint32_t listed_slots;
};

static uint32_t hash_name(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s != '\0'; s++) {
        h ^= (unsigned char)*s;
        h *= 16777619u;
    }
    return h;
}

static int grow(void **array, uint32_t *cap, uint32_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    uint32_t n = *cap ? *cap : 64;
    while (n < need)
        n *= 2;
    void *p = realloc(*array, (size_t)n * size);
    if (p == NULL)
        return -1;
    *array = p;
    *cap = n;
    return 0;
}

static long find_name(const struct item *items, const uint32_t *index, uint32_t slots, const char *name)
{
    if (slots == 0)
        return -1;
    uint32_t slot = hash_name(name) & (slots - 1);
    while (index[slot] != 0) {
        uint32_t i = index[slot] - 1;
        if (strcmp(items[i].name, name) == 0)
            return i;
        slot = (slot + 1) & (slots - 1);
    }
    return -1;
}

static long find_item(const struct cds_scan *s, const char *name)
{
    return find_name(s->items, s->name_index, s->name_slots, name);
}

static long find_listed(const struct cds_scan *s, const char *name)
{
    return find_name(s->listed, s->listed_index, s->listed_slots, name);
}

/* A name index of ITEMS (replacing *INDEX); 0, or -1 (ENOMEM). */
static int index_names(const struct item *items, uint32_t n, uint32_t **index, uint32_t *slots)
{
    uint32_t size = 16;
    while (size < n * 2u + 2u)
        size *= 2;
    free(*index);
    *index = calloc(size, sizeof **index);
    *slots = *index != NULL ? size : 0;
    if (*index == NULL)
        return -1;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t slot = hash_name(items[i].name) & (size - 1);
        while ((*index)[slot] != 0)
            slot = (slot + 1) & (size - 1);
        (*index)[slot] = i + 1;
    }
    return 0;
}

static int index_items(struct cds_scan *s) { return index_names(s->items, s->nitems, &s->name_index, &s->name_slots); }

static int add_skip(struct cds_scan *s, const char *name, int status)
{
    if (grow((void **)&s->skips, &s->skips_cap, s->nskips + 1, sizeof *s->skips) < 0)
        return -1;
    s->skips[s->nskips++] = (struct cds_skip){name, status};
    return 0;
}

/* Read the regular file open at FD into F (thread-safe: touches only F). With IDENTITY,
 * fstat it first (for its device and inode); otherwise trust that it was listed as a
 * regular file and let the reads find its size. */
static void read_file_into(struct file *f, int fd, int target, int identity)
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
    read_file_into(&s->files[s->nfiles], fd, s->target, 1);
    if (s->files[s->nfiles].status == -ENOMEM)
        return -1;
    return (long)s->nfiles++;
}

/* Open a regular listing item (not a link) for reading. */
static int open_item(struct cds_scan *s, const struct item *it)
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

static int resolve(struct cds_scan *s, uint32_t index, int hops);

/* Read a listed link's text into the item (thread-safe: touches only IT). */
static void read_link(const struct cds_scan *s, struct item *it)
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
static int lstat_item(struct cds_scan *s, struct item *it)
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
         * it, see file_of()). */
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
static int resolve(struct cds_scan *s, uint32_t index, int hops)
{
    struct item *it = &s->items[index];
    if (it->state != UNRESOLVED)
        return 0;
    if (hops > MAX_LINK_HOPS) {
        it->state = FAILED;
        it->err = -ELOOP;
        return 0;
    }
    if (lstat_item(s, it) < 0) {
        it->state = FAILED;
        it->err = it->lstat_err;
        return 0;
    }
    if (it->type != DT_LNK || it->extra >= 0) {
        stat_item(s, it); /* failures are recorded in the item */
        return 0;
    }
    if (it->link_text == NULL && it->link_err == 0)
        read_link(s, it);
    if (it->link_text == NULL) {
        it->state = FAILED;
        it->err = it->link_err;
        return 0;
    }
    const char *target = it->link_text;
    const char *base = same_dir_name(s, target);
    if (base != NULL) {
        long next = find_item(s, base);
        if (next < 0) {
            it->state = FAILED;
            it->err = -ENOENT;
            return 0;
        }
        it->state = FAILED; /* a loop back here stops at the hop limit */
        it->err = -ELOOP;
        if (resolve(s, (uint32_t)next, hops + 1) < 0)
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
static long file_of(struct cds_scan *s, uint32_t index)
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
    cleanup_fd int fd = open_item(s, end);
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

static int is_prelink_temp(const char *name)
{
    size_t len = strlen(name);
    if (len >= 10 && strcmp(name + len - 10, ".#prelink#") == 0)
        return 1;
    return len >= 17 && memcmp(name + len - 17, ".#prelink#.", 11) == 0;
}

static long find_dlib(const struct cds_scan *s, const char *soname)
{
    if (s->soname_slots == 0)
        return -1;
    uint32_t slot = hash_name(soname) & (s->soname_slots - 1);
    while (s->soname_index[slot] != 0) {
        uint32_t i = s->soname_index[slot] - 1;
        if (strcmp(s->dlibs[i].soname, soname) == 0)
            return i;
        slot = (slot + 1) & (s->soname_slots - 1);
    }
    return -1;
}

static int add_dlib(struct cds_scan *s, const struct dlib *d)
{
    if (grow((void **)&s->dlibs, &s->dlibs_cap, s->ndlibs + 1, sizeof *s->dlibs) < 0)
        return -1;
    if ((s->ndlibs + 1) * 2 > s->soname_slots) {
        uint32_t slots = s->soname_slots ? s->soname_slots * 2 : 256;
        uint32_t *index = calloc(slots, sizeof *index);
        if (index == NULL)
            return -1;
        for (uint32_t i = 0; i < s->ndlibs; i++) {
            uint32_t slot = hash_name(s->dlibs[i].soname) & (slots - 1);
            while (index[slot] != 0)
                slot = (slot + 1) & (slots - 1);
            index[slot] = i + 1;
        }
        free(s->soname_index);
        s->soname_index = index;
        s->soname_slots = slots;
    }
    s->dlibs[s->ndlibs] = *d;
    uint32_t slot = hash_name(d->soname) & (s->soname_slots - 1);
    while (s->soname_index[slot] != 0)
        slot = (slot + 1) & (s->soname_slots - 1);
    s->soname_index[slot] = ++s->ndlibs;
    return 0;
}

/* implicit_soname(): the file name, or for a.out up to the major version. */
static const char *implicit_soname(struct cds_scan *s, const char *name, int32_t flags)
{
    if ((flags & CDS_FLAG_TYPE_MASK) != CDS_FLAG_LIBC4)
        return name;
    const char *major = strstr(name, ".so.");
    size_t len = strlen(name);
    if (major != NULL) {
        const char *dot = strchr(major + 4, '.');
        if (dot != NULL)
            len = (size_t)(dot - name);
    }
    return cds_arena_strndup(&s->arena, name, len);
}

/* search_dir's first filter: which listed names it looks at at all. */
static int is_candidate(const struct cds_scan *s, const struct item *it, const struct cds_scan_opts *opts)
{
    uint8_t type = it->dtype;
    if (type != DT_UNKNOWN && type != DT_LNK && type != DT_REG && type != DT_DIR)
        return 0;
    if (!cds_is_dso_name(it->name) && (type == DT_REG || opts->in_hwcaps || !cds_is_hwcap_subdir(s->target, it->name)))
        return 0;
    return !is_prelink_temp(it->name);
}

/* One entry of the listing, as search_dir's loop body. -1 only on ENOMEM. */
static int consider(struct cds_scan *s, uint32_t index, const struct cds_scan_opts *opts)
{
    struct item *it = &s->items[index];
    const char *name = it->name;
    if (!is_candidate(s, it, opts))
        return 0;
    if (lstat_item(s, it) < 0)
        return add_skip(s, name, it->lstat_err);
    uint8_t type = it->type;
    int is_link = type == DT_LNK;
    int is_dir;
    if (is_link) {
        if (resolve(s, index, 0) < 0)
            return -1;
        it = &s->items[index];
        if (it->state != RESOLVED)
            return add_skip(s, name, it->err); /* a stale link */
        is_dir = S_ISDIR(it->mode);
    } else {
        is_dir = type == DT_DIR;
    }
    if (!opts->in_hwcaps && is_dir && cds_is_hwcap_subdir(s->target, name)) {
        if (!is_link && resolve(s, index, 0) < 0)
            return -1;
        it = &s->items[index];
        if (it->state != RESOLVED)
            return add_skip(s, name, it->err);
        if (grow((void **)&s->subdirs, &s->subdirs_cap, s->nsubdirs + 1, sizeof *s->subdirs) < 0)
            return -1;
        s->subdirs[s->nsubdirs++] = (struct subdir){name, it->dev, it->ino};
        return 0;
    }
    if (type != DT_REG && !is_link)
        return 0;
    if (is_link && !S_ISREG(it->mode))
        return add_skip(s, name, S_ISDIR(it->mode) ? -EISDIR : -EINVAL);

    long f = file_of(s, index);
    if (f == -2)
        return -1;
    const struct file *file = &s->files[f];
    if (file->status != CDS_ELF_LIBRARY && file->status != CDS_ELF_AOUT)
        return add_skip(s, name, file->status);

    int32_t flag = file->flags;
    const char *soname = file->soname != NULL ? file->soname : implicit_soname(s, name, flag);
    if (soname == NULL)
        return -1;
    if (is_link && strcmp(name, soname) != 0) {
        size_t len = strlen(name);
        if (len < 3 || strcmp(name + len - 3, ".so") != 0 || strncmp(name, soname, len) != 0)
            is_link = 0; /* treated as a file of its own */
    }
    if (is_link)
        soname = name;
    if (flag == CDS_FLAG_ELF && (opts->dir_flag == CDS_FLAG_ELF_LIBC5 || opts->dir_flag == CDS_FLAG_ELF_LIBC6))
        flag = opts->dir_flag;

    long existing = find_dlib(s, soname);
    if (existing >= 0) {
        struct dlib *d = &s->dlibs[existing];
        if ((!is_link && d->is_link) || (is_link == d->is_link && cds_libcmp(d->name, name, s->target) < 0)) {
            if (d->flags != flag) {
                if (d->flags == CDS_FLAG_ELF && (flag == CDS_FLAG_ELF_LIBC5 || flag == CDS_FLAG_ELF_LIBC6))
                    d->flags = flag;
                else if ((d->flags == CDS_FLAG_ELF_LIBC5 || d->flags == CDS_FLAG_ELF_LIBC6) && flag == CDS_FLAG_ELF)
                    d->flags = flag;
                /* otherwise ldconfig complains and keeps the first type */
            }
            d->name = name;
            d->file = (int32_t)f;
            d->is_link = is_link;
            d->isa_level = file->isa_level;
            d->extra = s->items[index].extra;
            d->dev = file->dev;
            d->ino = file->ino;
        }
        return 0;
    }
    struct dlib d = {
        .name = name,
        .soname = soname,
        .file = (int32_t)f,
        .flags = flag,
        .isa_level = file->isa_level,
        .is_link = is_link,
        .extra = s->items[index].extra,
        .soname_link_ok = 0,
        .dev = file->dev,
        .ino = file->ino,
    };
    return add_dlib(s, &d);
}

/* Items from a remembered listing (see filememo.h for its layout), pointing into it: the
 * scan keeps the lookup's copy. 0, or -1 (ENOMEM). */
static int items_from_memo(struct cds_scan *s, struct filememo_value *v)
{
    s->memo_listing = v->listing;
    v->listing = NULL;
    if (grow((void **)&s->items, &(uint32_t){0}, v->listing_count, sizeof *s->items) < 0)
        return -1;
    char *p = s->memo_listing;
    for (uint32_t i = 0; i < v->listing_count; i++) {
        uint8_t type = (uint8_t)p[0], has_text = (uint8_t)p[1];
        char *name = p + 2;
        char *text = name + strlen(name) + 1;
        p = text + strlen(text) + 1;
        s->items[s->nitems++] = (struct item){
            .name = name,
            .dtype = type,
            .type = type,
            .extra = -1,
            .state = UNRESOLVED,
            .file = -1,
            .target = -1,
            .link_text = has_text ? text : NULL,
            .link_borrowed = has_text,
        };
    }
    return 0;
}

/* After a scan: keep the directory's listing ITEMS, with the link texts read, if the
 * directory is unchanged since it was listed (a stat then and now). */
static void remember_listing(struct cds_scan *s, const struct item *items, uint32_t n)
{
    struct stat now;
    if (fstat(s->dirfd, &now) < 0 || !filememo_same(&s->dir_id, &now))
        return;
    size_t size = 0;
    for (uint32_t i = 0; i < n; i++) {
        const struct item *it = &items[i];
        if (it->type == DT_LNK && it->link_text == NULL && it->link_err != 0)
            return; /* a link that could not be read: read it next time */
        size += 2 + strlen(it->name) + 1 + (it->link_text ? strlen(it->link_text) : 0) + 1;
    }
    cleanup_free char *blob = malloc(size ? size : 1);
    if (blob == NULL)
        return;
    char *p = blob;
    for (uint32_t i = 0; i < n; i++) {
        const struct item *it = &items[i];
        const char *text = it->link_text ? it->link_text : "";
        *p++ = (char)it->dtype;
        *p++ = (char)(it->link_text != NULL);
        p = stpcpy(p, it->name) + 1;
        p = stpcpy(p, text) + 1;
    }
    struct filememo_value v = {.listing = blob, .listing_size = size, .listing_count = n};
    filememo_store(FILEMEMO_DIR, "", &s->dir_id, s->memo_with_dev, &v, s->started);
}

/* Whether links of a listing from the memo were read in this scan (then keep it again). */
static int gained_link_texts(const struct item *items, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (items[i].link_text != NULL && !items[i].link_borrowed)
            return 1;
    return 0;
}

/* The directory's listing into s->items: from the memo when it knows the directory. */
static int read_listing(struct cds_scan *s)
{
    if (s->dirfd < 0 || (s->extras_only && !s->memo))
        return 0;
    if (s->memo) {
        struct statfs fs;
        if (fstat(s->dirfd, &s->dir_id) == 0 && fstatfs(s->dirfd, &fs) == 0) {
            s->memo_with_dev = fs.f_type != OVERLAYFS_MAGIC;
            struct filememo_value v;
            if (filememo_lookup(FILEMEMO_DIR, "", &s->dir_id, s->memo_with_dev, &v)) {
                int rc = items_from_memo(s, &v);
                free(v.soname);
                s->listed_from_memo = 1;
                return rc;
            }
            s->remember_listing = 1;
        } else if (s->extras_only) {
            return 0;
        }
    }
    struct cds_dirents dir;
    int rc = cds_dirents_open(&dir, s->dirfd);
    uint32_t cap = 0;
    const char *entry;
    unsigned char type;
    while (rc == 0 && (rc = cds_dirents_next(&dir, &entry, &type)) == 1) {
        rc = -1;
        if (grow((void **)&s->items, &cap, s->nitems + 1, sizeof *s->items) < 0)
            break;
        const char *name = cds_arena_strndup(&s->arena, entry, strlen(entry));
        if (name == NULL)
            break;
        s->items[s->nitems++] = (struct item){
            .name = name,
            .dtype = type,
            .type = type,
            .extra = -1,
            .state = UNRESOLVED,
            .file = -1,
            .target = -1,
        };
        rc = 0;
    }
    cds_dirents_close(&dir);
    return rc < 0 ? -1 : 0;
}

/* With extras only, the listing is looked up, not scanned: move it to s->listed. */
static int set_aside_listing(struct cds_scan *s)
{
    if (!s->extras_only || !(s->listed_from_memo || s->remember_listing)) /* not listed */
        return 0;
    s->have_listed = 1;
    s->listed = s->items;
    s->nlisted = s->nitems;
    s->items = NULL;
    s->nitems = 0;
    return index_names(s->listed, s->nlisted, &s->listed_index, &s->listed_slots);
}

static int add_extras(struct cds_scan *s, size_t nextras)
{
    if (nextras == 0)
        return 0;
    if (index_items(s) < 0)
        return -1;
    uint32_t cap = s->nitems;
    for (size_t i = 0; i < nextras; i++) {
        const char *name = s->extras[i].name;
        if (name[0] == '\0' || strchr(name, '/') != NULL || strcmp(name, ".") == 0 || strcmp(name, "..") == 0) {
            errno = EINVAL;
            return -1;
        }
        long at = find_item(s, name);
        if (s->extras_only && s->have_listed) {
            if (find_listed(s, name) >= 0)
                s->shadowing++;
        } else if (s->extras_only && s->dirfd >= 0) {
            struct stat raw;
            if (fstatat(s->dirfd, name, &raw, AT_SYMLINK_NOFOLLOW) == 0)
                s->shadowing++;
            else if (errno != ENOENT)
                return -1;
        }
        uint8_t type = s->extras[i].is_link ? DT_LNK : DT_REG; /* (a link's host path is followed) */
        struct item extra = {
            .name = name,
            .dtype = type,
            .type = type,
            .extra = (int32_t)i,
            .state = UNRESOLVED,
            .file = -1,
            .target = -1,
        };
        if (at >= 0) {
            s->items[at] = extra; /* the mount hides what the tree has there */
            continue;
        }
        if (grow((void **)&s->items, &cap, s->nitems + 1, sizeof *s->items) < 0)
            return -1;
        s->items[s->nitems++] = extra;
        if (index_items(s) < 0)
            return -1;
    }
    return 0;
}

/* Whether DIR/SONAME is the file the entry was read from (then the cache may name it). */
static int soname_is_same_file(struct cds_scan *s, const struct dlib *d)
{
    if (strcmp(d->name, d->soname) == 0)
        return 1;
    long at = find_item(s, d->soname);
    if (at < 0 && s->extras_only && s->have_listed) {
        /* Not among the extras: a link of the directory's, naming the extra? */
        long was = find_listed(s, d->soname);
        if (was < 0)
            return 0;
        struct item *it = &s->listed[was];
        if (it->dtype != DT_LNK && it->dtype != DT_UNKNOWN)
            return 0;
        if (it->link_text == NULL && it->link_err == 0)
            read_link(s, it);
        if (it->link_err == -ENOMEM)
            return -1;
        return it->link_text != NULL && strcmp(it->link_text, d->name) == 0;
    }
    if (at < 0 && s->extras_only && s->dirfd >= 0) {
        /* Not among the extras: a link of the directory's, naming the extra? */
        char target[PATH_MAX + 1];
        ssize_t len = readlinkat(s->dirfd, d->soname, target, sizeof target - 1);
        if (len <= 0 || (size_t)len >= sizeof target - 1)
            return 0;
        target[len] = '\0';
        return strcmp(target, d->name) == 0;
    }
    if (at < 0)
        return 0;
    if (resolve(s, (uint32_t)at, 0) < 0)
        return -1;
    const struct item *it = &s->items[at];
    if (it->state != RESOLVED || !S_ISREG(it->mode))
        return 0;
    long f = file_of(s, (uint32_t)at);
    if (f == -2)
        return -1;
    if (f == d->file)
        return 1;
    const struct file *file = &s->files[f], *chosen = &s->files[d->file];
    return file->status >= 0 && file->has_identity && chosen->has_identity && file->dev == chosen->dev
        && file->ino == chosen->ino;
}

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
    read_file_into(f, fd, s->target, 1);
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
    int fd = open_item(s, it);
    if (fd < 0) {
        *f = (struct file){.status = -errno, .soname = NULL};
        return;
    }
    read_file_into(f, fd, s->target, 0);
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
            read_link(s, it);
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
        int fd = open_item(s, it);
        if (fd < 0) {
            *f = (struct file){.status = -errno, .soname = NULL};
            continue;
        }
        read_file_into(f, fd, s->target, it->extra >= 0);
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
static int prefetch(struct cds_scan *s, const struct cds_scan_opts *opts)
{
    cleanup_free uint32_t *list = malloc((s->nitems ? s->nitems : 1) * sizeof *list);
    if (list == NULL)
        return -1;
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->nitems; i++) {
        struct item *it = &s->items[i];
        if (!is_candidate(s, it, opts) || lstat_item(s, it) < 0)
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
        if (resolve(s, i, 0) < 0)
            return -1;
        it = &s->items[i];
        if (it->state == RESOLVED && it->file < 0 && it->target >= 0
            && queue_file(s, list, &n, (uint32_t)it->target) < 0)
            return -1;
    }
    return run_jobs(s, list, n);
}

/* The extras' "name\0host\0..." run as an array in the scan's arena (living as long as it).
 * A host path that starts with CDS_EXTRA_LINK (\001) is a link's (struct cds_extra). */
static int unpack_extras(struct cds_scan *s, const char *packed, size_t len, size_t nextras)
{
    if (nextras == 0)
        return 0;
    if (nextras > len / 2) {
        errno = EINVAL;
        return -1;
    }
    char *copy = cds_arena_alloc(&s->arena, len);
    struct cds_extra *extras = cds_arena_alloc(&s->arena, nextras * sizeof *extras);
    if (copy == NULL || extras == NULL)
        return -1;
    memcpy(copy, packed, len);
    char *p = copy, *end = copy + len;
    for (size_t i = 0; i < nextras; i++) {
        char *name_end = memchr(p, '\0', (size_t)(end - p));
        char *host_end = name_end ? memchr(name_end + 1, '\0', (size_t)(end - name_end - 1)) : NULL;
        if (host_end == NULL) {
            errno = EINVAL;
            return -1;
        }
        int is_link = name_end[1] == '\001';
        extras[i] = (struct cds_extra){p, name_end + 1 + is_link, is_link};
        p = host_end + 1;
    }
    s->extras = extras;
    return 0;
}

int cds_scan_dir(int rootfd, const char *dirpath, int dirfd, const char *extras, size_t len, size_t nextras,
                 const struct cds_scan_opts *opts, struct cds_scan **out)
{
    *out = NULL;
    struct cds_scan *s = calloc(1, sizeof *s);
    if (s == NULL)
        return -1;
    s->rootfd = rootfd;
    s->dirfd = dirfd;
    s->target = opts->target;
    s->extras_only = opts->extras_only;
    s->memo = filememo_enabled();
    s->memo_with_dev = 1;
    if (s->memo)
        s->started = filememo_clock();
    int rc = -1;
    s->dirpath = cds_arena_strndup(&s->arena, dirpath, strlen(dirpath));
    if (s->dirpath != NULL && unpack_extras(s, extras, len, nextras) == 0 && read_listing(s) == 0
        && set_aside_listing(s) == 0 && add_extras(s, nextras) == 0 && index_items(s) == 0 && prefetch(s, opts) == 0) {
        rc = 0;
        for (uint32_t i = 0; i < s->nitems && rc == 0; i++)
            rc = consider(s, i, opts);
        for (uint32_t i = 0; i < s->ndlibs && rc == 0 && opts->links == CDS_LINKS_EXISTING; i++) {
            int same = soname_is_same_file(s, &s->dlibs[i]);
            if (same < 0)
                rc = -1;
            else
                s->dlibs[i].soname_link_ok = same;
        }
        if (rc == 0 && s->extras_only && s->have_listed
            && (s->remember_listing || gained_link_texts(s->listed, s->nlisted)))
            remember_listing(s, s->listed, s->nlisted);
        else if (rc == 0 && !s->extras_only && nextras == 0
                 && (s->remember_listing || (s->listed_from_memo && gained_link_texts(s->items, s->nitems))))
            remember_listing(s, s->items, s->nitems);
    }
    if (rc < 0) {
        int saved = errno;
        cds_scan_free(s);
        errno = saved;
        return -1;
    }
    *out = s;
    return 0;
}

void cds_scan_free(struct cds_scan *s)
{
    if (s == NULL)
        return;
    cds_arena_free(&s->arena);
    for (uint32_t i = 0; i < s->nfiles; i++)
        free(s->files[i].soname);
    for (uint32_t i = 0; i < s->nitems; i++)
        if (!s->items[i].link_borrowed)
            free(s->items[i].link_text);
    for (uint32_t i = 0; i < s->nlisted; i++)
        if (!s->listed[i].link_borrowed)
            free(s->listed[i].link_text);
    free(s->listed);
    free(s->listed_index);
    free(s->memo_listing);
    free(s->items);
    free(s->name_index);
    free(s->files);
    free(s->dlibs);
    free(s->soname_index);
    free(s->subdirs);
    free(s->skips);
    free(s);
}

uint32_t cds_scan_count(const struct cds_scan *s) { return s->ndlibs; }

int cds_scan_lib(const struct cds_scan *s, uint32_t index, struct cds_dlib *lib)
{
    if (index >= s->ndlibs) {
        errno = ERANGE;
        return -1;
    }
    /* ldconfig pushes each new soname on the front of its list. */
    const struct dlib *d = &s->dlibs[s->ndlibs - 1 - index];
    lib->name = d->name;
    lib->soname = d->soname;
    lib->flags = d->flags;
    lib->isa_level = d->isa_level;
    lib->is_link = d->is_link;
    lib->extra = d->extra;
    lib->soname_link_ok = d->soname_link_ok;
    lib->dev = d->dev;
    lib->ino = d->ino;
    return 0;
}

uint32_t cds_scan_subdir_count(const struct cds_scan *s) { return s->nsubdirs; }

int cds_scan_subdir(const struct cds_scan *s, uint32_t index, const char **name, uint64_t *dev, uint64_t *ino)
{
    if (index >= s->nsubdirs) {
        errno = ERANGE;
        return -1;
    }
    *name = s->subdirs[index].name;
    *dev = s->subdirs[index].dev;
    *ino = s->subdirs[index].ino;
    return 0;
}

uint32_t cds_scan_skip_count(const struct cds_scan *s) { return s->nskips; }
uint32_t cds_scan_shadowing(const struct cds_scan *s) { return s->shadowing; }

int cds_scan_skip(const struct cds_scan *s, uint32_t index, struct cds_skip *skip)
{
    if (index >= s->nskips) {
        errno = ERANGE;
        return -1;
    }
    *skip = s->skips[index];
    return 0;
}

int cds_builder_add_scan(struct cds_builder *b, const struct cds_scan *s, const char *dirpath, uint32_t rank,
                         const char *hwcaps, uint64_t hwcap, int links)
{
    size_t dir_len = strlen(dirpath);
    cleanup_free char *path = NULL;
    size_t cap = 0;
    for (uint32_t i = 0; i < s->ndlibs; i++) {
        struct cds_dlib d;
        cds_scan_lib(s, i, &d);
        const char *file;
        if (hwcaps != NULL)
            file = d.name; /* glibc-hwcaps entries name the file itself */
        else if (links == CDS_LINKS_EXISTING && !d.soname_link_ok)
            file = d.name; /* no link to the soname there: name the file */
        else
            file = d.soname;
        size_t need = dir_len + strlen(file) + 2;
        if (need > cap) {
            char *grown = realloc(path, need);
            if (grown == NULL)
                return -1;
            path = grown;
            cap = need;
        }
        memcpy(path, dirpath, dir_len);
        path[dir_len] = '/';
        strcpy(path + dir_len + 1, file);
        if (cds_builder_add(b, d.soname, path, d.flags, d.isa_level, hwcaps ? 0 : hwcap, hwcaps, rank) < 0)
            return -1;
    }
    return 0;
}

/* ---- ldconfig's name tables ------------------------------------------------------- */

static const char *const x86_hwcaps[] = {"sse2", "x86_64", "avx512_1"};
static const char *const x86_platforms[] = {"i586", "i686", "haswell", "xeon_phi"};
#define X86_FIRST_PLATFORM 48
static const char *const aarch64_hwcaps[] = {
    "fp",    "asimd",    "evtstrm", "aes",   "pmull",  "sha1",  "sha2", "crc32", "atomics", "fphp",    "asimdhp",
    "cpuid", "asimdrdm", "jscvt",   "fcma",  "lrcpc",  "dcpop", "sha3", "sm3",   "sm4",     "asimddp", "sha512",
    "sve",   "asimdfhm", "dit",     "uscat", "ilrcpc", "flagm", "ssbs", "sb",    "paca",    "pacg",
};
#define AARCH64_HWCAP_IMPORTANT (1u << 8) /* atomics */
#define TLS_HWCAP_BIT 63

static int string_hwcap(int target, const char *name)
{
    if (target == CDS_TARGET_AARCH64) {
        for (int i = 0; i < (int)(sizeof aarch64_hwcaps / sizeof *aarch64_hwcaps); i++)
            if (strcmp(name, aarch64_hwcaps[i]) == 0)
                return i;
        return -1;
    }
    for (int i = 0; i < 3; i++)
        if (strcmp(name, x86_hwcaps[i]) == 0)
            return i;
    return -1;
}

static int string_platform(int target, const char *name)
{
    if (target == CDS_TARGET_AARCH64)
        return -1;
    for (int i = 0; i < 4; i++)
        if (strcmp(name, x86_platforms[i]) == 0)
            return X86_FIRST_PLATFORM + i;
    return -1;
}

int cds_is_hwcap_subdir(int target, const char *name)
{
    int idx = string_hwcap(target, name);
    uint32_t important = target == CDS_TARGET_AARCH64 ? AARCH64_HWCAP_IMPORTANT : 0x7u;
    if (idx != -1 && ((1u << idx) & important))
        return 1;
    if (string_platform(target, name) != -1)
        return 1;
    return strcmp(name, "tls") == 0;
}

uint64_t cds_path_hwcap(int target, const char *path)
{
    uint64_t hwcap = 0;
    char *copy = strdup(path);
    if (copy == NULL)
        return 0;
    for (;;) {
        char *slash = strrchr(copy, '/');
        if (slash == NULL)
            break;
        int bit = string_hwcap(target, slash + 1);
        if (bit == -1) {
            bit = string_platform(target, slash + 1);
            if (bit == -1) {
                if (strcmp(slash + 1, "tls") == 0)
                    bit = TLS_HWCAP_BIT;
                else
                    break;
            }
        }
        hwcap += 1ull << bit;
        *slash = '\0';
    }
    free(copy);
    return hwcap;
}

int cds_is_dso_name(const char *name)
{
    return ((strncmp(name, "lib", 3) == 0 || strncmp(name, "ld-", 3) == 0) && strstr(name, ".so") != NULL)
        || strncmp(name, "ld.so.", 6) == 0 || strncmp(name, "ld64.so.", 8) == 0;
}
