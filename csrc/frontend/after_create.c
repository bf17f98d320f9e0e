/* The last step of every path to runc: exec it, or, for a create whose device links can wait
 * (csrc/engine/devlinks.h: the /dev/dri/by-path links of a GPU with DRM nodes, which a hook
 * would make in runc's /dev), run `runc create` as our child, config.json without that hook,
 * and make the links ourselves in the created container's root (/proc/PID/root of its init,
 * which waits on its exec FIFO until `runc start`: nothing of the image has run). runc then
 * starts no hook process for them (docs/one-mount.md has what that saves).
 *
 * Only with --pid-file (containerd, Docker's and podman's shims give it): without it the init's
 * PID would cost a `runc state`, and the hook stays. The pid file is trusted only in a folder
 * nobody else can write (cds_private_dir_problem: each engine's state folder is one); in any
 * other the hook stays too, as whoever writes there could name another process. And the PID's
 * /proc/PID/root must be the container's root (root.path: same device and inode) before any
 * link is made. A failure after runc's create deletes the container (`runc delete --force`)
 * and fails the create, naming the link (or the PID), as the hook's failure would. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "frontend.h"
#include "../engine/cleanup.h"
#include "../engine/devlinks.h"
#include "../engine/inroot.h"

static double ms_since(const struct timespec *start)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - start->tv_sec) * 1e3 + (double)(now.tv_nsec - start->tv_nsec) / 1e6;
}

/* RUNTIME with ARGV as our child; its exit status (128 + a signal's number), or -1. */
static int run_child(const char *runtime, char **argv)
{
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        execv(runtime, argv);
        fprintf(stderr, "cdi-shim: cannot run the low-level runtime \"%s\": %s\n", runtime, strerror(errno));
        _exit(127);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The init's PID that runc wrote to PID_FILE; 0 when unreadable. */
static pid_t init_pid(const char *pid_file)
{
    char text[32];
    cleanup_fd int fd = open(pid_file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    ssize_t n = fd < 0 ? -1 : read(fd, text, sizeof text - 1);
    if (n <= 0)
        return 0;
    text[n] = '\0';
    char *end;
    long pid = strtol(text, &end, 10);
    return pid > 0 && end != text && (*end == '\0' || *end == '\n') ? (pid_t)pid : 0;
}

/* The links made in the root of the container whose init runc wrote to PID_FILE, once that
 * root is the container's (LINKS->root: same device and inode); 0, or -1 with why in WHY. */
static int make_container_links(const char *pid_file, struct cds_deferred_links *links, char *why, size_t cap)
{
    char root[64];
    pid_t pid = init_pid(pid_file);
    if (pid == 0) {
        snprintf(why, cap, "cannot read the container's PID from %s", pid_file);
        return -1;
    }
    snprintf(root, sizeof root, "/proc/%d/root", (int)pid);
    cleanup_fd int rootfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (rootfd < 0) {
        snprintf(why, cap, "cannot open %s: %s", root, strerror(errno));
        return -1;
    }
    struct stat got, want;
    if (fstat(rootfd, &got) != 0 || stat(links->root, &want) != 0 || got.st_dev != want.st_dev
        || got.st_ino != want.st_ino) {
        snprintf(why, cap, "%s names PID %d, whose root is not the container's root %s: no link made", pid_file,
                 (int)pid, links->root);
        return -1;
    }
    return cds_make_links(rootfd, "the container's root", links->link, links->count, why, cap);
}

/* Whether the folder of PID_FILE is one only root (or we) can write: 1, or 0 with why logged. */
static int pid_folder_trusted(const struct settings *set, const char *pid_file)
{
    char copy[4096], why[4400], message[4700];
    if (strlen(pid_file) >= sizeof copy)
        return 0;
    strcpy(copy, pid_file);
    if (cds_private_dir_problem(dirname(copy), why, sizeof why) == 0)
        return 1;
    snprintf(message, sizeof message,
             "cdi-shim: the pid file %s is in a folder others may write (%s): the device links are left to "
             "their hook",
             pid_file, why);
    info_line(set, message);
    return 0;
}

/* `runc [global options] delete --force ID`, after a create that failed past runc's part. */
static void delete_container(const char *runtime, char **argv, int command, const char *id)
{
    cleanup_free char **args = calloc((size_t)command + 4, sizeof(char *));
    if (!args)
        return;
    for (int i = 0; i < command; i++)
        args[i] = argv[i];
    args[command] = "delete";
    args[command + 1] = "--force";
    args[command + 2] = (char *)id;
    if (run_child(runtime, args) != 0)
        fprintf(stderr, "cdi-shim: container %s could not be deleted after its failed create\n", id);
}

/* Whether the device links of CREATE's config.json can wait until runc's create is done: then
 * config.json is rewritten without their hook (1), else left as it is (0). CONFIG, CONFIG_LEN:
 * its text as the caller has it, or NULL. */
static int links_wait(const struct settings *set, const struct create_line *create, const char *config, long config_len,
                      struct cds_deferred_links *links)
{
    if (!create || create->run || !create->pid_file || create->help || !create->id)
        return 0;
    /* (the caller's text says at no cost whether our hook is named at all) */
    if (config && !memmem(config, (size_t)config_len, CDS_NSHOOK_PROGRAM, strlen(CDS_NSHOOK_PROGRAM)))
        return 0;
    char path[4096];
    cleanup_free char *json = NULL;
    mode_t mode = 0;
    snprintf(path, sizeof path, "%s/config.json", create->bundle);
    long len = read_file_mode(path, MAX_CONFIG_JSON, &json, &mode);
    if (len <= 0 || cds_deferred_links(json, (size_t)len, create->bundle, links) != 1
        || !pid_folder_trusted(set, create->pid_file))
        return 0;
    cleanup_fd int bundlefd = open(create->bundle, O_PATH | O_DIRECTORY | O_CLOEXEC);
    return bundlefd >= 0
        && cds_write_at(bundlefd, "config.json", (const uint8_t *)links->config, links->config_len, mode, 0) == 0;
}

int exec_runtime_at(const struct settings *set, const char *runtime, char **argv, const struct create_line *create,
                    const char *config, long config_len)
{
    struct cds_deferred_links links = {0};
    if (!links_wait(set, create, config, config_len, &links)) {
        cds_deferred_links_free(&links);
        execv(runtime, argv);
        return -1;
    }

    int status = run_child(runtime, argv);
    if (status != 0) {
        cds_deferred_links_free(&links);
        if (status < 0)
            fprintf(stderr, "cdi-shim: cannot run the low-level runtime \"%s\": %s\n", runtime, strerror(errno));
        return status < 0 ? 127 : status;
    }
    struct timespec start;
    char why[8400], message[9000];
    clock_gettime(CLOCK_MONOTONIC, &start);
    int made = make_container_links(create->pid_file, &links, why, sizeof why);
    cds_deferred_links_free(&links);
    if (made != 0) {
        snprintf(message, sizeof message,
                 "cdi-shim: container %.200s: the device links: %s; the container was not created", create->id, why);
        report(message);
        delete_container(runtime, argv, create->runc_command, create->id);
        return 1;
    }
    snprintf(message, sizeof message,
             "cdi-shim: container %.200s: the device links made in the created container, no hook; "
             "phase=links took=%.2fms",
             create->id, ms_since(&start));
    debug_line(set, message);
    return 0;
}
