"""The host files a spec's edits need when a container is created: bind-mount sources and the
device nodes whose type and numbers come from the host. One rule for `cdi validate`, the
runtime's create and `doctor`: runc fails on a missing bind source with its own `error mounting
... no such file or directory`, which names neither the spec nor the device."""
import os

_BIND_TYPES = ("", "bind", "rbind", "none")
MOUNT_SOURCE, DEVICE_NODE = "mount source", "device node"


def _binds(mount):
    return (mount.get("type") or "") in _BIND_TYPES or any(
        option in ("bind", "rbind") for option in mount.get("options") or ())


def host_files(edits):
    """[(what, host path, needed)] of one containerEdits block, in its order. A device node the
    spec describes whole (type, and major unless a FIFO) is not needed: runc creates it from the
    spec, as the CDI library allows; its absence matters only to doctor."""
    files = []
    for mount in (edits or {}).get("mounts") or ():
        source = mount.get("hostPath") or ""
        if source.startswith("/") and _binds(mount):
            files.append((MOUNT_SOURCE, source, True))
    for node in (edits or {}).get("deviceNodes") or ():
        path = node.get("hostPath") or node.get("path") or ""
        if path:
            described = bool(node.get("type")) and (bool(node.get("major")) or node.get("type") == "p")
            files.append((DEVICE_NODE, path, not described))
    return files


def missing_host_files(edits):
    """[(what, host path)] of the needed files of one containerEdits block that are not there:
    one stat a path (a mount source is followed, as runc follows it; a device node is not, as
    the CDI library lstats it)."""
    missing = []
    for what, path, needed in host_files(edits):
        if needed and not (os.path.exists(path) if what == MOUNT_SOURCE else os.path.lexists(path)):
            missing.append((what, path))
    return missing


def describe_missing(missing, shown=3):
    """"A (mount source of D), B (device node) and 2 more" for [(owner or None, what, path)]."""
    words = [f"{path} ({what}{' of ' + owner if owner else ''})" for owner, what, path in missing[:shown]]
    more = len(missing) - shown
    return ", ".join(words) + (f" and {more} more" if more > 0 else "")
