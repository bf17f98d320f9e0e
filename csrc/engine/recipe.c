/* The formats of the steps folder beside the resident socket, each written and read here alone:
 * a kept linker step's recipe (STEP_MAGIC, named by the FNV-1a of the config's step key in hex), a
 * request's injection (REQUEST_MAGIC, 'q' and the hash of the request's key), and, at the end,
 * the notes of what a step left in a reused root (LEFT_MAGIC, in .left/).
 *
 * A recipe is its magic, then u32-sized blocks, then the FNV-1a (64 bits) of all before it: one
 * changed or cut since it was written is refused whole. A step recipe holds the version and the
 * key, then its variants, newest first, each one block of blocks (the ways the step of that key
 * went in roots that differed: two images of one config): the params file as the step read it,
 * the paths it looked at and their identities, the links, the bundle files, the changed hooks'
 * programs, the hooks as it left them and the mounts it bound or moved (both JSON with the
 * rootfs and bundle left blank: \1 and \2), the files written into the root, a read-only root's
 * /etc overlay, and the directory mounts whose host folders its cache read. A request recipe
 * holds the version, the key, the host paths and identities, the driver version file's first
 * bytes, the devices (for the log), whether a step follows, and the edits (request.c).
 *
 * Recipes live in a folder of ours (0700) as files of ours (0600), written to a temp file and
 * renamed; the reader opens nothing through a link and takes nothing another user could have
 * written. At most MAX_RECIPES files, the oldest removed. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bytebuf.h"
#include "cleanup.h"
#include "inroot.h"
#include "memo_rules.h"
#include "ociconf.h"
#include "recipe_blocks.h"
#include "scan.h"
#include "recipe.h"

#define STEP_MAGIC "CDSSTEP7"
#define REQUEST_MAGIC "CDSREQ1"
#define MAX_RECIPE (8u << 20)
#define MAX_RECIPES 64
#define MAX_VARIANTS 4

static void put_u32(struct buffer *o, uint32_t value) { put(o, &value, 4); }

static void put_block(struct buffer *o, const void *data, size_t len)
{
    if (len > UINT32_MAX)
        o->failed = 1;
    put_u32(o, (uint32_t)len);
    put(o, data, len);
}

static void put_string(struct buffer *o, const char *text) { put(o, text, strlen(text) + 1); }

/* The block that O was built into, appended to TO (O freed). */
static void put_out(struct buffer *to, struct buffer *o)
{
    to->failed |= o->failed;
    put_block(to, o->data, o->len);
    free(o->data);
}

/* JSON TEXT with ROOTFS and BUNDLE blanked where a string holds them at its start or just after
 * a '=' or ':' in it (an overlay's lowerdir=A:B): ROOTFS (followed by the string's end, '/' or
 * ':') as \1, BUNDLE followed by '/' as \2. The replay writes the next container's in their
 * place (replay.c, out_template); both are plain paths, written as they are in JSON. */
static void put_marked(struct buffer *o, const char *text, const char *rootfs, const char *bundle)
{
    size_t len = strlen(text), rl = strlen(rootfs), bl = strlen(bundle);
    int in = 0, start = 0;
    for (size_t i = 0; i < len; i++) {
        if (start && rl && i + rl < len && memcmp(text + i, rootfs, rl) == 0 && strchr("\"/:", text[i + rl])) {
            put(o, "\1", 1);
            i += rl - 1;
            start = 0;
            continue;
        }
        if (start && bl && i + bl < len && memcmp(text + i, bundle, bl) == 0 && text[i + bl] == '/') {
            put(o, "\2", 1);
            i += bl - 1;
            start = 0;
            continue;
        }
        char c = text[i];
        start = in ? c == '=' || c == ':' : c == '"';
        if (in && c == '\\' && i + 1 < len) {
            put(o, text + i, 2);
            i++;
            continue;
        }
        if (c == '"')
            in = !in;
        put(o, &c, 1);
    }
}

static void put_files(struct buffer *o, const struct cds_recipe_file *files, size_t n)
{
    struct buffer block = {0};
    for (size_t i = 0; i < n; i++) {
        put_string(&block, files[i].name);
        put_u32(&block, files[i].mode);
        put_u32(&block, (uint32_t)files[i].len);
        put(&block, files[i].data, files[i].len);
        block.failed |= files[i].len > UINT32_MAX;
    }
    put_out(o, &block);
}

/* target NUL parent NUL name NUL, a link each (the parent "/" for one at the top). */
static void put_links(struct buffer *o, const struct cds_step_recipe *r)
{
    struct buffer block = {0};
    for (size_t i = 0; i < r->n_links; i++) {
        const char *path = r->links[i].path, *slash = strrchr(path, '/');
        put_string(&block, r->links[i].target);
        if (!slash || !slash[1])
            block.failed = 1;
        else if (slash == path)
            put(&block, "/", 2);
        else
            put(&block, path, (size_t)(slash - path)), put(&block, "", 1);
        put_string(&block, slash ? slash + 1 : "");
    }
    put_out(o, &block);
}

static void put_binds(struct buffer *o, const struct cds_step_recipe *r)
{
    struct buffer block = {0};
    for (size_t i = 0; i < r->n_binds; i++) {
        struct buffer mount = {0};
        put_block(&block, r->binds[i].destination, strlen(r->binds[i].destination));
        if (r->binds[i].mount)
            put_marked(&mount, r->binds[i].mount, r->rootfs, r->bundle);
        put_out(&block, &mount);
    }
    put_out(o, &block);
}

/* The overlay's folders, files, filesystems, mount and mount points (replay_etc.c); empty: none. */
static void put_etc(struct buffer *o, const struct cds_step_recipe *r)
{
    struct buffer etc = {0}, dirs = {0}, mount = {0}, points = {0};
    if (r->etc_mount) {
        for (size_t i = 0; i < r->n_etc_dirs; i++) {
            const struct cds_recipe_dir *d = &r->etc_dirs[i];
            put_string(&dirs, d->path);
            put_u32(&dirs, d->uid);
            put_u32(&dirs, d->gid);
            put_u32(&dirs, d->mode);
        }
        put_out(&etc, &dirs);
        put_files(&etc, r->etc_files, r->n_etc_files);
        uint32_t fs[2] = {r->bundle_fs, r->rootfs_fs};
        put_block(&etc, fs, sizeof fs);
        put_marked(&mount, r->etc_mount, r->rootfs, r->bundle);
        put_out(&etc, &mount);
        for (size_t i = 0; i < r->n_etc_points; i++) {
            put_block(&points, r->etc_points[i].destination, strlen(r->etc_points[i].destination));
            put(&points, r->etc_points[i].folder ? "\1" : "\0", 1);
        }
        put_out(&etc, &points);
    }
    put_out(o, &etc);
}

/* One variant of a step: its blocks in order (struct step_variant). */
static void put_variant(struct buffer *o, const struct cds_step_recipe *r)
{
    struct buffer params = {0}, hooks = {0}, sources = {0};
    put(&params, r->params_state == 0 ? "0" : r->params_state == 1 ? "1" : "2", 1);
    if (r->params_state == 2)
        put(&params, r->params, r->params_len);
    put_out(o, &params);
    put_block(o, r->paths, r->paths_len);
    put_block(o, &r->count, 4);
    put_block(o, r->identities, (size_t)r->count * sizeof *r->identities);
    put_links(o, r);
    put_files(o, r->files, r->n_files);
    put_block(o, r->programs, r->programs_len);
    put_marked(&hooks, r->hooks, r->rootfs, r->bundle);
    put_out(o, &hooks);
    put_binds(o, r);
    put_files(o, r->roots, r->n_roots);
    put_etc(o, r);
    for (size_t i = 0; i < r->n_sources; i++) {
        put_u32(&sources, r->sources[i].index);
        put_block(&sources, r->sources[i].source, strlen(r->sources[i].source));
    }
    put_out(o, &sources);
}

/* TEXT (LEN bytes): MAGIC, then the COUNT blocks into ORDER (*REST: the bytes after them, up to
 * the sum; NULL: none may follow); its last 8 bytes are the FNV-1a of all before them. */
static int parse_blocks(const char *text, size_t len, const char *magic, struct block *const *order, size_t count,
                        struct block *rest)
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
    if (rest) {
        rest->data = at;
        rest->len = (size_t)(end - at);
        return 0;
    }
    return at == end ? 0 : -1;
}

int cds_step_variant_next(struct block *rest, struct step_variant *v)
{
    struct block whole;
    const char *at = rest->data, *end = rest->data + rest->len;
    if (at == end)
        return 0;
    if (next_block(&at, end, &whole) < 0)
        return -1;
    rest->data = at;
    rest->len = (size_t)(end - at);
    struct block *const order[] = {&v->params,   &v->paths, &v->count, &v->identities, &v->links, &v->files,
                                   &v->programs, &v->hooks, &v->binds, &v->roots,      &v->etc,   &v->sources};
    at = whole.data;
    end = whole.data + whole.len;
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
        if (next_block(&at, end, order[i]) < 0)
            return -1;
    v->whole = whole;
    return at == end && v->count.len == 4 ? 1 : -1;
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

/* STEPS_DIR, a folder of ours no one else may write, opened (never through a link); MAKE: made
 * (0700) when missing. */
static int open_steps(const char *steps_dir, int make)
{
    if (make && mkdir(steps_dir, 0700) < 0 && errno != EEXIST)
        return -1;
    cleanup_fd int dirfd = open(steps_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (dirfd < 0 || fstat(dirfd, &st) < 0)
        return -1;
    if (st.st_uid != geteuid() || (st.st_mode & 022)) {
        errno = EPERM;
        return -1;
    }
    return cds_take_fd(&dirfd);
}

/* The recipe NAME in STEPS_DIR (read_private), or -1. */
static long read_recipe(const char *steps_dir, const char *name, char **out)
{
    cleanup_fd int dirfd = open_steps(steps_dir, 0);
    return dirfd < 0 ? -1 : read_private(dirfd, name, MAX_RECIPE, out);
}

static int same(const struct block *b, const void *data, size_t len)
{
    return b->len == len && memcmp(b->data, data, len) == 0;
}

int cds_step_recipe_read(const char *steps_dir, const uint8_t *key, size_t key_len, const char *version, char **text,
                         struct block *variants)
{
    char name[32];
    struct block found_version, found_key;
    struct block *const order[] = {&found_version, &found_key};
    snprintf(name, sizeof name, "%016llx", (unsigned long long)cds_fnv1a(key, key_len));
    long len = read_recipe(steps_dir, name, text);
    if (len < 0)
        return -1;
    if (parse_blocks(*text, (size_t)len, STEP_MAGIC, order, 2, variants) == 0
        && same(&found_version, version, strlen(version)) && same(&found_key, key, key_len))
        return 0;
    free(*text);
    *text = NULL;
    return -1;
}

int cds_request_recipe_read(const char *steps_dir, const uint8_t *key, size_t key_len, const char *version, char **text,
                            struct request_recipe *r)
{
    char name[24];
    struct block *const order[] = {&r->version, &r->key,     &r->paths, &r->count, &r->identities,
                                   &r->driver,  &r->devices, &r->step,  &r->edits};
    snprintf(name, sizeof name, "q%016llx", (unsigned long long)cds_fnv1a(key, key_len));
    long len = read_recipe(steps_dir, name, text);
    if (len < 0)
        return -1;
    if (parse_blocks(*text, (size_t)len, REQUEST_MAGIC, order, sizeof order / sizeof order[0], NULL) == 0
        && same(&r->version, version, strlen(version)) && same(&r->key, key, key_len) && r->count.len == 4)
        return 0;
    free(*text);
    *text = NULL;
    return -1;
}

/* A temp file of a writer that is gone (cds_write_at's ".NAME.cds-PID-N~", no such process). */
static int stale_temp(const char *name)
{
    const char *dot = strrchr(name, '.');
    char *end, proc[32];
    if (name[0] != '.' || !dot || strncmp(dot, ".cds-", 5) != 0)
        return 0;
    long pid = strtol(dot + 5, &end, 10);
    if (*end != '-' || pid <= 0 || pid == (long)getpid())
        return 0;
    snprintf(proc, sizeof proc, "/proc/%ld", pid);
    return access(proc, F_OK) < 0 && errno == ENOENT;
}

struct aged {
    char name[24];
    int64_t mtime;
};

static int newer_first(const void *a, const void *b)
{
    const struct aged *x = a, *y = b;
    return x->mtime > y->mtime ? -1 : x->mtime < y->mtime;
}

/* At most MAX_RECIPES recipes in the folder DIRFD, the newest; and no temp file of a writer
 * that is gone. */
static void prune(int dirfd)
{
    int fd = dup(dirfd);
    DIR *dir = fd < 0 ? NULL : fdopendir(fd);
    struct aged found[4 * MAX_RECIPES];
    size_t n = 0;
    if (!dir) {
        if (fd >= 0)
            close(fd);
        return;
    }
    for (struct dirent *entry; (entry = readdir(dir)) && n < sizeof found / sizeof found[0];) {
        struct stat st;
        if (stale_temp(entry->d_name))
            unlinkat(dirfd, entry->d_name, 0);
        else if (entry->d_name[0] != '.' && strlen(entry->d_name) < sizeof found[0].name
                 && fstatat(dirfd, entry->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
            snprintf(found[n].name, sizeof found[n].name, "%s", entry->d_name);
            found[n++].mtime = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
        }
    }
    closedir(dir);
    qsort(found, n, sizeof found[0], newer_first);
    for (size_t i = MAX_RECIPES; i < n; i++)
        unlinkat(dirfd, found[i].name, 0);
}

/* DATA and its sum as the recipe NAME in STEPS_DIR: a temp file of ours (0600, never through a
 * link) renamed over it (cds_write_at). 0, or -1 with errno. */
static int write_recipe(const char *steps_dir, const char *name, struct buffer *data)
{
    uint64_t sum = cds_fnv1a((const uint8_t *)data->data, data->len);
    put(data, &sum, 8);
    if (data->failed) {
        errno = ENOMEM;
        return -1;
    }
    cleanup_fd int dirfd = open_steps(steps_dir, 1);
    if (dirfd < 0 || cds_write_at(dirfd, name, (const uint8_t *)data->data, data->len, 0600, 0) < 0)
        return -1;
    prune(dirfd);
    return 0;
}

int cds_step_recipe_write(const char *steps_dir, const struct cds_step_recipe *r)
{
    struct buffer o = {0}, variant = {0};
    cleanup_free char *old = NULL;
    struct block rest = {0};
    struct step_variant v;
    char name[32];
    put(&o, STEP_MAGIC, strlen(STEP_MAGIC));
    put_block(&o, r->version, strlen(r->version));
    put_block(&o, r->key, r->key_len);
    put_variant(&variant, r);
    put_block(&o, variant.data, variant.len);
    o.failed |= variant.failed;
    /* then the variants the file held, newest first, less this one */
    int kept = 1;
    if (cds_step_recipe_read(steps_dir, (const uint8_t *)r->key, r->key_len, r->version, &old, &rest) == 0)
        while (kept < MAX_VARIANTS && cds_step_variant_next(&rest, &v) == 1)
            if (!same(&v.whole, variant.data, variant.len)) {
                put_block(&o, v.whole.data, v.whole.len);
                kept++;
            }
    free(variant.data);
    snprintf(name, sizeof name, "%016llx", (unsigned long long)cds_fnv1a((const uint8_t *)r->key, r->key_len));
    int done = write_recipe(steps_dir, name, &o);
    free(o.data);
    return done;
}

/* The driver version file as the resolution saw it: '0' (unreadable), or '1' and its first
 * CDS_DRIVER_VERSION_BYTES bytes (what the replay compares: replay.c, driver_unchanged). */
static void put_driver(struct buffer *o)
{
    const char *path = getenv(CDS_DRIVER_VERSION_FILE_ENV);
    char buf[CDS_DRIVER_VERSION_BYTES];
    size_t got = 0;
    cleanup_fd int fd = open(path && *path ? path : CDS_DRIVER_VERSION_FILE, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    while (fd >= 0 && got < sizeof buf) {
        ssize_t n = read(fd, buf + got, sizeof buf - got);
        if (n < 0) {
            put_block(o, "0", 1);
            return;
        }
        if (n == 0)
            break;
        got += (size_t)n;
    }
    if (fd < 0) {
        put_block(o, "0", 1);
        return;
    }
    put_u32(o, (uint32_t)got + 1);
    put(o, "1", 1);
    put(o, buf, got);
}

int cds_request_recipe_write(const char *steps_dir, const struct cds_request_recipe *r)
{
    struct buffer o = {0};
    char name[24];
    put(&o, REQUEST_MAGIC, strlen(REQUEST_MAGIC));
    put_block(&o, r->version, strlen(r->version));
    put_block(&o, r->key, r->key_len);
    put_block(&o, r->paths, r->paths_len);
    put_block(&o, &r->count, 4);
    put_block(&o, r->identities, (size_t)r->count * sizeof *r->identities);
    put_driver(&o);
    put_block(&o, r->devices, strlen(r->devices));
    put_block(&o, r->stepped ? "S" : "N", 1);
    put_block(&o, r->edits, r->edits_len);
    snprintf(name, sizeof name, "q%016llx", (unsigned long long)cds_fnv1a((const uint8_t *)r->key, r->key_len));
    int done = write_recipe(steps_dir, name, &o);
    free(o.data);
    return done;
}

/* The third format of the steps folder: what a step left in a reused root (shim/linker/stepleft.py),
 * a note in its .left folder named by the FNV-1a of "DEV:INO": LEFT_MAGIC, the version, the
 * root's device and inode (u64 each), the entries (each NUL-terminated) and their identities,
 * then the sum. Read back only of this version, this root, whole, from a file of ours in a folder
 * of ours inside another (the steps folder), neither of which anyone else may write. */
#define LEFT_MAGIC "CDSLEFT1"
#define MAX_NOTE (1u << 20)

static void note_name(uint64_t dev, uint64_t ino, char *name, size_t cap)
{
    char text[48];
    int len = snprintf(text, sizeof text, "%llu:%llu", (unsigned long long)dev, (unsigned long long)ino);
    snprintf(name, cap, "%016llx", (unsigned long long)cds_fnv1a((const uint8_t *)text, (size_t)len));
}

/* FOLDER opened when it and the folder above it are ours and no one else may write them; MAKE:
 * FOLDER made (0700) when missing. */
static int open_notes(const char *folder, int make)
{
    char parent[4096];
    const char *slash = strrchr(folder, '/');
    if (!slash || slash == folder || (size_t)(slash - folder) >= sizeof parent)
        return -1;
    snprintf(parent, sizeof parent, "%.*s", (int)(slash - folder), folder);
    cleanup_fd int above = open_steps(parent, 0);
    return above < 0 ? -1 : open_steps(folder, make);
}

int cds_left_write(const char *folder, const char *version, uint64_t dev, uint64_t ino, const char *entries,
                   size_t entries_len, size_t count, const struct cds_identity *identities)
{
    struct buffer o = {0};
    uint64_t root[2] = {dev, ino};
    char name[24];
    cleanup_fd int dirfd = open_notes(folder, 1);
    if (dirfd < 0)
        return -1;
    note_name(dev, ino, name, sizeof name);
    put(&o, LEFT_MAGIC, strlen(LEFT_MAGIC));
    put_block(&o, version, strlen(version));
    put_block(&o, root, sizeof root);
    put_block(&o, entries, entries_len);
    put_block(&o, identities, count * sizeof *identities);
    int done = write_recipe(folder, name, &o);
    free(o.data);
    return done;
}

long cds_left_read(const char *folder, const char *version, uint64_t dev, uint64_t ino, char **entries,
                   size_t *entries_len, struct cds_identity **identities)
{
    struct block found_version, found_root, found_entries, found_identities;
    struct block *const order[] = {&found_version, &found_root, &found_entries, &found_identities};
    uint64_t root[2] = {dev, ino};
    char name[24];
    cleanup_free char *text = NULL;
    cleanup_fd int dirfd = open_notes(folder, 0);
    note_name(dev, ino, name, sizeof name);
    long len = dirfd < 0 ? -1 : read_private(dirfd, name, MAX_NOTE, &text);
    if (len < 0 || parse_blocks(text, (size_t)len, LEFT_MAGIC, order, 4, NULL) < 0
        || !same(&found_version, version, strlen(version)) || !same(&found_root, root, sizeof root))
        return -1;
    size_t count = 0;
    for (size_t i = 0; i < found_entries.len; i++)
        count += found_entries.data[i] == '\0';
    if (found_identities.len != count * sizeof **identities
        || (found_entries.len && found_entries.data[found_entries.len - 1] != '\0'))
        return -1;
    *entries = malloc(found_entries.len + 1);
    *identities = malloc(found_identities.len + 1);
    if (!*entries || !*identities) {
        free(*entries);
        free(*identities);
        return -1;
    }
    memcpy(*entries, found_entries.data, found_entries.len);
    memcpy(*identities, found_identities.data, found_identities.len);
    *entries_len = found_entries.len;
    return (long)count;
}

void cds_recipe_free(void *data) { free(data); }
