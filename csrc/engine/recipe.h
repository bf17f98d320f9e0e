/* The recipes of the steps folder, written here from what a worker's step or injection did
 * (shim/linker/stepmemo.py, shim/runtime/requestmemo.py) and read by the replay (replay.c):
 * both formats are defined in recipe.c alone. */
#ifndef CDI_SHIM_RECIPE_H
#define CDI_SHIM_RECIPE_H

#include <stddef.h>
#include <stdint.h>

/* A file the step wrote: into the bundle (NAME: its name there), into the root or an /etc
 * overlay's layer (NAME: its path there). */
struct cds_recipe_file {
    const char *name, *data;
    size_t len;
    uint32_t mode;
};

/* A link the step made in the root: TARGET at PATH (normalized, absolute in the root). */
struct cds_recipe_link {
    const char *target, *path;
};

/* A mount the step bound at DESTINATION (JSON text): MOUNT, its JSON text with this container's
 * rootfs and bundle paths in it, or NULL for a mount it moved into its binds hook (dropped). */
struct cds_recipe_bind {
    const char *destination, *mount;
};

/* A read-only root's /etc overlay (shim/linker/etcfiles.py): a folder of its layer (PATH in the
 * bundle, made in order), a mount point in it for the bind at DESTINATION (JSON text; FOLDER: a
 * folder, else a file). */
struct cds_recipe_dir {
    const char *path;
    uint32_t uid, gid, mode;
};

struct cds_recipe_point {
    const char *destination;
    int folder;
};

/* A directory mount whose host folder the step's cache read: its INDEX in config.json's mounts
 * and its SOURCE (JSON text). */
struct cds_recipe_source {
    uint32_t index;
    const char *source;
};

/* What one kept step read and did (stepresult.StepResult), with the paths of the container it
 * ran for (ROOTFS, BUNDLE: left blank in the recipe for the next container's own). */
struct cds_step_recipe {
    const char *version, *rootfs, *bundle;
    const char *key; /* the config's step key (ociconf.h's cds_step_key) */
    size_t key_len;
    int params_state; /* the host's params file: 0 not read, 1 absent, 2 PARAMS (PARAMS_LEN bytes) */
    const char *params;
    size_t params_len;
    const char *paths; /* the entries it looked at (cds_memo_same's list), PATHS_LEN bytes */
    size_t paths_len;
    uint32_t count;
    const struct cds_identity *identities; /* COUNT, as a new container shows them */
    const struct cds_recipe_link *links;
    size_t n_links;
    const struct cds_recipe_file *files; /* into the bundle */
    size_t n_files;
    const char *programs; /* the changed hooks' programs, each NUL-terminated, PROGRAMS_LEN bytes */
    size_t programs_len;
    const char *hooks; /* config.json's hooks as the step left them: JSON text */
    const struct cds_recipe_bind *binds;
    size_t n_binds;
    const struct cds_recipe_file *roots; /* into the root */
    size_t n_roots;
    const char *etc_mount; /* the /etc overlay's mount (JSON text), or NULL: none, and no more etc_ */
    const struct cds_recipe_dir *etc_dirs;
    size_t n_etc_dirs;
    const struct cds_recipe_file *etc_files;
    size_t n_etc_files;
    uint32_t bundle_fs, rootfs_fs; /* the filesystems (statfs f_type) it made the overlay on */
    const struct cds_recipe_point *etc_points;
    size_t n_etc_points;
    const struct cds_recipe_source *sources;
    size_t n_sources;
};

/* Write R's recipe into STEPS_DIR (made 0700 if missing; else it must be a folder of ours no one
 * else may write), first of the recipe file of its key, before up to three other ways the step of
 * that key went in other roots (variants: two images of one config alternate). 0, or -1 with
 * errno. */
int cds_step_recipe_write(const char *steps_dir, const struct cds_step_recipe *r);

/* What one injection of a request read and did (shim/runtime/requestmemo.py). */
struct cds_request_recipe {
    const char *version;
    const char *key; /* the request's key (request.h's cds_request_key) */
    size_t key_len;
    const char *paths; /* the host paths the resolution read ('h' entries), PATHS_LEN bytes */
    size_t paths_len;
    uint32_t count;
    const struct cds_identity *identities;
    const char *devices; /* the devices injected, for the log */
    int stepped;         /* a step follows (its own recipe), else the injected text is config.json */
    const char *edits;   /* the edits record (cds_request_edits) */
    size_t edits_len;
};

/* Write R's recipe into STEPS_DIR, with the driver version file as it is now. 0, or -1. */
int cds_request_recipe_write(const char *steps_dir, const struct cds_request_recipe *r);

/* What a step left in a reused root (shim/linker/stepleft.py): COUNT memo entries (ENTRIES, each
 * NUL-terminated, ENTRIES_LEN bytes) and their IDENTITIES as the step left them, for the root
 * (DEV, INO), as a note in FOLDER (the steps folder's .left: made 0700 when missing; it and the
 * steps folder ours, no one else may write them). 0, or -1. */
int cds_left_write(const char *folder, const char *version, uint64_t dev, uint64_t ino, const char *entries,
                   size_t entries_len, size_t count, const struct cds_identity *identities);

/* The note of VERSION for the root (DEV, INO) in FOLDER, whole: its count of entries, with
 * *ENTRIES (*ENTRIES_LEN bytes) and *IDENTITIES (free both with cds_recipe_free); or -1. */
long cds_left_read(const char *folder, const char *version, uint64_t dev, uint64_t ino, char **entries,
                   size_t *entries_len, struct cds_identity **identities);

void cds_recipe_free(void *data);

#endif
