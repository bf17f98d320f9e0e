/* The work of cdi-shim-nshook's subcommands inside the container's rootfs, shared by the command
 * line (nshook.c) and the NRI hook (nrihook.c): the params bind, links, file binds and modes.
 *
 * The image is hostile: every path is resolved inside the rootfs (csrc/engine/inroot.c: no link
 * leads out of it). The params target must be a regular file; each mount names the resolved
 * file through /proc/self/fd, never the path again. Errors are reported on stderr
 * ("Error: ..."). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../engine/devlinks.h"
#include "../engine/inroot.h"
#include "../engine/memo_rules.h"
#include "rootfs_ops.h"

#define PARAMS_PATH CDS_PARAMS_PATH

/* An O_PATH descriptor of the rootfs's params file, resolved inside it; -1 (reported). */
static int open_params(int rootfd, const char *rootfs)
{
    int fd = cds_inroot_open(rootfd, PARAMS_PATH, O_PATH | O_NOFOLLOW);
    if (fd < 0) {
        fprintf(stderr, "Error: bind-params: cannot open " PARAMS_PATH " in %s: %s\n", rootfs, strerror(errno));
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

/* mount(2) of SOURCE (or NULL) with FLAGS on what FD names (through /proc/self/fd: the resolved
 * target, never its path again); FD is closed. 0, or -1 with errno. */
static int mount_on_fd(int fd, const char *source, unsigned long flags)
{
    char where[64];
    snprintf(where, sizeof where, "/proc/self/fd/%d", fd);
    int rc = mount(source, where, NULL, flags, NULL);
    int err = errno;
    close(fd);
    errno = err;
    return rc;
}

int cds_nshook_bind_params(int rootfd, const char *rootfs, const char *source)
{
    /* The bind; then, on the path opened again (it now names the mount, not the file under
     * it), read-only and private. */
    static const struct {
        unsigned long flags;
        const char *what;
    } steps[] = {
        {MS_BIND, "cannot bind"},
        {MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, "cannot remount read-only"},
        {MS_PRIVATE, "cannot make private"},
    };
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        int fd = open_params(rootfd, rootfs);
        if (fd < 0)
            return 1;
        if (mount_on_fd(fd, i == 0 ? source : NULL, steps[i].flags) != 0) {
            fprintf(stderr, "Error: bind-params: %s %s over " PARAMS_PATH " in %s: %s\n", steps[i].what, source, rootfs,
                    strerror(errno));
            return 1;
        }
    }
    return 0;
}

int cds_nshook_links(int rootfd, const char *rootfs, char **links, int count)
{
    char why[8400];
    if (cds_make_links(rootfd, rootfs, links, count, why, sizeof why) == 0)
        return 0;
    fprintf(stderr, "Error: symlinks: %s\n", why);
    return 1;
}

/* OPTIONS (a comma list) as mount(2) flags for the three steps runc takes: the bind (MS_BIND,
 * MS_REC), the propagation (MS_PRIVATE or MS_SLAVE, MS_REC), the remount (MS_RDONLY, MS_NOSUID,
 * MS_NODEV, MS_NOEXEC); -1 for an option we do not take or no bind at all. */
static int bind_options(const char *options, unsigned long flags[3])
{
    static const struct {
        const char *name;
        int step;
        unsigned long flags;
    } known[] = {
        {"bind", 0, MS_BIND},       {"rbind", 0, MS_BIND | MS_REC},
        {"private", 1, MS_PRIVATE}, {"rprivate", 1, MS_PRIVATE | MS_REC},
        {"slave", 1, MS_SLAVE},     {"rslave", 1, MS_SLAVE | MS_REC},
        {"ro", 2, MS_RDONLY},       {"nosuid", 2, MS_NOSUID},
        {"nodev", 2, MS_NODEV},     {"noexec", 2, MS_NOEXEC},
    };
    flags[0] = flags[1] = flags[2] = 0;
    const char *at = options;
    while (*at) {
        size_t len = strcspn(at, ",");
        size_t i = 0;
        while (i < sizeof known / sizeof known[0]
               && !(strlen(known[i].name) == len && strncmp(at, known[i].name, len) == 0))
            i++;
        if (i == sizeof known / sizeof known[0])
            return -1;
        if (known[i].step == 1 && flags[1] && flags[1] != known[i].flags)
            return -1; /* two propagations */
        flags[known[i].step] |= known[i].flags;
        at += len + (at[len] == ',');
    }
    if (flags[2])
        flags[2] |= MS_REMOUNT | MS_BIND;
    return flags[0] ? 0 : -1;
}

/* An O_PATH descriptor of DEST inside the root, followed there (as runc resolves a mount's
 * destination); made as an empty file (0755, parents 0755) where missing. -1 (reported). */
static int open_bind_target(int rootfd, const char *rootfs, char *dest)
{
    int fd = cds_inroot_open(rootfd, dest, O_PATH);
    if (fd < 0 && errno == ENOENT) {
        char *slash = strrchr(dest, '/');
        *slash = '\0';
        size_t failed_at = 0;
        int dirfd = slash == dest ? dup(rootfd) : cds_inroot_open_dirs(rootfd, dest, &failed_at);
        int err = errno;
        *slash = '/';
        if (dirfd < 0) {
            fprintf(stderr, "Error: binds: cannot make the directory of %s in %s (at %.*s): %s\n", dest, rootfs,
                    (int)failed_at, dest, strerror(err));
            return -1;
        }
        /* No process of the container runs yet: what is missing now stays missing. O_EXCL
         * keeps a link or FIFO put there since from being followed or opened. */
        int made = openat(dirfd, slash + 1, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0755);
        err = errno;
        close(dirfd);
        if (made < 0) {
            fprintf(stderr, "Error: binds: cannot make %s in %s: %s\n", dest, rootfs, strerror(err));
            return -1;
        }
        close(made);
        fd = cds_inroot_open(rootfd, dest, O_PATH | O_NOFOLLOW);
    }
    if (fd < 0) {
        fprintf(stderr, "Error: binds: cannot open %s in %s: %s\n", dest, rootfs, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || S_ISDIR(st.st_mode)) {
        close(fd);
        fprintf(stderr, "Error: binds: %s in %s is a directory: a file cannot be bound over it\n", dest, rootfs);
        return -1;
    }
    return fd;
}

/* Each --bind SOURCE DEST OPTIONS, in runc's steps: the bind on the resolved target, then the
 * propagation and the remount, each on DEST resolved anew (it now names the mount, not the
 * file under it). */
int cds_nshook_binds(int rootfd, const char *rootfs, char **binds, int count)
{
    static const char *const what[] = {"bind", "set the propagation of", "remount (with its options)"};
    for (int i = 0; i < count; i++) {
        const char *source = binds[3 * i], *options = binds[3 * i + 2];
        char *dest = binds[3 * i + 1];
        unsigned long flags[3];
        if (source[0] != '/' || dest[0] != '/' || dest[1] == '\0' || strstr(dest, "/../") || strstr(dest, "/./")
            || bind_options(options, flags) < 0) {
            fprintf(stderr,
                    "Error: binds: malformed --bind \"%s\" \"%s\" \"%s\": expected /SOURCE /DEST OPTIONS "
                    "(bind or rbind; any of ro,nosuid,nodev,noexec; private, rprivate, slave or rslave)\n",
                    source, dest, options);
            return 1;
        }
        for (int step = 0; step < 3; step++) {
            if (!flags[step])
                continue;
            int fd = step == 0 ? open_bind_target(rootfd, rootfs, dest) : cds_inroot_open(rootfd, dest, O_PATH);
            if (fd < 0) {
                if (step)
                    fprintf(stderr, "Error: binds: cannot open %s in %s again: %s\n", dest, rootfs, strerror(errno));
                return 1;
            }
            if (mount_on_fd(fd, step == 0 ? source : NULL, flags[step]) != 0) {
                fprintf(stderr, "Error: binds: cannot %s %s at %s in %s: %s\n", what[step], source, dest, rootfs,
                        strerror(errno));
                return 1;
            }
        }
    }
    return 0;
}

/* MODE (octal text) onto each of PATHS, as the toolkit's chmod hook (see the top). */
int cds_nshook_chmod(int rootfd, const char *rootfs, const char *mode_text, char **paths, int count)
{
    char *end;
    errno = 0;
    unsigned long mode = mode_text ? strtoul(mode_text, &end, 8) : 0;
    if (!mode_text || !*mode_text || *end || errno || mode > 07777) {
        fprintf(stderr, "Error: chmod: --mode \"%s\" is not an octal file mode\n", mode_text ? mode_text : "");
        return 1;
    }
    for (int i = 0; i < count; i++) {
        if (paths[i][0] != '/' || strstr(paths[i], "/../") || strstr(paths[i], "/./")) {
            fprintf(stderr, "Error: chmod: malformed --path \"%s\": expected an absolute path\n", paths[i]);
            return 1;
        }
        int fd = cds_inroot_open(rootfd, paths[i], O_PATH);
        struct stat st;
        if (fd < 0)
            continue; /* as the hook's os.Stat error: skipped */
        if (fstat(fd, &st) < 0 || (st.st_mode & 07777) == mode) {
            close(fd);
            continue;
        }
        char where[64];
        snprintf(where, sizeof where, "/proc/self/fd/%d", fd);
        int rc = chmod(where, (mode_t)mode), err = errno;
        close(fd);
        if (rc != 0 && err != EPERM) {
            fprintf(stderr, "Error: chmod: cannot change the mode of %s in %s: %s\n", paths[i], rootfs, strerror(err));
            return 1;
        }
    }
    return 0;
}
