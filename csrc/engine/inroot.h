/* In-root file access: paths resolved inside a directory tree (a container rootfs) as if
 * that tree were "/", never following a link out of it, never blocking on a FIFO.
 * Plain values and errno; no knowledge of containers beyond "a tree". */
#ifndef CDI_SHIM_INROOT_H
#define CDI_SHIM_INROOT_H

#include <stddef.h>
#include <stdint.h>

/* What fstat said, in fixed-size fields. */
struct cds_stat {
    uint64_t dev;
    uint64_t ino;
    uint64_t size;
    int64_t mtime_sec;
    int64_t mtime_nsec;
    uint32_t mode;
    uint32_t nlink;
};

enum {
    CDS_RESOLVE_AUTO = 0,    /* openat2(RESOLVE_IN_ROOT), the component walk where absent */
    CDS_RESOLVE_OPENAT2 = 1, /* openat2 only (ENOSYS where the kernel lacks it) */
    CDS_RESOLVE_WALK = 2     /* the O_NOFOLLOW component walk only */
};

/* Choose how paths are resolved (process-wide; tests use it to cover the fallback).
 * Returns the previous mode. */
int cds_inroot_set_mode(int mode);

/* Open PATH inside the tree at ROOTFD. OFLAGS are open(2) flags for the last component:
 * O_PATH, O_RDONLY, O_DIRECTORY, O_NOFOLLOW (do not follow a final symlink: ELOOP).
 * O_CLOEXEC and O_NOCTTY are always added, O_NONBLOCK for anything but O_PATH.
 * Absolute links and ".." resolve against ROOTFD and stop there; "magic" /proc links are
 * refused (ELOOP). Returns a descriptor, or -1 with errno. */
int cds_inroot_open(int rootfd, const char *path, int oflags);

/* The directory PATH (absolute, normalized) inside the tree at ROOTFD as an O_PATH
 * descriptor, missing directories made (mode 0755) in the directory held above each, nothing
 * followed out of the tree (a link where a directory is missing: EEXIST). -1 with errno on
 * failure, *FAILED_AT then the length of PATH's prefix that names what failed (the component
 * that could not be opened or made; all of PATH when it could not be opened for another
 * reason than a missing component). */
int cds_inroot_open_dirs(int rootfd, const char *path, size_t *failed_at);

/* The symbolic link NAME -> TARGET in the directory open at DIRFD (O_PATH will do), as the
 * toolkit's create-symlinks does it (`ln -sfn`): a link there already with TARGET as its text
 * is left (1); anything else that is not a directory -- a file, a device, another link -- is
 * replaced by a temporary link renamed over it, so the name never goes missing (0); a
 * directory: -1 with EISDIR, as rename(2) gives. NAME must be a plain name, no '/'. 0, 1 or
 * -1 with errno (the temporary link removed). */
int cds_link_at(int dirfd, const char *name, const char *target);

/* stat(2) of PATH inside the tree (FOLLOW: follow a final symlink, in the tree). 0 or -1. */
int cds_inroot_stat(int rootfd, const char *path, int follow, struct cds_stat *st);

/* fstat into a cds_stat. 0 or -1. */
int cds_fstat(int fd, struct cds_stat *st);

/* Read the whole regular file open at FD (from offset 0) into a new buffer (free with
 * cds_free). Refuses directories (EISDIR), anything else that is not a regular file
 * (EINVAL; *ST still says what it was) and files over MAX bytes (EFBIG), without reading.
 * 0 or -1. */
int cds_read_fd(int fd, size_t max, uint8_t **buf, size_t *len, struct cds_stat *st);

/* cds_inroot_open(O_RDONLY) + cds_read_fd. */
int cds_inroot_read(int rootfd, const char *path, size_t max, uint8_t **buf, size_t *len, struct cds_stat *st);

/* Open a host path given by a trusted caller for reading, without blocking on a FIFO. */
int cds_open_host(const char *path);

/* Write LEN bytes to NAME in the directory open at DIRFD: a temporary file beside it, then
 * rename(2) over NAME (NAME must be a plain name, no '/'). MODE is the new file's mode;
 * SYNC asks for fsync before the rename. 0 or -1 (the temporary file is removed). */
int cds_write_at(int dirfd, const char *name, const uint8_t *data, size_t len, uint32_t mode, int sync);

/* cds_write_at (no sync), unless NAME is that file already: a regular file (never a link) of
 * ours (uid and gid), with one name, MODE and those LEN bytes is left as it is, so its identity
 * and its directory's stay what a previous write of the same gave them (a root reused run after
 * run: shim/linker/stepmemo.py). 0 or -1. The one rule the step and the replay (replay.c) share. */
int cds_write_same_at(int dirfd, const char *name, const uint8_t *data, size_t len, uint32_t mode);

/* Directory listing: names and d_type values of the directory open at DIRFD (O_RDONLY;
 * read from its start, its offset is left at the end), "." and ".." left out. NAMES is one buffer of NUL-separated
 * names, TYPES one byte per name. Free both with cds_free. Returns the count or -1. */
long cds_list_dir(int dirfd, char **names, uint8_t **types, size_t *names_len);

void cds_free(void *p);

#endif
