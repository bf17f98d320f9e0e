"""A rootless engine (podman run by a user) runs the runtime in a user namespace, where no
device node can be made: runc then bind-mounts the host's node at the container's path
(linux.devices[].path) instead. A CDI spec whose hostPath differs from its path (a driver
container's /run/nvidia/driver/dev/..., a test's fake nodes) cannot work there; say so before
runc fails with an opaque "error creating device nodes: ... no such file or directory"."""
import os
import stat

FULL_MAP = ("0", "0", "4294967295")


def in_user_namespace(uid_map="/proc/self/uid_map"):
    """True inside a user namespace other than the initial one (whose map is the identity)."""
    try:
        with open(uid_map) as stream:
            lines = [line.split() for line in stream if line.strip()]
    except OSError:
        return False
    return lines != [list(FULL_MAP)]


def _why(err):
    """ERR in words no engine misreads: podman classifies a runtime's message by its text (libpod's
    getOCIRuntimeError), so "no such file or directory" reads as "the runtime was not found"
    (exit 127) and "permission denied" as "cannot be run" (126)."""
    import errno

    if err.errno in (errno.ENOENT, errno.ENOTDIR):
        return "not on this host"
    if err.errno in (errno.EACCES, errno.EPERM):
        return "not visible to this user"
    return f"cannot be looked up ({errno.errorcode.get(err.errno, err.errno)})"


def devices_unbindable(config):
    """[(path, why)] of config's linux.devices that runc in a user namespace cannot bind from
    the host: no such node at that path, or one of another type or number."""
    problems = []
    for device in (config.get("linux") or {}).get("devices") or []:
        path = device.get("path") if isinstance(device, dict) else None
        if not isinstance(path, str):
            continue
        try:
            info = os.stat(path)
        except OSError as err:
            problems.append((path, _why(err)))
            continue
        kind = {"c": stat.S_ISCHR, "u": stat.S_ISCHR, "b": stat.S_ISBLK}.get(device.get("type"))
        if kind is None:
            continue
        if not kind(info.st_mode) or (os.major(info.st_rdev), os.minor(info.st_rdev)) != (device.get("major"),
                                                                                         device.get("minor")):
            problems.append((path, f"the host's {path} is {os.major(info.st_rdev)}:{os.minor(info.st_rdev)}, "
                                   f"not the device's {device.get('major')}:{device.get('minor')}"))
    return problems


def check(config, container_id="?"):
    """An error message when this runs rootless and a device cannot be given; else None."""
    if not in_user_namespace():
        return None
    problems = devices_unbindable(config)
    if not problems:
        return None
    listed = "; ".join(f"{path}: {why}" for path, why in problems)
    return (f"container {container_id}: running rootless (in a user namespace), where no device node can be made: "
            f"runc binds the host's node at the same path instead, and cannot for {listed}. A rootless container "
            "gets a device only where the host has it at the path the container sees (a spec whose hostPath "
            "differs from its path, as a driver container's, needs root): run the engine as root "
            "(sudo podman), or generate the spec against the host's own /dev")
