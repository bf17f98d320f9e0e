/* A scan's items: the directory's listing (read with getdents64, or from the file memo where it
 * knows the directory), kept in the memo after a scan, the extras (files that bind mounts will
 * put there) laid over it, the name indexes that find an item by name, and the filter that picks
 * the items the scan looks at (used by the loop in scan.c and the up-front reads in
 * scan_prefetch.c alike). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "arena.h"
#include "cleanup.h"
#include "dirents.h"
#include "filememo.h"
#include "scan_impl.h"

static int is_prelink_temp(const char *name)
{
    size_t len = strlen(name);
    if (len >= 10 && strcmp(name + len - 10, ".#prelink#") == 0)
        return 1;
    return len >= 17 && memcmp(name + len - 17, ".#prelink#.", 11) == 0;
}

/* search_dir's first filter: which listed names it looks at at all. */
int scan_is_candidate(const struct cds_scan *s, const struct item *it, const struct cds_scan_opts *opts)
{
    uint8_t type = it->dtype;
    if (type != DT_UNKNOWN && type != DT_LNK && type != DT_REG && type != DT_DIR)
        return 0;
    if (!cds_is_dso_name(it->name) && (type == DT_REG || opts->in_hwcaps || !cds_is_hwcap_subdir(s->target, it->name)))
        return 0;
    return !is_prelink_temp(it->name);
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

long scan_find_item(const struct cds_scan *s, const char *name)
{
    return find_name(s->items, s->name_index, s->name_slots, name);
}

long scan_find_listed(const struct cds_scan *s, const char *name)
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

int scan_index_items(struct cds_scan *s) { return index_names(s->items, s->nitems, &s->name_index, &s->name_slots); }

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
void scan_remember_listing(struct cds_scan *s, const struct item *items, uint32_t n)
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
int scan_gained_link_texts(const struct item *items, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (items[i].link_text != NULL && !items[i].link_borrowed)
            return 1;
    return 0;
}

/* The directory's listing into s->items: from the memo when it knows the directory. */
int scan_read_listing(struct cds_scan *s)
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
int scan_set_aside_listing(struct cds_scan *s)
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

int scan_add_extras(struct cds_scan *s, size_t nextras)
{
    if (nextras == 0)
        return 0;
    if (scan_index_items(s) < 0)
        return -1;
    uint32_t cap = s->nitems;
    for (size_t i = 0; i < nextras; i++) {
        const char *name = s->extras[i].name;
        if (name[0] == '\0' || strchr(name, '/') != NULL || strcmp(name, ".") == 0 || strcmp(name, "..") == 0) {
            errno = EINVAL;
            return -1;
        }
        long at = scan_find_item(s, name);
        if (s->extras_only && s->have_listed) {
            if (scan_find_listed(s, name) >= 0)
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
        if (scan_index_items(s) < 0)
            return -1;
    }
    return 0;
}

/* The extras' "name\0host\0..." run as an array in the scan's arena (living as long as it).
 * A host path that starts with CDS_EXTRA_LINK (\001) is a link's (struct cds_extra). */
int scan_unpack_extras(struct cds_scan *s, const char *packed, size_t len, size_t nextras)
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
