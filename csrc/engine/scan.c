/* One library directory as ldconfig's search_dir() reads it: see scan.h.
 *
 * This file is the loop itself (search_dir's body, the libraries kept per soname) and the
 * scan's public face; its listing, link following and reads are scan_listing.c,
 * scan_resolve.c and scan_prefetch.c.
 *
 * Differences from ldconfig, all on the safe side: nothing is ever followed out of the
 * tree (links resolve inside it, as under ldconfig's chroot), only regular files are
 * opened (ldconfig blocks forever on a link to a FIFO), and no link is created or removed.
 * Links to a plain name in the same directory are resolved through the listing, so extra
 * files (bind mounts to come) are seen where they will be. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "arena.h"
#include "cleanup.h"
#include "elf.h"
#include "filememo.h"
#include "ldcache.h"
#include "scan.h"
#include "scan_impl.h"

static int add_skip(struct cds_scan *s, const char *name, int status)
{
    if (grow((void **)&s->skips, &s->skips_cap, s->nskips + 1, sizeof *s->skips) < 0)
        return -1;
    s->skips[s->nskips++] = (struct cds_skip){name, status};
    return 0;
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

/* Item INDEX, a glibc-hwcaps subdirectory (IS_LINK: listed as a link, so already resolved):
 * kept to scan after the directory. -1 only on ENOMEM. */
static int add_subdir(struct cds_scan *s, uint32_t index, int is_link)
{
    const char *name = s->items[index].name;
    if (!is_link && scan_resolve(s, index, 0) < 0)
        return -1;
    const struct item *it = &s->items[index];
    if (it->state != RESOLVED)
        return add_skip(s, name, it->err);
    if (grow((void **)&s->subdirs, &s->subdirs_cap, s->nsubdirs + 1, sizeof *s->subdirs) < 0)
        return -1;
    s->subdirs[s->nsubdirs++] = (struct subdir){name, it->dev, it->ino};
    return 0;
}

/* The library of item INDEX (file F, as SONAME with FLAG; IS_LINK: keyed by its link name)
 * among the ones kept per soname: added, or in place of the one kept when ldconfig prefers
 * it. -1 only on ENOMEM. */
static int keep_library(struct cds_scan *s, uint32_t index, long f, const char *soname, int32_t flag, int is_link)
{
    const char *name = s->items[index].name;
    const struct file *file = &s->files[f];
    long existing = find_dlib(s, soname);
    if (existing < 0) {
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
    struct dlib *d = &s->dlibs[existing];
    if (!((!is_link && d->is_link) || (is_link == d->is_link && cds_libcmp(d->name, name, s->target) < 0)))
        return 0;
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
    return 0;
}

/* One entry of the listing, as search_dir's loop body. -1 only on ENOMEM. */
static int consider(struct cds_scan *s, uint32_t index, const struct cds_scan_opts *opts)
{
    struct item *it = &s->items[index];
    const char *name = it->name;
    if (!scan_is_candidate(s, it, opts))
        return 0;
    if (scan_lstat_item(s, it) < 0)
        return add_skip(s, name, it->lstat_err);
    uint8_t type = it->type;
    int is_link = type == DT_LNK;
    int is_dir;
    if (is_link) {
        if (scan_resolve(s, index, 0) < 0)
            return -1;
        it = &s->items[index];
        if (it->state != RESOLVED)
            return add_skip(s, name, it->err); /* a stale link */
        is_dir = S_ISDIR(it->mode);
    } else {
        is_dir = type == DT_DIR;
    }
    if (!opts->in_hwcaps && is_dir && cds_is_hwcap_subdir(s->target, name))
        return add_subdir(s, index, is_link);
    if (type != DT_REG && !is_link)
        return 0;
    if (is_link && !S_ISREG(it->mode))
        return add_skip(s, name, S_ISDIR(it->mode) ? -EISDIR : -EINVAL);

    long f = scan_file_of(s, index);
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
    return keep_library(s, index, f, soname, flag, is_link);
}

/* Whether DIR/SONAME is the file the entry was read from (then the cache may name it). */
static int soname_is_same_file(struct cds_scan *s, const struct dlib *d)
{
    if (strcmp(d->name, d->soname) == 0)
        return 1;
    long at = scan_find_item(s, d->soname);
    if (at < 0 && s->extras_only && s->have_listed) {
        /* Not among the extras: a link of the directory's, naming the extra? */
        long was = scan_find_listed(s, d->soname);
        if (was < 0)
            return 0;
        struct item *it = &s->listed[was];
        if (it->dtype != DT_LNK && it->dtype != DT_UNKNOWN)
            return 0;
        if (it->link_text == NULL && it->link_err == 0)
            scan_read_link(s, it);
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
    if (scan_resolve(s, (uint32_t)at, 0) < 0)
        return -1;
    const struct item *it = &s->items[at];
    if (it->state != RESOLVED || !S_ISREG(it->mode))
        return 0;
    long f = scan_file_of(s, (uint32_t)at);
    if (f == -2)
        return -1;
    if (f == d->file)
        return 1;
    const struct file *file = &s->files[f], *chosen = &s->files[d->file];
    return file->status >= 0 && file->has_identity && chosen->has_identity && file->dev == chosen->dev
        && file->ino == chosen->ino;
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
    if (s->dirpath != NULL && scan_unpack_extras(s, extras, len, nextras) == 0 && scan_read_listing(s) == 0
        && scan_set_aside_listing(s) == 0 && scan_add_extras(s, nextras) == 0 && scan_index_items(s) == 0
        && scan_prefetch(s, opts) == 0) {
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
            && (s->remember_listing || scan_gained_link_texts(s->listed, s->nlisted)))
            scan_remember_listing(s, s->listed, s->nlisted);
        else if (rc == 0 && !s->extras_only && nextras == 0
                 && (s->remember_listing || (s->listed_from_memo && scan_gained_link_texts(s->items, s->nitems))))
            scan_remember_listing(s, s->items, s->nitems);
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
