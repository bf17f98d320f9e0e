/* The front end's reading of cdi-shim's config file: the keys it needs (config_keys.h, made from
 * shim/config.py's table); anything it does not understand leaves the decision to Python. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config_keys.h"
#include "frontend.h"
#include "../engine/cleanup.h"

/* Read a whole regular file, refusing links, FIFOs and anything over `limit`; its mode into
 * *MODE when MODE is given. Returns the length, or -1 with errno set (EFBIG when too large). */
long read_file_mode(const char *path, size_t limit, char **out, mode_t *mode)
{
    cleanup_fd int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0)
        return -1;
    if (mode)
        *mode = st.st_mode;
    if (!S_ISREG(st.st_mode)) {
        errno = EINVAL;
        return -1;
    }
    if ((size_t)st.st_size > limit) {
        errno = EFBIG;
        return -1;
    }
    cleanup_free char *buf = malloc((size_t)st.st_size + 1);
    if (!buf)
        return -1;
    size_t len = 0;
    for (;;) {
        if (len == (size_t)st.st_size + 1) { /* grew while reading: let Python judge */
            errno = EFBIG;
            return -1;
        }
        ssize_t n = read(fd, buf + len, (size_t)st.st_size + 1 - len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    buf[len] = '\0';
    *out = cds_take_ptr(&buf);
    return (long)len;
}

static long read_file(const char *path, size_t limit, char **out) { return read_file_mode(path, limit, out, NULL); }

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    char *end = s + strlen(s);
    while (end > s && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r'))
        *--end = '\0';
    return s;
}

/* Parse one "..." TOML basic string without escapes at *p; advances *p. */
static int parse_string(char **p, char *out, size_t cap)
{
    char *s = *p;
    if (*s != '"')
        return -1;
    char *end = strchr(s + 1, '"');
    if (!end || memchr(s + 1, '\\', (size_t)(end - s - 1)) || (size_t)(end - s - 1) >= cap)
        return -1;
    memcpy(out, s + 1, (size_t)(end - s - 1));
    out[end - s - 1] = '\0';
    *p = end + 1;
    return 0;
}

/* Parse a `["a", "b"]` list of such strings at *p into ITEMS (MAX of CAP bytes each; the
 * count into *N), or only check it when ITEMS is NULL; advances *p. */
static int parse_list(char **p, char *items, size_t cap, int max, int *n)
{
    char scratch[4096];
    char *s = *p;
    if (*s++ != '[')
        return -1;
    *n = 0;
    for (;;) {
        s = trim(s);
        if (*s == ']')
            break;
        if (items && *n == max)
            return -1;
        if (parse_string(&s, items ? items + (size_t)*n * cap : scratch, items ? cap : sizeof(scratch)) < 0)
            return -1;
        (*n)++;
        s = trim(s);
        if (*s == ',')
            s++;
        else if (*s != ']')
            return -1;
    }
    *p = s + 1;
    return 0;
}

static int parse_bool(char **p, int *value)
{
    for (int v = 0; v < 2; v++) {
        const char *word = v ? "true" : "false";
        size_t len = strlen(word);
        if (strncmp(*p, word, len) == 0) {
            *p += len;
            *value = v;
            return 0;
        }
    }
    return -1;
}

static int one_of(const char *value, const char *const *choices)
{
    for (; choices && *choices; choices++)
        if (strcmp(value, *choices) == 0)
            return 1;
    return choices == NULL;
}

/* The string field of the settings that KEY sets, and its size; NULL for a key without one. */
static char *string_field(struct settings *set, enum cds_key key, size_t *cap)
{
    switch (key) {
    case CDS_KEY_RUNTIME: *cap = sizeof(set->runtime); return set->runtime;
    case CDS_KEY_DEVICE_ENV: *cap = sizeof(set->device_env); return set->device_env;
    case CDS_KEY_RESIDENT_SOCKET: *cap = sizeof(set->socket); return set->socket;
    case CDS_KEY_LOG_FILE: *cap = sizeof(set->log_file); return set->log_file;
    default: return NULL;
    }
}

/* One `key = value` line's value, of KEY's type (config_keys.h, from shim/config.py's KEYS),
 * into SET when the front end reads that key. Returns -1 when the value is not one this reader
 * understands, or not one Python accepts (Python then reports it). */
static int set_value(struct settings *set, enum cds_key key, char **value)
{
    const struct cds_key_info *info = &cds_keys[key];
    char scratch[4096];
    int n, flag;
    if (info->type == 'b')
        return parse_bool(value, &flag);
    if (info->type == 'l') {
        if (key != CDS_KEY_ANNOTATION_PREFIXES)
            return parse_list(value, NULL, 0, 0, &n);
        if (parse_list(value, &set->prefixes[0][0], sizeof(set->prefixes[0]), MAX_PREFIXES, &n) < 0)
            return -1;
        set->n_prefixes = n;
        return 0;
    }
    size_t cap = sizeof(scratch);
    char *field = string_field(set, key, &cap);
    if (parse_string(value, scratch, cap) < 0 || !one_of(scratch, info->choices))
        return -1;
    if (field)
        strcpy(field, scratch);
    else if (key == CDS_KEY_LOG_LEVEL)
        set->debug = strcmp(scratch, "debug") == 0;
    else if (key == CDS_KEY_FILE_BINDS)
        set->runc_binds = strcmp(scratch, "runc") == 0;
    return 0;
}

static void load_defaults(struct settings *set)
{
    static const char *const prefixes[] = CDS_DEFAULT_ANNOTATION_PREFIXES;
    set->text = NULL;
    set->text_len = 0;
    strcpy(set->runtime, CDS_DEFAULT_RUNTIME);
    strcpy(set->device_env, CDS_DEFAULT_DEVICE_ENV);
    strcpy(set->socket, CDS_DEFAULT_RESIDENT_SOCKET);
    strcpy(set->log_file, CDS_DEFAULT_LOG_FILE);
    set->n_prefixes = 0;
    for (int i = 0; prefixes[i]; i++)
        strcpy(set->prefixes[set->n_prefixes++], prefixes[i]);
    set->debug = strcmp(CDS_DEFAULT_LOG_LEVEL, "debug") == 0;
    set->runc_binds = strcmp(CDS_DEFAULT_FILE_BINDS, "runc") == 0;
}

/* The subset of TOML our config file uses: `key = "string"`, `key = ["a", "b"]` on one
 * line, `key = true|false`, comments and blank lines. Anything else: not understood. */
void load_settings(struct settings *set)
{
    const char *path = getenv(CDS_CONFIG_ENV);
    cleanup_free char *text = NULL;

    load_defaults(set);
    set->understood = 1;
    int named = path && *path;
    if (!named)
        path = CDS_DEFAULT_CONFIG_PATH;
    long len = read_file(path, CDS_MAX_CONFIG_BYTES, &text);
    if (len < 0) {
        if (errno != ENOENT || named)
            set->understood = 0; /* unreadable, or a named file is missing: Python reports it */
        return;
    }
    set->text = malloc(len + 1);
    if (set->text) {
        memcpy(set->text, text, (size_t)len);
        set->text_len = (size_t)len;
    }
    int seen[CDS_KEY_COUNT] = {0};
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char *s = trim(line);
        if (*s == '\0' || *s == '#')
            continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            set->understood = 0;
            return;
        }
        *eq = '\0';
        char *key = trim(s), *value = trim(eq + 1);
        int k = 0;
        while (k < CDS_KEY_COUNT && strcmp(key, cds_keys[k].name) != 0)
            k++;
        /* an unknown or repeated key, or a value we cannot read: Python reports it */
        if (k == CDS_KEY_COUNT || seen[k]++ || set_value(set, (enum cds_key)k, &value) < 0) {
            set->understood = 0;
            return;
        }
        value = trim(value);
        if (*value != '\0' && *value != '#') {
            set->understood = 0;
            return;
        }
    }
}
