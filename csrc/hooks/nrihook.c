/* cdi-shim-nshook nri: the one createContainer hook of an NRI adjustment (shim/nri/nativehook.py),
 * in place of the toolkit's create-symlinks, chmod, enable-cuda-compat and update-ldcache hooks.
 *
 *   cdi-shim-nshook nri [--socket PATH] [--fallback PROGRAM] [--params FILE]
 *                       [--link TARGET::LINK]... [--chmod MODE:PATH]...
 *                       [--cuda-compat DRIVER:CUDA | --folder DIR]...
 *
 * runc runs it in the container's mount namespace after its mounts, before pivot_root, with the
 * OCI state on stdin (the rootfs: ocistate.c). In order: the links and the modes, here (what
 * `symlinks` and `chmod` do: csrc/engine/devlinks.c, every path resolved inside the rootfs) and,
 * with --params, FILE (the plugin's copy of the host's params with ModifyDeviceFiles: 0) bound
 * over the rootfs's /proc/driver/nvidia/params, as `bind-params` (disable-device-node-modification);
 * then, with folders or compat calls (enable-cuda-compat's host versions; both kept in their
 * order), the linker cache: the rootfs's descriptor, opened here where the mounts are, goes
 * over SOCKET (SCM_RIGHTS) to the NRI plugin, a process already running, which decides the
 * compat folder and writes the cache through it with the runtime's code (shim/nri/hookserver.py,
 * cache.py) and answers "ok" or the reason. No interpreter starts per container. When nothing
 * listens at SOCKET (the plugin restarting), PROGRAM (cdi-shim-hook) is exec'd for the cache:
 * `PROGRAM nri --rootfs DIR [--cuda-compat V | --folder DIR]...`, the same work in a process of
 * its own.
 * Errors: "Error: ..." on stderr, exit 1 (runc fails the create, naming the hook). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "../engine/devlinks.h"
#include "nrihook.h"
#include "ocistate.h"
#include "rootfs_ops.h"

#define MAX_ITEMS CDS_MAX_DEVICE_LINKS
#define MAX_REQUEST (256u << 10)
#define ANSWER_TIMEOUT 60          /* seconds: the plugin's cache work is bounded well below */
#define COMPAT_ITEM "cuda-compat:" /* a compat call's request item: "cuda-compat:DRIVER:CUDA" */

/* The cache's items in their order: a folder, or (compat set) an enable-cuda-compat call. */
struct cache_item {
    char *value;
    int compat;
};

static int nri_usage(void)
{
    fputs("usage: cdi-shim-nshook nri [--socket PATH] [--fallback PROGRAM] [--params FILE]\n"
          "                           [--link TARGET::LINK]... [--chmod MODE:PATH]...\n"
          "                           [--cuda-compat DRIVER:CUDA | --folder DIR]...\n",
          stderr);
    return 2;
}

/* "update-ldcache\0ITEM\0ITEM\0..." (a folder, or COMPAT_ITEM and the versions) and ROOTFD to
 * the plugin at SOCKET_PATH; its answer read to the end. 0 done, 1 refused (reported), -1
 * nobody there (errno). */
static int ask_plugin(const char *socket_path, int rootfd, const struct cache_item *items, int count)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(socket_path) >= sizeof addr.sun_path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    strcpy(addr.sun_path, socket_path);
    static char request[MAX_REQUEST];
    size_t used = 0;
    const char *verb = "update-ldcache";
    memcpy(request, verb, strlen(verb) + 1);
    used = strlen(verb) + 1;
    for (int i = 0; i < count; i++) {
        size_t prefix = items[i].compat ? strlen(COMPAT_ITEM) : 0, n = strlen(items[i].value) + 1;
        if (used + prefix + n > sizeof request) {
            fprintf(stderr, "Error: nri: the folders are over %u bytes\n", MAX_REQUEST);
            return 1;
        }
        memcpy(request + used, COMPAT_ITEM, prefix);
        memcpy(request + used + prefix, items[i].value, n);
        used += prefix + n;
    }
    int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0)
        return -1;
    if (connect(sock, (struct sockaddr *)&addr, sizeof addr) < 0) {
        int err = errno;
        close(sock);
        errno = err;
        return -1;
    }
    struct timeval limit = {.tv_sec = ANSWER_TIMEOUT};
    setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } control;
    memset(&control, 0, sizeof control);
    struct iovec iov = {.iov_base = request, .iov_len = used};
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf, .msg_controllen = sizeof control.buf};
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cmsg), &rootfd, sizeof(int));
    ssize_t sent = sendmsg(sock, &msg, MSG_NOSIGNAL);
    size_t total = sent > 0 ? (size_t)sent : 0;
    while (sent >= 0 && total < used) { /* the rest without the descriptor */
        sent = send(sock, request + total, used - total, MSG_NOSIGNAL);
        if (sent > 0)
            total += (size_t)sent;
    }
    if (sent < 0 && errno != EINTR) {
        fprintf(stderr, "Error: nri: cannot send to the NRI plugin at %s: %s\n", socket_path, strerror(errno));
        close(sock);
        return 1;
    }
    shutdown(sock, SHUT_WR);
    char answer[4096];
    size_t got = 0;
    ssize_t n;
    while (got < sizeof answer - 1
           && ((n = read(sock, answer + got, sizeof answer - 1 - got)) > 0 || (n < 0 && errno == EINTR)))
        if (n > 0)
            got += (size_t)n;
    int err = errno;
    close(sock);
    answer[got] = 0;
    if (got == 2 && memcmp(answer, "ok", 2) == 0)
        return 0;
    if (got == 0)
        fprintf(stderr, "Error: nri: no answer from the NRI plugin at %s%s%s\n", socket_path, err ? ": " : "",
                err ? strerror(err) : "");
    else
        fprintf(stderr, "Error: %s\n", answer);
    return 1;
}

/* PROGRAM nri --rootfs ROOTFS [--cuda-compat V | --folder DIR]... in place of this process (the
 * plugin is away). */
static int exec_fallback(const char *program, const char *rootfs, const struct cache_item *items, int count)
{
    static char *args[3 + 2 + 2 * MAX_ITEMS + 1];
    int n = 0;
    args[n++] = "cdi-shim-hook";
    args[n++] = "nri";
    args[n++] = "--rootfs";
    args[n++] = (char *)rootfs;
    for (int i = 0; i < count; i++) {
        args[n++] = items[i].compat ? "--cuda-compat" : "--folder";
        args[n++] = items[i].value;
    }
    args[n] = NULL;
    execv(program, args);
    fprintf(stderr, "Error: nri: cannot run %s: %s\n", program, strerror(errno));
    return 1;
}

static int chmod_entries(int rootfd, const char *rootfs, char **entries, int count)
{
    for (int i = 0; i < count; i++) {
        char mode[16];
        const char *colon = strchr(entries[i], ':');
        size_t len = colon ? (size_t)(colon - entries[i]) : 0;
        if (!colon || !len || len >= sizeof mode || !colon[1]) {
            fprintf(stderr, "Error: nri: malformed --chmod \"%s\": expected MODE:PATH\n", entries[i]);
            return 1;
        }
        memcpy(mode, entries[i], len);
        mode[len] = 0;
        char *path = (char *)colon + 1;
        if (cds_nshook_chmod(rootfd, rootfs, mode, &path, 1) != 0)
            return 1;
    }
    return 0;
}

int cds_nri_hook(int argc, char **argv)
{
    static char *links[MAX_ITEMS], *modes[MAX_ITEMS];
    static struct cache_item items[MAX_ITEMS];
    int nlinks = 0, nmodes = 0, nitems = 0;
    const char *socket_path = NULL, *fallback = NULL, *params = NULL;
    for (int i = 2; i < argc; i++) {
        const char *name = argv[i];
        if (i + 1 >= argc)
            return nri_usage();
        char *value = argv[++i];
        if (strcmp(name, "--socket") == 0 && value[0] == '/')
            socket_path = value;
        else if (strcmp(name, "--fallback") == 0 && value[0] == '/')
            fallback = value;
        else if (strcmp(name, "--params") == 0 && value[0] == '/')
            params = value;
        else if (strcmp(name, "--link") == 0 && nlinks < MAX_ITEMS)
            links[nlinks++] = value;
        else if (strcmp(name, "--chmod") == 0 && nmodes < MAX_ITEMS)
            modes[nmodes++] = value;
        else if (strcmp(name, "--folder") == 0 && nitems < MAX_ITEMS)
            items[nitems++] = (struct cache_item){.value = value, .compat = 0};
        else if (strcmp(name, "--cuda-compat") == 0 && nitems < MAX_ITEMS && strchr(value, ':'))
            items[nitems++] = (struct cache_item){.value = value, .compat = 1};
        else
            return nri_usage();
    }
    char why[4200];
    char *rootfs = cds_rootfs_from_state(0, why, sizeof why);
    if (rootfs == NULL) {
        fprintf(stderr, "Error: nri: %s\n", why);
        return 1;
    }
    int rc = 1;
    int rootfd = open(rootfs, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (rootfd < 0) {
        fprintf(stderr, "Error: nri: cannot open the rootfs %s: %s\n", rootfs, strerror(errno));
        goto out;
    }
    if ((nlinks && cds_nshook_links(rootfd, rootfs, links, nlinks)) || chmod_entries(rootfd, rootfs, modes, nmodes)
        || (params && cds_nshook_bind_params(rootfd, rootfs, params)))
        goto out;
    rc = 0;
    if (nitems) {
        rc = socket_path ? ask_plugin(socket_path, rootfd, items, nitems) : (errno = ENOENT, -1);
        if (rc < 0 && fallback) {
            close(rootfd);
            rootfd = -1;
            rc = exec_fallback(fallback, rootfs, items, nitems);
        } else if (rc < 0) {
            fprintf(stderr, "Error: nri: the NRI plugin is not at %s (%s) and no --fallback is given\n",
                    socket_path ? socket_path : "(no --socket)", strerror(errno));
            rc = 1;
        }
    }
out:
    if (rootfd >= 0)
        close(rootfd);
    free(rootfs);
    return rc;
}
