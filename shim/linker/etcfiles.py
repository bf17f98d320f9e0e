"""The files the update-ldcache (and enable-cuda-compat) hooks leave under the container's /etc,
written as they leave them: in the root, each resolved inside it, or for a read-only root in an
overlay of its /etc whose upper folder lies in the bundle. The step that decides is
container.py; the step memo's replay and the front end's (replay.c) make the same files."""
import errno
import os
import posixpath
import stat

from .links import make_soname_links, open_dir_in_root

ETC_DIR = "cdi-shim.etc"    # the bundle folder of a read-only root's /etc overlay: upper/, work/
# Filesystems (statfs f_type) an overlay of /etc is made on: its upper and work folders in the
# bundle, its lower folder the image's /etc (one overlay deep at most: the kernel stacks two).
_UPPER_FS = {0x01021994, 0xEF53, 0x58465342, 0x9123683E}   # tmpfs, ext2/3/4, xfs, btrfs
_LOWER_FS = _UPPER_FS | {0x794C7630}                        # and overlayfs (a containerd snapshot)
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


def write_etc_in_root(rootfs, result, sonames, out, after=()):
    """Write what the spec's update-ldcache (and enable-cuda-compat) leave in the root: the
    soname links, then _etc_files, each resolved inside the root and renamed into place. True,
    or False when the root cannot be written (an image on a read-only filesystem: the caller
    binds the cache from the bundle instead)."""
    from ..ldconfig.engine import LdcacheError, Root

    if sonames:
        make_soname_links(rootfs, [(target, link) for target, link, _ in sonames], out)
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
    there is replaced, never followed). OSError on failure."""
    from .._native import ffi, lib

    parent, name = posixpath.split(path)
    rootfd = os.open(rootfs, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = open_dir_in_root(rootfd, parent, ffi, lib)
        try:
            if lib.cds_write_at(fd, os.fsencode(name), data, len(data), mode, 0) != 0:
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


def _no_overlay(config, bundle, rootfs):
    """Why /etc cannot be overlaid for this container, or ""."""
    mounts = [m.get("destination") for m in config.get("mounts") or () if isinstance(m, dict)]
    if any(isinstance(d, str) and posixpath.normpath(d) in ("/", "/etc") for d in mounts):
        return "config.json mounts something at /etc"
    namespaces = ((config.get("linux") or {}).get("namespaces") or ())
    if any(isinstance(ns, dict) and ns.get("type") == "user" for ns in namespaces):
        return "a user namespace"
    for path in (rootfs, bundle):
        if any(c in path for c in OVERLAY_UNSAFE):
            return f"{path} has a character overlay's options cannot carry"
    if _fs_type(bundle) not in _UPPER_FS:
        return f"the bundle's filesystem ({bundle}) is not one an overlay's upper folder is made on here"
    if _fs_type(rootfs) not in _LOWER_FS:
        return f"the rootfs's filesystem ({rootfs}) is not one an overlay's lower folder is taken from here"
    return ""


def overlay_etc(config, bundle, rootfs, result, sonames, out, after=()):
    """A read-only root: CONFIG with the image's /etc overlaid by the bundle's ETC_DIR/upper
    holding _etc_files, or None (why logged; the caller binds the cache from the bundle). The
    container's /etc shows the files as the hook leaves them and takes a later ldconfig's
    writes (into the bundle: nothing is written into the image's /etc); the rest of the root
    stays read-only. The soname links are made in the root, as the hook makes them."""
    from ..ldconfig.engine import LdcacheError, Root

    why = _no_overlay(config, bundle, rootfs)
    owners = {}
    try:
        with Root(rootfs) as root:
            for path in ("/etc", "/etc/ld.so.conf.d"):
                # (the kernel takes the lower folder by its host path: /etc must be no link)
                fd = root.open(path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
                if fd < 0:
                    if path == "/etc" or root.errno != errno.ENOENT:
                        why = why or f"the image's {path}: {os.strerror(root.errno)}"
                    continue
                try:
                    owners[path] = os.fstat(fd)
                finally:
                    os.close(fd)
            files = _etc_files(root, result, after)
    except LdcacheError as err:
        why = why or str(err)
    if why:
        out.log.debug(f"linker cache bound from the bundle, /etc not overlaid: {why}")
        return None
    # (the merged folder shows its upper folder's owner and mode: the image's)
    upper = f"{ETC_DIR}/upper"
    dirs = [(ETC_DIR, os.geteuid(), os.getegid(), 0o700), (f"{ETC_DIR}/work", os.geteuid(), os.getegid(), 0o700)]
    for path in ("/etc", "/etc/ld.so.conf.d"):
        if path == "/etc" or any(name.startswith("/etc/ld.so.conf.d/") for name, _ in files):
            st = owners.get(path)
            dirs.append((upper + path[len("/etc"):], st.st_uid if st else 0, st.st_gid if st else 0,
                         stat.S_IMODE(st.st_mode) if st else 0o755))
    overlay = (dirs, [(upper + path[len("/etc"):], data, 0o644) for path, data in files],
               _fs_type(bundle), _fs_type(rootfs))
    try:
        config = etc_overlay(config, bundle, rootfs, overlay)
    except OSError as err:
        out.log.debug(f"linker cache bound from the bundle, /etc not overlaid: {err}")
        return None
    out.overlay = overlay
    if sonames:
        make_soname_links(rootfs, [(target, link) for target, link, _ in sonames], out)
    out.log.debug(f"read-only root: /etc overlaid, the linker files in {os.path.join(bundle, upper)}")
    return config


def etc_overlay(config, bundle, rootfs, overlay):
    """Make OVERLAY (DIRS, FILES, bundle and rootfs filesystem types: overlay_etc) in the
    bundle: each folder (path in the bundle, owner, group, mode) made afresh, in order (the
    first removed with all in it before), then
    each file (path in the bundle, bytes, mode); return CONFIG with the overlay mount of /etc
    before any mount under /etc (runc mounts in order). OSError, nothing left, on failure (a
    folder of ours already there, a filesystem other than the step's). The step memo's replay
    and the front end's (replay.c, make_etc) do the same."""
    from ..ldconfig.ldcache import LdcacheError, write_cache

    dirs, files, bundle_fs, rootfs_fs = overlay
    bundle = os.path.abspath(bundle)
    if _fs_type(bundle) != bundle_fs or _fs_type(rootfs) != rootfs_fs \
            or any(c in path for c in OVERLAY_UNSAFE for path in (rootfs, bundle)):
        raise OSError(errno.EINVAL, "not the filesystems or paths the overlay was made for", bundle)
    made = []
    _remove_tree(os.path.join(bundle, dirs[0][0]))     # (one a replay left half made)
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
    base = os.path.join(bundle, ETC_DIR)
    mount = {"destination": "/etc", "type": "overlay", "source": "overlay",
             "options": [f"lowerdir={os.path.abspath(rootfs)}/etc", f"upperdir={base}/upper", f"workdir={base}/work"]}
    mounts = list(config.get("mounts") or ())
    # (the destination as written, as the front end compares it)
    at = next((i for i, m in enumerate(mounts) if isinstance(m, dict) and isinstance(m.get("destination"), str)
               and m["destination"].startswith("/etc/")), len(mounts))
    return dict(config, mounts=mounts[:at] + [mount] + mounts[at:])


def _remove_tree(path):
    import shutil

    shutil.rmtree(path, ignore_errors=True)
