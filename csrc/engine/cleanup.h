/* __attribute__((cleanup)) helpers shared by the C sources (not part of the cffi surface). */
#ifndef CDI_SHIM_CLEANUP_H
#define CDI_SHIM_CLEANUP_H

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

static inline void cds_closep(int *fd)
{
    if (*fd >= 0) {
        int saved = errno;
        close(*fd);
        errno = saved;
    }
}

static inline void cds_freep(void *p) { free(*(void **)p); }

static inline void cds_closedirp(DIR **dir)
{
    if (*dir != NULL) {
        int saved = errno;
        closedir(*dir);
        errno = saved;
    }
}

#define cleanup_fd __attribute__((cleanup(cds_closep)))
#define cleanup_free __attribute__((cleanup(cds_freep)))
#define cleanup_dir __attribute__((cleanup(cds_closedirp)))

/* Hand a cleaned-up value over to the caller: the variable no longer owns it. */
static inline int cds_take_fd(int *fd)
{
    int value = *fd;
    *fd = -1;
    return value;
}

static inline void *cds_take_ptr(void *p)
{
    void *value = *(void **)p;
    *(void **)p = NULL;
    return value;
}

#endif
