"""The bundle's config.json: read it carefully, replace it atomically."""
import errno
import os

from cdi.safeio import UnsafeFile, read_regular_file, write_file_atomic

from . import fastjson

MAX_CONFIG_BYTES = 64 << 20


class BundleError(Exception):
    pass


def config_path(bundle):
    return os.path.join(bundle, "config.json")


def rootfs_path(config, bundle):
    """The host path of the container's rootfs: root.path, relative to the bundle unless absolute."""
    root = config.get("root")
    path = root.get("path") if isinstance(root, dict) else None
    if not isinstance(path, str) or not path:
        return None
    return os.path.normpath(path if os.path.isabs(path) else os.path.join(bundle, path))


def read_config(bundle):
    """(parsed config dict, raw bytes, stat) of BUNDLE/config.json; BundleError if unusable."""
    path = config_path(bundle)
    try:
        raw, info = read_regular_file(path, MAX_CONFIG_BYTES, follow_links=False)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise BundleError(f"{path} is a symbolic link; refusing to follow it") from None
        raise BundleError(f"cannot open {path}: {err.strerror}") from None
    except UnsafeFile as err:
        raise BundleError(f"{path}: {err}") from None
    try:
        config = fastjson.loads(raw)
    except ValueError as err:
        raise BundleError(f"{path} is not valid JSON: {err}") from None
    except (RecursionError, SystemError):
        # The C scanner recurses per nesting level; runc itself stops at 10,000 levels.
        raise BundleError(f"{path} is nested too deeply to be an OCI config") from None
    if not isinstance(config, dict):
        raise BundleError(f"{path}: the document is not a JSON object")
    return config, raw, info


_TEMP_PREFIX = ".config.json.cdi-shim."
# The linker cache files the runtime writes into the bundle (shim.linker.container) go
# through the C engine's temp files: ".<name>.cds-<pid>-<counter>~".
_ENGINE_TEMP_PREFIX, _ENGINE_TEMP_MARK = ".cdi-shim.", ".cds-"


def _temp_writer(name):
    """The pid (text) of the writer of temp file NAME of ours, or None."""
    if name.startswith(_TEMP_PREFIX):
        return name[len(_TEMP_PREFIX):]
    if name.startswith(_ENGINE_TEMP_PREFIX) and name.endswith("~") and _ENGINE_TEMP_MARK in name:
        return name.rsplit(_ENGINE_TEMP_MARK, 1)[1].split("-", 1)[0]
    return None


def _remove_stale_temps(bundle):
    """Temp files of writers that were killed before their rename (their pid is gone):
    config.json's and the linker cache's."""
    try:
        names = [name for name in os.listdir(bundle) if name.startswith(".")]
    except OSError:
        return
    for name in names:
        pid = _temp_writer(name)
        if pid is None:
            continue
        try:
            os.kill(int(pid), 0)
            continue  # its writer is alive
        except ProcessLookupError:
            pass
        except (ValueError, PermissionError):
            continue
        try:
            os.unlink(os.path.join(bundle, name))
        except OSError:
            pass


def write_config(bundle, config, mode):
    """Replace BUNDLE/config.json atomically: temp file in the bundle, rename.

    A writer killed mid-way leaves config.json whole (old or new) and at most its temp file,
    which the next writer in that bundle removes. No fsync: a bundle is the engine's state for
    one container start, rebuilt after a crash (containerd's and CRI-O's are on tmpfs, where
    fsync does nothing); on a disk it would slow each create, for nothing.
    """
    data = fastjson.dumpb(config)
    _remove_stale_temps(bundle)
    write_file_atomic(config_path(bundle), data, mode, temp_name=f"{_TEMP_PREFIX}{os.getpid()}")
