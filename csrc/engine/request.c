/* A device request's injection, replayed: the key of what request resolution reads of a
 * config.json, and the edits a worker recorded for that key, applied to another config's text.
 *
 * The worker (shim/runtime/main.py) resolves a request and applies the spec's edits in Python.
 * The edits touch five places of the config: process.env, mounts, linux.devices,
 * linux.resources.devices and hooks. It records each changed place as a list whose items are
 * either an element of the input (by index) or a new element's JSON text, or, for hooks, as the
 * new value's text; checks that this file's apply gives exactly its own result; and keeps the
 * record under the key of the input config (cds_request_key). Another config with that key gets
 * the same places, each element taken from its own text, every other byte left as it was.
 *
 * The key holds all the injection depends on: the settings file's hash (the prefixes, the device
 * env var and every rule of the resolution), the runtime's own --device options, the fields of
 * the config listed in key_fields below, and which of the objects the places live in are there.
 * What the host and the specs add (their files' identities, the driver version) is the recipe's
 * to check (replay.c). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bytebuf.h"
#include "json_reader.h"
#include "memo_rules.h"
#include "ociconf.h"
#include "request.h"

#define MAX_PLACE_ELEMENTS 65536

/* The fields of config.json the key covers, one a line: a path ("[]": each element of an array,
 * "*": each member of an object), then how the key holds it. The one list of them: a test runs
 * the request's resolution and apply_edits on a config that records what they read, and fails
 * on a field not listed here, or on a field listed whose change leaves the key as it was
 * (tests/runtime/test_request_key.py). */
static const char key_fields[] =
    "annotations.* whole, of a name with a requesting prefix\n"
    "process.env[] the name (an edit replaces an entry by name); the device env vars' entries whole\n"
    "process.capabilities.bounding whole (an unprivileged env request)\n"
    "process.user whole (a device node's owner: apply_edits gives it the user's uid and gid)\n"
    "hooks whole\n"
    "mounts[].destination whole (edits replace by destination, then sort by depth)\n"
    "mounts[].source whole under the device-plugin folder (a request), else whether there is one "
    "(the step's library mounts)\n"
    "linux.devices whole\n"
    "linux.resources.devices whole\n"
    "linux.namespaces[].type whole (a user namespace: bind mounts get idmap)\n";

const char *cds_request_key_fields(void) { return key_fields; }

struct elements {
    struct cds_span *at;
    size_t n, cap;
};

/* The places of a config an injection reads or writes: each object's opening brace (0:
 * absent), each place's value and its elements. */
struct request_view {
    size_t root, process, linux_section, resources;
    struct cds_span annotations, bounding, hooks, user;
    struct cds_span env, mounts, devices, rules;
    struct elements env_at, mounts_at, devices_at, rules_at;
    int seen_process, seen_linux, seen_resources, seen_caps;
};

static int is(const char *key, size_t len, const char *name)
{
    return len == strlen(name) && memcmp(key, name, len) == 0;
}

static int element(struct cds_reader *r, void *data)
{
    struct elements *list = data;
    if (list->n == list->cap) {
        size_t cap = list->cap ? list->cap * 2 : 16;
        struct cds_span *more = cap > MAX_PLACE_ELEMENTS ? NULL : realloc(list->at, cap * sizeof *more);
        if (!more)
            return -1;
        list->at = more;
        list->cap = cap;
    }
    struct cds_span *span = &list->at[list->n++];
    span->start = span->end = 0;
    cds_json_blanks(r);
    return cds_json_take(r, span);
}

/* An array place at r->i: its span and its elements' (once). */
static int array_place(struct cds_reader *r, struct cds_span *span, struct elements *list)
{
    if (span->end != 0 || r->i >= r->n || r->s[r->i] != '[')
        return -1;
    span->start = r->i;
    if (cds_json_elements(r, element, list) < 0)
        return -1;
    span->end = r->i;
    return 0;
}

/* An object at r->i whose opening brace goes to *OPEN (once), its members to ON_MEMBER. */
static int object_place(struct cds_reader *r, int *seen, size_t *open, cds_member_fn on_member, void *data)
{
    if ((*seen)++ || r->i >= r->n || r->s[r->i] != '{')
        return -1;
    *open = r->i;
    return cds_json_members(r, on_member, data);
}

static int caps_member(struct cds_reader *r, const char *key, size_t len, void *data)
{
    struct request_view *v = data;
    return is(key, len, "bounding") ? cds_json_take(r, &v->bounding) : cds_json_value(r);
}

static int process_member(struct cds_reader *r, const char *key, size_t len, void *data)
{
    struct request_view *v = data;
    if (is(key, len, "env"))
        return array_place(r, &v->env, &v->env_at);
    if (is(key, len, "user"))
        return cds_json_take(r, &v->user);
    if (is(key, len, "capabilities")) {
        size_t open;
        return object_place(r, &v->seen_caps, &open, caps_member, v);
    }
    return cds_json_value(r);
}

static int resources_member(struct cds_reader *r, const char *key, size_t len, void *data)
{
    struct request_view *v = data;
    return is(key, len, "devices") ? array_place(r, &v->rules, &v->rules_at) : cds_json_value(r);
}

static int linux_member(struct cds_reader *r, const char *key, size_t len, void *data)
{
    struct request_view *v = data;
    if (is(key, len, "devices"))
        return array_place(r, &v->devices, &v->devices_at);
    if (is(key, len, "resources"))
        return object_place(r, &v->seen_resources, &v->resources, resources_member, v);
    return cds_json_value(r);
}

static int top_member(struct cds_reader *r, const char *key, size_t len, void *data)
{
    struct request_view *v = data;
    if (is(key, len, "annotations")) {
        if (r->i >= r->n || r->s[r->i] != '{')
            return -1;
        return cds_json_take(r, &v->annotations);
    }
    if (is(key, len, "hooks")) {
        if (r->i >= r->n || r->s[r->i] != '{')
            return -1;
        return cds_json_take(r, &v->hooks);
    }
    if (is(key, len, "mounts"))
        return array_place(r, &v->mounts, &v->mounts_at);
    if (is(key, len, "process"))
        return object_place(r, &v->seen_process, &v->process, process_member, v);
    if (is(key, len, "linux"))
        return object_place(r, &v->seen_linux, &v->linux_section, linux_member, v);
    return cds_json_value(r);
}

static void view_free(struct request_view *v)
{
    free(v->env_at.at);
    free(v->mounts_at.at);
    free(v->devices_at.at);
    free(v->rules_at.at);
}

static int read_view(const char *json, size_t len, struct request_view *v)
{
    struct cds_reader r = {.s = json, .n = len};
    memset(v, 0, sizeof *v);
    cds_json_blanks(&r);
    v->root = r.i;
    if (r.i < len && json[r.i] == '{' && cds_json_members(&r, top_member, v) == 0) {
        cds_json_blanks(&r);
        if (r.i == r.n)
            return 0;
    }
    view_free(v);
    errno = EINVAL;
    return -1;
}

static void put_text(struct buffer *b, const char *text) { put(b, text, strlen(text)); }

/* B's bytes into *OUT and *LEN (0), or -1 with B freed (FAILED: EINVAL; out of memory: ENOMEM). */
static int hand_over(struct buffer *b, int failed, uint8_t **out, size_t *len)
{
    if (failed || b->failed) {
        free(b->data);
        errno = b->failed ? ENOMEM : EINVAL;
        return -1;
    }
    *out = b->data;
    *len = b->len;
    return 0;
}

static void put_span(struct buffer *b, char tag, const char *json, struct cds_span span)
{
    put(b, &tag, 1);
    put(b, json + span.start, span.end - span.start);
    put(b, "", 1);
}

/* A string element's name: from after its quote to its '=' (or its end). */
static size_t env_name_length(const char *json, struct cds_span s)
{
    const char *start = json + s.start + 1, *eq = memchr(start, '=', s.end - s.start - 1);
    return eq ? (size_t)(eq - start) : s.end - s.start - 2;
}

/* The members of the annotations object that ask for devices (a key with one of PREFIXES). */
struct annotation_key {
    struct buffer *out;
    const char *prefixes;
    size_t prefixes_len;
};

static int annotation_member(struct cds_reader *r, const char *key, size_t len, void *data)
{
    struct annotation_key *a = data;
    size_t start = r->i;
    if (cds_json_value(r) < 0)
        return -1;
    for (const char *p = a->prefixes; p < a->prefixes + a->prefixes_len; p += strlen(p) + 1) {
        size_t n = strlen(p);
        if (n && len >= n && memcmp(key, p, n) == 0) {
            put(a->out, "a", 1);
            put(a->out, key, len);
            put(a->out, "", 1);
            put(a->out, r->s + start, r->i - start);
            put(a->out, "", 1);
            break;
        }
    }
    return 0;
}

/* Each namespace's type (not its path: a pod's network, IPC and UTS paths differ per pod). */
static int namespace_member(struct cds_reader *r, const char *key, size_t len, void *data)
{
    struct buffer *b = data;
    if (!is(key, len, "type"))
        return cds_json_value(r);
    size_t start = r->i;
    if (cds_json_value(r) < 0)
        return -1;
    put(b, r->s + start, r->i - start);
    return 0;
}

static int namespace_element(struct cds_reader *r, void *data)
{
    struct buffer *b = data;
    cds_json_blanks(r);
    if (r->i >= r->n || r->s[r->i] != '{' || cds_json_members(r, namespace_member, b) < 0)
        return -1;
    put(b, ";", 1);
    return 0;
}

int cds_request_key(const char *json, size_t len, const char *prefixes, size_t prefixes_len, const char *device_env,
                    const char *devices, size_t devices_len, const uint8_t *settings, size_t settings_len,
                    uint8_t **key, size_t *key_len)
{
    struct request_view v;
    struct cds_oci_view oci;
    if (read_view(json, len, &v) < 0)
        return -1;
    if (cds_oci_view(json, len, &oci) < 0) {
        view_free(&v);
        return -1;
    }
    struct buffer b = {0};
    uint64_t hash = cds_fnv1a(settings, settings_len);
    int failed = 0;
    put(&b, "S", 1);
    put(&b, &hash, sizeof hash);
    put(&b, "V", 1); /* the runtime's own --device options, NUL-terminated each */
    put(&b, devices, devices_len);
    put(&b, "", 1);
    if (v.annotations.end) {
        struct cds_reader r = {.s = json, .n = v.annotations.end, .i = v.annotations.start};
        struct annotation_key a = {&b, prefixes, prefixes_len};
        failed |= cds_json_members(&r, annotation_member, &a) < 0;
    }
    put(&b, "E", 1);
    for (size_t i = 0; i < v.env_at.n; i++) {
        struct cds_span s = v.env_at.at[i];
        if (json[s.start] != '"') {
            failed = 1;
            break;
        }
        size_t name = env_name_length(json, s);
        if (memchr(json + s.start + 1, '\\', name)) { /* an escaped name: which variable is it? */
            failed = 1;
            break;
        }
        int whole = (name == strlen(device_env) && memcmp(json + s.start + 1, device_env, name) == 0)
            || (name == strlen(CDS_LEGACY_HOOK_ENV) && memcmp(json + s.start + 1, CDS_LEGACY_HOOK_ENV, name) == 0);
        put(&b, json + s.start, whole ? s.end - s.start : name + 1);
        put(&b, "", 1);
    }
    put_span(&b, 'B', json, v.bounding);
    put_span(&b, 'H', json, v.hooks);
    for (size_t m = 0; m < oci.n_mounts; m++) {
        struct cds_oci_mount *mount = &oci.mount[m];
        if (!mount->destination.end) {
            failed = 1;
            break;
        }
        put_span(&b, 'M', json, mount->destination);
        const char *d = json + mount->destination.start + 1;
        size_t d_len = mount->destination.end - mount->destination.start - 2;
        if (d_len >= strlen(CDS_DEVICE_MOUNT_ROOT) - 1
            && memcmp(d, CDS_DEVICE_MOUNT_ROOT, strlen(CDS_DEVICE_MOUNT_ROOT) - 1) == 0)
            put_span(&b, 's', json, mount->source);
        else /* (whether the step has a library mount here: needs_step) */
            put(&b, mount->source.end ? "+" : "-", 1);
    }
    put_span(&b, 'D', json, v.devices);
    put_span(&b, 'R', json, v.rules);
    put_span(&b, 'U', json, v.user);
    put(&b, "N", 1);
    if (oci.namespaces.end) {
        struct cds_reader r = {.s = json, .n = oci.namespaces.end, .i = oci.namespaces.start};
        failed |= cds_json_elements(&r, namespace_element, &b) < 0;
    }
    put(&b, "", 1);
    char objects[4] = {v.process ? 'p' : '-', v.linux_section ? 'l' : '-', v.resources ? 'r' : '-',
                       v.mounts.end ? 'm' : '-'};
    put(&b, objects, sizeof objects);
    cds_oci_view_free(&oci);
    view_free(&v);
    return hand_over(&b, failed, key, key_len);
}

/* The recorded edits: per place, a target byte ('E' env, 'M' mounts, 'D' linux.devices, 'R'
 * linux.resources.devices, 'H' hooks) and a form: 'V' and a u32-sized text (the new value),
 * or 'L', a u32 count and that many items, each 'I' and a u32 index of an input element or
 * 'T' and a u32-sized text (a new element). */
static int u32_at(const uint8_t **at, const uint8_t *end, uint32_t *out)
{
    if ((size_t)(end - *at) < 4)
        return -1;
    memcpy(out, *at, 4);
    *at += 4;
    return 0;
}

struct place {
    char target;
    size_t at, end;          /* the span replaced; at == end: inserted at `at` */
    const char *name, *wrap; /* inserted: the member's name; wrap: inside "resources":{...} */
    int comma;               /* inserted into an object with members: a comma after it */
    struct buffer value;
};

static void free_places(struct place *places, int n)
{
    for (int i = 0; i < n; i++)
        free(places[i].value.data);
}

/* The new value of one place from its record at *AT, into P->value. */
static int place_value(const char *json, const struct elements *list, const uint8_t **at, const uint8_t *end,
                       struct place *p)
{
    uint32_t count, n;
    if (*at >= end)
        return -1;
    char form = (char)*(*at)++;
    if (form == 'V') {
        if (u32_at(at, end, &n) < 0 || (size_t)(end - *at) < n)
            return -1;
        put(&p->value, *at, n);
        *at += n;
        return p->value.failed ? -1 : 0;
    }
    if (form != 'L' || !list || u32_at(at, end, &count) < 0)
        return -1;
    put_text(&p->value, "[");
    for (uint32_t i = 0; i < count; i++) {
        if (i)
            put_text(&p->value, ",");
        if (*at >= end)
            return -1;
        char kind = (char)*(*at)++;
        if (u32_at(at, end, &n) < 0)
            return -1;
        if (kind == 'I') {
            if (n >= list->n)
                return -1;
            put(&p->value, json + list->at[n].start, list->at[n].end - list->at[n].start);
        } else if (kind == 'T' && (size_t)(end - *at) >= n) {
            put(&p->value, *at, n);
            *at += n;
        } else {
            return -1;
        }
    }
    put_text(&p->value, "]");
    return p->value.failed ? -1 : 0;
}

/* Where a place goes: its value's span, or an insertion at the start of its object. */
static int locate(const char *json, const struct request_view *v, struct place *p)
{
    struct cds_span span = {0, 0};
    size_t object = 0; /* the brace of the object it goes in (the root's may be at 0) */
    int there = 1;
    switch (p->target) {
    case 'E': span = v->env, object = v->process, there = v->process != 0, p->name = "env"; break;
    case 'M': span = v->mounts, object = v->root, p->name = "mounts"; break;
    case 'H': span = v->hooks, object = v->root, p->name = "hooks"; break;
    case 'D': span = v->devices, object = v->linux_section, there = v->linux_section != 0, p->name = "devices"; break;
    case 'R':
        span = v->rules, p->name = "devices";
        object = v->resources ? v->resources : v->linux_section;
        there = object != 0;
        p->wrap = v->resources ? NULL : "resources";
        break;
    default: return -1;
    }
    if (span.end) {
        p->at = span.start, p->end = span.end;
        return 0;
    }
    if (!there)
        return -1;
    p->at = p->end = object + 1;
    size_t i = object + 1;
    while (json[i] == ' ' || json[i] == '\t' || json[i] == '\n' || json[i] == '\r')
        i++;
    p->comma = json[i] != '}';
    return 0;
}

static int by_position(const void *a, const void *b)
{
    const struct place *x = a, *y = b;
    return x->at < y->at ? -1 : x->at > y->at;
}

int cds_request_apply(const char *json, size_t len, const uint8_t *edits, size_t edits_len, char **out, size_t *out_len)
{
    struct request_view v;
    struct place places[5];
    int n = 0, failed = 0;
    if (read_view(json, len, &v) < 0)
        return -1;
    const uint8_t *at = edits, *end = edits + edits_len;
    while (at < end && !failed) {
        if (n == 5) {
            failed = 1;
            break;
        }
        struct place *p = &places[n];
        memset(p, 0, sizeof *p);
        p->target = (char)*at++;
        for (int i = 0; i < n; i++)
            failed |= places[i].target == p->target;
        const struct elements *list = p->target == 'E' ? &v.env_at
            : p->target == 'M'                         ? &v.mounts_at
            : p->target == 'D'                         ? &v.devices_at
            : p->target == 'R'                         ? &v.rules_at
                                                       : NULL;
        n += !failed;
        failed = failed || place_value(json, list, &at, end, p) < 0 || locate(json, &v, p) < 0;
    }
    struct buffer b = {0};
    if (!failed) {
        /* (two insertions into one object: linux gets its devices and its resources) */
        qsort(places, (size_t)n, sizeof *places, by_position);
        size_t from = 0;
        for (int i = 0; i < n; i++) {
            struct place *p = &places[i];
            put(&b, json + from, p->at - from);
            if (p->at == p->end) {
                int more = i + 1 < n && places[i + 1].at == p->at;
                put_text(&b, "\"");
                put_text(&b, p->wrap ? p->wrap : p->name);
                put_text(&b, p->wrap ? "\":{\"devices\":" : "\":");
                put(&b, p->value.data, p->value.len);
                put_text(&b, p->wrap ? "}" : "");
                put_text(&b, more || p->comma ? "," : "");
            } else {
                put(&b, p->value.data, p->value.len);
            }
            from = p->end;
        }
        put(&b, json + from, len - from);
        put(&b, "", 1);
    }
    free_places(places, n);
    view_free(&v);
    if (hand_over(&b, failed, (uint8_t **)out, out_len) < 0)
        return -1;
    *out_len -= 1; /* (the NUL after the text) */
    return 0;
}

static void put_u32(struct buffer *b, size_t value)
{
    uint32_t v = (uint32_t)value;
    b->failed |= value > UINT32_MAX;
    put(b, &v, 4);
}

/* The record cds_request_apply reads, written from the places the injection changed. */
int cds_request_edits(const struct cds_request_place *places, size_t n, uint8_t **out, size_t *out_len)
{
    struct buffer b = {0};
    put(&b, "", 0);
    for (size_t i = 0; i < n; i++) {
        const struct cds_request_place *p = &places[i];
        put(&b, &p->target, 1);
        put_text(&b, p->value ? "V" : "L");
        put_u32(&b, p->value ? p->len : p->n_items);
        put(&b, p->value, p->value ? p->len : 0);
        for (size_t j = 0; !p->value && j < p->n_items; j++) {
            const struct cds_request_item *item = &p->items[j];
            put_text(&b, item->text ? "T" : "I");
            put_u32(&b, item->text ? item->len : (size_t)item->index);
            put(&b, item->text, item->text ? item->len : 0);
        }
    }
    return hand_over(&b, 0, out, out_len);
}

void cds_request_free(void *data) { free(data); }
