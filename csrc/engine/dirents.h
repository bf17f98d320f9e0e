/* Reading a directory with getdents64 on the caller's descriptor (not part of the cffi
 * surface). readdir(3) needs its own descriptor (fdopendir: a reopen, an fstat, two fcntl
 * and a close per listing); this reads from the start of DIRFD and leaves its offset at
 * the end, which is all our callers need. "." and ".." are left out. */
#ifndef CDI_SHIM_DIRENTS_H
#define CDI_SHIM_DIRENTS_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define CDS_DIRENTS_BUF 65536u /* a 1,000-name library directory in one call */

struct cds_dirent64 { /* the kernel's struct linux_dirent64 */
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

struct cds_dirents {
    int fd;
    char *buf;
    long len, pos;
};

/* 0, or -1 with errno (EBADF for a descriptor that cannot be read, like O_PATH). */
static inline int cds_dirents_open(struct cds_dirents *d, int dirfd)
{
    d->fd = dirfd;
    d->len = d->pos = 0;
    d->buf = NULL;
    if (lseek(dirfd, 0, SEEK_SET) < 0)
        return -1;
    d->buf = malloc(CDS_DIRENTS_BUF);
    return d->buf == NULL ? -1 : 0;
}

/* The next entry (NAME, TYPE), 1; 0 at the end; -1 with errno. */
static inline int cds_dirents_next(struct cds_dirents *d, const char **name, unsigned char *type)
{
    for (;;) {
        if (d->pos >= d->len) {
            long n = syscall(SYS_getdents64, d->fd, d->buf, CDS_DIRENTS_BUF);
            if (n < 0)
                return -1;
            if (n == 0)
                return 0;
            d->len = n;
            d->pos = 0;
        }
        const struct cds_dirent64 *e = (const struct cds_dirent64 *)(d->buf + d->pos);
        d->pos += e->d_reclen;
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        *name = e->d_name;
        *type = e->d_type;
        return 1;
    }
}

static inline void cds_dirents_close(struct cds_dirents *d)
{
    free(d->buf);
    d->buf = NULL;
}

#endif
