"""The NRI hook's cache work, as the runtime does it (shim/linker/container.py): the toolkit's
enable-cuda-compat and update-ldcache hooks of a container, on its rootfs after runc's mounts.

The hook's items come in the spec's hook order: a folder (update-ldcache's --folder) or a
compat call ("DRIVER:CUDA": enable-cuda-compat's --host-driver-version and --host-cuda-version).
For each compat call the compat folder is decided by the runtime's own code
(toolkit_hooks.cuda_compat_folder: the compat libcuda's note, else the driver majors; the
folder's links resolved inside the root, as the real hook names it). A compat folder that an
update-ldcache hook after it reads is its drop-in first in the cache's configuration (as the
runtime's step: the compat libcuda wins); one that no later update-ldcache reads is written as
its drop-in alone (the toolkit's hook writes it all the same). What the hooks leave under /etc
is written as they leave it (etcfiles: ld.so.conf where there is none, the drop-ins, the musl
path file, the cache), every path resolved inside the root.

Used by the plugin's hook server (hookserver.py, the rootfs a descriptor) and by
`cdi-shim-hook nri` (hook.py, the fallback when the plugin is away).
"""
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


def update(rootfs, items):
    """Do ITEMS ([("folder", DIR) | ("compat", "DRIVER:CUDA")], in hook order) on ROOTFS.
    Returns (the folders, the compat folders the cache reads first, those written alone).
    Raises HookFailure, LdcacheError, OSError, ValueError."""
    answer = work(rootfs, items)
    write(rootfs, answer.files)
    return answer.folders, answer.first, answer.alone


class Answer:
    """What ITEMS come to on a root: the folders, the compat folders read first and written
    alone, the files to write ([(path, bytes)], in order) and the folders the plan configured."""

    __slots__ = ("folders", "first", "alone", "files", "dirs")

    def __init__(self, folders, first, alone, files, dirs):
        self.folders, self.first, self.alone, self.files, self.dirs = folders, first, alone, files, dirs


def work(rootfs, items):
    """The Answer for ITEMS on ROOTFS (nothing written). Raises as update() does."""
    from ..ldconfig.engine import Root
    from ..ldconfig.ldcache import LINKER_TIME_LIMIT, Deadline, plan
    from ..linker.etcfiles import _etc_files, compat_files
    from ..linker.toolkit_hooks import cuda_compat_folder

    deadline = Deadline(LINKER_TIME_LIMIT)
    folders = list(dict.fromkeys(value for kind, value in items if kind == "folder"))
    first, alone = [], []
    for index, (kind, value) in enumerate(items):
        if kind != "compat":
            continue
        folder = cuda_compat_folder(rootfs, compat_call(value))
        if folder:
            read = any(later == "folder" for later, _ in items[index + 1:])
            (first if read else alone).append(folder)
    first, alone = list(dict.fromkeys(first)), list(dict.fromkeys(alone))
    result = plan(rootfs, folders, deadline=deadline, compat=first) if folders else None
    with Root(rootfs) as root:
        files = _etc_files(root, result, compat_files(alone))
    return Answer(folders, first, alone, files, list(result.dirs) if result is not None else [])


def write(rootfs, files):
    """FILES ([(path, bytes)]) written into ROOTFS as the hooks leave them."""
    from ..linker.etcfiles import write_in_root

    for path, data in files:
        write_in_root(rootfs, path, data, 0o644)
