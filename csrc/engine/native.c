#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "native.h"

#ifndef SYS_openat2
#define SYS_openat2 437
#endif

const char *cds_native_version(void) { return "1"; }

int cds_have_openat2(void)
{
    /* An invalid (zero-sized) open_how makes a supporting kernel answer EINVAL
     * without opening anything; an old kernel answers ENOSYS. */
    long rc = syscall(SYS_openat2, AT_FDCWD, ".", (void *)0, (size_t)0);
    if (rc >= 0) {
        close((int)rc);
        return 1;
    }
    return errno != ENOSYS;
}

void cds_keep_freed_heap(size_t bytes)
{
    /* Fixed thresholds (glibc then stops adapting them): blocks under BYTES come from the
     * heap, and up to BYTES of freed heap stay mapped. */
    mallopt(M_MMAP_THRESHOLD, (int)bytes);
    mallopt(M_TRIM_THRESHOLD, (int)bytes);
}
