/* The container's rootfs from what runc hands a hook: the OCI state on stdin names the bundle,
 * whose config.json names root.path (relative to the bundle unless absolute). See ocistate.h.
 *
 * Both documents come from the engine (runc's state, the engine's config.json), not from the
 * image, but they are bounded, and read by the engine's strict JSON reader (ociconf.c), which
 * refuses malformed input all the same. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../engine/ociconf.h"
#include "ocistate.h"

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
    char *bundle;
    cds_json_string(state, len, "bundle", NULL, &bundle); /* NULL when malformed too */
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
    char *root;
    cds_json_string(config, len, "root", "path", &root);
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
