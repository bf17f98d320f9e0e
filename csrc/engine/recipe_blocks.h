/* A recipe's blocks (the formats: recipe.c, which writes and reads them): each a u32 length and
 * its bytes; a block of files holds file entries. Read by replay.c and replay_etc.c, never
 * trusted for a length (a block or entry cut short is -1). */
#ifndef CDI_SHIM_RECIPE_BLOCKS_H
#define CDI_SHIM_RECIPE_BLOCKS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* What of the driver version file a request's recipe holds (shim/driver_version.py reads as much). */
#define CDS_DRIVER_VERSION_BYTES 4096

struct block {
    const char *data;
    size_t len;
};

static inline int next_block(const char **at, const char *end, struct block *b)
{
    uint32_t len;
    if ((size_t)(end - *at) < 4)
        return -1;
    memcpy(&len, *at, 4);
    *at += 4;
    if ((size_t)(end - *at) < len)
        return -1;
    b->data = *at;
    b->len = len;
    *at += len;
    return 0;
}

/* A file of a recipe's block: name NUL, mode (u32), length (u32), bytes. */
struct file_entry {
    const char *name, *data;
    uint32_t mode, len;
};

/* The file entry at *AT (before END) into F, *AT past it; -1 when the block is cut there. */
static inline int next_file(const char **at, const char *end, struct file_entry *f)
{
    size_t n = strnlen(*at, (size_t)(end - *at));
    if ((size_t)(end - *at) < n + 1 + 8)
        return -1;
    f->name = *at;
    memcpy(&f->mode, *at + n + 1, 4);
    memcpy(&f->len, *at + n + 5, 4);
    f->data = *at + n + 9;
    if ((size_t)(end - f->data) < f->len)
        return -1;
    *at = f->data + f->len;
    return 0;
}

/* One way a kept step went (recipe.c): what it read (the params file, its paths and their
 * identities), what it did, and WHOLE, the variant's own block. */
struct step_variant {
    struct block params, paths, count, identities, links, files, programs, hooks, binds, roots, etc, sources, whole;
};

/* The step recipe for KEY (KEY_LEN bytes) of VERSION in STEPS_DIR, a file of ours, whole: 0 with
 * *TEXT (free it) and *VARIANTS (for cds_step_variant_next), or -1. */
int cds_step_recipe_read(const char *steps_dir, const uint8_t *key, size_t key_len, const char *version, char **text,
                         struct block *variants);

/* The next variant of REST into V (REST past it): 1, 0 at the end, -1 when it is malformed. */
int cds_step_variant_next(struct block *rest, struct step_variant *v);

/* A request's recipe (recipe.c): the key, the host paths whose identities the resolution
 * depended on, the driver version file as it was ('0': unreadable; '1' and its first bytes),
 * the devices (for the log), whether a step follows ('S') or not ('N'), the edits (request.c). */
struct request_recipe {
    struct block version, key, paths, count, identities, driver, devices, step, edits;
};

/* The request recipe for KEY of VERSION in STEPS_DIR: 0 with *TEXT (free it) and R, or -1. */
int cds_request_recipe_read(const char *steps_dir, const uint8_t *key, size_t key_len, const char *version, char **text,
                            struct request_recipe *r);

#endif
