"""What the last step in a root left there, shared by the resident workers and the per-create
interpreters (issue 47).

A plain-folder bundle run again and again (`cdi-shim-runtime --device ... run --bundle B`) keeps
its root: each create finds the files, links and mount points the step before it made, younger
than the settle window. A step trusts such a path while it shows the identity our own step left
(trusted). The server's workers take creates in turn, so what one step left must reach the next:
each note is a file beside the recipes (``steps/.left/``, 0700, each file 0600, named by the
root's device and inode), written and read by C (csrc/engine/recipe.c, the steps folder's third
format): read back only when it is a file of ours that no one else may write, in such a folder,
of this version, whole (its checksum) and of this very root. Roots on overlayfs (every engine's:
a new mount and an empty upper folder per container) are never reused, and get no note. At most
64 notes, the oldest removed. Also here: the identities of memo entries (identify, places_of),
with that trust, and when a step left the root as a step there leaves it (only_the_cache).
"""
import os

from .._native import ffi, lib

OVERLAYFS_MAGIC = 0x794C7630


def _on_overlay(rootfs):
    """True when ROOTFS is an overlayfs mount (statfs's f_type): an engine's container root."""
    from .etcfiles import _fs_type

    return _fs_type(rootfs) == OVERLAYFS_MAGIC


def write(folder, root, left, rootfs):
    """Note LEFT ({memo entry: identity bytes}) for ROOT ((device, inode) of ROOTFS) in FOLDER (the
    steps folder's .left), written by C (cds_left_write, csrc/engine/recipe.c); nothing for a
    root on overlayfs (never reused)."""
    if not left or _on_overlay(rootfs):
        return
    from cdi import __version__

    entries = sorted(left)
    identities = ffi.new("struct cds_identity[]", len(entries))
    ffi.memmove(identities, b"".join(left[entry] for entry in entries), len(entries) * ffi.sizeof(identities[0]))
    joined = b"\0".join(entries) + b"\0"
    lib.cds_left_write(os.fsencode(folder), __version__.encode(), *root, joined, len(joined), len(entries), identities)


def read(folder, root):
    """The note for ROOT in FOLDER ({memo entry: identity bytes}), or {} (cds_left_read)."""
    from cdi import __version__

    entries, size, identities = ffi.new("char **"), ffi.new("size_t *"), ffi.new("struct cds_identity **")
    count = lib.cds_left_read(os.fsencode(folder), __version__.encode(), *root, entries, size, identities)
    if count < 0:
        return {}
    try:
        names = ffi.buffer(entries[0], size[0])[:].split(b"\0")[:-1]
        width = ffi.sizeof("struct cds_identity")
        data = ffi.buffer(identities[0], count * width)[:]
        return {name: data[at * width:(at + 1) * width] for at, name in enumerate(names)}
    finally:
        lib.cds_recipe_free(entries[0])
        lib.cds_recipe_free(identities[0])


def trusted(folder, rootfs):
    """{memo entry: identity} of the paths the last step kept in ROOTFS (this folder, by device and
    inode) left there, as noted in FOLDER: the next step in that root (whatever its key: a bundle
    run directly has its config.json rewritten by the first run) finds its own writes, links and
    mount points within the settle window, and takes each as settled while it shows the identity
    the step left (a root reused run after run: a plain-folder bundle). Any other writer's change,
    even of one of those files, gives another identity (a new inode, size or time), which the
    settle window judges as ever."""
    root = _root_id(rootfs)
    return read(folder, root) if root is not None else {}


def left(folder, done, rootfs, seen=None):
    """Note in FOLDER what an observed step left in ROOTFS (DONE: stepresult.StepResult): SEEN
    ({entry: identity} of what a kept step looked at, as it left them; None: the note there so
    far) and the paths its own writes, links and mount points changed, as they are now, for the
    next step there (trusted). A step that was refused for one of them being too new still made
    them so: the next one finds them young, and ours."""
    root = _root_id(rootfs)
    now = identify(rootfs, done.changed) if done.changed else None
    if root is None or not done.changed and seen is None:
        return
    size = ffi.sizeof("struct cds_identity")
    made = dict(trusted(folder, rootfs) if seen is None else seen)
    if now is not None:
        made.update((entry, bytes(ffi.buffer(now + index, size))) for index, entry in enumerate(done.changed))
    try:
        os.makedirs(os.path.dirname(folder), mode=0o700, exist_ok=True)
    except OSError:
        return
    write(folder, root, made, rootfs)


def _root_id(rootfs):
    try:
        st = os.stat(rootfs)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def places_of(rootfs, entries):
    """[((kind, place), entry)] of memo ENTRIES (a kind byte and a path) in ROOTFS: the path with
    its folders' links followed (engine.Root.canonical), the last name as written (what the links
    of a step change is that name, never the folders above it), looked up without being observed."""
    from ..ldconfig.engine import LdcacheError, Root

    if not entries:
        return []
    try:
        root = Root(rootfs, observed=False)
    except LdcacheError:
        return []
    with root:
        return [((entry[:1], root.canonical(os.fsdecode(entry[1:]))), entry) for entry in entries]


def identify(rootfs, entries, started=None, trusted=None):
    """The identities (struct cds_identity[]) of memo ENTRIES in ROOTFS, or None when one of
    them changed within the settle time before STARTED (unless None), or the root cannot be
    opened. TRUSTED ({entry: identity bytes}, trusted): an entry showing that identity
    is exempt from the settle time (our own step left it so)."""
    identities = _identify(rootfs, entries, started if not trusted else None)
    if identities is None or not trusted or started is None:
        return identities
    size = ffi.sizeof("struct cds_identity")
    shown = {entry: bytes(ffi.buffer(identities + index, size)) for index, entry in enumerate(entries)}
    young = [entry for entry in entries if trusted.get(entry) != shown[entry]]
    if young:
        # (our own writes, noted as the mounts spell them, read under another spelling: merged /usr)
        ours = {place: trusted[entry] for place, entry in places_of(rootfs, list(trusted))}
        young = [entry for place, entry in places_of(rootfs, young) if ours.get(place) != shown[entry]]
    return identities if not young or _identify(rootfs, young, started) is not None else None


def _identify(rootfs, entries, started):
    paths = b"\0".join(entries) + b"\0"
    identities = ffi.new("struct cds_identity[]", max(1, len(entries)))
    try:
        rootfd = os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        unsettled = lib.cds_memo_identify(rootfd, paths, len(paths), len(entries), started or 0, identities)
    finally:
        os.close(rootfd)
    return identities if unsettled == 0 or (started is None and unsettled > 0) else None


_CACHE_AND_ITS_FOLDER = {b"/etc/ld.so.cache", b"/etc"}


def only_the_cache(changed, done, rootfs):
    """True when the only entries the step changed (CHANGED, of those it looked at; and of all
    that its links, writes and mount points change: done.changed) are the linker cache it wrote
    and /etc above it: a step in the root it left then writes the same and changes nothing. The
    cache is the planner's for the folders and drop-ins, which the step left as they were (the
    root's own cache only spares a scan: the same bytes as a full one, test_reused_root); its
    links, mount points and drop-ins were there already. (Not so a first run in a fresh root: the
    link create-symlinks makes to a soname link ldconfig makes after its scan dangles during the
    scan and is made after the cache, so the next step's cache lists it, as the toolkit's
    ldconfig does on a reused root: test_direct_runs.) Never on overlayfs: an engine's next
    container starts from the image again, so the recipe is of the root as the step found it."""
    if not any(path == "/etc/ld.so.cache" for path, _, _ in done.root_files) or \
            any(entry[1:] not in _CACHE_AND_ITS_FOLDER for entry in changed) or _on_overlay(rootfs):
        return False
    others = [entry for entry in done.changed if entry[1:] not in _CACHE_AND_ITS_FOLDER]
    now = identify(rootfs, others) if others else None
    size = ffi.sizeof("struct cds_identity")
    return not others or now is not None and all(
        done.before.get(entry) == bytes(ffi.buffer(now + index, size)) for index, entry in enumerate(others))
