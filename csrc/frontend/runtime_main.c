/*
 * cdi-shim-runtime: the native front end of the runtime wrapper.
 *
 * containerd calls this binary exactly as it would call runc, for every container operation
 * (state, start, kill, delete, exec probes...). Only create/run may need CDI injection, and
 * only when the bundle's config.json can be asking for a device. Everything else is exec'd
 * straight into runc here, so it costs one exec and no interpreter start-up.
 *
 * The decision "nothing can be requested" is conservative: config.json is searched for the
 * raw byte patterns a request needs (an annotation key with a configured prefix, the device
 * env var, a device-plugin mount). If any pattern, or any JSON escape that could hide one,
 * appears, or if our config file holds anything this small reader does not understand, the
 * Python implementation decides (the interpreter beside this program: pylaunch.h).
 * A false "maybe" costs time; a false "no" cannot happen.
 *
 * Docker's --gpus hook program (nvidia-container-runtime-hook) counts as a request: Python turns it
 * into one and drops it.
 *
 * A config without a request but with a hook program's name in it (injected by containerd's
 * own CDI or podman) is first offered to replay.c: the linker step a resident worker kept for
 * such a config, redone here without asking the worker.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "config_keys.h"
#include "runtime_rules.h"
#include "replay.h"
#include "../engine/resident.h"
#include "../launcher/pylaunch.h"

#ifndef CDS_VERSION
#define CDS_VERSION "unknown"
#endif

#define MAX_CONFIG_JSON (64u << 20)
#define MAX_PREFIXES 16
#define DEVICE_MOUNT_PATTERN "\"" CDS_DEVICE_MOUNT_ROOT

struct settings {
    char runtime[4096];
    char device_env[256];
    char prefixes[MAX_PREFIXES][256];
    int n_prefixes;
    char socket[sizeof(((struct sockaddr_un *)0)->sun_path)]; /* the resident process; "" = none */
    char log_file[4096]; /* our own log (log-file), and whether debug lines go to it (log-level) */
    int debug;
    int runc_binds; /* file-binds = "runc": no replay (a kept step's recipe binds them by our hook) */
    int understood; /* 0: let Python read the config file (and report its problems) */
};

static void free_buf(char **buf) { free(*buf); }
static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
}

/* Read a whole regular file, refusing links, FIFOs and anything over `limit`; its mode into
 * *MODE when MODE is given. Returns the length, or -1 with errno set (EFBIG when too large). */
static long read_file_mode(const char *path, size_t limit, char **out, mode_t *mode)
{
    __attribute__((cleanup(close_fd))) int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
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
    char *buf = malloc((size_t)st.st_size + 1);
    if (!buf)
        return -1;
    size_t len = 0;
    for (;;) {
        if (len == (size_t)st.st_size + 1) { /* grew while reading: let Python judge */
            free(buf);
            errno = EFBIG;
            return -1;
        }
        ssize_t n = read(fd, buf + len, (size_t)st.st_size + 1 - len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            free(buf);
            return -1;
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    buf[len] = '\0';
    *out = buf;
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
static void load_settings(struct settings *set)
{
    const char *path = getenv(CDS_CONFIG_ENV);
    __attribute__((cleanup(free_buf))) char *text = NULL;

    load_defaults(set);
    set->understood = 1;
    int named = path && *path;
    if (!named)
        path = CDS_DEFAULT_CONFIG_PATH;
    if (read_file(path, CDS_MAX_CONFIG_BYTES, &text) < 0) {
        if (errno != ENOENT || named)
            set->understood = 0; /* unreadable, or a named file is missing: Python reports it */
        return;
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

/* Whether NAME (LEN bytes, not NUL-terminated) is one of the NULL-terminated NAMES. */
static int among(const char *name, size_t len, const char *const *names)
{
    for (; *names; names++)
        if (strlen(*names) == len && strncmp(name, *names, len) == 0)
            return 1;
    return 0;
}

static int is_device_option(const char *name, size_t len)
{
    return among(name, len, (const char *const[]){CDS_DEVICE_OPTION, NULL});
}

/* runc's global options that take a value, and ours. */
static int global_takes_value(const char *name, size_t len)
{
    return among(name, len, cds_global_value_options) || is_device_option(name, len);
}

/* Option name without leading dashes and its length (up to '=' if any). */
static const char *option_name(const char *arg, size_t *len)
{
    const char *name = arg + (arg[1] == '-' ? 2 : 1);
    const char *eq = strchr(name, '=');
    *len = eq ? (size_t)(eq - name) : strlen(name);
    return name;
}

/* What a create/run command line (argv from the command word on) says to us. */
struct create_line {
    const char *bundle;
    int has_device; /* --device among the command's options: always Python */
    int help;       /* --help/-h: runc prints the command's help; no bundle is read */
    int end;        /* where the options end (the container id, "--", or n) */
};

static int is_help_option(const char *name, size_t len) { return among(name, len, cds_help_options); }

/* A --device option without "=": whether the next argument is its value (a device name never
 * starts with '-', so `--device --help` asks for help, not for a device called "--help"). */
static int device_value_follows(char **args, int i, int n) { return i + 1 < n && args[i + 1][0] != '-'; }

/* Options of create/run that take a value; the rest of theirs are booleans. */
static int create_takes_value(const char *name, size_t len) { return among(name, len, cds_create_value_options); }

static struct create_line scan_create(char **args, int n)
{
    struct create_line line = {".", 0, 0, n};
    for (int i = 1; i < n; i++) {
        const char *a = args[i];
        if (a[0] != '-' || strcmp(a, "-") == 0 || strcmp(a, "--") == 0) {
            line.end = i;
            /* runc (urfave/cli) also takes its options after the container id: --help there
             * shows the command's help too */
            for (int j = i; j < n && strcmp(args[j], "--") != 0; j++)
                if (strcmp(args[j], "--help") == 0 || strcmp(args[j], "-h") == 0 || strcmp(args[j], "-help") == 0
                    || strcmp(args[j], "--h") == 0)
                    line.help = 1;
            break;
        }
        size_t len;
        const char *name = option_name(a, &len);
        const char *eq = strchr(a, '=');
        if (is_device_option(name, len)) {
            line.has_device = 1;
            if (!eq && device_value_follows(args, i, n))
                i++;
        } else if (is_help_option(name, len)) {
            line.help = 1;
        } else if (create_takes_value(name, len)) {
            if (len == 6 || len == 1) /* --bundle, -b */
                line.bundle = eq ? eq + 1 : (i + 1 < n ? args[i + 1] : ".");
            if (!eq)
                i++;
        }
    }
    return line;
}

/* The hook programs whose work the Python half does (cds_hook_programs): a config injected by
 * someone else (containerd's own CDI, podman) carries them with no request left in it. Docker's
 * --gpus hook (CDS_LEGACY_HOOK) is a request, and ours to drop, whatever the env says. Both are
 * matched as a whole JSON string or its last path component. */
#define N_HOOK_PROGRAMS (sizeof(cds_hook_programs) / sizeof(cds_hook_programs[0]) - 1)

static int starts_with(const char *at, const char *end, const char *text, size_t len)
{
    return (size_t)(end - at) >= len && memcmp(at, text, len) == 0;
}

/* Whether AT holds one of cds_no_request_values, closed by its quote. */
static int no_request_value(const char *at, const char *end)
{
    for (const char *const *v = cds_no_request_values; *v; v++) {
        size_t len = strlen(*v);
        if (starts_with(at, end, *v, len) && at + len < end && at[len] == '"')
            return 1;
    }
    return 0;
}

enum config_kind { NOTHING_FOR_US = 0, HOOKS_ONLY = 1, MAY_REQUEST = 2 };

/* What config.json (read into *JSON, its length *LEN and mode *MODE) holds for us:
 * MAY_REQUEST when it may request a device (or we cannot tell), HOOKS_ONLY when it cannot but
 * carries a hook program whose work we may do, NOTHING_FOR_US when it has neither. One pass:
 * it stops only at quotes and backslashes, where every pattern begins (a request: an opening
 * quote) or ends (a hook program: a closing quote). */
static enum config_kind config_kind(const char *bundle, const struct settings *set, char **json_out, long *len_out,
                                    mode_t *mode)
{
    char path[8192], env_pattern[300];
    __attribute__((cleanup(free_buf))) char *json = NULL;
    int hooks = 0;

    if (snprintf(path, sizeof(path), "%s/config.json", bundle) >= (int)sizeof(path))
        return MAY_REQUEST;
    long len = read_file_mode(path, MAX_CONFIG_JSON, &json, mode);
    if (len < 0)
        return MAY_REQUEST; /* Python reports the problem with the file */
    size_t prefix_len[MAX_PREFIXES], env_len = 0, mount_len = strlen(DEVICE_MOUNT_PATTERN), hook_len[N_HOOK_PROGRAMS];
    for (int i = 0; i < set->n_prefixes; i++)
        prefix_len[i] = strlen(set->prefixes[i]);
    if (set->device_env[0])
        env_len = (size_t)snprintf(env_pattern, sizeof(env_pattern), "%s=", set->device_env);
    for (size_t h = 0; h < N_HOOK_PROGRAMS; h++)
        hook_len[h] = strlen(cds_hook_programs[h]);
    const char *end = json + len;
    for (const char *p = json;; p++) {
        p += strcspn(p, "\\\""); /* stops at a quote, a backslash or a NUL */
        if (*p == '\0') {
            if (p < end)
                return MAY_REQUEST; /* a NUL inside the text: Python says what is wrong */
            break;
        }
        if (*p == '\\') {
            if (p[1] == 'u' || p[1] == '/' || p[1] == '\0')
                return MAY_REQUEST; /* an escape could spell a pattern differently */
            p++;                    /* the escaped character is no pattern's edge */
            continue;
        }
        /* a quote: a request begins here, or a hook program ends here */
        if (starts_with(p, end, DEVICE_MOUNT_PATTERN, mount_len))
            return MAY_REQUEST;
        for (int i = 0; i < set->n_prefixes; i++)
            if (starts_with(p + 1, end, set->prefixes[i], prefix_len[i]))
                return MAY_REQUEST;
        if (env_len && starts_with(p + 1, end, env_pattern, env_len)) {
            /* cds_no_request_values ("void", "none") request nothing, and beat any other value
             * of the variable: only when every one is such can none be a request. */
            const char *value = p + 1 + env_len;
            if (!no_request_value(value, end))
                return MAY_REQUEST;
        }
        size_t legacy_len = sizeof(CDS_LEGACY_HOOK) - 1;
        if ((size_t)(p - json) > legacy_len && memcmp(p - legacy_len, CDS_LEGACY_HOOK, legacy_len) == 0
            && (p[-(long)legacy_len - 1] == '/' || p[-(long)legacy_len - 1] == '"'))
            return MAY_REQUEST;
        for (size_t h = 0; !hooks && h < N_HOOK_PROGRAMS; h++) {
            const char *name = p - hook_len[h];
            if ((size_t)(p - json) > hook_len[h] && memcmp(name, cds_hook_programs[h], hook_len[h]) == 0
                && (name[-1] == '/' || name[-1] == '"'))
                hooks = 1;
        }
    }
    if (!hooks)
        return NOTHING_FOR_US;
    *json_out = json;
    *len_out = len;
    json = NULL;
    return HOOKS_ONLY;
}

static void debug_line(const struct settings *set, const char *message);

/* The container id at argv[AT] (past a "--"), for log lines; NULL when there is none. */
static const char *container_id(char **argv, int argc, int at)
{
    if (at < argc && strcmp(argv[at], "--") == 0)
        at++;
    return at < argc ? argv[at] : NULL;
}

/* A create whose config only carries hooks (injected by containerd or podman): the step a
 * resident worker kept for it, replayed here (replay.c); 1 when done. */
static int replayed(const struct settings *set, const char *bundle, const char *id, const char *json, long len,
                    mode_t mode)
{
    char steps[sizeof(set->socket) + 16], message[512];
    struct timespec start, end;
    const char *slash = strrchr(set->socket, '/');
    if (!set->socket[0] || !slash)
        return 0;
    clock_gettime(CLOCK_MONOTONIC, &start);
    snprintf(steps, sizeof(steps), "%.*s/steps", (int)(slash - set->socket), set->socket);
    if (!replay_step(steps, bundle, json, (size_t)len, mode))
        return 0;
    clock_gettime(CLOCK_MONOTONIC, &end);
    snprintf(message, sizeof(message),
             "cdi-shim: container %.200s: the linker step of an earlier container of these "
             "files and spec, replayed by the front end; phase=replay took=%.2fms",
             id ? id : "?", (double)(end.tv_sec - start.tv_sec) * 1e3 + (double)(end.tv_nsec - start.tv_nsec) / 1e6);
    debug_line(set, message);
    return 1;
}

/* runc's --log file and format, so our own failures reach containerd like runc's do. */
static const char *log_path, *log_format = "text";

static void append_escaped(char *out, size_t cap, size_t *len, const char *text)
{
    for (const unsigned char *c = (const unsigned char *)text; *c && *len + 8 < cap; c++) {
        if (*c == '"' || *c == '\\') {
            out[(*len)++] = '\\';
            out[(*len)++] = (char)*c;
        } else if (*c < 0x20) {
            *len += (size_t)snprintf(out + *len, cap - *len, "\\u%04x", *c);
        } else {
            out[(*len)++] = (char)*c;
        }
    }
}

/* MESSAGE at LEVEL appended to the log file PATH in FORMAT ("json" or runc's "text"). */
static void append_line(const char *path, const char *format, const char *level, const char *message)
{
    struct timespec now;
    struct tm tm;
    char stamp[64], line[8192];
    size_t len = 0;
    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm);
    size_t n = strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(stamp + n, sizeof(stamp) - n, ".%09ldZ", now.tv_nsec);
    int json = strcmp(format, "json") == 0;
    len = json ? (size_t)snprintf(line, sizeof(line), "{\"level\":\"%s\",\"msg\":\"", level)
               : (size_t)snprintf(line, sizeof(line), "time=\"%s\" level=%s msg=\"", stamp, level);
    append_escaped(line, sizeof(line) - 64, &len, message);
    len += (size_t)snprintf(line + len, sizeof(line) - len, json ? "\",\"time\":\"%s\"}\n" : "\"\n", stamp);
    __attribute__((cleanup(close_fd))) int fd =
        open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0 || write(fd, line, len) < 0)
        fprintf(stderr, "cdi-shim: cannot write log file %s: %s\n", path, strerror(errno));
}

/* Report a failure on stderr and, when runc was given --log, in that file in its format. */
static void report(const char *message)
{
    fprintf(stderr, "%s\n", message);
    if (log_path)
        append_line(log_path, log_format, "error", message);
}

/* A debug line where the Python half writes its own (log-level = "debug"): runc's --log and
 * our log-file. */
static void debug_line(const struct settings *set, const char *message)
{
    if (!set->debug)
        return;
    if (log_path)
        append_line(log_path, log_format, "debug", message);
    if (set->log_file[0])
        append_line(set->log_file, "json", "debug", message);
}

/* Find `name` on PATH with access(2): a failed execve per PATH entry (what execvp does) costs
 * far more, and this is the hot path of every exec probe. */
static const char *search_path(const char *name, char *buf, size_t cap)
{
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    for (const char *dir = path; dir; dir = strchr(dir, ':') ? strchr(dir, ':') + 1 : NULL) {
        size_t len = strchr(dir, ':') ? (size_t)(strchr(dir, ':') - dir) : strlen(dir);
        if (len == 0 || len + strlen(name) + 2 > cap)
            continue;
        memcpy(buf, dir, len);
        buf[len] = '/';
        strcpy(buf + len + 1, name);
        struct stat st;
        if (access(buf, X_OK) == 0 && stat(buf, &st) == 0 && S_ISREG(st.st_mode))
            return buf;
    }
    return NULL;
}

static int exec_runtime(const struct settings *set, char **argv_out)
{
    char found[4096], message[8192];
    const char *runtime = set->runtime;
    argv_out[0] = (char *)set->runtime;
    if (!strchr(runtime, '/')) {
        runtime = search_path(runtime, found, sizeof(found));
        if (!runtime) {
            snprintf(message, sizeof(message),
                     "cdi-shim: the low-level runtime \"%s\" is not on PATH "
                     "(install runc or set \"runtime\" in the cdi-shim config)",
                     set->runtime);
            report(message);
            return 127;
        }
    }
    execv(runtime, argv_out);
    snprintf(message, sizeof(message), "cdi-shim: cannot run the low-level runtime \"%s\": %s%s", set->runtime,
             strerror(errno), errno == ENOENT ? " (install runc or set \"runtime\" in the cdi-shim config)" : "");
    report(message);
    return 127;
}

static int exec_python(int argc, char **argv)
{
    char message[8192], line[8300];
    cds_exec_python("shim.runtime.main", argc, argv, message, sizeof(message));
    snprintf(line, sizeof(line), "cdi-shim: %s", message);
    report(line);
    return 127;
}

/* A growable byte buffer for the resident request. */
struct bytes {
    char *data;
    size_t len, cap;
};

static int put(struct bytes *b, const char *field)
{
    size_t n = strlen(field) + 1;
    if (b->len + n > b->cap) {
        size_t cap = (b->cap ? b->cap * 2 : 8192) + n;
        char *data = realloc(b->data, cap);
        if (!data)
            return -1;
        b->data = data;
        b->cap = cap;
    }
    memcpy(b->data + b->len, field, n);
    b->len += n;
    return 0;
}

static void free_bytes(struct bytes *b) { free(b->data); }

static int send_request(int fd, const struct bytes *body, int token)
{
    const char magic[8] = {'C', 'D', 'S', 'H', 'I', 'M', '0' + CDS_RESIDENT_PROTOCOL, '\0'};
    unsigned char header[12];
    uint32_t len = (uint32_t)body->len;
    memcpy(header, magic, 8);
    for (int i = 0; i < 4; i++)
        header[8 + i] = (unsigned char)(len >> (8 * i));
    /* The claim goes along (see claim()); our stderr does not: the worker's messages come back
     * in the answer, so a full stderr pipe blocks us, never a worker. */
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } control;
    memset(&control, 0, sizeof(control));
    struct iovec iov[2] = {{header, sizeof(header)}, {body->data, body->len}};
    struct msghdr msg = {
        .msg_iov = iov, .msg_iovlen = 2, .msg_control = control.buf, .msg_controllen = sizeof(control.buf)};
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cmsg), &token, sizeof(int));
    ssize_t sent = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (sent < 0)
        return -1;
    size_t total = sizeof(header) + body->len;
    while ((size_t)sent < total) { /* the rest without the descriptor */
        size_t off = (size_t)sent - sizeof(header);
        ssize_t n = send(fd, body->data + off, body->len - off, MSG_NOSIGNAL);
        if (n < 0 && errno != EINTR)
            return -1;
        if (n > 0)
            sent += n;
    }
    return 0;
}

/* The claim on a request: a pipe (non-blocking) holding two bytes, whose read end the worker
 * gets with the request. A worker reads the first before it starts the work and the second
 * before its first write; we read one before we run the interpreter instead. Reads are atomic,
 * so when we get either byte, no worker has written anything, nor will. */
static int claim(int token)
{
    char byte;
    ssize_t n;
    do
        n = read(token, &byte, 1);
    while (n < 0 && errno == EINTR);
    return n == 1;
}

static long ms_since(const struct timespec *start)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (long)(now.tv_sec - start->tv_sec) * 1000 + (now.tv_nsec - start->tv_nsec) / 1000000;
}

/* Wait until FD is readable or MS milliseconds have passed: 1, or 0 on timeout. */
static int wait_readable(int fd, long ms)
{
    struct pollfd ready = {.fd = fd, .events = POLLIN};
    int polled;
    do
        polled = poll(&ready, 1, ms < 0 ? 0 : (int)ms);
    while (polled < 0 && errno == EINTR);
    return polled != 0;
}

/* A whole answer in REPLY ("A<status>\0<n>\0<n bytes of messages><argv fields>"): its status, and
 * where its messages and argv begin; -1 while incomplete or malformed. */
static int parse_answer(const struct bytes *reply, long *status, const char **messages, size_t *messages_len,
                        const char **argv_at)
{
    const char *end = reply->data + reply->len;
    if (reply->len < 2 || reply->data[0] != 'A')
        return -1;
    const char *status_end = memchr(reply->data + 1, '\0', reply->len - 1);
    if (!status_end || status_end == reply->data + 1)
        return -1;
    const char *len_end = memchr(status_end + 1, '\0', (size_t)(end - status_end - 1));
    if (!len_end || len_end == status_end + 1)
        return -1;
    char *stop;
    *status = strtol(reply->data + 1, &stop, 10);
    if (stop != status_end)
        return -1;
    unsigned long n = strtoul(status_end + 1, &stop, 10);
    if (stop != len_end || n > (unsigned long)(end - len_end - 1))
        return -1;
    *messages = len_end + 1;
    *messages_len = n;
    *argv_at = len_end + 1 + n;
    return 0;
}

/* Hand create/run to the resident process (shim/runtime/resident.py has the protocol,
 * csrc/engine/resident.h its bounds). Returns -1 when nothing was touched and the caller should
 * start the interpreter itself: the server is not there, declines, no worker claimed the request
 * within CDS_RESIDENT_CLAIM_WAIT_MS (every worker busy), or the worker that did gave no whole
 * answer within CDS_RESIDENT_ANSWER_WAIT_MS before its first write; we took the request back.
 * Otherwise execs the runtime it names, or returns the exit status. */
static int try_resident(const struct settings *set, int argc, char **argv)
{
    extern char **environ;
    char cwd[4096], field[32], message[8192];
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    struct timespec start;

    if (!set->socket[0] || !getcwd(cwd, sizeof(cwd)))
        return -1; /* (a deleted working directory: the interpreter copes with it) */
    strcpy(addr.sun_path, set->socket);
    __attribute__((cleanup(close_fd))) int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0)
        return -1; /* not running: the usual case without the service */
    struct ucred peer = {.uid = (uid_t)-1};
    socklen_t peer_len = sizeof(peer);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &peer_len) < 0 || peer.uid != geteuid()) {
        snprintf(message, sizeof(message), "cdi-shim: ignoring %s: served by uid %d, not by us", set->socket,
                 (int)peer.uid);
        fprintf(stderr, "%s\n", message);
        return -1;
    }
    int pipe_fds[2];
    if (pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) < 0)
        return -1;
    __attribute__((cleanup(close_fd))) int token = pipe_fds[0];
    int ready_token = write(pipe_fds[1], "CW", 2) == 2; /* resident.py CLAIM, PERMIT */
    close(pipe_fds[1]);
    mode_t mask = umask(0);
    umask(mask);
    __attribute__((cleanup(free_bytes))) struct bytes body = {0};
    int failed = (ready_token ? 0 : -1) | put(&body, CDS_VERSION) | put(&body, cwd);
    snprintf(field, sizeof(field), "%o", (unsigned)mask);
    failed |= put(&body, field);
    snprintf(field, sizeof(field), "%d", argc - 1);
    failed |= put(&body, field);
    for (int i = 1; i < argc; i++)
        failed |= put(&body, argv[i]);
    for (char **env = environ; *env; env++)
        failed |= put(&body, *env);
    __attribute__((cleanup(free_bytes))) struct bytes reply = {.data = malloc(65536), .cap = 65536};
    if (failed || !reply.data)
        return -1;
    int why = 0;
    long status = 0;
    const char *messages = NULL, *argv_at = NULL;
    size_t messages_len = 0;
    clock_gettime(CLOCK_MONOTONIC, &start);
    if (send_request(fd, &body, token) < 0) {
        why = errno;
    } else {
        /* A worker takes the request up within a moment, or every worker is busy (or the
         * server is stuck): then we claim it back and the interpreter does it here; a worker
         * that gets to it later finds the claim gone and does nothing. */
        if (!wait_readable(fd, CDS_RESIDENT_CLAIM_WAIT_MS) && claim(token))
            return -1;
        /* An answer is coming, or a worker has claimed the request: wait for all of it, as
         * long as the bound. */
        for (;;) {
            long left = CDS_RESIDENT_ANSWER_WAIT_MS - ms_since(&start);
            if (left <= 0 || !wait_readable(fd, left)) {
                why = ETIMEDOUT;
                break;
            }
            if (reply.cap - reply.len < 4096) {
                char *data = realloc(reply.data, reply.cap + 65536);
                if (!data)
                    return 127;
                reply.data = data;
                reply.cap += 65536;
            }
            ssize_t n = read(fd, reply.data + reply.len, reply.cap - reply.len - 1);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0)
                why = errno;
            if (n <= 0)
                break;
            reply.len += (size_t)n;
            if (reply.len > CDS_RESIDENT_MAX_ANSWER) {
                why = EFBIG;
                break;
            }
        }
    }
    reply.data[reply.len] = '\0';
    int whole = why != EFBIG && parse_answer(&reply, &status, &messages, &messages_len, &argv_at) == 0
        && (status != 0 || argv_at < reply.data + reply.len);
    /* Declined ("F"), or no whole answer: if we can take a byte of the claim back, no worker
     * has written anything, nor will one. */
    if (!whole && claim(token))
        return -1;
    /* A worker began the work and may have written: whatever goes wrong now is a failure,
     * never a second run through the interpreter. */
    if (!whole) {
        snprintf(message, sizeof(message),
                 "cdi-shim: the resident process at %s stopped before it "
                 "answered (%s); the container was not started",
                 set->socket,
                 why == ETIMEDOUT   ? "no answer within the bound, a worker stalled after it began writing"
                     : why == EFBIG ? "answer too large"
                     : why          ? strerror(why)
                                    : "connection closed");
        report(message);
        return 1;
    }
    for (size_t off = 0; off < messages_len;) { /* the create's messages, on our stderr */
        ssize_t n = write(STDERR_FILENO, messages + off, messages_len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        off += (size_t)n;
    }
    if (status != 0)
        return (int)status; /* the child reported why on our stderr and in runc's log */
    char **args = calloc(reply.len, sizeof(char *));
    if (!args)
        return 127;
    int n = 0;
    for (const char *p = argv_at; p < reply.data + reply.len; p += strlen(p) + 1)
        args[n++] = (char *)p;
    execv(args[0], args);
    snprintf(message, sizeof(message), "cdi-shim: cannot run the low-level runtime \"%s\": %s", args[0],
             strerror(errno));
    report(message);
    return 127;
}

/* Printed before runc's own help (`--help`, `-h`, `help`, or no command at all). */
static const char help_text[] =
    "cdi-shim-runtime: runc with CDI devices. It takes runc's commands and options, listed below,\n"
    "and passes them to runc unchanged; on create and run it first adds the CDI devices the\n"
    "container asks for to the bundle's config.json (device nodes, mounts, env, hooks), from the\n"
    "CDI spec files in the spec directories (default /etc/cdi, /var/run/cdi).\n"
    "\n"
    "A container asks for devices with any of:\n"
    "   annotations    \"cdi.k8s.io/<any name>\": \"vendor.com/class=name[,...]\" in config.json\n"
    "                  (config key annotation-prefixes)\n"
    "   environment    NVIDIA_VISIBLE_DEVICES=0,1 | GPU-<uuid> | all | vendor.com/class=name in the\n"
    "                  process env; none, void or empty: no device (config keys device-env,\n"
    "                  default-kind = nvidia.com/gpu for bare indexes and UUIDs)\n"
    "   mounts         the device plugin's volume mounts at /var/run/nvidia-container-devices/<name>\n"
    "   --device NAME  a qualified device name, e.g. --device nvidia.com/gpu=0 (repeatable; before or\n"
    "                  after create/run: cdi-shim-runtime run --device NAME --bundle DIR ID); runc\n"
    "                  never sees it\n"
    "\n"
    "--debug also prints cdi-shim's per-phase timings: on stderr, and into runc's --log file when\n"
    "one is given. Configuration: /etc/cdi-shim/config.toml (optional), or the file\n"
    "$CDI_SHIM_CONFIG names. Spec tooling and set-up: cdi-shim --help.\n"
    "\n"
    "runc's own help:\n"
    "\n";

int main(int argc, char **argv)
{
    struct settings set;
    int command = argc, has_device = 0, version = 0, help = 0;

    load_settings(&set);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-' || strcmp(a, "-") == 0) {
            command = i;
            break;
        }
        size_t len;
        const char *name = option_name(a, &len);
        if (is_device_option(name, len)) {
            has_device = 1;
            if (!strchr(a, '=') && device_value_follows(argv, i, argc))
                i++;
            continue;
        }
        if ((len == 7 && strncmp(name, "version", 7) == 0) || (len == 1 && name[0] == 'v'))
            version = 1;
        else if (is_help_option(name, len))
            help = 1;
        if (global_takes_value(name, len)) {
            const char *value = strchr(a, '=') ? strchr(a, '=') + 1 : (i + 1 < argc ? argv[i + 1] : "");
            if (len == 3 && strncmp(name, "log", 3) == 0)
                log_path = value;
            else if (len == 10 && strncmp(name, "log-format", 10) == 0)
                log_format = value;
            if (!strchr(a, '='))
                i++;
        }
    }
    /* runc shows its help for --help, no command (unless --version) and a bare `help`: ours first. */
    if (command == argc
            ? !version
            : help || (argc - command == 1 && among(argv[command], strlen(argv[command]), cds_help_commands))) {
        help = 1;
        fputs(help_text, stdout);
        fflush(stdout);
    }
    if (!set.understood)
        return exec_python(argc, argv);

    int create = command < argc && among(argv[command], strlen(argv[command]), cds_injecting_commands);
    struct create_line scan = {".", 0, 0, 0};
    if (create) {
        scan = scan_create(argv + command, argc - command);
        __attribute__((cleanup(free_buf))) char *json = NULL;
        long len = 0;
        mode_t mode = 0;
        enum config_kind kind =
            has_device || scan.has_device ? MAY_REQUEST : config_kind(scan.bundle, &set, &json, &len, &mode);
        if (!help && !scan.help && kind != NOTHING_FOR_US
            && !(kind == HOOKS_ONLY && !set.runc_binds
                 && replayed(&set, scan.bundle, container_id(argv, argc, command + scan.end), json, len, mode))) {
            int status = try_resident(&set, argc, argv);
            return status >= 0 ? status : exec_python(argc, argv);
        }
    } else if (command == argc && version) {
        printf("cdi-shim-runtime version %s\n", CDS_VERSION);
        fflush(stdout);
    }

    /* Pass through: runc gets our argv without our own --device options (the global ones, and
     * those among the options of create/run, which reach here only with --help). */
    char **out = calloc((size_t)argc + 1, sizeof(char *));
    if (!out)
        return 127;
    int n = 1, end = create ? command + scan.end : command;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i < end && i != command && a[0] == '-') {
            size_t len;
            const char *name = option_name(a, &len);
            if (is_device_option(name, len)) {
                if (!strchr(a, '=') && device_value_follows(argv, i, argc))
                    i++;
                if (command < argc && !create && !help)
                    fprintf(stderr, "cdi-shim: --device is ignored for the %s command\n", argv[command]);
                continue;
            }
            if (i > command && !strchr(a, '=') && i + 1 < argc && create_takes_value(name, len))
                out[n++] = argv[i++]; /* and its value, whatever it looks like */
        }
        out[n++] = argv[i];
    }
    return exec_runtime(&set, out);
}
