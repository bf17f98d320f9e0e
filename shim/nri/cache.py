"""The NRI hook's cache work, as the runtime does it (shim/linker/container.py): the toolkit's
enable-cuda-compat and update-ldcache hooks of a container, on its rootfs after runc's mounts.

The hook's items come in the spec's hook order: a folder (update-ldcache's --folder; "" for an
update-ldcache call without one, which rebuilds the cache all the same) or a compat call
("DRIVER:CUDA": enable-cuda-compat's --host-driver-version and --host-cuda-version).
For each compat call the compat folder is decided by the runtime's own code
(toolkit_hooks.cuda_compat_folder: the compat libcuda's note, else the driver majors; the
folder's links resolved inside the root, as the real hook names it). A compat folder that an
update-ldcache hook after it reads is its drop-in first in the cache's configuration (as the
runtime's step: the compat libcuda wins); one that no later update-ldcache reads is written as
its drop-in alone (the toolkit's hook writes it all the same). What the hooks leave under /etc
is written as they leave it (etcfiles: ld.so.conf where there is none, the drop-ins, the musl
path file, the cache), every path resolved inside the root. The soname links the hook's ldconfig
makes beside the spec's mounted library files (MOUNTED: the container paths of the mounts below
the root, read from the hook's mount namespace) are made as the runtime makes them
(links.soname_links_to_make: the same files, the same rules), before the files, and the cache
names them as ldconfig's does.

Used by the plugin's hook server (hookserver.py, the rootfs a descriptor) and by
`cdi-shim-hook nri` (hook.py, the fallback when the plugin is away).
"""
import os
import posixpath

COMPAT = "cuda-compat:"   # a request item of the hook socket: "cuda-compat:DRIVER:CUDA"


def compat_call(value):
    """enable-cuda-compat's call for VALUE ("DRIVER:CUDA", either side may be empty)."""
    from ..linker.container import HookCall

    driver, sep, cuda = value.partition(":")
    if not sep:
        raise ValueError(f"malformed --cuda-compat {value!r}: expected DRIVER:CUDA")
    args = ["nvidia-cdi-hook", "enable-cuda-compat"]
    args += [f"--host-driver-version={driver}"] if driver else []
    args += [f"--host-cuda-version={cuda}"] if cuda else []
    return HookCall({"path": "nvidia-cdi-hook", "args": args})


def update(rootfs, items, mounted=()):
    """Do ITEMS ([("folder", DIR) | ("compat", "DRIVER:CUDA")], in hook order) on ROOTFS, whose
    mounts below it are at MOUNTED (container paths). Returns (the folders, None where no cache
    was written, the compat folders
    the cache reads first, those written alone). Raises HookFailure, LdcacheError, OSError,
    ValueError."""
    answer = work(rootfs, items, mounted)
    write(rootfs, answer.files, answer.links)
    return answer.folders, answer.first, answer.alone


class Answer:
    """What ITEMS come to on a root: the folders (None: no update-ldcache, no cache), the compat
    folders read first and written alone, the files to write ([(path, bytes)], in order), the
    folders the plan configured and the soname links to make first ([(target, link)])."""

    __slots__ = ("folders", "first", "alone", "files", "dirs", "links")

    def __init__(self, folders, first, alone, files, dirs, links=()):
        self.folders, self.first, self.alone, self.files, self.dirs = folders, first, alone, files, dirs
        self.links = list(links)


class _Quiet:
    def debug(self, message):
        pass


def mounted_libraries(rootfs, mounted):
    """{container path: the file through ROOTFS} of the library files mounted at MOUNTED (the
    runtime's libraries: the spec's mounts named as libraries are; here the regular files)."""
    import stat

    from ..linker.container import _is_library

    libraries = {}
    for path in mounted:
        if _is_library(path):
            try:
                if stat.S_ISREG(os.stat(rootfs + path, follow_symlinks=False).st_mode):
                    libraries[path] = rootfs + path
            except OSError:
                pass
    return libraries


def _dangling(rootfs, sonames):
    """{link: its own path through ROOTFS} of the links beside the soname links SONAMES that lead
    to one of them and nowhere now: the hook's ldconfig scans before it makes its soname links,
    so a dev link made by create-symlinks to one (libcuda.so -> libcuda.so.1) dangles during its
    scan and is not listed (the runtime makes such links after planning: links.dangling_later).
    As extras they hide what the folder has there, and lead nowhere: skipped as ldconfig does.
    (Only links are read, by their type in the listing: a folder has hundreds of entries.)"""
    from ..ldconfig.engine import Root

    names = {posixpath.basename(link) for _, link, _ in sonames}
    hidden = {}
    with Root(rootfs, observed=False) as tree:
        for folder in dict.fromkeys(posixpath.dirname(link) for _, link, _ in sonames):
            fd = tree.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            if fd < 0:
                continue
            try:
                with os.scandir(fd) as entries:
                    for entry in entries:
                        if not entry.is_symlink():
                            continue
                        path = posixpath.join(folder, entry.name)
                        if posixpath.basename(os.readlink(entry.name, dir_fd=fd)) in names and tree.stat(path) is None:
                            hidden[path] = rootfs + path
            except OSError:
                pass
            finally:
                os.close(fd)
    return hidden


def work(rootfs, items, mounted=()):
    """The Answer for ITEMS on ROOTFS with MOUNTED (nothing written). Raises as update() does."""
    import time

    from ..ldconfig.engine import Root
    from ..ldconfig.ldcache import LINKER_TIME_LIMIT, Deadline, plan
    from ..linker.etcfiles import _etc_files, compat_files
    from ..linker.links import soname_links_to_make
    from ..linker.toolkit_hooks import cuda_compat_folder

    start = time.monotonic()
    deadline = Deadline(LINKER_TIME_LIMIT, start)
    updates = any(kind == "folder" for kind, _ in items)
    folders = list(dict.fromkeys(value for kind, value in items if kind == "folder" and value))
    first, alone = [], []
    for index, (kind, value) in enumerate(items):
        if kind != "compat":
            continue
        folder = cuda_compat_folder(rootfs, compat_call(value))
        if folder:
            read = any(later == "folder" for later, _ in items[index + 1:])
            (first if read else alone).append(folder)
    first, alone = list(dict.fromkeys(first)), list(dict.fromkeys(alone))
    libraries = mounted_libraries(rootfs, mounted) if updates and mounted else {}
    sonames = soname_links_to_make(rootfs, folders, updates, libraries, first, _Quiet(), start) if libraries else []
    # (planned as the runtime plans: the mounted files and their soname links as extras)
    extra = dict(_dangling(rootfs, sonames), **libraries, **{link: file for _, link, file in sonames})
    result = plan(rootfs, folders, extra=extra or None, deadline=deadline, compat=first) if updates else None
    with Root(rootfs) as root:
        files = _etc_files(root, result, compat_files(alone))
    return Answer(folders if updates else None, first, alone, files, list(result.dirs) if result is not None else [],
                  [(target, link) for target, link, _ in sonames])


def write(rootfs, files, links=()):
    """LINKS ([(target, link)]: the soname links), then FILES ([(path, bytes)]) written into
    ROOTFS as the hooks leave them."""
    from ..linker.etcfiles import write_in_root
    from ..linker.links import make_links

    if links:
        try:
            make_links(rootfs, links)
        except OSError:
            pass        # (ldconfig's warning: the cache still names the file's soname path)
    for path, data in files:
        write_in_root(rootfs, path, data, 0o644)
