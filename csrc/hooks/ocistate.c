/* The container's rootfs from what runc hands a hook: the OCI state on stdin names the bundle,
 * whose config.json names root.path (relative to the bundle unless absolute). See ocistate.h.
 *
 * A strict little JSON reader (RFC 8259): it walks values without building them and decodes only
 * the two strings it needs. Both documents come from the engine (runc's state, the engine's config.json),
 * not from the image, but they are bounded and malformed input is refused all the same. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ocistate.h"

#define MAX_DEPTH 512

struct cursor {
    const char *p, *end;
};

static void skip_space(struct cursor *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static int hex4(const char *p, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char ch = p[i];
        v <<= 4;
        if (ch >= '0' && ch <= '9')
            v |= (unsigned)(ch - '0');
        else if (ch >= 'a' && ch <= 'f')
            v |= (unsigned)(ch - 'a' + 10);
        else if (ch >= 'A' && ch <= 'F')
            v |= (unsigned)(ch - 'A' + 10);
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
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A string at the cursor (after its opening quote is checked here). With OUT, its decoded
 * bytes (NUL-terminated, malloc'd; a decoded NUL is refused: it cannot be a path). 0 or -1. */
static int read_string(struct cursor *c, char **out)
{
    if (c->p >= c->end || *c->p != '"')
        return -1;
    c->p++;
    char *buf = NULL;
    size_t n = 0;
    if (out) {
        buf = malloc((size_t)(c->end - c->p) + 1); /* decoding never grows the text */
        if (buf == NULL)
            return -1;
    }
    while (c->p < c->end && *c->p != '"') {
        unsigned char ch = (unsigned char)*c->p;
        if (ch < 0x20)
            goto bad;
        if (ch != '\\') {
            if (buf)
                buf[n++] = (char)ch;
            c->p++;
            continue;
        }
        if (c->end - c->p < 2)
            goto bad;
        char esc = c->p[1];
        c->p += 2;
        const char *simple = strchr("\"\\/bfnrt", esc);
        if (esc != '\0' && simple != NULL) {
            if (buf)
                buf[n++] = "\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"];
            continue;
        }
        unsigned cp;
        if (esc != 'u' || c->end - c->p < 4 || hex4(c->p, &cp) < 0)
            goto bad;
        c->p += 4;
        if (cp >= 0xD800 && cp < 0xDC00) { /* a surrogate pair, or refused */
            unsigned low;
            if (c->end - c->p < 6 || c->p[0] != '\\' || c->p[1] != 'u' || hex4(c->p + 2, &low) < 0 || low < 0xDC00
                || low >= 0xE000)
                goto bad;
            c->p += 6;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
        } else if ((cp >= 0xDC00 && cp < 0xE000) || cp == 0) {
            goto bad;
        }
        if (buf)
            n += put_utf8(buf + n, cp);
    }
    if (c->p >= c->end)
        goto bad;
    c->p++;
    if (buf) {
        buf[n] = '\0';
        *out = buf;
    }
    return 0;
bad:
    free(buf);
    return -1;
}

static int skip_value(struct cursor *c, int depth);

/* After a member or an element: 1 past a ",", 0 past CLOSE, -1 for anything else. */
static int after_item(struct cursor *c, char close)
{
    skip_space(c);
    if (c->p < c->end && (*c->p == ',' || *c->p == close))
        return *c->p++ == ',' ? 1 : 0;
    return -1;
}

/* An object at the cursor. For each member, CALLBACK(key, cursor at the value, data) either
 * consumes the value itself (returns 1), leaves it to be skipped (0), or fails (-1). */
typedef int (*member_fn)(const char *key, struct cursor *c, void *data, int depth);

static int walk_object(struct cursor *c, int depth, member_fn member, void *data)
{
    if (depth > MAX_DEPTH || c->p >= c->end || *c->p != '{')
        return -1;
    c->p++;
    skip_space(c);
    if (c->p < c->end && *c->p == '}') {
        c->p++;
        return 0;
    }
    for (;;) {
        char *key = NULL;
        skip_space(c);
        if (read_string(c, member ? &key : NULL) < 0)
            return -1;
        skip_space(c);
        if (c->p >= c->end || *c->p != ':') {
            free(key);
            return -1;
        }
        c->p++;
        skip_space(c);
        int taken = member ? member(key, c, data, depth) : 0;
        free(key);
        if (taken < 0 || (taken == 0 && skip_value(c, depth + 1) < 0))
            return -1;
        int more = after_item(c, '}');
        if (more <= 0)
            return more;
    }
}

static int skip_digits(struct cursor *c)
{
    const char *start = c->p;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9')
        c->p++;
    return c->p > start ? 0 : -1;
}

/* true, false, null, or a number as JSON writes it. */
static int skip_scalar(struct cursor *c)
{
    static const char *const words[] = {"true", "false", "null"};
    for (size_t i = 0; i < 3; i++) {
        size_t n = strlen(words[i]);
        if ((size_t)(c->end - c->p) >= n && memcmp(c->p, words[i], n) == 0) {
            c->p += n;
            return 0;
        }
    }
    if (c->p < c->end && *c->p == '-')
        c->p++;
    if (c->p < c->end && *c->p == '0')
        c->p++;
    else if (skip_digits(c) < 0)
        return -1;
    if (c->p < c->end && *c->p == '.') {
        c->p++;
        if (skip_digits(c) < 0)
            return -1;
    }
    if (c->p < c->end && (*c->p == 'e' || *c->p == 'E')) {
        c->p++;
        if (c->p < c->end && (*c->p == '+' || *c->p == '-'))
            c->p++;
        if (skip_digits(c) < 0)
            return -1;
    }
    return 0;
}

static int skip_value(struct cursor *c, int depth)
{
    skip_space(c);
    if (depth > MAX_DEPTH || c->p >= c->end)
        return -1;
    switch (*c->p) {
    case '{': return walk_object(c, depth, NULL, NULL);
    case '[':
        c->p++;
        skip_space(c);
        if (c->p < c->end && *c->p == ']') {
            c->p++;
            return 0;
        }
        for (;;) {
            if (skip_value(c, depth + 1) < 0)
                return -1;
            int more = after_item(c, ']');
            if (more <= 0)
                return more;
        }
    case '"': return read_string(c, NULL);
    default: return skip_scalar(c);
    }
}

/* What a walk looks for: the string member INNER of the object (top level), or, with KEY, of
 * the object member KEY. A repeated key: the last one counts, as in Go's encoding/json. */
struct want {
    const char *key;
    const char *inner;
    char *value;
};

static int take_string(const char *key, struct cursor *c, void *data, int depth)
{
    struct want *w = data;
    (void)depth;
    if (strcmp(key, w->inner) != 0 || c->p >= c->end || *c->p != '"')
        return 0; /* another member, or not a string (skipped: not found) */
    free(w->value);
    w->value = NULL;
    return read_string(c, &w->value) < 0 ? -1 : 1;
}

static int take_member(const char *key, struct cursor *c, void *data, int depth)
{
    struct want *w = data;
    if (strcmp(key, w->key) != 0 || c->p >= c->end || *c->p != '{')
        return 0;
    struct want inner = {.inner = w->inner, .value = NULL};
    if (walk_object(c, depth + 1, take_string, &inner) < 0) {
        free(inner.value);
        return -1;
    }
    free(w->value);
    w->value = inner.value;
    return 1;
}

/* KEY's string (or, with INNER, KEY.INNER's) of the JSON object in TEXT; NULL when absent,
 * not a string, or the document is malformed. */
static char *json_string(const char *text, size_t len, const char *key, const char *inner)
{
    struct cursor c = {text, text + len};
    struct want w = {.key = inner ? key : NULL, .inner = inner ? inner : key, .value = NULL};
    skip_space(&c);
    int rc = walk_object(&c, 0, inner ? take_member : take_string, &w);
    skip_space(&c);
    if (rc < 0 || c.p != c.end) { /* malformed, or trailing text: not one JSON document */
        free(w.value);
        return NULL;
    }
    return w.value;
}

static char *read_all(int fd, size_t max, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf != NULL) {
        if (n == cap) {
            if (cap >= max) {
                errno = EFBIG;
                break;
            }
            cap = cap * 2 > max ? max : cap * 2;
            char *grown = realloc(buf, cap);
            if (grown == NULL)
                break;
            buf = grown;
        }
        ssize_t got = read(fd, buf + n, cap - n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            break;
        if (got == 0) {
            *len = n;
            return buf;
        }
        n += (size_t)got;
    }
    free(buf);
    return NULL;
}

char *cds_rootfs_from_state(int state_fd, char *why, size_t why_len)
{
    size_t len = 0;
    char *state = read_all(state_fd, CDS_MAX_STATE, &len);
    if (state == NULL) {
        snprintf(why, why_len, "cannot read the OCI state on stdin: %s", strerror(errno));
        return NULL;
    }
    char *bundle = json_string(state, len, "bundle", NULL);
    free(state);
    if (bundle == NULL || bundle[0] != '/') {
        snprintf(why, why_len, "the OCI state on stdin names no absolute bundle");
        free(bundle);
        return NULL;
    }
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/config.json", bundle) >= sizeof path) {
        snprintf(why, why_len, "the bundle path is too long");
        free(bundle);
        return NULL;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        snprintf(why, why_len, "cannot open %s: %s", path, fd < 0 ? strerror(errno) : "not a regular file");
        if (fd >= 0)
            close(fd);
        free(bundle);
        return NULL;
    }
    char *config = read_all(fd, CDS_MAX_CONFIG, &len);
    close(fd);
    if (config == NULL) {
        snprintf(why, why_len, "cannot read %s: %s", path, strerror(errno));
        free(bundle);
        return NULL;
    }
    char *root = json_string(config, len, "root", "path");
    free(config);
    if (root == NULL || root[0] == '\0') {
        snprintf(why, why_len, "%s has no root.path", path);
        free(root);
        free(bundle);
        return NULL;
    }
    if (root[0] == '/') {
        free(bundle);
        return root;
    }
    char *joined = NULL;
    if (asprintf(&joined, "%s/%s", bundle, root) < 0)
        joined = NULL;
    free(root);
    free(bundle);
    if (joined == NULL)
        snprintf(why, why_len, "out of memory");
    return joined;
}
