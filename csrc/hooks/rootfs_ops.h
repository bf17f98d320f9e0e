/* The work in the container's rootfs that cdi-shim-nshook's subcommands share (rootfs_ops.c):
 * each takes the rootfs open as ROOTFD (named ROOTFS in errors) and returns 0, or 1 (reported). */
#ifndef CDI_SHIM_ROOTFS_OPS_H
#define CDI_SHIM_ROOTFS_OPS_H

/* FILE bound read-only over the rootfs's /proc/driver/nvidia/params. */
int cds_nshook_bind_params(int rootfd, const char *rootfs, const char *source);
/* The links TARGET::LINK inside the rootfs. */
int cds_nshook_links(int rootfd, const char *rootfs, char **links, int count);
/* COUNT binds, three values each in BINDS: SOURCE (a host file), DEST (in the rootfs), OPTIONS
 * (a comma list: bind or rbind, ro, nosuid, nodev, noexec, [r]private, [r]slave), in runc's steps. */
int cds_nshook_binds(int rootfd, const char *rootfs, char **binds, int count);
/* MODE_TEXT (octal) onto each of PATHS inside the rootfs, as the toolkit's chmod hook. */
int cds_nshook_chmod(int rootfd, const char *rootfs, const char *mode_text, char **paths, int count);

#endif
