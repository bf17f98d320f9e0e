"""The hook server's memo of whole answers, kept by the image's layers: the cache work planned, in
effect, before runc's mounts.

The hook runs after runc's mounts. runc makes a mount point for each of the spec's library
files in the library folder, so that folder is new in every container's upper layer (copied
up, its mtime now): the image's cache no longer stands for it and every plan rescans it, and the
plan memo cannot keep a folder whose identity is new each time. What the container's cache
depends on is the image (its overlay's lower layers: committed snapshots, never written) and
what this container's upper layer and mounts put over it at the paths the cache reads. Both
are known here, from the hook's own mount namespace (the peer's /proc/PID/mountinfo: the
rootfs's overlay, its lowerdir and upperdir, and every mount below it):

* the key: the hook's items and the lower layers (their paths and identities);
* the state: under the paths the work reads (the configured library folders, the linker's
  configuration and cache under /etc, the CUDA compat folder, and the folders above them),
  what the upper layer holds (folders, links and their texts, mount points) and what is
  mounted there (each mounted file's identity). A pod's own mounts elsewhere (/etc/hosts, its
  volumes) are not part of it.

A later container with the same key and the same state gets the files the first one got
(ld.so.cache, the drop-ins), written as the first were. Anything this cannot account for
makes the work be done as before, and nothing kept: a rootfs that is not an overlay mount
of its own, an option text with an escape, an upper entry under those paths that is a
whiteout, an opaque folder, a file that is not a mount point, a link or a non-folder above
them, a folder mounted there, an include of the image's configuration outside
/etc/ld.so.conf.d, or more than MAX_UPPER upper entries.

One memo per hook server (its own process, long-lived), one container's work at a time.
"""
import os
import posixpath
import stat
import time

MAX_UPPER = 4096        # upper-layer entries walked; past it nothing is kept (a root runc made is small)
MAX_KEPT = 64           # answers kept (a node's images times its specs)
CONF_D = "/etc/ld.so.conf.d"
# what the linker's configuration and its cache are (and the musl path files), the compat
# folder, and the folders ldconfig and the toolkit's drop-in add
FIXED_ROOTS = ("/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/ld.so.cache", "/etc/ld-musl-x86_64.path",
               "/etc/ld-musl-aarch64.path", "/usr/local/cuda", "/lib", "/lib64", "/usr/lib", "/usr/lib64",
               "/usr/local/lib")


class Unaccounted(Exception):
    """Something of the container this memo cannot account for: do the work."""


def _field_path(text):
    if "\\" in text:
        raise Unaccounted("an escaped path in mountinfo")
    return text


def _rootfs_mount(pid, rootfd):
    """(the rootfs ROOTFD's own mount, as (id, root, mount point, fstype, options), every mount
    of the process PID's mount namespace likewise). Raises Unaccounted."""
    try:
        with open(f"/proc/self/fdinfo/{rootfd}") as stream:
            mnt_id = next(line.split()[1] for line in stream if line.startswith("mnt_id:"))
        with open(f"/proc/{pid}/mountinfo") as stream:
            lines = stream.read().splitlines()
    except (OSError, StopIteration):
        raise Unaccounted("no mountinfo") from None
    mounts, top = [], None
    for line in lines:
        fields = line.split(" ")
        try:
            dash = fields.index("-")
        except ValueError:
            raise Unaccounted("a malformed mountinfo line") from None
        options = fields[dash + 3] if dash + 3 < len(fields) else ""
        mounts.append((fields[0], fields[3], fields[4], fields[dash + 1], options))
        if fields[0] == mnt_id:
            top = mounts[-1]
    if top is None:
        raise Unaccounted("the rootfs's mount is not in the hook's namespace")
    return top, mounts


def _below(point, mounts):
    prefix = _field_path(point).rstrip("/") + "/"
    return [("/" + _field_path(where)[len(prefix):], kind) for _, _, where, kind, _ in mounts
            if where.startswith(prefix)]


def mounts_below(pid, rootfd):
    """[(container path, fstype)] of the mounts below the rootfs ROOTFD (whatever it is), as the
    process PID's mount namespace has them: runc's, the spec's library files among them. The
    rootfs is its mount's top (runc binds it onto itself), or else the folder its descriptor
    names, where that path leads to it in PID's namespace too. Raises Unaccounted."""
    top, mounts = _rootfs_mount(pid, rootfd)
    try:
        st = os.fstat(rootfd)
        named = os.readlink(f"/proc/self/fd/{rootfd}")
    except OSError:
        raise Unaccounted("the rootfs's descriptor") from None
    for place in dict.fromkeys((_field_path(top[2]), named)):
        try:
            there = os.stat(f"/proc/{pid}/root{place}")
        except OSError:
            continue
        if place.startswith("/") and (there.st_dev, there.st_ino) == (st.st_dev, st.st_ino):
            return _below(place, mounts)
    raise Unaccounted("the rootfs's place in the hook's namespace")


def overlay_of(pid, rootfd):
    """(lowerdirs, upperdir, [(container path, fstype)] of the mounts below it) of the rootfs
    ROOTFD, as the process PID's mount namespace has it. Raises Unaccounted."""
    (_, root, point, fstype, options), mounts = _rootfs_mount(pid, rootfd)
    if fstype != "overlay" or root != "/":
        raise Unaccounted("the rootfs is not an overlay mount of its own")
    opts = dict(option.partition("=")[::2] for option in _field_path(options).split(","))
    lower, upper = opts.get("lowerdir"), opts.get("upperdir")
    if not lower or not upper:
        raise Unaccounted("an overlay without an upper layer")
    return tuple(lower.split(":")), upper, _below(point, mounts)


def _identity(st):
    return (stat.S_IFMT(st.st_mode), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _opaque(fd):
    for name in ("trusted.overlay.opaque", "user.overlay.opaque"):
        try:
            if os.getxattr(fd, name):
                return True
        except OSError:
            pass
    return False


def _walk_upper(upper_fd):
    """[(container path, kind, detail)] of the upper layer: "d" (a folder; detail: opaque),
    "l" (a link; its text), "f" (a regular file; its size), "o" (anything else: a whiteout)."""
    found = []
    stack = [("", upper_fd)]
    try:
        while stack:
            path, fd = stack.pop()
            try:
                with os.scandir(fd) as entries:
                    for entry in entries:
                        if len(found) >= MAX_UPPER:
                            raise Unaccounted("too many upper entries")
                        where = f"{path}/{entry.name}"
                        st = entry.stat(follow_symlinks=False)
                        if stat.S_ISDIR(st.st_mode):
                            child = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                                            dir_fd=fd)
                            found.append((where, "d", _opaque(child)))
                            stack.append((where, child))
                        elif stat.S_ISLNK(st.st_mode):
                            found.append((where, "l", os.readlink(entry.name, dir_fd=fd)))
                        elif stat.S_ISREG(st.st_mode):
                            found.append((where, "f", st.st_size))
                        else:
                            found.append((where, "o", st.st_rdev))
            finally:
                if fd != upper_fd:
                    os.close(fd)
    finally:
        for _, fd in stack:
            if fd != upper_fd:
                os.close(fd)
    return found


class _Roots:
    """ROOTS (container paths) asked about fast: a path under or at one, a path above one."""

    def __init__(self, roots):
        self.roots = frozenset(roots)
        above = set()
        for root in roots:
            while root not in ("/", ""):
                root = posixpath.dirname(root)
                above.add(root)
        self.above = frozenset(above)

    def under(self, path):
        while path not in ("/", ""):
            if path in self.roots:
                return True
            path = posixpath.dirname(path)
        return False


class Container:
    """What a hook's rootfs is made of (overlay_of, the upper layer walked), read once."""

    def __init__(self, pid, rootfd, rootfs):
        lower, upper, self.mounts = overlay_of(pid, rootfd)
        there = f"/proc/{pid}/root"
        try:
            self.lower = tuple((path, _identity(os.stat(there + path))) for path in lower)
            upper_fd = os.open(there + upper, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as err:
            raise Unaccounted(f"a layer: {err}") from None
        try:
            self.upper = _walk_upper(upper_fd)
        except OSError as err:
            raise Unaccounted(f"the upper layer: {err}") from None
        finally:
            os.close(upper_fd)
        self.rootfs = rootfs
        self._mounted = {}

    def _mounted_identity(self, tree, path):
        """The identity of what is mounted at PATH, through the rootfs (TREE); resolved inside it."""
        from ..ldconfig.engine import O_PATH

        found = self._mounted.get(path)
        if found is None:
            fd = tree.open(path, O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
            if fd < 0:
                raise Unaccounted(f"a mount point, {path}: {os.strerror(tree.errno)}")
            try:
                found = self._mounted[path] = _identity(os.fstat(fd))
            finally:
                os.close(fd)
        return found

    def state(self, roots):
        """What the container puts over its image under ROOTS (container paths, real: no link
        on the way); raises Unaccounted."""
        from ..ldconfig.engine import Root

        asked = _Roots(roots)
        mounted = {}
        with Root(self.rootfs, observed=False) as tree:
            for path, _fstype in self.mounts:
                if path in asked.above:
                    raise Unaccounted(f"a mount at {path}")
                if asked.under(path):
                    identity = self._mounted_identity(tree, path)
                    if not stat.S_ISREG(identity[0]):
                        raise Unaccounted(f"a folder mounted at {path}")
                    mounted[path] = identity
        upper = []
        for path, kind, detail in self.upper:
            if path in asked.above and kind != "d":
                raise Unaccounted(f"{path} in the upper layer is not a folder")
            if not asked.under(path):
                continue
            if kind == "o" or (kind == "d" and detail) or (kind == "f" and path not in mounted):
                raise Unaccounted(f"{path} in the upper layer")
            upper.append((path, kind, detail if kind == "l" else None))
        return (tuple(sorted(upper)), tuple(sorted(mounted.items())))


def conf_dirs(rootfs):
    """The folders the image's ld.so.conf and the drop-ins of /etc/ld.so.conf.d name; raises
    Unaccounted where one includes files outside /etc/ld.so.conf.d (whose folders and
    includes the state would not cover) or cannot be read."""
    from ..ldconfig.engine import Root

    texts = []
    with Root(rootfs, observed=False) as tree:
        for path in ["/etc/ld.so.conf"] + [f"{CONF_D}/{name}" for name, _ in tree.listdir(CONF_D) or ()]:
            st = tree.stat(path)
            if st is None or not stat.S_ISREG(st[0]):
                continue
            try:
                texts.append((posixpath.dirname(path), tree.read(path, 1 << 20)[0]))
            except Exception:   # noqa: BLE001 - what the plan reads differently is not kept
                raise Unaccounted(f"{path} unreadable") from None
    dirs = []
    for folder, text in texts:
        for line in text.decode("utf-8", "replace").splitlines():
            words = line.split("#", 1)[0].split()
            if len(words) >= 2 and words[0] == "include":
                for word in words[1:]:
                    if not posixpath.normpath(posixpath.join(folder, word)).startswith(CONF_D + "/"):
                        raise Unaccounted(f"an include outside {CONF_D}")
            elif words and words[0] != "hwcap":
                dirs += [word.split("=", 1)[0] for word in " ".join(words).replace(",", " ").split()
                         if word.startswith("/")]
    return dirs


def roots_of(rootfs, items, result_dirs, compat):
    """The container paths (real) the cache work reads under: the folders, the configured
    ones (the plan's, and those the configuration names), the compat ones and FIXED_ROOTS,
    each placed inside the rootfs. Raises Unaccounted."""
    from ..ldconfig.engine import Root

    spelled = ([value for kind, value in items if kind == "folder" and value] + list(result_dirs) + list(compat)
               + conf_dirs(rootfs) + list(FIXED_ROOTS))
    roots = set()
    with Root(rootfs, observed=False) as tree:
        for path in dict.fromkeys(spelled):
            roots.add(path.rstrip("/") or "/")
            roots.add(tree.place(path).rstrip("/") or "/")
    if "/" in roots:
        raise Unaccounted("a folder at /")
    return tuple(sorted(roots))


class AnswerMemo:
    """{(items, lower layers): [(roots, state, answer)]}: the work's answer for a container
    whose upper layer and mounts put the same over the same image."""

    def __init__(self, settle_ns=None):
        from cdi.safeio import RACY_WINDOW_NS

        self._kept = {}
        self.hits = self.misses = 0
        self.settle_ns = RACY_WINDOW_NS if settle_ns is None else settle_ns

    def recall(self, key, container):
        for at, (roots, state, answer) in enumerate(self._kept.get(key, ())):
            try:
                if container.state(roots) == state:
                    candidates = self._kept[key]
                    candidates.insert(0, candidates.pop(at))
                    self.hits += 1
                    return answer
            except Unaccounted:
                return None
        self.misses += 1
        return None

    def keep(self, key, roots, state, answer):
        """Keep ANSWER for KEY (items, lower layers) and STATE under ROOTS; not where a layer
        or a mounted file changed within the settle window (settle_ns, cdi.safeio.RACY_WINDOW_NS
        by default: a change within one tick of a filesystem's clock would not change its
        identity). Returns whether it was kept."""
        settled = time.time_ns() - self.settle_ns
        if any(identity[5] > settled for _, identity in key[1]) or \
                any(identity[5] > settled for _, identity in state[1]):
            return False
        if sum(len(kept) for kept in self._kept.values()) >= MAX_KEPT:
            self._kept.clear()
        candidates = self._kept.setdefault(key, [])
        candidates.insert(0, (roots, state, answer))
        del candidates[4:]
        return True
