/* cdi-shim native helpers: plain values and errno, no CDI or OCI knowledge. */
#ifndef CDI_SHIM_NATIVE_H
#define CDI_SHIM_NATIVE_H

#include <stddef.h>

/* Version of the native library, bumped when its ABI changes. */
const char *cds_native_version(void);

/* 1 when the running kernel implements openat2(2) (needed for RESOLVE_IN_ROOT), else 0. */
int cds_have_openat2(void);

/* Keep up to BYTES of freed heap mapped instead of giving it back to the kernel after each
 * large free (mallopt M_TRIM_THRESHOLD and M_MMAP_THRESHOLD): process-wide. */
void cds_keep_freed_heap(size_t bytes);

#endif
