/* The replay of a linker step a resident worker kept (its recipe: recipe.c, written from the
 * step's result by shim/linker/stepmemo.py): the same step again, from C, the one way a kept
 * step is applied. The front end replays it for a config.json someone else
 * injected (hooks, no request) without the round trip to the worker and its interpreter; a
 * worker replays it for the config it just injected from a request (shim/runtime/main.py).
 *
 * The worker writes a recipe per step key (csrc/engine/ociconf.h) into the steps directory
 * beside its socket: what the step read of the host (the params file's bytes), the identity
 * of every path it looked at (filememo.c's cds_memo_same), the links it made, the files it
 * wrote into the bundle, the programs of the hooks it changed, the hooks as it left them and
 * the mounts it bound or moved to its binds hook (the rootfs and bundle paths left blank: \1
 * and \2), and the files it wrote into the root (the linker cache and configuration); up to
 * four such variants, for roots that differed. The replay reads the recipe named by this
 * config's key, checks it is ours (owner, mode, version, the whole key), takes the first
 * variant whose paths and params file are as they were, then makes the links inside the
 * rootfs (never following anything out of it), writes the files there and into the bundle,
 * then config.json (temp file and rename). Any doubt or failure before config.json is renamed
 * leaves the work to the worker, which makes the same links and files again (both idempotent)
 * and says what is wrong. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cleanup.h"
#include "inroot.h"
#include "memo_rules.h"
#include "ociconf.h"
#include "replay.h"
#include "recipe_blocks.h"
#include "replay_etc.h"
#include "request.h"
#include "scan.h"

#define MAX_PARAMS (1u << 20)
#define PARAMS_PATH CDS_PARAMS_PATH
#define PARAMS_ENV "CDI_SHIM_NVIDIA_PARAMS" /* testing only, as in shim/linker/toolkit_hooks.py */

/* The host's params file as the step saw it: recorded state 0 (no such hook), 1 (absent),
 * 2 + its bytes. */
static int params_unchanged(const struct block *recorded)
{
    if (recorded->len < 1)
        return 0;
    if (recorded->data[0] == '0')
        return recorded->len == 1;
    const char *path = getenv(PARAMS_ENV);
    if (!path || !*path)
        path = PARAMS_PATH;
    cleanup_fd int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return errno == ENOENT && recorded->data[0] == '1' && recorded->len == 1;
    if (recorded->data[0] != '2')
        return 0;
    cleanup_free char *buf = malloc(MAX_PARAMS);
    size_t got = 0;
    if (!buf)
        return 0;
    for (;;) {
        ssize_t n = read(fd, buf + got, MAX_PARAMS - got);
        if (n < 0)
            return 0;
        if (n == 0 || (got += (size_t)n) == MAX_PARAMS)
            break;
    }
    return got == recorded->len - 1 && memcmp(buf, recorded->data + 1, got) == 0;
}

/* A path we can paste into JSON as it is and that Python's normpath leaves alone. */
static int plain_path(const char *p)
{
    if (p[0] != '/' || strstr(p, "//") || strstr(p, "/./") || strstr(p, "/../"))
        return 0;
    size_t len = strlen(p);
    if ((len > 1 && p[len - 1] == '/') || (len >= 2 && strcmp(p + len - 2, "/.") == 0)
        || (len >= 3 && strcmp(p + len - 3, "/..") == 0))
        return 0;
    for (; *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f || *p == '"' || *p == '\\')
            return 0;
    return 1;
}

/* LINKS: target NUL parent NUL name NUL, each made inside the root as the step makes it
 * (cds_link_at: what is there replaced, an identical link left). A folder's links come
 * together (a driver's thirty soname links): its descriptor serves the next ones too. */
static int make_links(int rootfd, const struct block *links)
{
    const char *at = links->data, *end = links->data + links->len, *held = NULL;
    cleanup_fd int dirfd = -1;
    while (at < end) {
        const char *target = at, *parent = target + strnlen(target, (size_t)(end - target)) + 1;
        if (parent >= end)
            return -1;
        const char *name = parent + strnlen(parent, (size_t)(end - parent)) + 1;
        if (name >= end)
            return -1;
        at = name + strnlen(name, (size_t)(end - name)) + 1;
        if (at > end)
            return -1;
        if (!held || strcmp(held, parent) != 0) {
            size_t failed_at;
            if (dirfd >= 0)
                close(dirfd);
            dirfd = cds_inroot_open_dirs(rootfd, parent, &failed_at);
            held = parent;
        }
        if (dirfd < 0 || cds_link_at(dirfd, name, target) < 0)
            return -1;
    }
    return 0;
}

/* FILES: file entries, each written into the bundle. */
static int write_files(int bundlefd, const struct block *files)
{
    const char *at = files->data, *end = files->data + files->len;
    struct file_entry f;
    while (at < end)
        if (next_file(&at, end, &f) < 0
            || cds_write_at(bundlefd, f.name, (const uint8_t *)f.data, f.len, f.mode, 0) < 0)
            return -1;
    return 0;
}

/* ROOTS: path NUL, mode (u32), length (u32), bytes; each written inside the root (its
 * directory resolved there, missing ones made; renamed over the name: a link there replaced,
 * never followed; one that holds exactly those bytes left as it is: cds_write_same_at), as the
 * step writes them (shim/linker/etcfiles.py, write_in_root). */
static int write_root_files(int rootfd, const struct block *roots)
{
    const char *at = roots->data, *end = roots->data + roots->len;
    struct file_entry f;
    while (at < end) {
        if (next_file(&at, end, &f) < 0)
            return -1;
        cleanup_free char *path = strdup(f.name);
        char *slash = path ? strrchr(path, '/') : NULL;
        if (!slash || path[0] != '/' || !slash[1])
            return -1;
        *slash = '\0';
        size_t failed_at;
        cleanup_fd int dirfd = slash == path ? dup(rootfd) : cds_inroot_open_dirs(rootfd, path, &failed_at);
        if (dirfd < 0 || cds_write_same_at(dirfd, slash + 1, (const uint8_t *)f.data, f.len, f.mode) < 0)
            return -1;
    }
    return 0;
}

/* SOURCES: the directory mounts whose host folders the step's cache read (u32 index, then a
 * block: the source as JSON text); each must be this config's mount at that index with that
 * source (the key holds a mount's source only where it names a library). */
static int same_sources(const struct block *sources, const char *json, const struct cds_oci_view *view)
{
    const char *at = sources->data, *end = sources->data + sources->len;
    while (at < end) {
        uint32_t index;
        struct block text;
        if ((size_t)(end - at) < 4)
            return 0;
        memcpy(&index, at, 4);
        at += 4;
        if (next_block(&at, end, &text) < 0 || index >= view->n_mounts)
            return 0;
        const struct cds_span *source = &view->mount[index].source;
        if (!source->end || source->end - source->start != text.len
            || memcmp(json + source->start, text.data, text.len) != 0)
            return 0;
    }
    return 1;
}

static int programs_there(const struct block *programs)
{
    const char *at = programs->data, *end = programs->data + programs->len;
    while (at < end) {
        size_t n = strnlen(at, (size_t)(end - at));
        if (at + n >= end || access(at, X_OK) < 0)
            return 0;
        at += n + 1;
    }
    return 1;
}

struct out {
    char *data;
    size_t len, cap;
};

static int out_put(struct out *o, const char *data, size_t len)
{
    if (o->len + len > o->cap) {
        size_t cap = (o->len + len) * 2;
        char *more = realloc(o->data, cap);
        if (!more)
            return -1;
        o->data = more;
        o->cap = cap;
    }
    memcpy(o->data + o->len, data, len);
    o->len += len;
    return 0;
}

/* TEMPLATE with \1 the rootfs and \2 the bundle (both plain paths: no escaping needed). */
static int out_template(struct out *o, const char *template, size_t len, const char *rootfs, const char *bundle)
{
    for (size_t i = 0; i < len; i++) {
        int failed = template[i] == '\1' ? out_put(o, rootfs, strlen(rootfs))
            : template[i] == '\2'        ? out_put(o, bundle, strlen(bundle))
                                         : out_put(o, template + i, 1);
        if (failed)
            return -1;
    }
    return 0;
}

/* OVERLAY (a mount template), once, before the mount at DEST (LEN bytes, NULL: the end) when
 * that is the first under /etc (etc_overlay's place for it). */
static int out_overlay(struct out *o, const struct block *overlay, int *placed, int *first, const char *dest,
                       size_t len, const char *rootfs, const char *bundle)
{
    if (*placed || overlay->len == 0)
        return 0;
    int under = dest ? cds_etc_under(dest, len) : 1;
    if (under <= 0)
        return under;
    *placed = 1;
    if ((!*first && out_put(o, ",", 1) < 0) || out_template(o, overlay->data, overlay->len, rootfs, bundle) < 0)
        return -1;
    *first = 0;
    return 0;
}

/* The mounts array: the config's own, less those at a destination the step binds or moved to
 * its binds hook, then the step's binds (BINDS: u32 length and the destination as JSON, u32
 * length and the mount; an empty mount for a moved one); a read-only root's /etc OVERLAY
 * before the first of them under /etc. */
static int out_mounts(struct out *o, const char *json, const struct cds_oci_view *view, const struct block *binds,
                      const struct block *overlay, const char *rootfs, const char *bundle)
{
    int first = 1, placed = 0;
    if (out_put(o, "[", 1) < 0)
        return -1;
    for (size_t m = 0; m < view->n_mounts; m++) {
        const struct cds_oci_mount *mount = &view->mount[m];
        size_t dlen = mount->destination.end - mount->destination.start;
        int bound = 0;
        const char *at = binds->data, *end = binds->data + binds->len;
        struct block dest, body;
        while (at < end && next_block(&at, end, &dest) == 0 && next_block(&at, end, &body) == 0)
            if (mount->destination.end && dest.len == dlen
                && memcmp(dest.data, json + mount->destination.start, dlen) == 0)
                bound = 1;
        if (bound)
            continue;
        if (out_overlay(o, overlay, &placed, &first, json + mount->destination.start, dlen, rootfs, bundle) < 0)
            return -1;
        if ((!first && out_put(o, ",", 1) < 0)
            || out_put(o, json + mount->whole.start, mount->whole.end - mount->whole.start) < 0)
            return -1;
        first = 0;
    }
    const char *at = binds->data, *end = binds->data + binds->len;
    struct block dest, body;
    while (at < end) {
        if (next_block(&at, end, &dest) < 0 || next_block(&at, end, &body) < 0)
            return -1;
        if (body.len == 0)
            continue; /* moved: bound by the hook */
        if (out_overlay(o, overlay, &placed, &first, dest.data, dest.len, rootfs, bundle) < 0
            || (!first && out_put(o, ",", 1) < 0) || out_template(o, body.data, body.len, rootfs, bundle) < 0)
            return -1;
        first = 0;
    }
    if (out_overlay(o, overlay, &placed, &first, NULL, 0, rootfs, bundle) < 0)
        return -1;
    return out_put(o, "]", 1);
}

/* The new config.json text: the hooks and mounts replaced, every other byte as it was. A config
 * without hooks (a request's injection that added none) gets the step's, if any, first in it. */
static int new_config(struct out *o, const char *json, size_t len, const struct cds_oci_view *view,
                      const struct step_variant *r, const struct etc_overlay *e, const char *rootfs, const char *bundle)
{
    struct cds_span hooks = view->hooks;
    int insert = hooks.end == 0, none = r->hooks.len == 4 && memcmp(r->hooks.data, "null", 4) == 0;
    if (insert) /* just inside the root object: it has members (mounts at least) */
        hooks.start = hooks.end = strspn(json, " \t\r\n") + 1;
    const struct cds_span *first = &hooks, *second = &view->mounts;
    if (second->start < first->start) {
        first = &view->mounts;
        second = &hooks;
    }
    const struct cds_span *spans[] = {first, second};
    size_t at = 0;
    for (int i = 0; i < 2; i++) {
        if (out_put(o, json + at, spans[i]->start - at) < 0)
            return -1;
        int failed;
        if (spans[i] != &hooks)
            failed = out_mounts(o, json, view, &r->binds, &e->mount, rootfs, bundle);
        else if (!insert)
            failed = out_template(o, r->hooks.data, r->hooks.len, rootfs, bundle);
        else if (none)
            failed = 0; /* none before, none after */
        else
            failed = out_put(o, "\"hooks\":", 8) < 0 || out_template(o, r->hooks.data, r->hooks.len, rootfs, bundle) < 0
                || out_put(o, ",", 1) < 0;
        if (failed)
            return -1;
        at = spans[i]->end;
    }
    return out_put(o, json + at, len - at);
}

static int write_config(int bundlefd, const struct out *o, mode_t mode)
{
    char temp[64];
    snprintf(temp, sizeof temp, ".config.json.cdi-shim.%d", (int)getpid()); /* shim/bundle.py's name */
    cleanup_fd int fd = openat(bundlefd, temp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    size_t done = 0;
    while (done < o->len) {
        ssize_t n = write(fd, o->data + done, o->len - done);
        if (n <= 0)
            break;
        done += (size_t)n;
    }
    if (done != o->len || fchmod(fd, mode & 07777) < 0 || renameat(bundlefd, temp, bundlefd, "config.json") < 0) {
        unlinkat(bundlefd, temp, 0);
        return -1;
    }
    return 0;
}

/* The rootfs of the config (root.path, a string without escapes, relative to BUNDLE unless
 * absolute) into ROOTFS (CAP bytes): 0, or -1 when it is not a plain path. */
static int rootfs_of(const char *json, const struct cds_oci_view *view, const char *bundle, char *rootfs, size_t cap)
{
    int root_len = (int)(view->root_path.end - view->root_path.start - 2);
    const char *root = json + view->root_path.start + 1;
    int made = root_len > 0 && root[0] == '/' ? snprintf(rootfs, cap, "%.*s", root_len, root)
                                              : snprintf(rootfs, cap, "%s/%.*s", bundle, root_len, root);
    return made < 0 || (size_t)made >= cap || !plain_path(rootfs) ? -1 : 0;
}

struct target {
    const char *json, *rootfs, *bundle;
    size_t len;
    const struct cds_oci_view *view;
    int rootfd, bundlefd;
    unsigned config_mode;
};

/* Variant V of a recipe, when it holds for T (the params file, the programs, the sources, the
 * overlay's mount points, every path's identity): its links and files made and config.json
 * written. 1 done, 0 it does not hold, -1 it held and a write failed (the worker does it all). */
static int apply_variant(const struct step_variant *v, const struct target *t)
{
    struct etc_overlay etc;
    uint32_t count;
    memcpy(&count, v->count.data, 4);
    if (cds_etc_parse(&v->etc, &etc) < 0 || v->identities.len != (size_t)count * sizeof(struct cds_identity)
        || !params_unchanged(&v->params) || !programs_there(&v->programs)
        || !same_sources(&v->sources, t->json, t->view) || !cds_etc_same_points(&etc, t->json, t->view, t->bundle))
        return 0;
    /* (the identities are copied out: the recipe's text need not be aligned) */
    cleanup_free char *ids = malloc(v->identities.len ? v->identities.len : 1);
    if (!ids)
        return 0;
    memcpy(ids, v->identities.data, v->identities.len);
    if (cds_memo_same(t->rootfd, v->paths.data, v->paths.len, count, (const struct cds_identity *)ids) != 1)
        return 0;
    struct out o = {0};
    int done = make_links(t->rootfd, &v->links) == 0 && write_root_files(t->rootfd, &v->roots) == 0
        && write_files(t->bundlefd, &v->files) == 0 && cds_etc_make(t->bundlefd, t->rootfs, t->bundle, &etc) == 0
        && new_config(&o, t->json, t->len, t->view, v, &etc, t->rootfs, t->bundle) == 0
        && write_config(t->bundlefd, &o, t->config_mode) == 0;
    free(o.data);
    return done ? 1 : -1;
}

int replay_step(const char *steps_dir, const char *bundle, const char *json, size_t len, unsigned config_mode,
                const char *version)
{
    struct cds_oci_view view;
    uint8_t *key;
    size_t key_len;
    cleanup_free char *text = NULL;
    struct block variants;
    struct step_variant v;
    char rootfs[4096];

    if (!plain_path(bundle) || cds_step_key(json, len, &key, &key_len) < 0)
        return 0;
    int ours = cds_step_recipe_read(steps_dir, key, key_len, version, &text, &variants) == 0;
    cds_step_key_free(key);
    if (!ours || cds_oci_view(json, len, &view) < 0)
        return 0;
    int done = 0;
    if (view.mounts.end && view.root_path.end && rootfs_of(json, &view, bundle, rootfs, sizeof rootfs) == 0) {
        cleanup_fd int rootfd = open(rootfs, O_PATH | O_DIRECTORY | O_CLOEXEC);
        cleanup_fd int bundlefd = open(bundle, O_PATH | O_DIRECTORY | O_CLOEXEC);
        struct target t = {json, rootfs, bundle, len, &view, rootfd, bundlefd, config_mode};
        while (done == 0 && rootfd >= 0 && bundlefd >= 0 && cds_step_variant_next(&variants, &v) == 1)
            done = apply_variant(&v, &t);
    }
    cds_oci_view_free(&view);
    return done == 1;
}

/* The driver version file as the resolution saw it (shim/driver_version.py reads 4 KiB). */
static int driver_unchanged(const struct block *recorded)
{
    const char *path = getenv(CDS_DRIVER_VERSION_FILE_ENV);
    char buf[CDS_DRIVER_VERSION_BYTES];
    size_t got = 0;
    if (!path || !*path)
        path = CDS_DRIVER_VERSION_FILE;
    cleanup_fd int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (recorded->len < 1 || fd < 0)
        return recorded->len == 1 && recorded->data[0] == '0' && fd < 0;
    while (got < sizeof buf) {
        ssize_t n = read(fd, buf + got, sizeof buf - got);
        if (n < 0)
            return recorded->len == 1 && recorded->data[0] == '0';
        if (n == 0)
            break;
        got += (size_t)n;
    }
    return recorded->data[0] == '1' && got == recorded->len - 1 && memcmp(buf, recorded->data + 1, got) == 0;
}

int replay_request(const char *steps_dir, const char *bundle, const char *json, size_t len, unsigned config_mode,
                   const char *version, const struct request_rules *rules, char *devices, size_t devices_cap)
{
    uint8_t *key;
    size_t key_len;
    if (cds_request_key(json, len, rules->prefixes, rules->prefixes_len, rules->device_env, rules->devices,
                        rules->devices_len, rules->settings, rules->settings_len, &key, &key_len)
        < 0)
        return 0;
    cleanup_free char *text = NULL;
    struct request_recipe r;
    int ours = cds_request_recipe_read(steps_dir, key, key_len, version, &text, &r) == 0;
    cds_request_free(key);
    if (!ours || !driver_unchanged(&r.driver))
        return 0;
    uint32_t count;
    memcpy(&count, r.count.data, 4);
    cleanup_free char *ids = malloc(r.identities.len ? r.identities.len : 1);
    cleanup_fd int hostfd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (!ids || hostfd < 0 || r.identities.len != (size_t)count * sizeof(struct cds_identity))
        return 0;
    memcpy(ids, r.identities.data, r.identities.len);
    if (cds_memo_same(hostfd, r.paths.data, r.paths.len, count, (const struct cds_identity *)ids) != 1)
        return 0;
    char *injected;
    size_t injected_len;
    if (cds_request_apply(json, len, (const uint8_t *)r.edits.data, r.edits.len, &injected, &injected_len) < 0)
        return 0;
    int done = 0;
    if (r.step.len == 1 && r.step.data[0] == 'S') {
        done = replay_step(steps_dir, bundle, injected, injected_len, config_mode, version);
    } else if (r.step.len == 1 && r.step.data[0] == 'N' && plain_path(bundle)) {
        /* a config with no hook of ours and no library mount: no step, config.json is the result */
        cleanup_fd int bundlefd = open(bundle, O_PATH | O_DIRECTORY | O_CLOEXEC);
        struct out o = {injected, injected_len, injected_len};
        done = bundlefd >= 0 && write_config(bundlefd, &o, config_mode) == 0;
    }
    cds_request_free(injected);
    if (done && devices_cap)
        snprintf(devices, devices_cap, "%.*s", (int)r.devices.len, r.devices.data);
    return done;
}
