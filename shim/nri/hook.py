"""`cdi-shim-hook nri ...`: the one createContainer hook an NRI adjustment carries
(nativehook.py) in place of the toolkit's update-ldcache, create-symlinks and chmod hooks.

    cdi-shim-hook nri [--rootfs DIR] [--link TARGET::LINK]... [--chmod MODE:PATH]...
                      [--cuda-compat DRIVER:CUDA | --folder DIR]...

runc runs it in the container's mount namespace after its mounts, before pivot_root, with the
container state on stdin. In order: the links (as create-symlinks: what is at LINK replaced,
parents made), the modes (as chmod: a missing path skipped, EPERM ignored), then the linker
cache with FOLDERS (as update-ldcache; an empty one: an update-ldcache without a folder) and the
soname links beside the library files mounted below the root (read from this mount namespace),
each --cuda-compat (as enable-cuda-compat, with those host versions) before it read first
(cache.py: the runtime's decision and engine) -- all inside the root, nothing of the image run
or loaded.
With --rootfs (what cdi-shim-nshook nri execs when the plugin is away) the work is done on DIR
and the state is not read.
Errors: "Error: ..." on stderr, exit 1: runc fails the create, naming the hook.
"""
import sys

OPTIONS = {"--link": "links", "--chmod": "modes", "--folder": "folders", "--rootfs": "rootfs",
           "--cuda-compat": "compat"}


class _Everywhere:
    """Mount places for a hook that runs after the mounts: every path is reachable now."""

    def at_a_mount(self, path):
        return False

    def under_a_mount(self, path):
        return False


def parse(argv):
    """{links, modes, folders, compat, rootfs, cache} of ARGV (after `nri`; cache: the folders
    and compat calls in their order), or raise ValueError."""
    values = {key: [] for key in [*OPTIONS.values(), "cache"]}
    i = 0
    while i < len(argv):
        name, eq, value = argv[i].partition("=")
        if name not in OPTIONS:
            raise ValueError(f"unknown option {argv[i]!r}")
        if not eq:
            if i + 1 >= len(argv):
                raise ValueError(f"{name} needs a value")
            i += 1
            value = argv[i]
        values[OPTIONS[name]].append(value)
        if name in ("--folder", "--cuda-compat"):
            values["cache"].append(("folder" if name == "--folder" else "compat", value))
        i += 1
    for mode in values["modes"]:
        octal, sep, path = mode.partition(":")
        if not sep or not octal or not path:
            raise ValueError(f"malformed --chmod {mode!r}: expected MODE:PATH")
    for value in values["compat"]:
        if ":" not in value:
            raise ValueError(f"malformed --cuda-compat {value!r}: expected DRIVER:CUDA")
    return values


def _mounted(rootfs):
    """The container paths of the mounts below ROOTFS (this process runs in the container's
    mount namespace), or none where that cannot be read."""
    import os

    from .layers import Unaccounted, mounts_below

    try:
        fd = os.open(rootfs, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        return [path for path, _ in mounts_below(os.getpid(), fd)]
    except Unaccounted:
        return []
    finally:
        os.close(fd)


def run(values, state_text):
    """Do the work on the container whose OCI state is STATE_TEXT: None, or what went wrong."""
    from ..ldconfig.ldcache import LdcacheError
    from ..linker.container import HookCall
    from ..linker.hooks import HookError, container_rootfs, create_symlinks
    from ..linker.toolkit_hooks import HookFailure, chmod
    from .cache import update

    try:
        rootfs = values["rootfs"][-1] if values.get("rootfs") else container_rootfs(state_text)
        if values["links"]:
            create_symlinks(rootfs, values["links"])
        for entry in values["modes"]:
            mode, _, path = entry.partition(":")
            call = HookCall({"path": "nvidia-cdi-hook", "args": ["nvidia-cdi-hook", "chmod", "--mode", mode,
                                                                 "--path", path]})
            chmod({}, rootfs, call, _Everywhere())
        if values["cache"]:
            update(rootfs, values["cache"], _mounted(rootfs))
    except (HookError, HookFailure) as err:
        return str(err)
    except (LdcacheError, OSError) as err:
        return f"nri: {err}"
    return None


def main(argv):
    from ..linker.hooks import MAX_STATE

    try:
        values = parse(argv)
    except ValueError as err:
        sys.stderr.write(f"Error: {err}\n")
        return 2
    error = run(values, "" if values["rootfs"] else sys.stdin.buffer.read(MAX_STATE))
    if error:
        sys.stderr.write(f"Error: {error}\n")
        return 1
    return 0
