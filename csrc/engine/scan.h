/* One library directory, read the way glibc's ldconfig (2.36) reads it (search_dir), inside
 * a tree and with optional extra files (host files that will appear in the directory).
 * Plain values and errno. */
#ifndef CDI_SHIM_SCAN_H
#define CDI_SHIM_SCAN_H

#include <stddef.h>
#include <stdint.h>

struct cds_stat;
struct cds_builder;

enum {
    CDS_LINKS_LDCONFIG = 0, /* DIR/SONAME, as ldconfig (which creates the link) */
    CDS_LINKS_EXISTING = 1  /* DIR/SONAME where that name is this file, else DIR/NAME */
};

struct cds_scan_opts {
    int target;       /* CDS_TARGET_* */
    int in_hwcaps;    /* a glibc-hwcaps subdirectory: no subdirectories, and
                                     entries name the file itself */
    int32_t dir_flag; /* the "=libc6" style type of the directory, -1 if none */
    int links;        /* CDS_LINKS_*: EXISTING also works out soname_link_ok */
    int extras_only;  /* look at the EXTRAS only, not at the directory's listing
                                     (the directory is still asked about names: see
                                     cds_scan_shadowing) */
};

/* A library ldconfig keeps for the directory. */
struct cds_dlib {
    const char *name; /* the file (or link) name chosen for the soname */
    const char *soname;
    int32_t flags;
    uint32_t isa_level;
    int32_t is_link;
    int32_t extra;          /* index into the extras, or -1 */
    int32_t soname_link_ok; /* DIR/SONAME exists and is this same file */
    uint64_t dev, ino;
};

/* A file left out, and why (CDS_ELF_* status, or -errno). */
struct cds_skip {
    const char *name;
    int32_t status;
};

struct cds_scan;

/* Read the directory open at DIRFD (O_RDONLY|O_DIRECTORY, not closed; its offset is
 * moved; -1 for a directory that exists only through extras). DIRPATH is its path in the
 * tree at ROOTFD, for links that point elsewhere. EXTRAS (LEN bytes): NEXTRAS files that
 * are not in the tree yet, each as its name in the directory and the host path it is read
 * from, NUL-terminated ("name\0/host/path\0..."); a host path that starts with \001 (the
 * byte stripped) is a link's: a directory mount's entry that is a link there, which ldconfig
 * keys by its own name (libcuda.so) where a file is keyed by its SONAME. Returns 0 or -1
 * with errno. */
int cds_scan_dir(int rootfd, const char *dirpath, int dirfd, const char *extras, size_t len, size_t nextras,
                 const struct cds_scan_opts *opts, struct cds_scan **out);
void cds_scan_free(struct cds_scan *scan);
uint32_t cds_scan_count(const struct cds_scan *scan);
/* Libraries in ldconfig's order of addition to the cache. */
int cds_scan_lib(const struct cds_scan *scan, uint32_t index, struct cds_dlib *lib);
/* Legacy hwcap subdirectories found (tls, x86_64, haswell, ...), in directory order. */
uint32_t cds_scan_subdir_count(const struct cds_scan *scan);
int cds_scan_subdir(const struct cds_scan *scan, uint32_t index, const char **name, uint64_t *dev, uint64_t *ino);
/* With extras_only: how many extras land on a name the directory already has (they hide
 * it, so what the directory's cache entries said may no longer hold). */
uint32_t cds_scan_shadowing(const struct cds_scan *scan);
uint32_t cds_scan_skip_count(const struct cds_scan *scan);
int cds_scan_skip(const struct cds_scan *scan, uint32_t index, struct cds_skip *skip);

/* Add a scanned directory's libraries to a cache under construction: DIRPATH as the cache
 * names it, RANK its place in the directory list, HWCAPS its glibc-hwcaps subdirectory name
 * (or NULL), HWCAP its legacy hwcap value. 0 or -1. */
int cds_builder_add_scan(struct cds_builder *builder, const struct cds_scan *scan, const char *dirpath, uint32_t rank,
                         const char *hwcaps, uint64_t hwcap, int links);

/* Threads that read files in big directories: 0 = one per CPU (up to 4), 1 = none.
 * Returns the previous setting. */
int cds_scan_set_threads(int n);

struct cds_memo_stats {
    uint64_t hits, misses;
    uint32_t entries;
};
/* Keep what reading library files gave, keyed by stat identity, and stat them instead of
 * reading them again (for long-lived processes: the resident worker; see filememo.h).
 * ENABLE 1 turns it on, 0 off, -1 leaves it; FORGET drops what it holds; SETTLE_NS (or -1
 * to leave it) is how old a file's ctime must be to be kept; STATS (or NULL) gets the
 * counters. Returns the previous setting. */
int cds_scan_memo(int enable, int forget, int64_t settle_ns, struct cds_memo_stats *stats);

/* The identity of one file for a memo of whole plans (shim/ldconfig/plan.py): what stat said,
 * or the errno it failed with (all other fields 0). Fixed fields, no padding: compared
 * bytewise. */
struct cds_identity {
    int32_t err;
    uint32_t mode;
    uint64_t dev; /* 0 for files in a tree on overlayfs, as in the file memo */
    uint64_t ino;
    uint64_t size;
    int64_t mtime_ns;
    int64_t ctime_ns;
};
/* Now, on the clock the kernel stamps ctime with (coarse realtime), in ns. */
int64_t cds_memo_clock_ns(void);
/* Stat COUNT files named in PATHS (SIZE bytes): each a kind byte and a NUL-terminated path,
 * 'f' a path inside the tree at ROOTFD (a final link followed, inside it), 'n' the same
 * without following a final link, 'h' a host path. cds_memo_identify fills OUT and returns
 * how many of the files found changed too recently to be trusted at STARTED_NS (the file
 * memo's settle rule); cds_memo_same returns 1 when every file's identity equals EXPECTED's,
 * 0 at the first that does not. Both: -1 with EINVAL on a malformed list. */
int cds_memo_identify(int rootfd, const char *paths, size_t size, size_t count, int64_t started_ns,
                      struct cds_identity *out);
int cds_memo_same(int rootfd, const char *paths, size_t size, size_t count, const struct cds_identity *expected);

/* ldconfig's path_hwcap(): the legacy hwcap bits of PATH's trailing components. */
uint64_t cds_path_hwcap(int target, const char *path);
/* ldconfig's is_hwcap_platform(): NAME is a legacy hwcap subdirectory name. */
int cds_is_hwcap_subdir(int target, const char *name);
/* _dl_is_dso(): NAME looks like a shared library's file name. */
int cds_is_dso_name(const char *name);

#endif
