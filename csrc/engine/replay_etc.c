/* A read-only root's /etc overlay, replayed from a kept step's recipe as the step makes it
 * (shim/linker/etcfiles.py, etc_overlay): our layer's folders and files made afresh in the bundle,
 * the binds whose mount points it holds checked, the mount placed before any under /etc (replay.c).
 * The overlay is read-only (no upper folder): the container writes nothing into /etc. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "cleanup.h"
#include "inroot.h"
#include "memo_rules.h"
#include "replay_etc.h"

int cds_etc_parse(const struct block *etc, struct etc_overlay *e)
{
    memset(e, 0, sizeof *e);
    if (etc->len == 0)
        return 0;
    const char *at = etc->data, *end = etc->data + etc->len;
    struct block *order[] = {&e->dirs, &e->files, &e->fs, &e->mount, &e->points};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
        if (next_block(&at, end, order[i]) < 0)
            return -1;
    return at == end && e->fs.len == 8 && e->mount.len > 0 ? 0 : -1;
}

/* NAME in DIRFD removed with all in it, nothing followed (an earlier create's overlay folder);
 * -1 past DEPTH levels (the Python step, which removes any depth, then does it). */
static int remove_tree(int dirfd, const char *name, int depth)
{
    if (unlinkat(dirfd, name, 0) == 0 || errno == ENOENT)
        return 0;
    if (errno != EISDIR || depth == 0)
        return -1;
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *dir = fd < 0 ? NULL : fdopendir(fd);
    if (!dir) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    int failed = 0;
    for (struct dirent *entry; !failed && (entry = readdir(dir));)
        if (strcmp(entry->d_name, ".") != 0 && strcmp(entry->d_name, "..") != 0)
            failed = remove_tree(fd, entry->d_name, depth - 1);
    closedir(dir);
    return failed || unlinkat(dirfd, name, AT_REMOVEDIR) < 0 ? -1 : 0;
}

/* The overlay's folders and files made in the bundle as etc_overlay makes them: DIRS (path in
 * the bundle NUL, uid, gid, mode: u32 each) made afresh in order (the first removed with all
 * in it before), then FILES (path NUL, mode, length, bytes) written into their folder;
 * only on the filesystems the step made it on, and for paths the mount's options can carry. */
int cds_etc_make(int bundlefd, const char *rootfs, const char *bundle, const struct etc_overlay *e)
{
    if (e->mount.len == 0)
        return 0;
    uint32_t fs[2];
    struct statfs bundle_fs, rootfs_fs;
    memcpy(fs, e->fs.data, sizeof fs);
    if (strpbrk(rootfs, CDS_OVERLAY_UNSAFE) || strpbrk(bundle, CDS_OVERLAY_UNSAFE) || statfs(bundle, &bundle_fs) < 0
        || statfs(rootfs, &rootfs_fs) < 0 || (uint32_t)bundle_fs.f_type != fs[0] || (uint32_t)rootfs_fs.f_type != fs[1])
        return -1;
    const char *at = e->dirs.data, *end = e->dirs.data + e->dirs.len;
    if (at == end || remove_tree(bundlefd, at, 16) < 0)
        return -1;
    while (at < end) {
        size_t n = strnlen(at, (size_t)(end - at));
        uint32_t owner[3];
        if (at + n + 1 + sizeof owner > end)
            return -1;
        memcpy(owner, at + n + 1, sizeof owner);
        if (mkdirat(bundlefd, at, 0700) < 0 || fchownat(bundlefd, at, owner[0], owner[1], AT_SYMLINK_NOFOLLOW) < 0
            || fchmodat(bundlefd, at, owner[2], 0) < 0)
            return -1;
        at += n + 1 + sizeof owner;
    }
    at = e->files.data;
    end = e->files.data + e->files.len;
    struct file_entry f;
    while (at < end) {
        if (next_file(&at, end, &f) < 0)
            return -1;
        cleanup_free char *path = strdup(f.name);
        char *slash = path ? strrchr(path, '/') : NULL;
        if (!slash || slash == path || !slash[1])
            return -1;
        *slash = '\0';
        cleanup_fd int dirfd = openat(bundlefd, path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (dirfd < 0 || cds_write_at(dirfd, slash + 1, (const uint8_t *)f.data, f.len, f.mode, 0) < 0)
            return -1;
    }
    return 0;
}

/* Whether the source of each bind the overlay holds a mount point for (POINTS: a block, the
 * destination as JSON text, then 1 for a folder or 0 for a file) is still of that kind, for
 * every mount at that destination (etcfiles.py, etc_overlay): a mount point of the other kind
 * would fail runc's mount. */
int cds_etc_same_points(const struct etc_overlay *e, const char *json, const struct cds_oci_view *view,
                        const char *bundle)
{
    const char *at = e->points.data, *end = e->points.data + e->points.len;
    while (at < end) {
        struct block dest;
        if (next_block(&at, end, &dest) < 0 || at == end)
            return 0;
        int folder = *at++ == 1;
        for (size_t m = 0; m < view->n_mounts; m++) {
            const struct cds_oci_mount *mount = &view->mount[m];
            const struct cds_span *source = &mount->source;
            if (!mount->destination.end || mount->destination.end - mount->destination.start != dest.len
                || memcmp(json + mount->destination.start, dest.data, dest.len) != 0)
                continue;
            char path[4096];
            struct stat st;
            int len = source->end ? (int)(source->end - source->start - 2) : -1;
            const char *text = json + source->start + 1;
            if (len <= 0 || memchr(text, '\\', (size_t)len))
                return 0;
            int made = text[0] == '/' ? snprintf(path, sizeof path, "%.*s", len, text)
                                      : snprintf(path, sizeof path, "%s/%.*s", bundle, len, text);
            if (made < 0 || made >= (int)sizeof path || stat(path, &st) < 0 || !S_ISDIR(st.st_mode) != !folder)
                return 0;
        }
    }
    return 1;
}

int cds_etc_under(const char *dest, size_t len)
{
    if (memchr(dest, '\\', len))
        return -1;
    return len > 6 && memcmp(dest, "\"/etc/", 6) == 0;
}
