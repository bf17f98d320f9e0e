/* The links of a create-symlinks hook under runc's /dev: see devlinks.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "devlinks.h"
#include "inroot.h"
#include "json_reader.h"

/* A descriptor of directory PATH (absolute, no "." or ".." parts) inside the root, made
 * (0755) where missing, as the hook's MkdirAll does; -1 with errno. PATH is changed while
 * walked, and restored. */
static int open_dir_made(int rootfd, char *path)
{
    int fd = dup(rootfd);
    char *part = path;
    while (fd >= 0 && *part) {
        while (*part == '/')
            part++;
        if (!*part)
            break;
        char *end = strchr(part, '/');
        if (end)
            *end = '\0';
        int child = openat(fd, part, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (child < 0 && errno == ENOENT && mkdirat(fd, part, 0755) == 0)
            child = openat(fd, part, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (child < 0 && errno == ENOTDIR) {
            /* a link in the image: follow it, inside the root only */
            char sofar[4096];
            snprintf(sofar, sizeof sofar, "%.*s", (int)(end ? end - path : (long)strlen(path)), path);
            child = cds_inroot_open(rootfd, sofar, O_PATH | O_DIRECTORY);
        }
        int err = errno;
        close(fd);
        fd = child;
        errno = err;
        if (end)
            *end = '/';
        part = end ? end + 1 : part + strlen(part);
    }
    return fd;
}

int cds_make_links(int rootfd, const char *where, char **links, int count, char *why, size_t cap)
{
    for (int i = 0; i < count; i++) {
        char *sep = strstr(links[i], "::");
        if (sep == NULL || sep == links[i] || sep[2] != '/') {
            snprintf(why, cap, "malformed --link \"%s\": expected TARGET::/ABSOLUTE/LINK", links[i]);
            return -1;
        }
        *sep = '\0';
        const char *target = links[i];
        char *link = sep + 2;
        char *slash = strrchr(link, '/');
        const char *name = slash + 1;
        int bad =
            !*name || strcmp(name, ".") == 0 || strcmp(name, "..") == 0 || strstr(link, "/../") || strstr(link, "/./");
        int dirfd = -1, rc = -1, err = 0;
        if (!bad) {
            *slash = '\0';
            dirfd = open_dir_made(rootfd, link);
            err = errno;
            *slash = '/';
        }
        if (dirfd >= 0) {
            rc = cds_link_at(dirfd, name, target);
            err = errno;
            close(dirfd);
        }
        if (bad)
            snprintf(why, cap, "malformed link path \"%s\"", link);
        else if (dirfd < 0)
            snprintf(why, cap, "cannot open the directory of %s in %s: %s", link, where, strerror(err));
        else if (rc < 0)
            snprintf(why, cap, "cannot make %s -> %s in %s: %s", link, target, where, strerror(err));
        *sep = ':';
        if (bad || rc < 0)
            return -1;
    }
    return 0;
}

/* PATH (N bytes) cleaned into OUT (CAP bytes), as runc and the kernel read it: absolute, its
 * empty ("//") and "." parts dropped, no trailing "/". A ".." part is dropped with the part
 * before it when HOW is CLEAN_POP_DOTDOT (as Python's os.path.abspath does), refused when
 * CLEAN_NO_DOTDOT; CLEAN_AS_IS refuses "." parts too. The cleaned length, or -1: refused, a
 * relative path, or too long. */
enum { CLEAN_NO_DOTDOT, CLEAN_POP_DOTDOT, CLEAN_AS_IS };

static long clean_path(const char *path, size_t n, char *out, size_t cap, int how)
{
    size_t len = 0, i = 0;
    if (n == 0 || path[0] != '/' || cap < 2)
        return -1;
    while (i < n) {
        while (i < n && path[i] == '/')
            i++;
        size_t start = i;
        while (i < n && path[i] != '/')
            i++;
        size_t part = i - start;
        if (part == 0)
            break;
        if (part == 1 && path[start] == '.') {
            if (how == CLEAN_AS_IS)
                return -1;
            continue;
        }
        if (part == 2 && path[start] == '.' && path[start + 1] == '.') {
            if (how != CLEAN_POP_DOTDOT)
                return -1;
            while (len > 0 && out[--len] != '/')
                ;
            continue;
        }
        if (len + 1 + part + 1 > cap)
            return -1;
        out[len] = '/';
        memcpy(out + len + 1, path + start, part);
        len += 1 + part;
    }
    if (len == 0)
        out[len++] = '/';
    out[len] = '\0';
    return (long)len;
}

/* The one rule of a folder we trust (cdi/safeio.py private_dir_problem, checked alike by
 * tests/runtime/test_links_after_create.py): DIR and every folder above it owned by root or
 * us and not writable by group or others (one above it may be when sticky, like /tmp), on the
 * path as written and on the path its links lead to. */
static int folder_problem(const char *current, int last, char *why, size_t cap)
{
    struct stat info;
    uid_t uid = geteuid();
    if (lstat(current, &info) != 0) {
        if (errno == ENOENT)
            snprintf(why, cap, "%s does not exist", current);
        else
            snprintf(why, cap, "cannot inspect %s: %s", current, strerror(errno));
        return 1;
    }
    if (info.st_uid != 0 && info.st_uid != uid) {
        snprintf(why, cap, "%s is owned by uid %u, not by uid %u or root", current, (unsigned)info.st_uid,
                 (unsigned)uid);
        return 1;
    }
    if (S_ISLNK(info.st_mode))
        return 0; /* its folder is checked; where it leads is the other chain */
    if (!S_ISDIR(info.st_mode)) {
        snprintf(why, cap, "%s is not a directory", current);
        return 1;
    }
    if ((info.st_mode & 022) && (last || !(info.st_mode & S_ISVTX))) {
        snprintf(why, cap, "%s is writable by group or others (mode %o); it must not be", current,
                 (unsigned)(info.st_mode & 07777));
        return 1;
    }
    return 0;
}

static int chain_problem(const char *chain, char *why, size_t cap)
{
    char current[4096];
    size_t n = strlen(chain);
    if (folder_problem("/", n == 1, why, cap))
        return 1;
    for (size_t end = 2; end <= n; end++) {
        if (end < n && chain[end] != '/')
            continue;
        snprintf(current, sizeof current, "%.*s", (int)end, chain);
        if (folder_problem(current, end == n, why, cap))
            return 1;
    }
    return 0;
}

int cds_private_dir_problem(const char *dir, char *why, size_t cap)
{
    char given[4096], path[4096], real[PATH_MAX];
    if (dir[0] == '/')
        snprintf(given, sizeof given, "%s", dir);
    else if (!getcwd(given, sizeof given - 1 - strlen(dir))) {
        snprintf(why, cap, "cannot tell where %s is: %s", dir, strerror(errno));
        return 1;
    } else
        snprintf(given + strlen(given), sizeof given - strlen(given), "/%s", dir);
    if (clean_path(given, strlen(given), path, sizeof path, CLEAN_POP_DOTDOT) < 0) {
        snprintf(why, cap, "%s: too long a path", dir);
        return 1;
    }
    if (chain_problem(path, why, cap))
        return 1;
    if (!realpath(path, real)) {
        snprintf(why, cap, "cannot resolve %s: %s", path, strerror(errno));
        return 1;
    }
    return strcmp(real, path) != 0 && chain_problem(real, why, cap);
}

/* What the reading of config.json gathers. A string with an escape makes the config "not for
 * deferral" (plain = 0) rather than an error. */
struct reading {
    const char *s;
    int plain;
    struct cds_span container_hooks; /* hooks.createContainer (an array) */
    struct cds_span last_hook, before_last;
    struct cds_span root_path;
    int dev_mount;                        /* the last mount at /dev: 1 a read-write tmpfs, 0 anything else or none */
    int mount_dev, mount_tmpfs, mount_ro; /* of the mount being read */
    char **destinations;                  /* every mount's but /dev's, cleaned (malloc'd) */
    size_t n_destinations, cap_destinations;
    int user_namespace;
    int dev_paths; /* a readonlyPaths or maskedPaths entry at, in or above /dev */
    int unclean;   /* a destination or path with a ".." part, relative, or too long */
};

/* The plain string SPAN's text cleaned (CLEAN_NO_DOTDOT) into OUT; -1 sets G->unclean. */
static long cleaned(struct reading *g, struct cds_span span, char *out, size_t cap)
{
    long n = clean_path(g->s + span.start + 1, span.end - span.start - 2, out, cap, CLEAN_NO_DOTDOT);
    if (n < 0)
        g->unclean = 1;
    return n;
}

static void free_destinations(struct reading *g)
{
    for (size_t i = 0; i < g->n_destinations; i++)
        free(g->destinations[i]);
    free(g->destinations);
}

/* The string at r->i into *SPAN (quotes included); a string with an escape, or another value,
 * clears PLAIN (an escape's spelling is not compared here). */
static int plain_string(struct cds_reader *r, struct reading *g, struct cds_span *span)
{
    struct cds_span got = {0, 0};
    if (cds_json_take(r, &got) < 0)
        return -1;
    if (r->s[got.start] != '"' || memchr(r->s + got.start, '\\', got.end - got.start))
        g->plain = 0;
    *span = got;
    return 0;
}

static int is_text(const struct reading *g, struct cds_span span, const char *text)
{
    size_t n = strlen(text);
    return span.end == span.start + n + 2 && g->s[span.start] == '"' && memcmp(g->s + span.start + 1, text, n) == 0;
}

static int is(const char *key, size_t len, const char *name)
{
    return strlen(name) == len && memcmp(key, name, len) == 0;
}

/* The array (EACH per element) or the object (MEMBER per member) at r->i; anything else there
 * is skipped, and clears PLAIN. */
static int array_at(struct cds_reader *r, struct reading *g, cds_element_fn each)
{
    if (r->i < r->n && r->s[r->i] == '[')
        return cds_json_elements(r, each, g);
    g->plain = 0;
    return cds_json_value(r);
}

static int object_at(struct cds_reader *r, struct reading *g, cds_member_fn member)
{
    if (r->i < r->n && r->s[r->i] == '{')
        return cds_json_members(r, member, g);
    g->plain = 0;
    return cds_json_value(r);
}

static int hook_element(struct cds_reader *r, void *data)
{
    struct reading *g = data;
    g->before_last = g->last_hook;
    g->last_hook = (struct cds_span){0, 0};
    return cds_json_take(r, &g->last_hook);
}

static int hooks_member(struct cds_reader *r, const char *key, size_t len, void *data)
{
    struct reading *g = data;
    if (!is(key, len, "createContainer"))
        return cds_json_value(r);
    if (r->i >= r->n || r->s[r->i] != '[' || g->container_hooks.end) {
        g->plain = 0;
        return cds_json_value(r);
    }
    g->container_hooks.start = r->i;
    g->last_hook = g->before_last = (struct cds_span){0, 0};
    if (cds_json_elements(r, hook_element, g) < 0)
        return -1;
    g->container_hooks.end = r->i;
    return 0;
}

static int option_element(struct cds_reader *r, void *data)
{
    struct reading *g = data;
    struct cds_span option;
    if (plain_string(r, g, &option) < 0)
        return -1;
    if (is_text(g, option, "ro"))
        g->mount_ro = 1;
    return 0;
}

static int mount_member(struct cds_reader *r, const char *key, size_t len, void *data)
{
    struct reading *g = data;
    struct cds_span span;
    if (is(key, len, "destination")) {
        char path[4096];
        if (plain_string(r, g, &span) < 0)
            return -1;
        /* runc cleans it: "//dev", "/dev/./dri" and "/dev//dri" are /dev and /dev/dri */
        if (!g->plain || cleaned(g, span, path, sizeof path) < 0)
            return 0;
        g->mount_dev = strcmp(path, "/dev") == 0;
        if (g->mount_dev)
            return 0;
        if (g->n_destinations == g->cap_destinations) {
            size_t cap = g->cap_destinations ? 2 * g->cap_destinations : 32;
            char **more = realloc(g->destinations, cap * sizeof *more);
            if (!more)
                return -1;
            g->destinations = more;
            g->cap_destinations = cap;
        }
        if (!(g->destinations[g->n_destinations] = strdup(path)))
            return -1;
        g->n_destinations++;
        return 0;
    }
    if (is(key, len, "type")) {
        if (plain_string(r, g, &span) < 0)
            return -1;
        g->mount_tmpfs = is_text(g, span, "tmpfs");
        return 0;
    }
    return is(key, len, "options") ? array_at(r, g, option_element) : cds_json_value(r);
}

static int mount_element(struct cds_reader *r, void *data)
{
    struct reading *g = data;
    g->mount_dev = g->mount_tmpfs = g->mount_ro = 0;
    if (object_at(r, g, mount_member) < 0)
        return -1;
    if (g->mount_dev)
        g->dev_mount = g->mount_tmpfs && !g->mount_ro;
    return 0;
}

static int namespace_member(struct cds_reader *r, const char *key, size_t len, void *data)
{
    struct reading *g = data;
    struct cds_span type;
    if (!is(key, len, "type"))
        return cds_json_value(r);
    if (plain_string(r, g, &type) < 0)
        return -1;
    if (is_text(g, type, "user"))
        g->user_namespace = 1;
    return 0;
}

static int namespace_element(struct cds_reader *r, void *data) { return object_at(r, data, namespace_member); }

static int path_element(struct cds_reader *r, void *data)
{
    struct reading *g = data;
    struct cds_span path;
    char p[4096];
    if (plain_string(r, g, &path) < 0)
        return -1;
    if (!g->plain || cleaned(g, path, p, sizeof p) < 0)
        return 0;
    if (strcmp(p, "/") == 0 || (strncmp(p, "/dev", 4) == 0 && (p[4] == '\0' || p[4] == '/')))
        g->dev_paths = 1;
    return 0;
}

static int linux_member(struct cds_reader *r, const char *key, size_t len, void *data)
{
    struct reading *g = data;
    cds_element_fn each = is(key, len, "namespaces")                   ? namespace_element
        : is(key, len, "readonlyPaths") || is(key, len, "maskedPaths") ? path_element
                                                                       : NULL;
    return each ? array_at(r, g, each) : cds_json_value(r);
}

static int root_member(struct cds_reader *r, const char *key, size_t len, void *data)
{
    struct reading *g = data;
    return is(key, len, "path") ? plain_string(r, g, &g->root_path) : cds_json_value(r);
}

static int top_member(struct cds_reader *r, const char *key, size_t len, void *data)
{
    struct reading *g = data;
    cds_member_fn inner = is(key, len, "hooks") ? hooks_member
        : is(key, len, "root")                  ? root_member
        : is(key, len, "linux")                 ? linux_member
                                                : NULL;
    if (is(key, len, "mounts"))
        return array_at(r, g, mount_element);
    return inner ? object_at(r, g, inner) : cds_json_value(r);
}

/* The last createContainer hook, read: its path, and its args as the links they give. */
struct hook_reading {
    struct reading *g;
    struct cds_span path;
    struct cds_span arg[2 + 2 * CDS_MAX_DEVICE_LINKS + 2];
    size_t args;
    int other; /* a member a plain symlinks hook does not have, or args past the bound */
};

static int arg_element(struct cds_reader *r, void *data)
{
    struct hook_reading *h = data;
    if (h->args == sizeof h->arg / sizeof h->arg[0]) {
        h->other = 1;
        return cds_json_value(r);
    }
    return plain_string(r, h->g, &h->arg[h->args++]);
}

static int hook_member(struct cds_reader *r, const char *key, size_t len, void *data)
{
    struct hook_reading *h = data;
    if (is(key, len, "path"))
        return plain_string(r, h->g, &h->path);
    if (is(key, len, "args") && r->i < r->n && r->s[r->i] == '[')
        return cds_json_elements(r, arg_element, h);
    if (!is(key, len, "env") && !is(key, len, "timeout"))
        h->other = 1;
    return cds_json_value(r);
}

/* The text of a plain string span, without its quotes, copied NUL-terminated to AT. */
static char *put(char *at, const char *s, struct cds_span span)
{
    size_t n = span.end - span.start - 2;
    memcpy(at, s + span.start + 1, n);
    at[n] = '\0';
    return at + n + 1;
}

/* Whether the link PATH (cleaned) lies at or under a mount's destination other than /dev (all
 * cleaned): runc may change that mount after its hooks (a read-only tmpfs is made read-only
 * only then). */
static int under_a_mount(const struct reading *g, const char *path)
{
    size_t n = strlen(path);
    for (size_t i = 0; i < g->n_destinations; i++) {
        const char *d = g->destinations[i];
        size_t len = strlen(d);
        if (len == 1 || (len <= n && memcmp(path, d, len) == 0 && (len == n || path[len] == '/')))
            return 1;
    }
    return 0;
}

/* The container's root (root.path, relative to BUNDLE unless absolute) into ROOT (CAP bytes):
 * 0, or -1 when there is none or it is too long. */
static int root_of(const struct reading *g, const char *bundle, char *root, size_t cap)
{
    size_t root_len = g->root_path.end - g->root_path.start - 2;
    if (!g->root_path.end || root_len == 0 || root_len + (bundle ? strlen(bundle) : 0) + 2 >= cap)
        return -1;
    if (g->s[g->root_path.start + 1] == '/')
        put(root, g->s, g->root_path);
    else if (bundle)
        put(root + snprintf(root, cap, "%s/", bundle), g->s, g->root_path);
    else
        return -1;
    return 0;
}

/* Whether the directory the hook's --rootfs value GIVEN names is the container's root ROOT: the
 * runtime writes it resolved, containerd's root.path is relative. */
static int same_root(const struct reading *g, const char *root, struct cds_span given)
{
    char rootfs[4096];
    if (given.end - given.start - 2 >= sizeof rootfs)
        return 0;
    put(rootfs, g->s, given);
    struct stat a, b;
    return stat(root, &a) == 0 && stat(rootfs, &b) == 0 && S_ISDIR(a.st_mode) && a.st_dev == b.st_dev
        && a.st_ino == b.st_ino;
}

/* The links of the hook H read from JSON (G: the config's reading), OUT filled: 1, 0 or -1. */
static int links_of(const char *json, size_t len, const char *bundle, struct reading *g, struct hook_reading *h,
                    struct cds_deferred_links *out)
{
    h->g = g;
    struct cds_reader hook = {.s = json, .n = g->last_hook.end, .i = g->last_hook.start};
    if (cds_json_members(&hook, hook_member, h) < 0)
        return errno == ENOMEM ? -1 : 0;
    if (!g->plain || h->other || !h->path.end || h->args < 4 || !is_text(g, h->arg[1], "symlinks"))
        return 0;
    /* the program: ours by name, and there (runc would fail the create on a missing one) */
    size_t path_len = h->path.end - h->path.start - 2, name_len = strlen(CDS_NSHOOK_PROGRAM);
    const char *path = json + h->path.start + 1;
    char program[4096];
    if (path_len <= name_len || path_len >= sizeof program || path[path_len - name_len - 1] != '/'
        || memcmp(path + path_len - name_len, CDS_NSHOOK_PROGRAM, name_len) != 0)
        return 0;
    put(program, json, h->path);
    if (access(program, X_OK) != 0)
        return 0;
    char root[8192];
    if (root_of(g, bundle, root, sizeof root) < 0)
        return 0;
    size_t text_len = 0;
    int count = 0;
    for (size_t i = 2; i < h->args; i += 2) {
        if (i + 1 == h->args)
            return 0;
        if (is_text(g, h->arg[i], "--rootfs")) {
            if (!same_root(g, root, h->arg[i + 1]))
                return 0;
            continue;
        }
        if (!is_text(g, h->arg[i], "--link") || ++count > CDS_MAX_DEVICE_LINKS)
            return 0;
        const char *link = json + h->arg[i + 1].start + 1;
        size_t n = h->arg[i + 1].end - h->arg[i + 1].start - 2;
        const char *sep = memmem(link, n, "::", 2);
        char path[4096];
        /* compared cleaned ("//" dropped); a "." or ".." part is left to the hook */
        if (!sep || clean_path(sep + 2, (size_t)(link + n - sep) - 2, path, sizeof path, CLEAN_AS_IS) < 6
            || memcmp(path, "/dev/", 5) != 0 || under_a_mount(g, path))
            return 0;
        text_len += n + 1;
    }
    if (count == 0)
        return 0;

    /* the array without its last element: up to the end of the one before it, or empty */
    size_t keep = g->before_last.end ? g->before_last.end : g->container_hooks.start + 1;
    out->config_len = keep + 1 + (len - g->container_hooks.end);
    out->config = malloc(out->config_len + 1);
    out->text = malloc(text_len);
    out->link = malloc((size_t)count * sizeof *out->link);
    out->root = strdup(root);
    if (!out->config || !out->text || !out->link || !out->root) {
        cds_deferred_links_free(out);
        errno = ENOMEM;
        return -1;
    }
    memcpy(out->config, json, keep);
    out->config[keep] = ']';
    memcpy(out->config + keep + 1, json + g->container_hooks.end, len - g->container_hooks.end);
    out->config[out->config_len] = '\0';
    char *at = out->text;
    for (size_t i = 2; i < h->args; i += 2)
        if (is_text(g, h->arg[i], "--link")) {
            out->link[out->count++] = at;
            at = put(at, json, h->arg[i + 1]);
        }
    return 1;
}

int cds_deferred_links(const char *json, size_t len, const char *bundle, struct cds_deferred_links *out)
{
    struct reading g = {.s = json, .plain = 1};
    struct cds_reader r = {.s = json, .n = len};
    memset(out, 0, sizeof *out);
    if (!memmem(json, len, CDS_NSHOOK_PROGRAM, strlen(CDS_NSHOOK_PROGRAM)))
        return 0; /* most creates: no reading at all */
    int parsed = cds_json_members(&r, top_member, &g);
    cds_json_blanks(&r);
    if (parsed < 0 || r.i != r.n || !g.plain || !g.last_hook.end || !g.dev_mount || g.user_namespace || g.dev_paths
        || g.unclean || json[g.last_hook.start] != '{') {
        free_destinations(&g);
        return parsed < 0 && errno == ENOMEM ? -1 : 0;
    }
    struct hook_reading *h = calloc(1, sizeof *h); /* its spans are many for a stack */
    int done = h ? links_of(json, len, bundle, &g, h, out) : -1;
    free(h);
    free_destinations(&g);
    return done;
}

void cds_deferred_links_free(struct cds_deferred_links *out)
{
    free(out->config);
    free(out->text);
    free(out->link);
    free(out->root);
    memset(out, 0, sizeof *out);
}
