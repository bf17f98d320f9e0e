"""Folders of the linker's configuration that a directory mount provides.

runc mounts config.json's mounts in order, after we plan the cache: a directory bound at a
configured folder (or above it) replaces what the image has there with the host folder's
entries. The toolkit's ldconfig, run after the mounts, reads that content; we read it through
the mount's host source, as the libraries of file mounts are read (host paths are trusted and
opened as runc opens them; below the source nothing is followed, since in the container a link
there resolves inside the container's root). A folder whose content cannot be known here -- a
mount that is not a bind, a source that is not a readable directory, a link that leaves the
folder, a hwcap subdirectory -- raises UnknownFolder: the caller leaves the update-ldcache hook
to run rather than write a cache without it.
"""
import errno
import os
import posixpath
import stat

from .._native import lib
from .engine import LdcacheError

MAX_ENTRIES = 16384     # entries of one mounted folder read (a driver folder has ~100)


class UnknownFolder(LdcacheError):
    """A folder the cache covers comes from a mount whose content cannot be known here."""


def directory_mounts(mounts):
    """[(destination, host source or None)] of config.json MOUNTS in order: None for a mount
    that is not a bind (tmpfs, overlay...: its content exists only once mounted)."""
    found = []
    for m in mounts:
        dest = m.get("destination")
        if not isinstance(dest, str) or not dest.startswith("/"):
            continue
        options = m.get("options") if isinstance(m.get("options"), list) else ()
        bind = m.get("type") == "bind" or "bind" in options or "rbind" in options
        source = m.get("source") if bind and isinstance(m.get("source"), str) else None
        found.append((posixpath.normpath(dest), source))
    return found


def _under(path, top):
    return path == top or top == "/" or path.startswith(top + "/")


def _is_hwcap_name(name, target):
    return name == "glibc-hwcaps" or lib.cds_is_hwcap_subdir(target, os.fsencode(name)) != 0


def _covering(mounts, path, target):
    """The mount that shows at PATH (the last one at it or above it), or None; UnknownFolder
    when a later mount lands in a subdirectory ldconfig reads under PATH (a hwcap one)."""
    shown = None
    for dest, source in mounts:
        if _under(path, dest):
            shown = (dest, source)
        elif dest.startswith(path + "/") and _is_hwcap_name(dest[len(path) + 1:].split("/")[0], target):
            raise UnknownFolder(f"{path}: a mount at {dest}, a subdirectory ldconfig reads, is not read here")
    return shown


def coverage(mounts, paths, target):
    """((folder, mount destination, host source) of each of PATHS a mount provides), or None
    when that cannot be known (UnknownFolder): what a kept plan's folders must be given again."""
    try:
        found = []
        for path in dict.fromkeys(posixpath.normpath(p) for p in paths):
            shown = _covering(mounts, path, target)
            if shown is not None:
                found.append((path, *shown))
        return tuple(found)
    except UnknownFolder:
        return None


def folders(mounts, paths, target):
    """({folder: mount destination} of PATHS a mount provides, {container path: host path} of
    the libraries it shows there, {container paths of those that are links}, [the host folders
    read]). UnknownFolder where that content cannot be known."""
    hidden, brought, links, sources = {}, {}, set(), []
    for path in dict.fromkeys(posixpath.normpath(p) for p in paths):
        shown = _covering(mounts, path, target)
        if shown is None:
            continue
        dest, source = shown
        if source is None:
            raise UnknownFolder(f"{path}: the mount at {dest} is not a bind; its content exists only once runc "
                                "mounts it")
        rest = [part for part in path[len(dest):].split("/") if part]
        hidden[path] = dest
        sources.append(posixpath.join(source, *rest))
        for name, host, is_link in _read_folder(source, rest, path, target):
            brought[posixpath.join(path, name)] = host
            if is_link:    # ldconfig keys a link by its own name (libcuda.so), a file by its SONAME
                links.add(posixpath.join(path, name))
    return hidden, brought, links, sources


def _read_folder(source, rest, path, target):
    """[(name, host path, is a link)] of the library names in SOURCE/REST (nothing when it is
    missing or not a directory: ldconfig finds no folder there either)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(source, flags)     # (a host path: followed as runc follows it)
    except OSError as err:
        raise UnknownFolder(f"{path}: its mount's source {source} cannot be read: {err.strerror}") from None
    try:
        for part in rest:
            try:
                below = os.open(part, flags | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as err:
                if err.errno in (errno.ENOENT, errno.ENOTDIR):
                    return []
                if err.errno == errno.ELOOP:
                    raise UnknownFolder(f"{path}: {source} holds a link on the way to it") from None
                raise UnknownFolder(f"{path}: cannot read it in {source}: {err.strerror}") from None
            os.close(fd)
            fd = below
        host = posixpath.join(source, *rest)
        found = []
        with os.scandir(fd) as entries:
            for count, entry in enumerate(entries):
                if count >= MAX_ENTRIES:
                    raise UnknownFolder(f"{path}: {host} has more than {MAX_ENTRIES} entries")
                name = entry.name
                if entry.is_dir(follow_symlinks=False):
                    if _is_hwcap_name(name, target):
                        raise UnknownFolder(f"{path}: {host}/{name}, a subdirectory ldconfig reads, is not read here")
                    continue
                if not lib.cds_is_dso_name(os.fsencode(name)):
                    continue
                link = entry.is_symlink()
                if link:
                    _link_in_folder(fd, name, host, path)
                found.append((name, posixpath.join(host, name), link))
        return found
    finally:
        os.close(fd)


def _link_in_folder(fd, name, host, path):
    """A link of the folder must lead to a name in it (in the container a link with a slash
    resolves inside the container's root, not where the host would take it)."""
    for _ in range(40):
        text = os.readlink(name, dir_fd=fd)
        if "/" in text:
            raise UnknownFolder(f"{path}: {host}/{name} is a link out of the folder ({text})")
        try:
            if not stat.S_ISLNK(os.stat(text, dir_fd=fd, follow_symlinks=False).st_mode):
                return
        except FileNotFoundError:
            return      # (dangling: the scan skips it, as ldconfig does)
        name = text
    raise UnknownFolder(f"{path}: {host} holds a link loop")


def hide(config, hidden, place):
    """The configured directories at or under a mounted folder: the image's content there is
    hidden (only the extras, the mount's libraries, are scanned). PLACE: where a configured
    path leads (engine.Root.place), as HIDDEN's folders are spelled."""
    for d in config.dirs:
        if any(_under(place(d.path), top) for top in hidden):
            d.real = False


def is_hidden(path, hidden):
    return any(_under(posixpath.normpath(path), top) for top in hidden)


