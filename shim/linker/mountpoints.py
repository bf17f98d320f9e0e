"""The mount points runc would make in a plain-folder root, made by the step itself.

runc makes a bind mount's destination where the image has none (an empty file, mode 0755, for a
file's bind; a folder for a folder's; missing folders above it, 0755: libcontainer's
createIfNotExists), and our binds hook does the same for the mounts it takes
(csrc/hooks/nshook.c). In a root reused run after run (a plain-folder bundle run directly) that
happens once, during the first create, after its step: the folders the step read (the library
folder, /etc) then change under it, and the next step finds them too new to keep. Made here,
before the step's result is taken, they are the step's own changes (their earlier identities
noted: stepresult.StepResult.linking), and the next create of that root finds the root as the
step left it (stepleft.trusted). Only where the step memo observes the step (an overlay root
gets them in its upper folder, as from runc), the root is not read-only and has no user
namespace (runc makes them as the container's root); any doubt leaves the rest to runc.
"""
import errno
import os
import posixpath
import stat

from .etcfiles import _clean, readonly_root

_RUNC_OWN = ("/proc", "/sys", "/dev")    # runc's own mounts: what is under them is never the root's


def make_mount_points(config, rootfs, out):
    """The missing destinations of CONFIG's bind mounts made in ROOTFS as runc makes them (see
    above), each noted in OUT before it is made."""
    namespaces = (config.get("linux") or {}).get("namespaces") or ()
    if not out.observe or readonly_root(config) or any(isinstance(ns, dict) and ns.get("type") == "user"
                                                        for ns in namespaces):
        return
    points = _points(config)
    if not points:
        return
    from .._native import ffi, lib
    from .links import open_dir_in_root

    rootfd = os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for destination, directory in points:
            fd = lib.cds_inroot_open(rootfd, os.fsencode(destination), os.O_PATH | os.O_NOFOLLOW)
            if fd >= 0:
                os.close(fd)
                continue
            if ffi.errno != errno.ENOENT:
                continue
            out.linking(rootfs, [(None, destination)])
            if out.refused:
                return
            parent, name = posixpath.split(destination)
            try:
                dirfd = open_dir_in_root(rootfd, parent, ffi, lib)
            except OSError:
                return
            try:
                if directory:
                    os.mkdir(name, 0o755, dir_fd=dirfd)
                    os.chmod(name, 0o755, dir_fd=dirfd, follow_symlinks=False)
                else:
                    made = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK
                                   | os.O_CLOEXEC, 0o755, dir_fd=dirfd)
                    try:
                        os.fchmod(made, 0o755)
                    finally:
                        os.close(made)
            except OSError:
                return
            finally:
                os.close(dirfd)
    finally:
        os.close(rootfd)


def _points(config):
    """[(destination, whether a folder)] of CONFIG's bind mounts that land in the root itself:
    not under runc's own mounts or under an earlier mount, a source there is."""
    seen, points = [], []
    for mount in config.get("mounts") or ():
        if not isinstance(mount, dict) or not isinstance(mount.get("destination"), str):
            continue
        destination = _clean(mount["destination"])
        covered = any(destination == above or destination.startswith(above.rstrip("/") + "/")
                      for above in seen + list(_RUNC_OWN))
        seen.append(destination)
        options = mount.get("options") if isinstance(mount.get("options"), list) else ()
        if covered or destination == "/" or not (mount.get("type") == "bind" or "bind" in options
                                                 or "rbind" in options):
            continue
        try:
            points.append((destination, stat.S_ISDIR(os.stat(mount.get("source")).st_mode)))
        except (OSError, TypeError, ValueError):
            continue
    return points
