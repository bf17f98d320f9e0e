/* cdi-shim-nshook: the createContainer hooks the runtime cannot do before runc, because their
 * work lies under a mount runc makes itself; runc runs them in the container's mount namespace
 * after its mounts and before pivot_root.
 *
 *   cdi-shim-nshook bind-params [--rootfs DIR] --source FILE
 *       binds FILE (the runtime's copy of the host's /proc/driver/nvidia/params with
 *       ModifyDeviceFiles: 0) read-only over DIR's /proc/driver/nvidia/params: the native form
 *       of the toolkit's disable-device-node-modification (runc refuses config.json mounts
 *       under /proc);
 *   cdi-shim-nshook symlinks [--rootfs DIR] --link TARGET::LINK...
 *       makes the links of a create-symlinks hook that lie under a mount (the toolkit's
 *       /dev/dri/by-path links, in the /dev runc mounts), parents made as needed; what is at
 *       LINK is replaced, an identical link left, a directory there an error (cds_link_at, as
 *       the toolkit's hook);
 *   cdi-shim-nshook binds [--rootfs DIR] --bind SOURCE DEST OPTIONS... [--params FILE]
 *                         [--link TARGET::LINK...]
 *       binds the host's regular files at DEST in DIR, in order, as runc binds config.json's
 *       file mounts: DEST resolved inside DIR (links followed there), missing parents (0755) and
 *       the file itself (0755) made, OPTIONS a comma list of bind or rbind, any of ro,
 *       nosuid, nodev, noexec, and one of private, rprivate, slave, rslave. The runtime moves
 *       a device's library mounts and its own files here (shim/linker/filebinds.py): runc
 *       spends several resolutions of its own on each file mount, this a few syscalls. With --params and --link, then what bind-params FILE and symlinks
 *       do (one hook start, not two or three, on a GPU node);
 *   cdi-shim-nshook chmod [--rootfs DIR] --mode OCTAL --path PATH...
 *       the toolkit's chmod hook for paths under a mount runc makes (`chmod --mode 755 --path
 *       /dev/dri`, in runc's /dev): each PATH resolved inside DIR (links followed there), one
 *       that cannot be resolved skipped, one of that mode already left, EPERM ignored, as
 *       nvidia-cdi-hook chmod does; the mode's sticky, setuid and setgid bits are kept (the
 *       toolkit's Go FileMode drops them).
 *
 * They run for every container start on a GPU node, so this is C: an exec and a few syscalls,
 * no interpreter start. DIR is the rootfs (root.path), where it still
 * is at that point: the runtime writes it into the args when it prepares config.json; without
 * it (a generated spec's hook, run by podman or plain runc) it comes from the OCI state on stdin
 * (its bundle's config.json: ocistate.c).
 *
 * The image is hostile: every path is resolved inside DIR (csrc/engine/inroot.c: no link leads
 * out of it). The params target must be a regular file; the mount names the resolved file
 * through /proc/self/fd, never the path again.
 * Errors: "Error: ..." on stderr, exit 1 (runc then fails the create, naming the hook). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../engine/memo_rules.h"
#include "../engine/devlinks.h"
#include "../engine/inroot.h"

#ifndef CDS_VERSION
#define CDS_VERSION "unknown"
#endif
#include "nshook.h"
#include "ocistate.h"

#define PARAMS_PATH CDS_PARAMS_PATH
#define MAX_LINKS CDS_MAX_DEVICE_LINKS

/* To stdout with status 0 when asked for (--help), else to stderr with status 2 (a wrong call). */
static int usage_to(FILE *out, int status)
{
    fputs("usage: cdi-shim-nshook bind-params [--rootfs DIR] --source FILE\n"
          "       cdi-shim-nshook symlinks [--rootfs DIR] --link TARGET::LINK...\n"
          "       cdi-shim-nshook binds [--rootfs DIR] --bind SOURCE DEST OPTIONS... [--params FILE]\n"
          "                             [--link TARGET::LINK...]\n"
          "       cdi-shim-nshook chmod [--rootfs DIR] --mode OCTAL --path PATH...\n"
          "       cdi-shim-nshook nri [--socket PATH] [--fallback PROGRAM] [--params FILE]\n"
          "                           [--link TARGET::LINK]... [--chmod MODE:PATH]... [--folder DIR]...\n"
          "  (OCI createContainer hooks, run by runc in the container's mount namespace: bind FILE\n"
          "   read-only over " PARAMS_PATH ", make links under a mount, or bind host files\n"
          "   at DEST with OPTIONS (bind or rbind, ro, nosuid, nodev, noexec, [r]private, [r]slave),\n"
          "   or chmod PATHs under runc's mounts; nri: an NRI adjustment's hook, links, modes and the\n"
          "   linker cache (written by the NRI plugin at SOCKET; else by PROGRAM);\n"
          "   every path resolved inside DIR, the rootfs; without --rootfs, the rootfs of the OCI\n"
          "   state on stdin)\n",
          out);
    return status;
}

static int usage(void) { return usage_to(stderr, 2); }

static int asks_help(const char *arg)
{
    return strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0 || strcmp(arg, "help") == 0;
}

/* runc writes the container's state to our stdin: read it (bounded) so its write never
 * meets a closed pipe, when the rootfs was given and nothing is needed from it. */
static void drain_stdin(void)
{
    char buf[4096];
    size_t total = 0;
    ssize_t n;
    while (total < CDS_MAX_STATE && ((n = read(0, buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR)))
        if (n > 0)
            total += (size_t)n;
}

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
static int bind_files(int rootfd, const char *rootfs, char **binds, int count)
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

int main(int argc, char **argv)
{
    if (argc < 2)
        return usage();
    if (asks_help(argv[1]) || (argc == 3 && asks_help(argv[2]))) /* --help, or COMMAND --help */
        return usage_to(stdout, 0);
    if (argc == 2 && strcmp(argv[1], "--version") == 0) {
        printf("cdi-shim-nshook version %s\n", CDS_VERSION);
        return 0;
    }
    if (strcmp(argv[1], "nri") == 0)
        return cds_nri_hook(argc, argv);
    const char *command = argv[1], *source = NULL;
    char *rootfs = NULL;
    char *links[MAX_LINKS]; /* --link values (chmod: --path values) */
    char *binds[MAX_LINKS]; /* three values a --bind */
    int count = 0, bound = 0;
    int params = strcmp(command, "bind-params") == 0, binding = strcmp(command, "binds") == 0;
    int modes = strcmp(command, "chmod") == 0;
    const char *mode = NULL;
    if (!params && !binding && !modes && strcmp(command, "symlinks") != 0)
        return usage();
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--rootfs") == 0 && i + 1 < argc)
            rootfs = argv[++i];
        else if (modes && strcmp(argv[i], "--mode") == 0 && i + 1 < argc && mode == NULL)
            mode = argv[++i];
        else if (modes && strcmp(argv[i], "--path") == 0 && i + 1 < argc && count < MAX_LINKS)
            links[count++] = argv[++i];
        else if (params && strcmp(argv[i], "--source") == 0 && i + 1 < argc)
            source = argv[++i];
        else if (binding && strcmp(argv[i], "--params") == 0 && i + 1 < argc && source == NULL)
            source = argv[++i];
        else if (!params && !modes && strcmp(argv[i], "--link") == 0 && i + 1 < argc && count < MAX_LINKS)
            links[count++] = argv[++i];
        else if (binding && strcmp(argv[i], "--bind") == 0 && i + 3 < argc && 3 * (bound + 1) <= MAX_LINKS) {
            binds[3 * bound] = argv[i + 1], binds[3 * bound + 1] = argv[i + 2], binds[3 * bound + 2] = argv[i + 3];
            bound++;
            i += 3;
        } else
            return usage();
    }
    if ((rootfs != NULL && rootfs[0] != '/') || (params && source == NULL) || (source != NULL && source[0] != '/')
        || (!params && !binding && !count) || (binding && !bound) || (modes && mode == NULL))
        return usage();
    char *from_state = NULL;
    if (rootfs == NULL) {
        char why[4200];
        rootfs = from_state = cds_rootfs_from_state(0, why, sizeof why);
        if (rootfs == NULL) {
            fprintf(stderr, "Error: %s: %s\n", command, why);
            return 1;
        }
    }

    int rootfd = open(rootfs, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = 1;
    if (rootfd < 0) {
        fprintf(stderr, "Error: %s: cannot open the rootfs %s: %s\n", command, rootfs, strerror(errno));
    } else {
        rc = params ? cds_nshook_bind_params(rootfd, rootfs, source)
            : binding
            ? bind_files(rootfd, rootfs, binds, bound) || (source && cds_nshook_bind_params(rootfd, rootfs, source))
                || (count && cds_nshook_links(rootfd, rootfs, links, count))
            : modes ? cds_nshook_chmod(rootfd, rootfs, mode, links, count)
                    : cds_nshook_links(rootfd, rootfs, links, count);
        close(rootfd);
    }
    /* The state runc writes, read after the work: runc's writer is a goroutine of its own,
     * and waiting for it first would add its scheduling delay to every start. */
    if (from_state == NULL)
        drain_stdin();
    free(from_state);
    return rc;
}
