/* The container's rootfs from the OCI state runc writes to a hook's stdin. */
#ifndef CDI_SHIM_OCISTATE_H
#define CDI_SHIM_OCISTATE_H

#include <stddef.h>

#define CDS_MAX_STATE (1u << 20)   /* bytes of state read from stdin */
#define CDS_MAX_CONFIG (64u << 20) /* bytes of config.json (the runtime's own bound) */

/* Read the OCI state from STATE_FD (to its end), then its bundle's config.json: the rootfs
 * (root.path, joined to the bundle when relative), malloc'd; NULL with the reason in WHY. */
char *cds_rootfs_from_state(int state_fd, char *why, size_t why_len);

#endif
