/* Our own lines where runc's go: failures on stderr and in runc's --log file (in its format, so
 * containerd shows them as it shows runc's), info and debug lines in runc's --log and our
 * log-file; shim/runtime/runlog.py is the Python half's. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "frontend.h"
#include "runtime_rules.h"
#include "../engine/cleanup.h"

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
