/* A growing byte buffer (not part of the cffi surface): the recipes' and the request edits'
 * writers build their bytes in one. failed: out of memory, and every later put is dropped; one
 * byte past len is always there (room for a NUL). */
#ifndef CDI_SHIM_BYTEBUF_H
#define CDI_SHIM_BYTEBUF_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct buffer {
    uint8_t *data;
    size_t len, cap;
    int failed;
};

static inline void put(struct buffer *b, const void *data, size_t len)
{
    if (b->failed || len == 0)
        return;
    if (b->len + len + 1 > b->cap) {
        size_t cap = (b->len + len + 1) * 2;
        uint8_t *more = realloc(b->data, cap);
        if (!more) {
            b->failed = 1;
            return;
        }
        b->data = more;
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, len);
    b->len += len;
}

#endif
