/* ociconf.c's strict JSON reader, for the other readers of config.json in the engine (request.c).
 * Internal: not part of the cffi surface. */
#ifndef CDI_SHIM_JSON_READER_H
#define CDI_SHIM_JSON_READER_H

#include <stddef.h>

#include "ociconf.h"

struct cds_reader {
    const char *s;
    size_t n, i;
    int depth;
    int decode; /* the hooks' reading: \/ accepted, escapes decoded, escaped keys too */
};

/* ON_MEMBER(key without quotes) is called with r->i at the value and must leave r->i past it. */
typedef int (*cds_member_fn)(struct cds_reader *r, const char *key, size_t key_len, void *data);
/* ON_ELEMENT is called with r->i at each element of an array. */
typedef int (*cds_element_fn)(struct cds_reader *r, void *data);

/* The object (members) or array (elements) at r->i; any value at r->i, checked and skipped;
 * the value at r->i into *SPAN (-1 when SPAN is taken already: a key given twice). Each: 0 or
 * -1 (malformed, or refused as ociconf.h says). */
int cds_json_members(struct cds_reader *r, cds_member_fn on_member, void *data);
int cds_json_elements(struct cds_reader *r, cds_element_fn on_element, void *data);
int cds_json_value(struct cds_reader *r);
int cds_json_take(struct cds_reader *r, struct cds_span *span);
void cds_json_blanks(struct cds_reader *r);

#endif
