/* A recipe's blocks (shim/linker/stepmemo.py, export_recipe; shim/runtime/requestmemo.py):
 * each a u32 length and its bytes; a block of files holds file entries. Read by replay.c and
 * replay_etc.c, never trusted for a length (a block or entry cut short is -1). */
#ifndef CDI_SHIM_RECIPE_BLOCKS_H
#define CDI_SHIM_RECIPE_BLOCKS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

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

#endif
