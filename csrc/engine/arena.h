/* A bump allocator for strings that live as long as their owner (not part of the cffi
 * surface). */
#ifndef CDI_SHIM_ARENA_H
#define CDI_SHIM_ARENA_H

#include <stdlib.h>
#include <string.h>

struct cds_chunk {
    struct cds_chunk *next;
    size_t used, size;
    char data[];
};

struct cds_arena {
    struct cds_chunk *head;
};

static inline void *cds_arena_alloc(struct cds_arena *arena, size_t size)
{
    size = (size + 7) & ~(size_t)7;
    struct cds_chunk *chunk = arena->head;
    if (chunk == NULL || chunk->size - chunk->used < size) {
        size_t want = size > 65536 - sizeof *chunk ? size : 65536 - sizeof *chunk;
        chunk = malloc(sizeof *chunk + want);
        if (chunk == NULL)
            return NULL;
        chunk->next = arena->head;
        chunk->used = 0;
        chunk->size = want;
        arena->head = chunk;
    }
    void *p = chunk->data + chunk->used;
    chunk->used += size;
    return p;
}

static inline char *cds_arena_strndup(struct cds_arena *arena, const char *s, size_t len)
{
    char *copy = cds_arena_alloc(arena, len + 1);
    if (copy != NULL) {
        memcpy(copy, s, len);
        copy[len] = '\0';
    }
    return copy;
}

static inline void cds_arena_free(struct cds_arena *arena)
{
    while (arena->head != NULL) {
        struct cds_chunk *next = arena->head->next;
        free(arena->head);
        arena->head = next;
    }
}

#endif
