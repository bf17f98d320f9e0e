/* The parts of config.json a linker step reads, and the strings the hooks read: see ociconf.h.
 * One pass over the text with a strict JSON grammar (RFC 8259); values that do not matter are
 * checked and skipped. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "json_reader.h"
#include "ociconf.h"

static void blanks(struct cds_reader *r)
{
    while (r->i < r->n && (r->s[r->i] == ' ' || r->s[r->i] == '\t' || r->s[r->i] == '\n' || r->s[r->i] == '\r'))
        r->i++;
}

/* The length of the UTF-8 sequence at P (N bytes left), or 0 when it is not a valid one. */
static size_t utf8_length(const unsigned char *p, size_t n)
{
    if (p[0] < 0x80)
        return 1;
    size_t len = p[0] >= 0xc2 && p[0] <= 0xdf ? 2
        : p[0] >= 0xe0 && p[0] <= 0xef        ? 3
        : p[0] >= 0xf0 && p[0] <= 0xf4        ? 4
                                              : 0;
    if (len == 0 || len > n)
        return 0;
    for (size_t k = 1; k < len; k++)
        if ((p[k] & 0xc0) != 0x80)
            return 0;
    if ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] > 0x9f) /* overlong, surrogates */
        || (p[0] == 0xf0 && p[1] < 0x90) || (p[0] == 0xf4 && p[1] > 0x8f))
        return 0;
    return len;
}

static int hex4(const char *p, unsigned *out)
{
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p[k];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

static size_t put_utf8(char *out, unsigned cp)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* The \u escape at r->i (past its backslash and u): its code point, a surrogate pair joined; -1
 * when malformed, a lone surrogate, or NUL (no C string can hold it: never a path or a key). */
static int unicode_escape(struct cds_reader *r, unsigned *cp)
{
    if (r->n - r->i < 4 || hex4(r->s + r->i, cp) < 0)
        return -1;
    r->i += 4;
    if (*cp >= 0xd800 && *cp < 0xdc00) {
        unsigned low;
        if (r->n - r->i < 6 || r->s[r->i] != '\\' || r->s[r->i + 1] != 'u' || hex4(r->s + r->i + 2, &low) < 0
            || low < 0xdc00 || low >= 0xe000)
            return -1;
        r->i += 6;
        *cp = 0x10000 + ((*cp - 0xd800) << 10) + (low - 0xdc00);
    } else if ((*cp >= 0xdc00 && *cp < 0xe000) || *cp == 0) {
        return -1;
    }
    return 0;
}

/* A string at r->i (its opening quote): 0 past its closing quote, *ESCAPED set when it holds
 * an escape; -1 when malformed or holding an escape we refuse (\/ unless r->decode; a \u of
 * NUL or a lone surrogate). Go's encoder (containerd) writes <, > and & as \u escapes, so a
 * pod's command or env holds them; where a string is read for its meaning (a key, a path),
 * its caller refuses any escape (*ESCAPED). With
 * OUT (room for the string's length in the text and a NUL: decoding never grows it), its
 * decoded bytes, NUL-terminated. */
static int decoded_string(struct cds_reader *r, int *escaped, char *out)
{
    size_t n = 0;
    *escaped = 0;
    if (r->i >= r->n || r->s[r->i] != '"')
        return -1;
    r->i++;
    while (r->i < r->n) {
        unsigned char c = (unsigned char)r->s[r->i];
        if (c == '"') {
            r->i++;
            if (out)
                out[n] = '\0';
            return 0;
        }
        if (c < 0x20)
            return -1;
        if (c == '\\') {
            char e = r->i + 1 < r->n ? r->s[r->i + 1] : '\0';
            const char *simple = e ? strchr("\"\\/bfnrt", e) : NULL;
            unsigned cp;
            *escaped = 1;
            r->i += 2;
            if (simple && (e != '/' || r->decode)) {
                if (out)
                    out[n++] = "\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"];
                continue;
            }
            if (e != 'u' || unicode_escape(r, &cp) < 0)
                return -1;
            if (out)
                n += put_utf8(out + n, cp);
            continue;
        }
        size_t len = utf8_length((const unsigned char *)r->s + r->i, r->n - r->i);
        if (len == 0)
            return -1;
        if (out)
            memcpy(out + n, r->s + r->i, len);
        n += len;
        r->i += len;
    }
    return -1;
}

static int string(struct cds_reader *r, int *escaped) { return decoded_string(r, escaped, NULL); }

/* The string at r->i, decoded into *OUT (malloc'd). */
static int take_decoded(struct cds_reader *r, char **out)
{
    int escaped;
    size_t start = r->i;
    if (string(r, &escaped) < 0)
        return -1;
    char *text = malloc(r->i - start + 1);
    if (!text)
        return -1;
    r->i = start;
    decoded_string(r, &escaped, text);
    *out = text;
    return 0;
}

static int digits(struct cds_reader *r)
{
    size_t from = r->i;
    while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9')
        r->i++;
    return r->i > from ? 0 : -1;
}

static int number(struct cds_reader *r)
{
    if (r->i < r->n && r->s[r->i] == '-')
        r->i++;
    if (r->i < r->n && r->s[r->i] == '0')
        r->i++;
    else if (digits(r) < 0)
        return -1;
    if (r->i < r->n && r->s[r->i] == '.') {
        r->i++;
        if (digits(r) < 0)
            return -1;
    }
    if (r->i < r->n && (r->s[r->i] == 'e' || r->s[r->i] == 'E')) {
        r->i++;
        if (r->i < r->n && (r->s[r->i] == '+' || r->s[r->i] == '-'))
            r->i++;
        if (digits(r) < 0)
            return -1;
    }
    return 0;
}

static int word(struct cds_reader *r, const char *text)
{
    size_t len = strlen(text);
    if (r->n - r->i < len || memcmp(r->s + r->i, text, len) != 0)
        return -1;
    r->i += len;
    return 0;
}

static int value(struct cds_reader *r);

/* The members of the object at r->i: for each, ON_MEMBER(key without quotes) is called with
 * r->i at the value, and must leave r->i past it. A key with an escape is refused (it could
 * spell a name that matters). */
typedef cds_member_fn member_fn;
/* The elements of the array at r->i: ON_ELEMENT is called with r->i at each. */
typedef cds_element_fn element_fn;

/* The items of the object or array at r->i, with the separators between them. */
static int items(struct cds_reader *r, member_fn on_member, element_fn on_element, void *data)
{
    char close = on_member ? '}' : ']';
    int escaped;
    blanks(r);
    if (r->i >= r->n || r->s[r->i] != (on_member ? '{' : '[') || ++r->depth > CDS_OCI_MAX_DEPTH)
        return -1;
    r->i++;
    blanks(r);
    if (r->i < r->n && r->s[r->i] == close) {
        r->i++;
        r->depth--;
        return 0;
    }
    for (;;) {
        if (on_member) {
            size_t key = r->i;
            char *decoded = NULL; /* an escaped key, when the reader decodes */
            if (string(r, &escaped) < 0 || (escaped && !r->decode))
                return -1;
            if (escaped && (r->i = key, take_decoded(r, &decoded) < 0))
                return -1;
            size_t key_end = r->i;
            blanks(r);
            int failed = r->i >= r->n || r->s[r->i] != ':';
            if (!failed) {
                r->i++;
                blanks(r);
                failed = decoded ? on_member(r, decoded, strlen(decoded), data) < 0
                                 : on_member(r, r->s + key + 1, key_end - key - 2, data) < 0;
            }
            free(decoded);
            if (failed)
                return -1;
        } else if (on_element(r, data) < 0) {
            return -1;
        }
        blanks(r);
        if (r->i < r->n && r->s[r->i] == ',') {
            r->i++;
            blanks(r);
            continue;
        }
        if (r->i < r->n && r->s[r->i] == close) {
            r->i++;
            r->depth--;
            return 0;
        }
        return -1;
    }
}

static int members(struct cds_reader *r, member_fn on_member, void *data) { return items(r, on_member, NULL, data); }

static int skip_member(struct cds_reader *r, const char *key, size_t key_len, void *data)
{
    (void)key, (void)key_len, (void)data;
    return value(r);
}

static int skip_element(struct cds_reader *r, void *data)
{
    (void)data;
    return value(r);
}

/* Any value at r->i (blanks before it skipped), checked and skipped. */
static int value(struct cds_reader *r)
{
    int escaped;
    blanks(r);
    if (r->i >= r->n)
        return -1;
    switch (r->s[r->i]) {
    case '{': return members(r, skip_member, NULL);
    case '[': return items(r, NULL, skip_element, NULL);
    case '"': return string(r, &escaped);
    case 't': return word(r, "true");
    case 'f': return word(r, "false");
    case 'n': return word(r, "null");
    default: return number(r);
    }
}

static int is(const char *key, size_t len, const char *name)
{
    return len == strlen(name) && memcmp(key, name, len) == 0;
}

/* The value at r->i into *SPAN; -1 when SPAN is taken already (a key given twice). */
static int take(struct cds_reader *r, struct cds_span *span)
{
    if (span->end != 0)
        return -1;
    size_t start = r->i;
    if (value(r) < 0)
        return -1;
    span->start = start;
    span->end = r->i;
    return 0;
}

/* A string without escapes into *SPAN (a key given twice, another value, an escape: -1). */
static int take_plain_string(struct cds_reader *r, struct cds_span *span)
{
    int escaped;
    if (span->end != 0 || r->i >= r->n || r->s[r->i] != '"')
        return -1;
    size_t start = r->i;
    if (string(r, &escaped) < 0 || escaped)
        return -1;
    span->start = start;
    span->end = r->i;
    return 0;
}

static int root_member(struct cds_reader *r, const char *key, size_t len, void *data)
{
    struct cds_oci_view *view = data;
    if (is(key, len, "path"))
        return take_plain_string(r, &view->root_path);
    if (is(key, len, "readonly"))
        return take(r, &view->root_readonly);
    return value(r);
}

static int linux_member(struct cds_reader *r, const char *key, size_t len, void *data)
{
    struct cds_oci_view *view = data;
    if (is(key, len, "devices"))
        return take(r, &view->devices);
    if (is(key, len, "namespaces"))
        return take(r, &view->namespaces);
    if (is(key, len, "uidMappings"))
        return take(r, &view->uid_mappings);
    if (is(key, len, "gidMappings"))
        return take(r, &view->gid_mappings);
    return value(r);
}

static int mount_member(struct cds_reader *r, const char *key, size_t len, void *data)
{
    struct cds_oci_mount *mount = data;
    if (is(key, len, "destination"))
        return take_plain_string(r, &mount->destination);
    if (is(key, len, "source"))
        return take_plain_string(r, &mount->source);
    return value(r);
}

struct mounts_so_far {
    struct cds_oci_view *view;
    size_t cap;
};

/* A mount (an object: anything else is refused), its span, destination and source. */
static int mount_element(struct cds_reader *r, void *data)
{
    struct mounts_so_far *so_far = data;
    struct cds_oci_view *view = so_far->view;
    if (view->n_mounts == so_far->cap) {
        size_t cap = so_far->cap ? so_far->cap * 2 : 32;
        struct cds_oci_mount *more = realloc(view->mount, cap * sizeof *more);
        if (!more)
            return -1;
        view->mount = more;
        so_far->cap = cap;
    }
    struct cds_oci_mount *mount = &view->mount[view->n_mounts++];
    memset(mount, 0, sizeof *mount);
    mount->whole.start = r->i;
    if (members(r, mount_member, mount) < 0)
        return -1;
    mount->whole.end = r->i;
    return 0;
}

/* The mounts array at r->i (once), each element's span, destination and source. */
static int mounts(struct cds_reader *r, struct cds_oci_view *view)
{
    struct mounts_so_far so_far = {.view = view};
    size_t start = r->i;
    if (view->mounts.end != 0 || items(r, NULL, mount_element, &so_far) < 0)
        return -1;
    view->mounts.start = start;
    view->mounts.end = r->i;
    return 0;
}

/* "hooks", "mounts", "root" and "linux" must each come once at most: a second would be the
 * one Python's reader keeps. */
struct seen {
    struct cds_oci_view *view;
    int root, linux_section;
};

static int top_member(struct cds_reader *r, const char *key, size_t len, void *data)
{
    struct seen *seen = data;
    if (is(key, len, "hooks")) {
        if (r->i >= r->n || r->s[r->i] != '{')
            return -1;
        return take(r, &seen->view->hooks);
    }
    if (is(key, len, "mounts"))
        return mounts(r, seen->view);
    if (is(key, len, "root")) {
        if (seen->root++)
            return -1;
        return members(r, root_member, seen->view);
    }
    if (is(key, len, "linux")) {
        if (seen->linux_section++)
            return -1;
        return members(r, linux_member, seen->view);
    }
    return value(r);
}

int cds_oci_view(const char *json, size_t len, struct cds_oci_view *view)
{
    struct cds_reader r = {.s = json, .n = len};
    struct seen seen = {.view = view};
    memset(view, 0, sizeof *view);
    if (members(&r, top_member, &seen) == 0) {
        blanks(&r);
        if (r.i == r.n)
            return 0;
    }
    int saved = errno == ENOMEM ? ENOMEM : EINVAL;
    cds_oci_view_free(view);
    errno = saved;
    return -1;
}

void cds_oci_view_free(struct cds_oci_view *view)
{
    free(view->mount);
    view->mount = NULL;
    view->n_mounts = 0;
}

/* What cds_json_string looks for: the string member INNER (of the object KEY's value, with KEY). */
struct wanted {
    const char *key, *inner;
    char *value;
};

static int wanted_inner(struct cds_reader *r, const char *key, size_t len, void *data)
{
    struct wanted *w = data;
    char *text;
    if (!is(key, len, w->inner) || r->i >= r->n || r->s[r->i] != '"')
        return value(r); /* another member, or not a string (not found, unless given again) */
    if (take_decoded(r, &text) < 0)
        return -1;
    free(w->value);
    w->value = text;
    return 0;
}

static int wanted_outer(struct cds_reader *r, const char *key, size_t len, void *data)
{
    struct wanted *w = data;
    if (!is(key, len, w->key) || r->i >= r->n || r->s[r->i] != '{')
        return value(r);
    struct wanted inner = {.inner = w->inner};
    if (members(r, wanted_inner, &inner) < 0) {
        free(inner.value);
        return -1;
    }
    free(w->value);
    w->value = inner.value;
    return 0;
}

int cds_json_string(const char *json, size_t len, const char *key, const char *inner, char **out)
{
    struct cds_reader r = {.s = json, .n = len, .decode = 1};
    struct wanted w = {.key = inner ? key : NULL, .inner = inner ? inner : key};
    *out = NULL;
    blanks(&r);
    if (members(&r, inner ? wanted_outer : wanted_inner, &w) == 0) {
        blanks(&r);
        if (r.i == r.n) {
            *out = w.value;
            return 0;
        }
    }
    int saved = errno == ENOMEM ? ENOMEM : EINVAL;
    free(w.value);
    errno = saved;
    return -1;
}

/* shim/linker/container.py's _is_library: a basename libNAME with .so at its end or .so. in it. */
static int library_named(const char *s, size_t len)
{
    const char *slash = memrchr(s, '/', len);
    const char *name = slash ? slash + 1 : s;
    size_t n = len - (size_t)(name - s);
    if (n < 3 || memcmp(name, "lib", 3) != 0)
        return 0;
    if (n >= 3 && memcmp(name + n - 3, ".so", 3) == 0)
        return 1;
    return memmem(name, n, ".so.", 4) != NULL;
}

static void put(uint8_t *out, size_t *at, const void *data, size_t len)
{
    memcpy(out + *at, data, len);
    *at += len;
}

/* Whether the string (with its quotes) at S names a bundle file of the step's ("cdi-shim.*"). */
static int ours_named(const char *s, size_t len)
{
    const char *slash = memrchr(s, '/', len);
    size_t n = slash ? len - (size_t)(slash + 1 - s) : 0;
    return n > strlen("cdi-shim.") + 1 && memcmp(slash + 1, "cdi-shim.", strlen("cdi-shim.")) == 0;
}

static void put_span(uint8_t *out, size_t *at, const char *json, const struct cds_span *span, char tag)
{
    put(out, at, &tag, 1);
    put(out, at, json + span->start, span->end - span->start);
    put(out, at, "", 1);
}

/* One namespace of the step key: its type, and its path for a user or mount namespace only (the
 * file binds' rule reads those; a pod's network, IPC and UTS paths differ pod to pod and the step
 * reads none of them). */
struct namespace_key {
    struct cds_span type, path;
};

static int namespace_member(struct cds_reader *r, const char *key, size_t len, void *data)
{
    struct namespace_key *ns = data;
    if (is(key, len, "type"))
        return take_plain_string(r, &ns->type);
    if (is(key, len, "path"))
        return take_plain_string(r, &ns->path);
    return value(r);
}

struct namespaces_out {
    uint8_t *out;
    size_t *at;
};

static int namespace_element(struct cds_reader *r, void *data)
{
    struct namespaces_out *to = data;
    struct namespace_key ns = {{0, 0}, {0, 0}};
    if (members(r, namespace_member, &ns) < 0)
        return -1;
    const char *type = r->s + ns.type.start;
    size_t type_len = ns.type.end - ns.type.start;
    put(to->out, to->at, type, type_len);
    if ((type_len == 6 && memcmp(type, "\"user\"", 6) == 0) || (type_len == 7 && memcmp(type, "\"mount\"", 7) == 0))
        put(to->out, to->at, r->s + ns.path.start, ns.path.end - ns.path.start);
    put(to->out, to->at, ";", 1);
    return 0;
}

/* 'N', the key of each namespace (namespace_element), a NUL; -1 when the array is not one the
 * key can stand for. Each element writes less than its own text. */
static int put_namespaces(uint8_t *out, size_t *at, const char *json, const struct cds_span *span)
{
    put(out, at, "N", 1);
    if (span->end) {
        struct cds_reader r = {.s = json, .n = span->end, .i = span->start};
        struct namespaces_out to = {out, at};
        if (items(&r, NULL, namespace_element, &to) < 0)
            return -1;
    }
    put(out, at, "", 1);
    return 0;
}

int cds_step_key(const char *json, size_t len, uint8_t **key, size_t *key_len)
{
    struct cds_oci_view view;
    if (cds_oci_view(json, len, &view) < 0)
        return -1;
    /* Each part and a NUL: never longer than the text plus three bytes a mount and the tags. */
    size_t cap = len + 3 * view.n_mounts + 32, at = 0;
    uint8_t *out = malloc(cap);
    if (!out) {
        cds_oci_view_free(&view);
        errno = ENOMEM;
        return -1;
    }
    put_span(out, &at, json, &view.hooks, 'H');
    for (size_t m = 0; m < view.n_mounts; m++) {
        const struct cds_oci_mount *mount = &view.mount[m];
        const struct cds_span *d = &mount->destination, *s = &mount->source, *w = &mount->whole;
        put(out, &at, "M", 1);
        /* (between the quotes: the name itself) */
        if (s->end && !(d->end && library_named(json + d->start + 1, d->end - d->start - 2))) {
            put(out, &at, json + w->start, s->start - w->start);
            put(out, &at, ours_named(json + s->start, s->end - s->start) ? "1" : "0", 1);
            put(out, &at, json + s->end, w->end - s->end);
        } else {
            put(out, &at, json + w->start, w->end - w->start);
        }
        put(out, &at, "", 1);
    }
    put_span(out, &at, json, &view.root_readonly, 'R');
    put_span(out, &at, json, &view.devices, 'D');
    int failed = put_namespaces(out, &at, json, &view.namespaces);
    put_span(out, &at, json, &view.uid_mappings, 'U');
    put_span(out, &at, json, &view.gid_mappings, 'G');
    cds_oci_view_free(&view);
    if (failed) {
        free(out);
        errno = EINVAL;
        return -1;
    }
    *key = out;
    *key_len = at;
    return 0;
}

int cds_json_members(struct cds_reader *r, member_fn on_member, void *data) { return members(r, on_member, data); }
int cds_json_elements(struct cds_reader *r, element_fn on_element, void *data)
{
    return items(r, NULL, on_element, data);
}
int cds_json_value(struct cds_reader *r) { return value(r); }
int cds_json_take(struct cds_reader *r, struct cds_span *span) { return take(r, span); }
void cds_json_blanks(struct cds_reader *r) { blanks(r); }

uint64_t cds_fnv1a(const uint8_t *data, size_t len)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ data[i]) * 0x100000001b3ull;
    return h;
}

void cds_step_key_free(uint8_t *key) { free(key); }
