"""A tree we do not trust (a driver container's root, a dev root, a node image), its paths
resolved inside it: the one place `cdi generate` and `install --node` turn a path in such a
tree into the host path they hand on.

Resolution is the C engine's (shim.ldconfig.engine.Root: openat2 RESOLVE_IN_ROOT, or its
O_NOFOLLOW walk): the tree is read as a chroot would read it, so an absolute link leads to the
tree's own file of that name, never the host's. What comes back is the path of the file the
walk reached (read from the kernel, /proc/self/fd), so the host path we write names that file
itself and no link is left for runc (or anyone after us) to follow.

On top of the walk, three refusals, each a warning in `warnings`:

* a link whose text climbs above the tree with ".." (the walk would stop it at the tree's top,
  as a chroot does; a driver root never needs that, so it is a planted link);
* a name, or a resolved path, that is not valid UTF-8 (a spec is UTF-8 text);
* with `leaf_link=False`, a path that is itself a link (the IPC sockets and folders: they are
  mounted read-write, so only the real thing, where it is named, is accepted).
"""
import errno
import os
import posixpath
import stat

MAX_LINKS = 40   # as the kernel's walk


def printable(path):
    """PATH for a message: bytes that are not UTF-8 shown as \\xNN."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _utf8(text):
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class TreeError(Exception):
    """The tree cannot be opened."""


class Tree:
    """The directory ROOT opened once (WHAT names it in messages: "driver root", ...)."""

    def __init__(self, root, what="root"):
        from .ldconfig.engine import LdcacheError, Root

        self.path = os.path.abspath(root)
        self.what = what
        try:
            self.tree = Root(self.path, observed=False)
        except LdcacheError as err:
            raise TreeError(f"{what}: {err}") from None
        self.real = os.readlink(f"/proc/self/fd/{self.tree.fd}")
        self.warnings = []
        self._dirs = {}

    def close(self):
        self.tree.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def warn(self, text):
        if text not in self.warnings:
            self.warnings.append(text)

    def host(self, path):
        """The host path of tree path PATH (no resolution: PATH must already be resolved)."""
        return path if self.path == "/" else self.path + path

    # -- resolution -------------------------------------------------------------------------

    def lookup(self, path, kind=None, leaf_link=True):
        """(tree path of what PATH resolves to, its os.stat_result), or None when it is not
        there, is refused (see the module's doc; a warning says why) or, with KIND, is not
        that stat.S_IF* type. No host link is followed, no file opened but O_PATH."""
        from .ldconfig.engine import O_NOFOLLOW, O_PATH

        if not _utf8(path):
            self.warn(f"{printable(self.host(path))}: the name is not valid UTF-8, left out")
            return None
        if not leaf_link:
            fd = self.tree.open(path, O_PATH | O_NOFOLLOW)
            if fd >= 0:
                try:
                    if stat.S_ISLNK(os.fstat(fd).st_mode):
                        self.warn(f"{printable(self.host(path))} is a symbolic link "
                                  f"(to {printable(_link_text(fd))}): refused, "
                                  "only the real file where it is named is used")
                        return None
                finally:
                    os.close(fd)
        fd = self.tree.open(path, O_PATH | os.O_CLOEXEC)
        if fd < 0:
            return None
        try:
            info = os.fstat(fd)
            real = os.readlink(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        if kind is not None and stat.S_IFMT(info.st_mode) != kind:
            return None
        resolved = self._inside(real)
        if resolved is None:
            return None  # cannot happen with in-root resolution; never trust it anyway
        if not _utf8(resolved):
            self.warn(f"{printable(self.host(path))} leads to {printable(self.host(resolved))}, whose name is not "
                      "valid UTF-8: left out")
            return None
        # Only a path that went through a link can climb (nothing is above /).
        links = resolved != posixpath.normpath("/" + path) and self.real != "/"
        climbing = self._climbing_link(path) if links else None
        if climbing:
            link, text = climbing
            self.warn(f"{printable(self.host(link))} is a link to {printable(text)}, which leads out of the "
                      f"{self.what} {self.path}: refused")
            return None
        return resolved, info

    def resolve(self, path, kind=None, leaf_link=True):
        """The tree path of what PATH resolves to, or None (see lookup())."""
        found = self.lookup(path, kind, leaf_link)
        return found[0] if found else None

    def _inside(self, real):
        if self.real == "/":
            return real
        if real == self.real:
            return "/"
        if not real.startswith(self.real + "/"):
            return None
        return real[len(self.real):]

    def _climbing_link(self, path):
        """(link, its text) of the first link on PATH's chain of final links whose ".." climbs
        above the tree's top; None when there is none. A check of link texts only: where PATH
        leads is the C walk's answer, always."""
        from .ldconfig.engine import O_NOFOLLOW, O_PATH

        for _ in range(MAX_LINKS):
            parent, name = posixpath.split(posixpath.normpath("/" + path))
            if not name:
                return None
            directory = "/" if parent == "/" else self.resolve_dir(parent)
            if directory is None:
                return None
            fd = self.tree.open(posixpath.join(directory, name), O_PATH | O_NOFOLLOW)
            if fd < 0:
                return None
            try:
                if not stat.S_ISLNK(os.fstat(fd).st_mode):
                    return None
                text = _link_text(fd)
            finally:
                os.close(fd)
            if not text.startswith("/"):
                depth = len([p for p in directory.split("/") if p])
                for part in text.split("/"):
                    if part == "..":
                        depth -= 1
                        if depth < 0:
                            return posixpath.join(directory, name), text
                    elif part not in ("", "."):
                        depth += 1
                text = posixpath.join(directory, text)
            path = text
        return None

    def resolve_dir(self, path):
        """The tree path of directory PATH, links resolved by the walk (no checks of its own).
        Found ones are remembered: a generation or an install looks into a few folders often."""
        from .ldconfig.engine import O_DIRECTORY, O_PATH

        found = self._dirs.get(path)
        if found is not None:
            return found
        fd = self.tree.open(path, O_PATH | O_DIRECTORY)
        if fd < 0:
            return None
        try:
            found = self._inside(os.readlink(f"/proc/self/fd/{fd}"))
        finally:
            os.close(fd)
        if found is not None:
            self._dirs[path] = found
        return found

    def readlink(self, path):
        """The text of the link at PATH (its directory resolved in the tree), or None."""
        from .ldconfig.engine import O_NOFOLLOW, O_PATH

        fd = self.tree.open(path, O_PATH | O_NOFOLLOW)
        if fd < 0:
            return None
        try:
            return _link_text(fd) if stat.S_ISLNK(os.fstat(fd).st_mode) else None
        finally:
            os.close(fd)

    def listdir(self, path):
        """[(name, d_type)] of directory PATH, names that are not UTF-8 left out with a warning."""
        names = []
        for name, kind in self.tree.listdir(path) or []:
            if _utf8(name):
                names.append((name, kind))
            else:
                self.warn(f"{printable(self.host(posixpath.join(path, name)))}: the name is not valid UTF-8, "
                          "left out")
        return names

    # -- a node tree: paths to read and write --------------------------------------------------

    def locate(self, path):
        """The host path at which to read tree path PATH (nothing made): its longest existing
        directory resolved inside the tree, the rest as named; a final link followed inside the
        tree. Raises OSError (one line naming it) for a final link that leads nowhere in it."""
        parts = [p for p in posixpath.normpath("/" + path).split("/") if p]
        for cut in range(len(parts), -1, -1):
            directory = self.resolve_dir("/" + "/".join(parts[:cut]))
            if directory is not None:
                break
        rest = parts[cut:]
        if not rest:
            return self.host(directory)
        if len(rest) > 1:
            # Something at the first missing folder's place (a dangling or looping link, a file)
            # would be followed on the host if we named a path through it.
            blocker = posixpath.join(directory, rest[0])
            text = self.readlink(blocker)
            if text is not None:
                raise OSError(f"{self.host(blocker)} is a link to {text}, which leads to no folder in the "
                              f"{self.what} {self.path}")
            fd = self.tree.open(blocker, os.O_PATH | os.O_NOFOLLOW)
            if fd >= 0:
                os.close(fd)
                raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), self.host(blocker))
            return self.host(posixpath.join(directory, *rest))
        return self._final(posixpath.join(directory, rest[0]))

    def writable_path(self, path):
        """The host path at which to write tree path PATH: its directory resolved, the missing
        ones made (0755), inside the tree; a final link followed inside the tree (a linked
        config file stays linked). Raises OSError naming the tree path that failed."""
        parent, name = posixpath.split(posixpath.normpath("/" + path))
        return self._final(posixpath.join(self.make_dirs(parent), name))

    def entry_path(self, path):
        """The host path of the entry PATH itself (a link stays a link), its directory made and
        resolved inside the tree."""
        parent, name = posixpath.split(posixpath.normpath("/" + path))
        return self.host(posixpath.join(self.make_dirs(parent), name))

    def _final(self, path):
        from .ldconfig.engine import O_NOFOLLOW, O_PATH

        fd = self.tree.open(path, O_PATH | O_NOFOLLOW)
        if fd < 0:
            return self.host(path)
        try:
            is_link = stat.S_ISLNK(os.fstat(fd).st_mode)
        finally:
            os.close(fd)
        if not is_link:
            return self.host(path)
        found = self.lookup(path)
        if found is None:
            raise OSError(next((w for w in self.warnings if w.startswith(self.host(path) + " ")),
                               f"{self.host(path)} is a link to {self.readlink(path)}, which leads nowhere in the "
                               f"{self.what} {self.path}"))
        return self.host(found[0])

    def make_dirs(self, path):
        """Tree path of directory PATH, made (0755) where missing, inside the tree."""
        from .ldconfig.engine import ffi, lib

        failed_at = ffi.new("size_t *")
        encoded = os.fsencode(path)
        fd = lib.cds_inroot_open_dirs(self.tree.fd, encoded, failed_at)
        if fd < 0:
            error = ffi.errno
            raise OSError(error, os.strerror(error), self.host(os.fsdecode(encoded[:failed_at[0]])))
        try:
            found = self._inside(os.readlink(f"/proc/self/fd/{fd}"))
        finally:
            os.close(fd)
        if found is None:
            raise OSError(f"{self.host(path)}: leads out of the {self.what} {self.path}")
        return found


def _link_text(fd):
    return os.readlink("", dir_fd=fd)
