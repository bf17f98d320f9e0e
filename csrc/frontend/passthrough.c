/* Passthrough: runc (or the configured runtime) exec'd with our argv (after_create.c for a
 * create), or the interpreter when Python must decide. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "frontend.h"
#include "../engine/cleanup.h"
#include "../launcher/pylaunch.h"

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

int exec_runtime(const struct settings *set, char **argv_out, const struct create_line *create, const char *config,
                 long config_len)
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
    int status = exec_runtime_at(set, runtime, argv_out, create, config, config_len);
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
