/* cdi-shim-bind-params: the createContainer hook that binds the runtime's modified copy of
 * the host's /proc/driver/nvidia/params (ModifyDeviceFiles: 0) read-only over the
 * container's, the native form of the toolkit's disable-device-node-modification hook.
 *
 *   cdi-shim-bind-params --source FILE --rootfs DIR
 *
 * runc refuses config.json mounts under /proc, so this one takes a hook. runc runs it in the
 * container's mount namespace after its mounts and before pivot_root, for every container
 * start, so it is C: an exec, a few syscalls (~1 ms; the Python hook it replaces took ~30).
 * The runtime writes both paths into the hook's args when it prepares config.json: FILE is
 * the bundle's copy, DIR the rootfs (root.path), where it still is at that point.
 *
 * The image is hostile: the target is resolved inside DIR (csrc/engine/inroot.c: no link
 * leads out of it) and must be a regular file (procfs's, or the image's own). The mount
 * names the resolved file through /proc/self/fd, never the path again.
 * Errors: "Error: ..." on stderr, exit 1 (runc then fails the create, naming the hook). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../engine/inroot.h"

#define PARAMS_PATH "/proc/driver/nvidia/params"
#define MAX_STATE (1 << 20)

static int fail(const char *what, const char *path, int err)
{
    fprintf(stderr, "Error: bind-params: %s %s: %s\n", what, path, strerror(err));
    return 1;
}

static int usage(void)
{
    fputs("usage: cdi-shim-bind-params --source FILE --rootfs DIR\n"
          "  (an OCI createContainer hook written by cdi-shim-runtime: binds FILE read-only over\n"
          "   " PARAMS_PATH " inside DIR, in the container's mount namespace)\n", stderr);
    return 2;
}

/* runc writes the container's state to our stdin: read it (bounded) so its write never
 * meets a closed pipe. We need nothing from it. */
static void drain_stdin(void)
{
    char buf[4096];
    size_t total = 0;
    ssize_t n;
    while (total < MAX_STATE && ((n = read(0, buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR)))
        if (n > 0)
            total += (size_t)n;
}

/* An O_PATH descriptor of the rootfs's params file, resolved inside it; -1 (reported). */
static int open_target(int rootfd, const char *rootfs)
{
    int fd = cds_inroot_open(rootfd, PARAMS_PATH, O_PATH | O_NOFOLLOW);
    if (fd < 0) {
        fail("cannot open " PARAMS_PATH " in", rootfs, errno);
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        fprintf(stderr, "Error: bind-params: " PARAMS_PATH " in %s is not a regular file\n", rootfs);
        return -1;
    }
    return fd;
}

int main(int argc, char **argv)
{
    const char *source = NULL, *rootfs = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--source") == 0 && i + 1 < argc)
            source = argv[++i];
        else if (strcmp(argv[i], "--rootfs") == 0 && i + 1 < argc)
            rootfs = argv[++i];
        else
            return usage();
    }
    if (source == NULL || rootfs == NULL || source[0] != '/' || rootfs[0] != '/')
        return usage();
    drain_stdin();

    int rootfd = open(rootfs, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (rootfd < 0)
        return fail("cannot open the rootfs", rootfs, errno);
    /* The bind; then, on the path opened again (it now names the mount, not the file under
     * it), read-only and private. */
    static const struct { unsigned long flags; const char *what; } steps[] = {
        {MS_BIND, "cannot bind"},
        {MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, "cannot remount read-only"},
        {MS_PRIVATE, "cannot make private"},
    };
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        int fd = open_target(rootfd, rootfs);
        if (fd < 0)
            return 1;
        char where[64];
        snprintf(where, sizeof where, "/proc/self/fd/%d", fd);
        if (mount(i == 0 ? source : NULL, where, NULL, steps[i].flags, NULL) != 0) {
            int err = errno;
            fprintf(stderr, "Error: bind-params: %s %s over " PARAMS_PATH " in %s: %s\n",
                    steps[i].what, source, rootfs, strerror(err));
            return 1;
        }
        close(fd);
    }
    close(rootfd);
    return 0;
}
