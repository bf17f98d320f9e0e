/* The links of a create-symlinks hook under runc's /dev (the /dev/dri/by-path links of a GPU
 * with DRM nodes): made by cdi-shim-nshook when runc runs it as a createContainer hook, or by the
 * runtime front end itself once `runc create` has returned, in the created container's root,
 * with no hook process at all (csrc/frontend/after_create.c). In the cffi surface for the tests,
 * which read the rule as the front end does. */
#ifndef CDI_SHIM_DEVLINKS_H
#define CDI_SHIM_DEVLINKS_H

#include <stddef.h>

#include "memo_rules.h"

#define CDS_MAX_DEVICE_LINKS 1024

/* Make each link (TARGET::/ABSOLUTE/LINK, as create-symlinks' --link takes it) in the tree at
 * ROOTFD, missing parents made (0755), links in the tree followed inside it only; a link
 * already there with TARGET as its text left, anything else but a directory replaced
 * (cds_link_at). LINKS' strings are changed while read and restored. 0, or -1 with why, naming
 * the link and WHERE (the tree, for messages), in WHY (CAP bytes). */
int cds_make_links(int rootfd, const char *where, char **links, int count, char *why, size_t cap);

/* What a config.json's links look like once taken out of its hooks. */
struct cds_deferred_links {
    char *config; /* the config's text without that hook (malloc'd) */
    size_t config_len;
    char *text;  /* the links, NUL-separated (malloc'd) */
    char **link; /* COUNT pointers into TEXT (malloc'd) */
    int count;
    char *root; /* the container's root: root.path, resolved against the bundle (malloc'd) */
};

/* Whether the config.json in JSON can do without its cdi-shim-nshook symlinks hook, the links
 * then made after `runc create` in the created container's root, with nothing the container
 * can tell apart: the hook is the last createContainer hook, names an executable program, takes
 * only --link values (and --rootfs, the directory root.path names, relative to BUNDLE unless
 * absolute), each link lies in /dev and at or under
 * no other mount (runc makes a read-only tmpfs read-only after its hooks), /dev is a
 * read-write tmpfs mount, no readonlyPaths or maskedPaths entry lies at, in or above /dev,
 * and the container has no user namespace (a link made from the host would be owned by the
 * host's root there). Paths are compared as runc reads them, cleaned ("//" and "/./"
 * collapsed: "//dev" is the /dev mount); a mount destination or a readonlyPaths or
 * maskedPaths entry with a ".." part (or relative), or a link with a "." or ".." part, leaves
 * the hook in place. 1 with OUT filled (free it with cds_deferred_links_free), 0 when not (or a
 * string with an escape anywhere in what is read), -1 (ENOMEM). */
int cds_deferred_links(const char *json, size_t len, const char *bundle, struct cds_deferred_links *out);
void cds_deferred_links_free(struct cds_deferred_links *out);

/* Why the folder DIR (relative to the working directory unless absolute) cannot be trusted
 * with what root reads from it (the pid file runc writes for the front end): 1 with why in
 * WHY (CAP bytes), 0 when DIR and every folder above it, on the path as written and on the
 * path its links lead to, are owned by root or us and not writable by group or others (a
 * sticky one above DIR may be, like /tmp). The rule of cdi/safeio.py private_dir_problem. */
int cds_private_dir_problem(const char *dir, char *why, size_t cap);

#endif
