/* cdi-shim native helpers: plain values and errno, no CDI or OCI knowledge. */
#ifndef CDI_SHIM_NATIVE_H
#define CDI_SHIM_NATIVE_H

/* Version of the native library, bumped when its ABI changes. */
const char *cds_native_version(void);

/* 1 when the running kernel implements openat2(2) (needed for RESOLVE_IN_ROOT), else 0. */
int cds_have_openat2(void);

#endif
