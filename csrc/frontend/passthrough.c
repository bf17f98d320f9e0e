/* Passthrough: runc (or the configured runtime) exec'd with our argv, or the interpreter when
 * Python must decide; our own failures reported on stderr and in runc's --log, as runc does. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "frontend.h"
#include "runtime_rules.h"
#include "../engine/cleanup.h"
#include "../launcher/pylaunch.h"

/* runc's --log file and format, so our own failures reach containerd like runc's do. */
const char *log_path, *log_format = "text";

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
    cleanup_fd int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0 || write(fd, line, len) < 0)
        fprintf(stderr, "cdi-shim: cannot write log file %s: %s\n", path, strerror(errno));
}

/* Report a failure on stderr and, when runc was given --log, in that file in its format. */
void report(const char *message)
{
    fprintf(stderr, "%s\n", message);
    if (log_path)
        append_line(log_path, log_format, "error", message);
}

/* A line at LEVEL where the Python half writes its own: runc's --log and our log-file (renamed
 * to <name>.1 past its size bound first, as the Python half does). */
static void log_line(const struct settings *set, const char *level, const char *message)
{
    struct stat st;
    if (log_path)
        append_line(log_path, log_format, level, message);
    if (!set->log_file[0])
        return;
    if (stat(set->log_file, &st) == 0 && st.st_size > CDS_MAX_LOG_BYTES) {
        char old[sizeof set->log_file + 2];
        snprintf(old, sizeof old, "%s.1", set->log_file);
        rename(set->log_file, old);
    }
    append_line(set->log_file, "json", level, message);
}

/* A debug line (log-level = "debug"). */
void debug_line(const struct settings *set, const char *message)
{
    if (set->debug)
        log_line(set, "debug", message);
}

/* An info line: what the Python half says of a create it prepared. */
void info_line(const struct settings *set, const char *message) { log_line(set, "info", message); }

/* Whether this process runs in the host's user namespace (its uid map the identity). */
int in_host_user_namespace(void)
{
    char text[256];
    unsigned long inside, outside, count;
    cleanup_fd int fd = open("/proc/self/uid_map", O_RDONLY | O_CLOEXEC);
    ssize_t n = fd < 0 ? -1 : read(fd, text, sizeof text - 1);
    if (n <= 0)
        return 0;
    text[n] = '\0';
    const char *end = strchr(text, '\n'); /* one line only */
    return sscanf(text, "%lu %lu %lu", &inside, &outside, &count) == 3 && inside == 0 && outside == 0
        && count == 4294967295ul && (!end || end[1] == '\0');
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

int exec_runtime(const struct settings *set, char **argv_out, const char *config, long config_len)
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
    int status = exec_runtime_at(set, runtime, argv_out, config, config_len);
    if (status >= 0)
        return status;
    snprintf(message, sizeof(message), "cdi-shim: cannot run the low-level runtime \"%s\": %s%s", set->runtime,
             strerror(errno), errno == ENOENT ? " (install runc or set \"runtime\" in the cdi-shim config)" : "");
    report(message);
    return 127;
}

int exec_python(int argc, char **argv)
{
    char message[8192], line[8300];
    cds_exec_python("shim.runtime.main", argc, argv, message, sizeof(message));
    snprintf(line, sizeof(line), "cdi-shim: %s", message);
    report(line);
    return 127;
}
