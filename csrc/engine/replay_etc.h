/* A read-only root's /etc overlay in a kept step's replay (replay_etc.c; the step's own:
 * shim/linker/etcfiles.py, etc_overlay). */
#ifndef CDI_SHIM_REPLAY_ETC_H
#define CDI_SHIM_REPLAY_ETC_H

#include "ociconf.h"
#include "recipe_blocks.h"

/* A read-only root's /etc overlay (shim/linker/etcfiles.py, etc_overlay): its folders and
 * files in the bundle, the filesystems it was made on, its mount (read-only: no upper folder),
 * the binds whose mount points its files hold; mount.len 0: none. */
struct etc_overlay {
    struct block dirs, files, fs, mount, points;
};

/* The recipe's ETC block into E (all empty for none): 0, or -1 for a block cut or malformed. */
int cds_etc_parse(const struct block *etc, struct etc_overlay *e);

/* 1 when each bind E holds a mount point for still has a source of that kind in this config. */
int cds_etc_same_points(const struct etc_overlay *e, const char *json, const struct cds_oci_view *view,
                        const char *bundle);

/* E's folders and files made in the bundle (nothing for none): 0, or -1. */
int cds_etc_make(int bundlefd, const char *rootfs, const char *bundle, const struct etc_overlay *e);

/* Whether the JSON string DEST (LEN bytes, with its quotes) names a path under /etc as written; -1 for
 * one with an escape (the worker compares it decoded). */
int cds_etc_under(const char *dest, size_t len);

#endif
