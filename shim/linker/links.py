"""The library links of a linker step, made in the rootfs without ever leaving it: a
create-symlinks hook's links (now, or once the cache is planned when they lead nowhere yet) and
the soname links the update-ldcache hook's ldconfig would make beside the mounted libraries.
The step that decides which to make is container.py."""
import errno
import os
import posixpath
import stat

PENDING_LINK = ".cdi-shim-pending-link"     # the text of a link made again after planning: leads nowhere


def call_links(call):
    """(target, link) of each well-formed --link option of a create-symlinks CALL."""
    for spec in call.options.get("link", ()):
        target, sep, link = spec.partition("::")
        if sep and target and link.startswith("/"):
            yield target, link


class MountPlaces:
    """Where config.json's mounts land in the root, for the paths the step compares with them:
    by place, not by text (merged /usr reaches one folder as /lib/x86_64-linux-gnu and
    /usr/lib/x86_64-linux-gnu; runc resolves a destination inside the root, links and all)."""

    def __init__(self, rootfs, destinations, files=()):
        """FILES: those of DESTINATIONS that are files mounted (the libraries): nothing lies
        under them, so their own links need not be followed (each a lookup a replay repeats)."""
        self._rootfs = rootfs
        self._destinations = [d for d in destinations if isinstance(d, str) and d.startswith("/")]
        self._files = set(files)
        self._root, self._at, self._tops = None, None, None

    def canonical(self, path):
        """PATH as the root holds it (engine.Root.canonical), or merely cleaned where the root
        cannot be opened (the planner says why)."""
        if self._root is None:
            from ..ldconfig.engine import LdcacheError, Root
            try:
                self._root = Root(self._rootfs)
            except LdcacheError:
                self._root = False
        if self._root is False:
            return posixpath.normpath("/" + path.lstrip("/"))
        return self._root.canonical(path)

    def _places(self):
        if self._at is None:
            self._at = {self.canonical(d) for d in self._destinations}
            # (a mount lands where its destination leads: a link there is followed by runc)
            self._tops = set(self._at)
            if self._root:
                self._tops.update(self._root.place(d) for d in self._destinations if d not in self._files)
        return self._at, self._tops

    def at_a_mount(self, path):
        """Whether a mount lands at PATH itself."""
        return self.canonical(path) in self._places()[0]

    def under_a_mount(self, path):
        """Whether PATH lies under (not at) a mount's place."""
        place, tops = self.canonical(path), self._places()[1]
        return any(place != top and place.startswith(top.rstrip("/") + "/") for top in tops)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._root:
            self._root.close()
        self._root = None


def make_links(rootfs, links):
    """Create LINK -> TARGET inside the rootfs (parents made as needed), never leaving it, as the
    toolkit's create-symlinks does: what is at LINK is replaced (a temporary link renamed over
    it), an identical link left; a directory there raises IsADirectoryError (cds_link_at)."""
    from .._native import ffi, lib

    rootfd = os.open(rootfs, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    parents = {}
    try:
        for target, link in links:
            parent, name = posixpath.split(posixpath.normpath(link))
            fd = parents.get(parent)
            if fd is None:
                fd = parents[parent] = open_dir_in_root(rootfd, parent, ffi, lib)
            if lib.cds_link_at(fd, os.fsencode(name), os.fsencode(target)) < 0:
                error = ffi.errno
                raise OSError(error, os.strerror(error), link)
    finally:
        for fd in parents.values():
            os.close(fd)
        os.close(rootfd)


def open_dir_in_root(rootfd, path, ffi, lib):
    """An O_PATH descriptor of PATH inside the root, making missing directories (0755):
    cds_inroot_open_dirs, the front end's own (csrc/engine/replay.c)."""
    failed_at = ffi.new("size_t *")
    encoded = os.fsencode(path)
    fd = lib.cds_inroot_open_dirs(rootfd, encoded, failed_at)
    if fd < 0:
        error = ffi.errno
        raise OSError(error, os.strerror(error), os.fsdecode(encoded[:failed_at[0]]))
    return fd


def soname_links_to_make(rootfs, folders, updates, libraries, compat, log, start):
    """[(target, link, host file)]: the soname links ldconfig would make beside the mounted
    LIBRARIES (plan.soname_links), where its create_links would: a missing name, or a link
    that leads elsewhere (replaced); anything else there (the image's own file) is left ("is
    not a symbolic link"). None without an update-ldcache hook (no ldconfig, no links)."""
    if not updates or not libraries:
        return []
    from ..ldconfig.engine import LdcacheError, Root
    from ..ldconfig.ldcache import LINKER_TIME_LIMIT, Deadline
    from ..ldconfig.plan import soname_links

    try:
        wanted = soname_links(rootfs, folders, extra=libraries, deadline=Deadline(LINKER_TIME_LIMIT, start),
                              compat=compat)
        root = Root(rootfs)
    except (LdcacheError, OSError) as err:
        log.debug(f"soname links not worked out ({err}): the planner says why")
        return []
    todo = []
    with root:
        for link, name, file in wanted:
            if file not in libraries:
                continue    # (the image's own file: its link is the image's)
            directory = posixpath.dirname(link)
            found = root.stat(directory)
            if found is None:
                # (a folder the image lacks is runc's to make, for the mount, before the hook's
                # ldconfig runs there and makes the link: make_links makes it, 0755, as runc does)
                if root.errno == errno.ENOENT:
                    todo.append((name, link, libraries[file]))
                continue
            if not stat.S_ISDIR(found[0]):
                continue
            there = root.stat(link, follow=False)
            if there is None and root.errno == errno.ENOENT or there is not None and stat.S_ISLNK(there[0]) \
                    and _link_text(root, link) != name:
                todo.append((name, link, libraries[file]))
    return todo


def _link_text(root, link):
    """The text of the link LINK in ROOT (engine.Root), or None."""
    parent, name = posixpath.split(link)
    fd = root.open(parent, os.O_PATH | os.O_DIRECTORY)
    if fd < 0:
        return None
    try:
        return os.readlink(name, dir_fd=fd)
    except OSError:
        return None
    finally:
        os.close(fd)


def _make_noted_links(rootfs, links, out):
    """make_links, noted in OUT (what the links change, then the links)."""
    out.linking(rootfs, links)
    make_links(rootfs, links)
    out.linked(links)


def make_soname_links(rootfs, links, out):
    """Make the soname LINKS (soname_links_to_make) once the cache is planned. A failure is
    ldconfig's warning, not an error (the cache still names the file's soname path)."""
    try:
        _make_noted_links(rootfs, links, out)
    except OSError as err:
        out.warn(f"soname links not all made in {rootfs}: {err}")


def dangling_later(rootfs, pending, libraries, links_made, places):
    """(links to make now, links to make after planning): the latter lead nowhere in the root
    (not to an image file, a mounted library or another link being made: compared by place,
    PLACES a MountPlaces of the root)."""
    from ..ldconfig.engine import LdcacheError, Root

    now, later = [], []
    try:
        root = Root(rootfs)
    except LdcacheError:
        return pending, []
    coming = {places.canonical(path) for path in (*libraries, *links_made)}
    with root:
        for target, link in pending:
            path = posixpath.normpath(target if target.startswith("/") else
                                      posixpath.join(posixpath.dirname(link), target))
            reached = root.stat(path)
            missing = reached is None and root.errno in (errno.ENOENT, errno.ENOTDIR)
            there = root.stat(link, follow=False)
            # (a target that leads to what is at the link path now -- the image's soname link
            # to its own stub there -- loops once the link replaces it: it leads nowhere too)
            loops = reached is not None and there is not None and reached[1:3] == there[1:3]
            if places.canonical(path) in coming or reached is not None and not loops \
                    or reached is None and not missing:
                now.append((target, link))
            elif there is None or _link_text(root, link) == target:
                later.append((target, link))
            else:
                # Something of the image is there: replaced before planning, so the cache drops
                # its entry, by a link that dangles as the hook's does during its ldconfig's scan
                # (its target a soname link ldconfig makes after the scan); the link itself
                # after planning.
                now.append((PENDING_LINK, link))
                later.append((target, link))
    return now, later


def made_links(rootfs, call, links, out, reasons):
    """Make a create-symlinks hook's LINKS in the rootfs: True, or False (the hook is kept, its
    reason in REASONS) when they cannot be made."""
    if not links:
        return True
    try:
        _make_noted_links(rootfs, links, out)
    except IsADirectoryError as err:
        # the toolkit's hook fails the create here too (its rename over a directory)
        from .toolkit_hooks import HookFailure

        raise HookFailure("create-symlinks", f"cannot create the link {err.filename}: is a directory") from None
    except OSError as err:
        out.warn(f"keeping a create-symlinks hook: cannot create its links in {rootfs}: {err}")
        reasons[call.at] = f"cannot create its links in {rootfs}: {err}"
        return False
    out.log.debug(f"created {len(links)} library link(s) in {rootfs}")
    return True
