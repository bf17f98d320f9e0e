"""The files the update-ldcache (and enable-cuda-compat) hooks leave under the container's /etc,
written as they leave them: in the root, each resolved inside it, or for a read-only root in a
read-only overlay of its /etc whose top layer is a folder in the bundle. The step that decides
is container.py; the step memo's replay and the front end's (replay.c, replay_etc.c) make the same files."""
import errno
import os
import posixpath
import stat

from .links import make_soname_links, open_dir_in_root

ETC_DIR = "cdi-shim.etc"    # the bundle folder of a read-only root's /etc overlay: files/
LAYER = f"{ETC_DIR}/files"  # its top (lower) layer: our files over the image's /etc
# Filesystems (statfs f_type) an overlay of /etc is made on: our layer in the bundle, the
# image's /etc below it (one overlay deep at most: the kernel stacks two).
_BUNDLE_FS = {0x01021994, 0xEF53, 0x58465342, 0x9123683E}  # tmpfs, ext2/3/4, xfs, btrfs
_LOWER_FS = _BUNDLE_FS | {0x794C7630}                       # and overlayfs (a containerd snapshot)
OVERLAY_UNSAFE = ",:\\\n"   # characters overlay's options cannot carry (the front end's too)


def readonly_root(config):
    """Whether config.json makes the container's root read-only."""
    root = config.get("root")
    return isinstance(root, dict) and root.get("readonly") is True


def _etc_files(root, result, after=()):
    """[(path, bytes)]: what the hook leaves under /etc, in the order written: ld.so.conf
    where nothing is at that name (the hook creates it O_EXCL), the drop-ins, the musl path
    file, the cache (newer than all it was made from); then AFTER (files of hooks run after
    update-ldcache) where not written already. RESULT None: AFTER alone."""
    files = []
    for path, data in result.conf_files if result is not None else ():
        if path == "/etc/ld.so.conf" and (root.stat(path, follow=False) is not None or root.errno != errno.ENOENT):
            continue
        files.append((path, data))
    if result is not None:
        files += sorted(result.musl.items()) + [("/etc/ld.so.cache", result.cache)]
    return files + [(path, data) for path, data in after if path not in dict(files)]


def compat_files(folders):
    """enable-cuda-compat's drop-in naming FOLDERS, where no update-ldcache hook after it reads
    it: the hook writes it all the same (createLdsoconfdFile), so a later ldconfig in the
    container puts the compat folder first. [] without FOLDERS."""
    from ..ldconfig.ldconf import CONF_DIR, DROPIN_COMPAT

    lines = "".join(folder + "\n" for folder in dict.fromkeys(folders))
    return [(f"{CONF_DIR}/{DROPIN_COMPAT}", lines.encode())] if lines else []


def compat_alone(config, bundle, rootfs, folders, out):
    """CONFIG with compat_files(FOLDERS) written where the hook leaves them: in the root, or a
    read-only root's /etc overlay (its /etc otherwise left as it is: logged)."""
    files = compat_files(folders)
    if readonly_root(config):
        return overlay_etc(config, bundle, rootfs, None, (), out, files) or config
    write_etc_in_root(rootfs, None, (), out, files)
    return config


def write_etc_in_root(rootfs, result, sonames, out, after=(), before_files=None):
    """Write what the spec's update-ldcache (and enable-cuda-compat) leave in the root: the
    soname links, then (BEFORE_FILES() first: whatever else changes the folders the cache
    describes) _etc_files, each resolved inside the root and renamed into place, the cache last
    and so newer than every folder it describes, as the hook's ldconfig leaves it after runc's
    mounts. True, or False when the root cannot be written (an image on a read-only filesystem:
    the caller binds the cache from the bundle instead)."""
    from ..ldconfig.engine import LdcacheError, Root

    if sonames:
        make_soname_links(rootfs, [(target, link) for target, link, _ in sonames], out)
    if before_files is not None:
        before_files()
    try:
        with Root(rootfs) as root:
            files = _etc_files(root, result, after)
    except LdcacheError as err:
        out.log.debug(f"the root cannot be read for its linker configuration ({err})")
        return False
    try:
        out.linking(rootfs, [(None, path) for path, _ in files])     # (what the writes change, before)
        for path, data in files:
            write_in_root(rootfs, path, data, 0o644)
            out.root_files.append((path, data, 0o644))
    except OSError as err:
        out.log.debug(f"linker cache not written into {rootfs} ({err}): bound from the bundle")
        out.refuse("the root could not be written")
        return False
    return True


def write_in_root(rootfs, path, data, mode):
    """PATH in the rootfs (absolute, normalized) made DATA with MODE: its directory resolved
    inside the root (missing ones made, 0755), a temporary file renamed over the name (a link
    there is replaced, never followed); a file of ours that holds exactly DATA with MODE is left
    as it is (cds_write_same_at: a root reused run after run keeps its identities, so a later
    create replays the step). OSError on failure."""
    from .._native import ffi, lib

    parent, name = posixpath.split(path)
    rootfd = os.open(rootfs, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = open_dir_in_root(rootfd, parent, ffi, lib)
        try:
            if lib.cds_write_same_at(fd, os.fsencode(name), data, len(data), mode) != 0:
                error = ffi.errno
                raise OSError(error, os.strerror(error), path)
        finally:
            os.close(fd)
    finally:
        os.close(rootfd)


def _fs_type(path):
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(256)     # struct statfs: f_type first
    if libc.statfs(os.fsencode(path), buf) != 0:
        return None
    return ctypes.c_long.from_buffer(buf).value


def _clean(destination):
    """A mount's DESTINATION as runc takes it: under /, with // and . collapsed and .. clamped at /."""
    return posixpath.normpath("/" + destination.lstrip("/"))


def _no_overlay(config, bundle, rootfs):
    """Why /etc cannot be overlaid for this container, or ""."""
    mounts = [m.get("destination") for m in config.get("mounts") or () if isinstance(m, dict)]
    if any(isinstance(d, str) and _clean(d) in ("/", "/etc") for d in mounts):
        return "config.json mounts something at /etc"
    namespaces = ((config.get("linux") or {}).get("namespaces") or ())
    if any(isinstance(ns, dict) and ns.get("type") == "user" for ns in namespaces):
        return "a user namespace"
    for path in (rootfs, bundle):
        if any(c in path for c in OVERLAY_UNSAFE):
            return f"{path} has a character overlay's options cannot carry"
    if _fs_type(bundle) not in _BUNDLE_FS:
        return f"the bundle's filesystem ({bundle}) is not one an overlay's layer is taken from here"
    if _fs_type(rootfs) not in _LOWER_FS:
        return f"the rootfs's filesystem ({rootfs}) is not one an overlay's lower folder is taken from here"
    return ""


class _NoOverlay(Exception):
    pass


class _Layer:
    """Our layer over the image's /etc, as it is planned: {path under /etc: ("dir", uid, gid, mode)
    or ("file", bytes)}, in order (a folder before what is in it). A folder the image has is
    ours with its owner and mode (the merged folder shows the top layer's)."""

    def __init__(self, root):
        self.root, self.entries = root, {}

    def folder(self, path):
        missing = []
        while path not in self.entries:
            missing.append(path)
            if path == "/etc":
                break
            path = posixpath.dirname(path)
        for path in reversed(missing):
            # (the kernel takes the lower folder by its host path: /etc must be no link)
            fd = self.root.open(path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
            if fd < 0 and (path == "/etc" or self.root.errno != errno.ENOENT):
                raise _NoOverlay(f"the image's {path}: {os.strerror(self.root.errno)}")
            if fd < 0:
                self.entries[path] = ("dir", 0, 0, 0o755)     # (as runc's MkdirAll makes it)
                continue
            try:
                st = os.fstat(fd)
            finally:
                os.close(fd)
            self.entries[path] = ("dir", st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode))

    def file(self, path, data):
        self.folder(posixpath.dirname(path))
        if self.entries.get(path, ("file",))[0] != "file":
            raise _NoOverlay(f"{path} is both a folder and a file")
        self.entries[path] = ("file", data)


def _mount_points(config, bundle, root, layer):
    """Add to LAYER the mount points runc would make under the image's /etc for CONFIG's mounts:
    runc makes a missing one before it mounts there (a folder, or an empty file for a bind of a
    file), and our /etc is read-only. [(destination as written, whether a folder)] of the binds
    among them: a replay checks that their sources are still of that kind. _NoOverlay where runc
    would go through a link or we cannot tell."""
    points = []
    for mount in config.get("mounts") or ():
        if not isinstance(mount, dict) or not isinstance(mount.get("destination"), str):
            continue
        destination = _clean(mount["destination"])
        if not destination.startswith("/etc/"):
            continue
        path = "/etc"
        for part in destination[len("/etc/"):].split("/"):
            path += "/" + part
            if path in layer.entries:       # ours already: a file of ours, or a point made before
                kind = layer.entries[path][0]
            else:
                found = root.stat(path, follow=False)
                if found is None and root.errno != errno.ENOENT:
                    raise _NoOverlay(f"the image's {path}: {os.strerror(root.errno)}")
                if found is not None and stat.S_ISLNK(found[0]):
                    if path == destination and root.stat(path) is not None:
                        break   # runc mounts on what it leads to, which is there
                    raise _NoOverlay(f"the image's {path} is a link a mount under /etc goes through")
                if found is not None and not stat.S_ISDIR(found[0]):
                    break       # a file: runc mounts on it, or fails on it as without us
                if found is not None:
                    continue    # a folder of the image
                kind = None
            if path != destination:
                if kind == "file":
                    break       # runc fails on it as without us
                if kind is None:
                    layer.folder(path)
                continue
            bind = mount.get("type") == "bind" or any(o in ("bind", "rbind") for o in mount.get("options") or ())
            directory = not bind or _source_is_folder(mount, bundle)
            if kind is None and directory:
                layer.folder(path)
            elif kind is None:
                layer.file(path, b"")
            elif (kind == "dir") != directory:
                raise _NoOverlay(f"{path} is both a folder and a file")
            if bind:
                points.append((mount["destination"], directory))
    return points


def _source_is_folder(mount, bundle):
    source = mount.get("source")
    try:
        return stat.S_ISDIR(os.stat(os.path.join(bundle, source)).st_mode)
    except (OSError, TypeError, ValueError) as err:
        raise _NoOverlay(f"the source of the mount at {mount['destination']}: {err}") from None


def overlay_etc(config, bundle, rootfs, result, sonames, out, after=()):
    """A read-only root: CONFIG with the image's /etc overlaid, read-only, by the bundle's LAYER
    holding _etc_files, or None (why logged; the caller binds the cache from the bundle). The
    container's /etc shows the files as the hook leaves them and takes no write (no upper
    folder: as under plain runc, nothing the container writes lands anywhere, and a later
    ldconfig fails as it does after the toolkit's hook); the image's /etc is not written. The
    layer also holds the mount points runc would make under /etc (_mount_points). The soname
    links are made in the root, as the hook makes them."""
    from ..ldconfig.engine import LdcacheError, Root

    why = _no_overlay(config, bundle, rootfs)
    points = []
    try:
        with Root(rootfs) as root:
            layer = _Layer(root)
            layer.folder("/etc")
            for path, data in _etc_files(root, result, after):
                layer.file(path, data)
            points = _mount_points(config, bundle, root, layer)
    except LdcacheError as err:
        why = why or str(err)
    except _NoOverlay as err:
        why = why or str(err)
    if why:
        out.log.debug(f"linker cache bound from the bundle, /etc not overlaid: {why}")
        return None
    dirs = [(ETC_DIR, os.geteuid(), os.getegid(), 0o700)]
    files = []
    for path, entry in layer.entries.items():
        at = LAYER + path[len("/etc"):]
        if entry[0] == "dir":
            dirs.append((at, *entry[1:]))
        else:
            files.append((at, entry[1], 0o644))
    overlay = (dirs, files, _fs_type(bundle), _fs_type(rootfs), points)
    try:
        config = etc_overlay(config, bundle, rootfs, overlay)
    except OSError as err:
        out.log.debug(f"linker cache bound from the bundle, /etc not overlaid: {err}")
        return None
    out.overlay = overlay
    if sonames:
        make_soname_links(rootfs, [(target, link) for target, link, _ in sonames], out)
    out.log.debug(f"read-only root: /etc overlaid read-only, the linker files in {os.path.join(bundle, LAYER)}")
    return config


def etc_overlay(config, bundle, rootfs, overlay):
    """Make OVERLAY (DIRS, FILES, bundle and rootfs filesystem types, POINTS: overlay_etc) in the
    bundle: each folder (path in the bundle, owner, group, mode) made afresh, in order (the
    first removed with all in it before), then each file (path in the bundle, bytes, mode);
    return CONFIG with the read-only overlay mount of /etc (our layer over the image's /etc)
    before any mount under /etc (runc mounts in order). OSError, nothing left, on failure (a
    folder of ours already there, a filesystem other than the step's, a bind at one of POINTS
    whose source is no longer the kind of mount point made for it). The step memo's replay and
    the front end's (replay_etc.c, cds_etc_make) do the same."""
    from ..ldconfig.ldcache import LdcacheError, write_cache

    dirs, files, bundle_fs, rootfs_fs, points = overlay
    bundle = os.path.abspath(bundle)
    if _fs_type(bundle) != bundle_fs or _fs_type(rootfs) != rootfs_fs \
            or any(c in path for c in OVERLAY_UNSAFE for path in (rootfs, bundle)):
        raise OSError(errno.EINVAL, "not the filesystems or paths the overlay was made for", bundle)
    for destination, directory in points:
        for mount in config.get("mounts") or ():
            if isinstance(mount, dict) and mount.get("destination") == destination:
                try:
                    same = _source_is_folder(mount, bundle) == directory
                except _NoOverlay:
                    same = False
                if not same:
                    raise OSError(errno.EINVAL, "a mount under /etc whose source changed kind", destination)
    made = []
    _remove_tree(os.path.join(bundle, dirs[0][0]))     # (one a replay left half made, or older)
    try:
        for path, uid, gid, mode in dirs:
            folder = os.path.join(bundle, path)
            os.mkdir(folder, 0o700)
            made.append(folder)
            os.chown(folder, uid, gid, follow_symlinks=False)
            os.chmod(folder, mode)
        for path, data, mode in files:
            write_cache(os.path.join(bundle, path), data)    # temp file + rename, 0644
    except (LdcacheError, OSError) as err:
        if made:
            _remove_tree(made[0])
        raise err if isinstance(err, OSError) else OSError(errno.EIO, str(err)) from None
    # Read-only: no upper folder (the overlay then takes no write at all), and "ro" besides.
    mount = {"destination": "/etc", "type": "overlay", "source": "overlay",
             "options": ["ro", f"lowerdir={bundle}/{LAYER}:{os.path.abspath(rootfs)}/etc"]}
    mounts = list(config.get("mounts") or ())
    # (the destination as written, as the front end compares it)
    at = next((i for i, m in enumerate(mounts) if isinstance(m, dict) and isinstance(m.get("destination"), str)
               and m["destination"].startswith("/etc/")), len(mounts))
    return dict(config, mounts=mounts[:at] + [mount] + mounts[at:])


def _remove_tree(path):
    """PATH removed with all in it, nothing followed, best effort (what is left makes the next
    mkdir fail: the caller falls back). Without recursion, so a tree of any depth goes (an
    earlier overlay folder, or one planted): each folder's entries are moved up into the top
    folder, and it is removed once empty; no descriptor is held per level."""
    try:
        os.unlink(path)
        return
    except FileNotFoundError:
        return
    except OSError:
        pass
    try:
        top = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    lifted = 0
    try:
        while True:
            names = set(os.listdir(top))
            if not names:
                break
            for name in list(names):
                try:
                    os.unlink(name, dir_fd=top)
                    continue
                except OSError as err:
                    if err.errno not in (errno.EISDIR, errno.EPERM):
                        return
                inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=top)
                try:
                    for entry in os.listdir(inner):
                        while f".rm{lifted}" in names:
                            lifted += 1
                        os.rename(entry, f".rm{lifted}", src_dir_fd=inner, dst_dir_fd=top)
                        names.add(f".rm{lifted}")
                finally:
                    os.close(inner)
                os.rmdir(name, dir_fd=top)
                names.discard(name)
        os.rmdir(path)
    except OSError:
        pass
    finally:
        os.close(top)
