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
 * This file is the command line; the work in the rootfs is rootfs_ops.c's (shared with nri,
 * nrihook.c).
 * Errors: "Error: ..." on stderr, exit 1 (runc then fails the create, naming the hook). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../engine/memo_rules.h"
#include "../engine/devlinks.h"

#ifndef CDS_VERSION
#define CDS_VERSION "unknown"
#endif
#include "nrihook.h"
#include "ocistate.h"
#include "rootfs_ops.h"

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
    if (rootfd < 0)
        fprintf(stderr, "Error: %s: cannot open the rootfs %s: %s\n", command, rootfs, strerror(errno));
    else if (params)
        rc = cds_nshook_bind_params(rootfd, rootfs, source);
    else if (binding)
        rc = cds_nshook_binds(rootfd, rootfs, binds, bound)
            || (source && cds_nshook_bind_params(rootfd, rootfs, source))
            || (count && cds_nshook_links(rootfd, rootfs, links, count));
    else if (modes)
        rc = cds_nshook_chmod(rootfd, rootfs, mode, links, count);
    else
        rc = cds_nshook_links(rootfd, rootfs, links, count);
    if (rootfd >= 0)
        close(rootfd);
    /* The state runc writes, read after the work: runc's writer is a goroutine of its own,
     * and waiting for it first would add its scheduling delay to every start. */
    if (from_state == NULL)
        drain_stdin();
    free(from_state);
    return rc;
}
