/* glibc ld.so.cache: a bounds-checked reader of the three formats and a writer of glibc
 * 2.36's layout (entry order, flags, string table, extensions), byte for byte.
 * Plain values and errno. */
#ifndef CDI_SHIM_LDCACHE_H
#define CDI_SHIM_LDCACHE_H

#include <stddef.h>
#include <stdint.h>

struct cds_stat;

enum {
    CDS_FORMAT_OLD = 0,   /* ld.so-1.7.0 only */
    CDS_FORMAT_NEW = 1,   /* glibc-ld.so.cache1.1 only (glibc >= 2.32's default) */
    CDS_FORMAT_COMPAT = 2 /* both, the new one inside the old one's string table */
};

enum { CDS_RANK_DROP = 0xffffffffu };

/* One entry as stored. Strings point into the parsed cache and live as long as it. */
struct cds_cache_entry {
    int32_t flags;
    uint32_t osversion;
    uint64_t hwcap;
    const char *key;          /* the soname */
    const char *value;        /* the path */
    const char *hwcaps;       /* glibc-hwcaps subdirectory name, or NULL */
    const char *hwcaps_print; /* the name `ldconfig -p` prints (differs for compat files) */
};

struct cds_cache;

/* Parse LEN bytes (copied). On a malformed file returns -1 with errno EINVAL (EBADMSG for a
 * bad magic) and *WHY naming the defect. */
int cds_cache_parse(const uint8_t *data, size_t len, struct cds_cache **out, const char **why);
/* The same for the regular file open at FD, read straight into the cache (no copy): the
 * refusals of cds_read_fd (EISDIR, EINVAL for what is not a regular file, EFBIG over MAX,
 * *ST saying what it was; *WHY stays "") or those of cds_cache_parse. */
int cds_cache_read_fd(int fd, size_t max, struct cds_cache **out, const char **why, struct cds_stat *st);
void cds_cache_free(struct cds_cache *cache);
int cds_cache_format(const struct cds_cache *cache);
uint32_t cds_cache_count(const struct cds_cache *cache);
int cds_cache_entry(const struct cds_cache *cache, uint32_t index, struct cds_cache_entry *entry);
/* The generator string of the extension section (LEN bytes, NUL-terminated copy), or NULL. */
const char *cds_cache_generator(const struct cds_cache *cache, size_t *len);
/* Index of the first entry out of ldconfig's order for TARGET's loader, or -1 if none. */
long cds_cache_unsorted_at(const struct cds_cache *cache, int target);

/* The directories of the entries' paths (up to the last '/'), each once, in order of first
 * appearance, as NUL-separated strings in *NAMES, with how many entries each has in
 * *COUNTS. Free both with cds_free. Returns how many, or -1. */
long cds_cache_dirs(const struct cds_cache *cache, char **names, uint32_t **counts, size_t *names_len);

/* Whether CACHE has an entry for SONAME (by glibc's comparison, as the loader looks it up)
 * whose path lies directly in DIR. Binary search: the entries must be in order. */
int cds_cache_has(const struct cds_cache *cache, const char *soname, const char *dir, int target);

/* glibc's _dl_cache_libcmp as compiled for TARGET (char signedness differs). */
int cds_libcmp(const char *a, const char *b, int target);

struct cds_builder;

struct cds_builder *cds_builder_new(int target);
void cds_builder_free(struct cds_builder *builder);
/* Put a string in the string table without an entry (ldconfig interns every glibc-hwcaps
 * subdirectory name it meets, used or not). */
int cds_builder_intern(struct cds_builder *builder, const char *string);
/* Add one entry. HWCAP is the legacy hwcap value (0 for glibc-hwcaps entries), HWCAPS the
 * glibc-hwcaps subdirectory name or NULL, RANK the position of its directory in
 * ldconfig's directory list (ties between equal entries go to the lower rank). */
int cds_builder_add(struct cds_builder *builder, const char *soname, const char *path, int32_t flags,
                    uint32_t isa_level, uint64_t hwcap, const char *hwcaps, uint32_t rank);
/* Add the entries of CACHE. An entry's directory is its path up to the last '/'; when it
 * is DIRS[i] the entry gets RANKS[i] (CDS_RANK_DROP leaves it out); entries of other
 * directories get UNKNOWN_RANK (or are left out, for CDS_RANK_DROP). Stored OS versions
 * are dropped (glibc 2.36 writes 0), and so are glibc-hwcaps entries whose subdirectory
 * name does not resolve (the loader ignores them). Returns how many entries were of unknown
 * directories, or -1 with errno. */
long cds_builder_add_cache(struct cds_builder *builder, const struct cds_cache *cache, const char **dirs,
                           const uint32_t *ranks, size_t ndirs, uint32_t unknown_rank);
/* The same, leaving out the entries whose path is one of the NEXCEPT NUL-terminated paths
 * packed in EXCEPT (EXCEPT_LEN bytes, the last one a NUL; EINVAL otherwise). */
long cds_builder_add_cache_except(struct cds_builder *builder, const struct cds_cache *cache, const char **dirs,
                                  const uint32_t *ranks, size_t ndirs, uint32_t unknown_rank, const char *except,
                                  size_t except_len, size_t nexcept);
uint32_t cds_builder_count(const struct cds_builder *builder);
/* Lay the cache out in FORMAT with GENERATOR as the generator string (new and compat
 * formats). *OUT is freed with cds_free. 0 or -1 with errno. */
int cds_builder_build(struct cds_builder *builder, int format, const char *generator, uint8_t **out, size_t *len);

#endif
