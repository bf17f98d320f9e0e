"""OCI hooks that replace nvidia-cdi-hook's update-ldcache and create-symlinks.

Both read the container state (JSON) on stdin, find the rootfs through the bundle's
config.json and work inside it without following anything out of it: no ldconfig is run, no
pivot_root is needed, and nothing of the image (its environment, its binaries, its libraries)
is executed or loaded by the hook. The runtime normally does this work itself before runc
starts and drops these hooks; they exist for specs run by other runtimes.
"""
import os

from .. import fastjson
from ..bundle import BundleError, read_config, rootfs_path


class HookError(Exception):
    pass


def container_rootfs(state_text):
    """The rootfs of the container described by an OCI state document."""
    try:
        state = fastjson.loads(state_text)
    except ValueError as err:
        raise HookError(f"the container state on stdin is not JSON: {err}") from None
    bundle = state.get("bundle") if isinstance(state, dict) else None
    if not isinstance(bundle, str) or not os.path.isabs(bundle):
        raise HookError("the container state on stdin names no absolute bundle path")
    try:
        config, _, _ = read_config(bundle)
    except BundleError as err:
        raise HookError(str(err)) from None
    rootfs = rootfs_path(config, bundle)
    if rootfs is None:
        raise HookError(f"{bundle}/config.json names no root.path")
    if rootfs == "/":
        raise HookError("refusing to work on / as a container rootfs")
    return rootfs


def update_ldcache(rootfs, folders):
    """Write the cache the rootfs needs with FOLDERS (already mounted) into its /etc/ld.so.cache."""
    from ..ldconfig.ldcache import LINKER_TIME_LIMIT, Deadline, update

    return update(rootfs, list(dict.fromkeys(folders)), deadline=Deadline(LINKER_TIME_LIMIT))


def create_symlinks(rootfs, links):
    """Create each LINK -> TARGET ("TARGET::LINK") inside the rootfs; existing links stay."""
    from .links import make_links

    pairs = []
    for spec in links:
        target, sep, link = spec.partition("::")
        if not sep or not target or not link.startswith("/"):
            raise HookError(f'malformed --link "{spec}": expected TARGET::/ABSOLUTE/LINK')
        pairs.append((target, link))
    make_links(rootfs, pairs)
    return pairs


MAX_STATE = 1 << 20


def run(command, values, state_text):
    """Run hook COMMAND ("update-ldcache" with values["folders"], "create-symlinks" with
    values["links"]) on the container whose OCI state document (read from the hook's stdin,
    at most MAX_STATE bytes) is STATE_TEXT: None, or what went wrong."""
    from ..ldconfig.ldcache import LdcacheError

    try:
        rootfs = container_rootfs(state_text)
        if command == "update-ldcache":
            update_ldcache(rootfs, values["folders"])
        else:
            create_symlinks(rootfs, values["links"])
    except HookError as err:
        return str(err)
    except (LdcacheError, OSError) as err:
        return f"{command}: {err}"
    return None
