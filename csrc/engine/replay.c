/* The replay of a linker step a resident worker kept (shim/linker/stepmemo.py, export_recipe):
 * the same step again, from C. The front end replays it for a config.json someone else
 * injected (hooks, no request) without the round trip to the worker and its interpreter; a
 * worker replays it for the config it just injected from a request (shim/runtime/main.py).
 *
 * The worker writes a recipe per step key (csrc/engine/ociconf.h) into the steps directory
 * beside its socket: what the step read of the host (the params file's bytes), the identity
 * of every path it looked at (filememo.c's cds_memo_same), the links it made, the files it
 * wrote into the bundle, the programs of the hooks it changed, the hooks as it left them and
 * the mounts it bound or moved to its binds hook (the rootfs and bundle paths left blank: \1
 * and \2), and the files it wrote into the root (the linker cache and configuration). The
 * replay reads the recipe named by this config's key, checks it is ours (owner, mode, version,
 * the whole key), checks every path and the params file, then makes the links inside the
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
#include "replay_etc.h"
#include "request.h"
#include "scan.h"

#define RECIPE_MAGIC "CDSSTEP6"
#define REQUEST_MAGIC "CDSREQ1"
#define DRIVER_VERSION_BYTES 4096
#define MAX_RECIPE (8u << 20)
#define MAX_PARAMS (1u << 20)
#define PARAMS_PATH CDS_PARAMS_PATH
#define PARAMS_ENV "CDI_SHIM_NVIDIA_PARAMS" /* testing only, as in shim/linker/toolkit_hooks.py */

struct recipe {
    struct block version, key, params, paths, count, identities, links, files, programs, hooks, binds, roots, etc,
        sources;
};

/* TEXT (LEN bytes): MAGIC, then the COUNT blocks into ORDER; its last 8 bytes are the FNV-1a of
 * all before them (a recipe changed or cut since it was written is refused as a whole). */
static int parse_blocks(const char *text, size_t len, const char *magic, struct block *const *order, size_t count)
{
    size_t magic_len = strlen(magic);
    uint64_t sum;
    if (len < magic_len + 8 || memcmp(text, magic, magic_len) != 0)
        return -1;
    len -= 8;
    memcpy(&sum, text + len, 8);
    if (sum != cds_fnv1a((const uint8_t *)text, len))
        return -1;
    const char *at = text + magic_len, *end = text + len;
    for (size_t i = 0; i < count; i++)
        if (next_block(&at, end, order[i]) < 0)
            return -1;
    return at == end ? 0 : -1;
}

static int parse_recipe(const char *text, size_t len, struct recipe *r)
{
    struct block *const order[] = {&r->version,    &r->key,   &r->params, &r->paths,    &r->count,
                                   &r->identities, &r->links, &r->files,  &r->programs, &r->hooks,
                                   &r->binds,      &r->roots, &r->etc,    &r->sources};
    return parse_blocks(text, len, RECIPE_MAGIC, order, sizeof order / sizeof order[0]);
}

/* A file of ours: a regular file (never a link) owned by us, not writable by others, read
 * whole (cds_read_fd) into *OUT. Its length, or -1. */
static long read_private(int dirfd, const char *name, size_t limit, char **out)
{
    cleanup_fd int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    struct stat owner;
    struct cds_stat st;
    uint8_t *data;
    size_t len;
    if (fd < 0 || fstat(fd, &owner) < 0 || owner.st_uid != geteuid() || (owner.st_mode & 022)
        || cds_read_fd(fd, limit, &data, &len, &st) < 0)
        return -1;
    *out = (char *)data;
    return (long)len;
}

/* The recipe NAME in STEPS_DIR, a directory of ours no one else may write (read_private). */
static long read_recipe(const char *steps_dir, const char *name, char **out)
{
    cleanup_fd int dirfd = open(steps_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (dirfd < 0 || fstat(dirfd, &st) < 0 || st.st_uid != geteuid() || (st.st_mode & 022))
        return -1;
    return read_private(dirfd, name, MAX_RECIPE, out);
}

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
                      const struct recipe *r, const struct etc_overlay *e, const char *rootfs, const char *bundle)
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

int replay_step(const char *steps_dir, const char *bundle, const char *json, size_t len, unsigned config_mode,
                const char *version)
{
    struct cds_oci_view view;
    uint8_t *key;
    size_t key_len;
    char name[32];

    if (!plain_path(bundle) || cds_step_key(json, len, &key, &key_len) < 0)
        return 0;
    snprintf(name, sizeof name, "%016llx", (unsigned long long)cds_fnv1a(key, key_len));
    cleanup_free char *text = NULL;
    long text_len = read_recipe(steps_dir, name, &text);
    struct recipe r;
    struct etc_overlay etc;
    int ours = text_len >= 0 && parse_recipe(text, (size_t)text_len, &r) == 0 && cds_etc_parse(&r.etc, &etc) == 0
        && r.version.len == strlen(version) && memcmp(r.version.data, version, r.version.len) == 0
        && r.key.len == key_len && memcmp(r.key.data, key, key_len) == 0;
    cds_step_key_free(key);
    if (!ours || r.count.len != 4 || cds_oci_view(json, len, &view) < 0)
        return 0;
    int done = 0;
    struct out o = {0};
    char rootfs[4096];
    uint32_t count;
    memcpy(&count, r.count.data, 4);
    if (view.mounts.end == 0 || view.root_path.end == 0
        || r.identities.len != (size_t)count * sizeof(struct cds_identity))
        goto out;
    /* root.path (a string without escapes), relative to the bundle unless absolute */
    int root_len = (int)(view.root_path.end - view.root_path.start - 2);
    const char *root = json + view.root_path.start + 1;
    int made = root_len > 0 && root[0] == '/' ? snprintf(rootfs, sizeof rootfs, "%.*s", root_len, root)
                                              : snprintf(rootfs, sizeof rootfs, "%s/%.*s", bundle, root_len, root);
    if (made < 0 || made >= (int)sizeof rootfs || !plain_path(rootfs) || !params_unchanged(&r.params)
        || !programs_there(&r.programs) || !same_sources(&r.sources, json, &view)
        || !cds_etc_same_points(&etc, json, &view, bundle))
        goto out;
    {
        cleanup_fd int rootfd = open(rootfs, O_PATH | O_DIRECTORY | O_CLOEXEC);
        cleanup_fd int bundlefd = open(bundle, O_PATH | O_DIRECTORY | O_CLOEXEC);
        /* (the identities are copied out: the recipe's text need not be aligned) */
        cleanup_free char *ids = malloc(r.identities.len ? r.identities.len : 1);
        if (rootfd < 0 || bundlefd < 0 || !ids)
            goto out;
        memcpy(ids, r.identities.data, r.identities.len);
        if (cds_memo_same(rootfd, r.paths.data, r.paths.len, count, (const struct cds_identity *)ids) != 1
            || make_links(rootfd, &r.links) < 0 || write_root_files(rootfd, &r.roots) < 0
            || write_files(bundlefd, &r.files) < 0 || cds_etc_make(bundlefd, rootfs, bundle, &etc) < 0
            || new_config(&o, json, len, &view, &r, &etc, rootfs, bundle) < 0
            || write_config(bundlefd, &o, config_mode) < 0)
            goto out;
        done = 1;
    }
out:
    free(o.data);
    cds_oci_view_free(&view);
    return done;
}

/* A request's recipe (shim/runtime/requestmemo.py): the key, the host paths whose identities the
 * resolution depended on (the spec directories and files, the files the edits need), the driver
 * version file as it was ('0': unreadable; '1' and its first bytes), the devices (for the log),
 * whether a step follows ('S': the step's recipe for the injected text; 'N': none, the injected
 * text is config.json), and the edits (request.c). */
struct request_recipe {
    struct block version, key, paths, count, identities, driver, devices, step, edits;
};

static int parse_request_recipe(const char *text, size_t len, struct request_recipe *r)
{
    struct block *const order[] = {&r->version, &r->key,     &r->paths, &r->count, &r->identities,
                                   &r->driver,  &r->devices, &r->step,  &r->edits};
    return parse_blocks(text, len, REQUEST_MAGIC, order, sizeof order / sizeof order[0]);
}

/* The driver version file as the resolution saw it (shim/driver_version.py reads 4 KiB). */
static int driver_unchanged(const struct block *recorded)
{
    const char *path = getenv(CDS_DRIVER_VERSION_FILE_ENV);
    char buf[DRIVER_VERSION_BYTES];
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
    char name[24];
    if (cds_request_key(json, len, rules->prefixes, rules->prefixes_len, rules->device_env, rules->devices,
                        rules->devices_len, rules->settings, rules->settings_len, &key, &key_len)
        < 0)
        return 0;
    snprintf(name, sizeof name, "q%016llx", (unsigned long long)cds_fnv1a(key, key_len));
    cleanup_free char *text = NULL;
    long text_len = read_recipe(steps_dir, name, &text);
    struct request_recipe r;
    int ours = text_len >= 0 && parse_request_recipe(text, (size_t)text_len, &r) == 0
        && r.version.len == strlen(version) && memcmp(r.version.data, version, r.version.len) == 0
        && r.key.len == key_len && memcmp(r.key.data, key, key_len) == 0 && r.count.len == 4;
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
