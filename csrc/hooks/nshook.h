/* The parts of cdi-shim-nshook its subcommands share (nshook.c, nrihook.c). */
#ifndef CDI_SHIM_NSHOOK_H
#define CDI_SHIM_NSHOOK_H

/* The links TARGET::LINK inside the rootfs (ROOTFD, named ROOTFS in errors): 0, or 1 (reported). */
int cds_nshook_links(int rootfd, const char *rootfs, char **links, int count);
/* MODE_TEXT (octal) onto each of PATHS inside the rootfs, as the toolkit's chmod hook: 0, or 1 (reported). */
int cds_nshook_chmod(int rootfd, const char *rootfs, const char *mode_text, char **paths, int count);
/* FILE bound read-only over the rootfs's /proc/driver/nvidia/params: 0, or 1 (reported). */
int cds_nshook_bind_params(int rootfd, const char *rootfs, const char *source);
/* `cdi-shim-nshook nri ...` (ARGV[1] is "nri"): nrihook.c. */
int cds_nri_hook(int argc, char **argv);

#endif
