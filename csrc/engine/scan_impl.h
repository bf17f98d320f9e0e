/* The state of one directory scan (scan.h's struct cds_scan) and the functions its parts share:
 * the loop (scan.c), the listing and extras (scan_listing.c), link following and file reading
 * (scan_resolve.c), the up-front reads (scan_prefetch.c). Not part of the cffi surface. */
#ifndef CDI_SHIM_SCAN_IMPL_H
#define CDI_SHIM_SCAN_IMPL_H

#include <dirent.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

#include "arena.h"
#include "scan.h"

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

static inline uint32_t hash_name(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s != '\0'; s++) {
        h ^= (unsigned char)*s;
        h *= 16777619u;
    }
    return h;
}

static inline int grow(void **array, uint32_t *cap, uint32_t need, size_t size)
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

/* scan_listing.c */
/* search_dir's first filter: whether the loop looks at listed item IT at all. */
int scan_is_candidate(const struct cds_scan *s, const struct item *it, const struct cds_scan_opts *opts);
long scan_find_item(const struct cds_scan *s, const char *name);
long scan_find_listed(const struct cds_scan *s, const char *name);
/* A name index of the scan's items (replacing the one before); 0, or -1 (ENOMEM). */
int scan_index_items(struct cds_scan *s);
int scan_unpack_extras(struct cds_scan *s, const char *packed, size_t len, size_t nextras);
int scan_read_listing(struct cds_scan *s);
int scan_set_aside_listing(struct cds_scan *s);
int scan_add_extras(struct cds_scan *s, size_t nextras);
void scan_remember_listing(struct cds_scan *s, const struct item *items, uint32_t n);
int scan_gained_link_texts(const struct item *items, uint32_t n);

/* scan_resolve.c */
void scan_read_file_into(struct file *f, int fd, int target, int identity);
int scan_open_item(struct cds_scan *s, const struct item *it);
void scan_read_link(const struct cds_scan *s, struct item *it);
int scan_lstat_item(struct cds_scan *s, struct item *it);
int scan_resolve(struct cds_scan *s, uint32_t index, int hops);
long scan_file_of(struct cds_scan *s, uint32_t index);

/* scan_prefetch.c */
int scan_prefetch(struct cds_scan *s, const struct cds_scan_opts *opts);

#endif
