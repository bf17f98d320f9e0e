"""Container edits: their validation and their application to an OCI config.

An OCI config is the plain dict read from ``config.json``. Applying never mutates the input:
every object on the path to a change is copied first (copy-on-write), and everything that can
fail (host stats, type checks of the config) happens before the result is returned, so a
failure leaves the caller's config exactly as it was.
"""
import os
import posixpath
import stat

from .errors import CDIError, EditError, q

HOOK_NAMES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")
NO_PERMISSIONS = "none"
_DEVICE_TYPES = ("", "b", "c", "u", "p")
EDIT_CATEGORIES = ("env", "deviceNodes", "netDevices", "hooks", "mounts", "additionalGids")


# --- validation (messages are the reference's) --------------------------------------------

class EditsInvalid(CDIError):
    def __init__(self, field, reason):
        self.field, self.reason = field, reason
        super().__init__(f"{field}: {reason}")


def _check_env(env, field):
    for index, entry in enumerate(env or ()):
        if entry.find("=") <= 0:
            return f"{field}[{index}]", f'invalid environment variable {q(entry)}'
    return None


def is_empty(edits):
    """True when the edits change nothing (allowed for a spec, not for a device)."""
    if not edits:
        return True
    return not any(edits.get(key) for key in EDIT_CATEGORIES) and edits.get("intelRdt") is None


def validate_edits(edits, field):
    """Raise EditsInvalid (with the field path of the culprit) for invalid container edits."""
    if not edits:
        return
    bad = _check_env(edits.get("env"), f"{field}.env")
    if bad:
        raise EditsInvalid(bad[0], "invalid container edits: " + bad[1])
    for index, node in enumerate(edits.get("deviceNodes") or ()):
        where = f"{field}.deviceNodes[{index}]"
        if node is None:
            raise EditsInvalid(where, "invalid (nil) device node")
        path = node.get("path", "")
        if not path:
            raise EditsInvalid(f"{where}.path", "invalid (empty) device path")
        if node.get("type", "") not in _DEVICE_TYPES:
            raise EditsInvalid(f"{where}.type", f'device {q(path)}: invalid type ' + q(node["type"]))
        permissions = node.get("permissions", "")
        if permissions and permissions != NO_PERMISSIONS and permissions.strip("rwm"):
            raise EditsInvalid(f"{where}.permissions", f'device {q(path)}: invalid permissions {q(permissions)}')
    for index, hook in enumerate(edits.get("hooks") or ()):
        where = f"{field}.hooks[{index}]"
        if hook is None:
            raise EditsInvalid(where, "invalid (nil) hook")
        name = hook.get("hookName", "")
        if name not in HOOK_NAMES:
            raise EditsInvalid(f"{where}.hookName", f'invalid hook name {q(name)}')
        if not hook.get("path"):
            raise EditsInvalid(f"{where}.path", f'invalid hook {q(name)} with empty path')
        if not hook["path"].startswith("/"):  # [DIVERGES] from the CNCF library: see _relative_hook
            raise EditsInvalid(f"{where}.path", _relative_hook(name, hook["path"]))
        bad = _check_env(hook.get("env"), f"{where}.env")
        if bad:
            raise EditsInvalid(bad[0], f'invalid hook {q(name)}: {bad[1]}')
    for index, mount in enumerate(edits.get("mounts") or ()):
        where = f"{field}.mounts[{index}]"
        if mount is None:
            raise EditsInvalid(where, "invalid (nil) mount")
        if not mount.get("hostPath"):
            raise EditsInvalid(f"{where}.hostPath", "invalid mount, empty host path")
        if not mount.get("containerPath"):
            raise EditsInvalid(f"{where}.containerPath", "invalid mount, empty container path")
    rdt = edits.get("intelRdt")
    if rdt is not None:
        clos = rdt.get("closID", "")
        if clos != "/" and (len(clos) >= 4096 or clos in (".", "..") or "/" in clos or "\n" in clos):
            raise EditsInvalid(f"{field}.intelRdt.closID", "invalid ClosID")
    _validate_net_devices(edits.get("netDevices") or (), f"{field}.netDevices")


def _relative_hook(name, path):
    """The CNCF library accepts a relative hook path; the OCI runtime spec requires an absolute
    one, and runc starts createContainer hooks in the container's rootfs (before pivot_root),
    where a relative path names a file of the image, run with the host's privileges."""
    return f"invalid hook {q(name)}: path {q(path)} is not absolute (the OCI runtime spec requires an absolute path)"


def _validate_net_devices(devices, field):
    host_seen, name_seen = {}, {}
    for index, dev in enumerate(devices):
        if dev is None:
            raise EditsInvalid(f"{field}[{index}]", "invalid (nil) linux net device")
        host, name = dev.get("hostInterfaceName", ""), dev.get("name", "")
        if not host:
            raise EditsInvalid(f"{field}[{index}].hostInterfaceName",
                               "invalid linux net device, empty HostInterfaceName")
        if not name:
            raise EditsInvalid(f"{field}[{index}].name", "invalid linux net device, empty Name")
        if host in host_seen:
            raise EditsInvalid(f"{field}[{index}].hostInterfaceName",
                               f'invalid linux net device, duplicate HostInterfaceName {q(host)} '
                               f'with names {q(name)} and {q(host_seen[host])}')
        host_seen[host] = name
        if name in name_seen:
            raise EditsInvalid(f"{field}[{index}].name",
                               f'invalid linux net device, duplicate Name {q(name)} '
                               f'with HostInterfaceName {q(host)} and {q(name_seen[name])}')
        name_seen[name] = host


# --- merging ------------------------------------------------------------------------------

def merge_edits(blocks):
    """Concatenate edit blocks in order; the last intelRdt wins (the reference's Append)."""
    merged = {key: [] for key in EDIT_CATEGORIES}
    merged["intelRdt"] = None
    for edits in blocks:
        if not edits:
            continue
        for key in EDIT_CATEGORIES:
            if edits.get(key):
                merged[key].extend(edits[key])
        if edits.get("intelRdt") is not None:
            merged["intelRdt"] = edits["intelRdt"]
    return merged


# --- host device nodes --------------------------------------------------------------------

def _strerror(err):
    text = os.strerror(err.errno) if err.errno else str(err)
    return text[:1].lower() + text[1:]


def resolve_device_node(node):
    """The OCI device for a CDI device node, filled from the host as the reference does.

    Uses lstat: a symlink is never followed, so it is "not a device node".
    """
    dev_type = node.get("type", "")
    major, minor = node.get("major", 0) or 0, node.get("minor", 0) or 0
    file_mode = node.get("fileMode")
    path = node["path"]
    host_path = node.get("hostPath") or path
    minimal = dev_type != "" and (major != 0 or dev_type == "p")
    try:
        info = os.lstat(host_path)
    except OSError as err:
        if not minimal:
            raise EditError(f'failed to stat CDI host device {q(host_path)}: {_strerror(err)}') from None
        info = None
    host_type = None
    if info is not None:
        mode = info.st_mode
        host_type = ("b" if stat.S_ISBLK(mode) else "c" if stat.S_ISCHR(mode)
                     else "p" if stat.S_ISFIFO(mode) else None)
        if host_type is None and not minimal:
            raise EditError(f'failed to stat CDI host device {q(host_path)}: not a device node')
    if host_type is not None:
        if file_mode is None:
            file_mode = stat.S_IMODE(mode)
        if not minimal:
            if dev_type == "":
                dev_type = host_type
            elif dev_type != host_type:
                raise EditError(f'CDI device ({q(path)}, {q(host_path)}), host type mismatch '
                                f"({dev_type}, {host_type})")
            if dev_type != "p" and major == 0:
                major, minor = os.major(info.st_rdev), os.minor(info.st_rdev)
    device = {"path": path, "type": dev_type, "major": major, "minor": minor}
    if file_mode is not None:
        device["fileMode"] = file_mode
    for key in ("uid", "gid"):
        if node.get(key) is not None:
            device[key] = node[key]
    return device


# --- applying -----------------------------------------------------------------------------

class _Config:
    """Copy-on-write access to nested objects of an OCI config, with type checks."""

    def __init__(self, config):
        if not isinstance(config, dict):
            raise EditError("can't edit OCI config: the document is not a JSON object")
        self.root = dict(config)
        self._copied = {(): self.root}

    def obj(self, *path):
        """The object at path (created if missing), copied once so edits don't reach the input."""
        if path in self._copied:
            return self._copied[path]
        parent = self.obj(*path[:-1])
        value = parent.get(path[-1])
        if value is None:
            value = {}
        elif not isinstance(value, dict):
            raise EditError(f"can't edit OCI config: {'.'.join(path)} is not an object")
        value = parent[path[-1]] = dict(value)
        self._copied[path] = value
        return value

    def peek(self, *path):
        """The value at path without creating or copying anything (None when absent)."""
        value = self.root
        for key in path:
            if not isinstance(value, dict):
                return None
            value = value.get(key)
        return value

    def list(self, *path):
        """The list at path (created if missing), copied once like obj()."""
        if path in self._copied:
            return self._copied[path]
        parent = self.obj(*path[:-1])
        value = parent.get(path[-1])
        if value is None:
            value = []
        elif not isinstance(value, list):
            raise EditError(f"can't edit OCI config: {'.'.join(path)} is not a list")
        value = parent[path[-1]] = list(value)
        self._copied[path] = value
        return value


def _clean_depth(destination):
    cleaned = posixpath.normpath(destination) if destination else "."
    if cleaned.startswith("//"):
        cleaned = "/" + cleaned.lstrip("/")
    return cleaned.count("/")


def _has_user_namespace(config):
    namespaces = config.peek("linux", "namespaces")
    return isinstance(namespaces, list) and any(
        isinstance(ns, dict) and ns.get("type") == "user" for ns in namespaces)


def _oci_mount(mount, user_namespace):
    result = {"destination": mount["containerPath"], "source": mount["hostPath"]}
    if mount.get("type"):
        result["type"] = mount["type"]
    options = list(mount.get("options") or ())
    if user_namespace:
        # A bind mount in a user namespace is id-mapped, as the reference head does.
        recursive = "rbind" in options
        if (recursive or "bind" in options or mount.get("type") == "bind") \
                and "idmap" not in options and "ridmap" not in options:
            options.append("ridmap" if recursive else "idmap")
    if options:
        result["options"] = options
    return result


def _oci_hook(hook):
    result = {"path": hook["path"]}
    for key in ("args", "env"):
        if hook.get(key):
            result[key] = list(hook[key])
    if hook.get("timeout") is not None:
        result["timeout"] = hook["timeout"]
    return result


def _apply_env(config, env):
    current = config.list("process", "env")
    index = {}
    for position, entry in enumerate(current):
        if not isinstance(entry, str):
            raise EditError(f"can't edit OCI config: process.env[{position}] is not a string")
        # The last entry of a key is the one runc leaves in effect, and the one the reference
        # indexes (createEnvCacheMap in internal/ociedit/spec_editor.go: later entries overwrite).
        index[entry.partition("=")[0]] = position
    for entry in env:
        key = entry.partition("=")[0]
        if key in index:
            current[index[key]] = entry  # replace in place (reference head)
        else:
            index[key] = len(current)
            current.append(entry)


def _apply_device_nodes(config, nodes):
    # Stat everything first: a failure here must leave nothing half-done.
    devices = [(node, resolve_device_node(node)) for node in nodes]
    user = config.peek("process", "user")
    user = user if isinstance(user, dict) else {}
    linux_devices = config.list("linux", "devices")
    rules = None  # linux.resources is only touched when a cgroup rule is added (Go omitempty)
    for node, device in devices:
        for key in ("uid", "gid"):
            ident = user.get(key)
            if key not in device and isinstance(ident, int) and ident > 0:
                device[key] = ident
        path = device["path"]
        same = [i for i, dev in enumerate(linux_devices) if isinstance(dev, dict) and dev.get("path") == path]
        if same:
            del linux_devices[same[0]]
            same = same[1:]
        if same:
            linux_devices[same[0] - 1] = device
        else:
            linux_devices.append(device)
        if device["type"] in ("b", "c"):
            permissions = node.get("permissions", "")
            access = "rwm" if permissions == "" else "" if permissions == NO_PERMISSIONS else permissions
            rule = {"allow": True, "type": device["type"], "major": device["major"], "minor": device["minor"]}
            if access:
                rule["access"] = access
            if rules is None:
                rules = config.list("linux", "resources", "devices")
            rules.append(rule)


def _apply_mounts(config, mounts):
    user_namespace = _has_user_namespace(config)
    current = config.list("mounts")
    for position, mount in enumerate(current):
        if not isinstance(mount, dict):
            raise EditError(f"can't edit OCI config: mounts[{position}] is not an object")
    for mount in mounts:
        destination = mount["containerPath"]
        for position, existing in enumerate(current):
            if existing.get("destination") == destination:
                del current[position]
                break
        current.append(_oci_mount(mount, user_namespace))
    current.sort(key=lambda m: _clean_depth(m.get("destination") or ""))  # stable, by depth


def _apply_additional_gids(config, gids):
    if not any(gids):
        return
    current = config.list("process", "user", "additionalGids")
    for gid in gids:
        if gid and gid not in current:
            current.append(gid)


def apply_edits(config, edits):
    """Return a new OCI config with the merged `edits` applied; `config` is never modified.

    Order of categories is the reference's: env, device nodes (and cgroup rules), net devices,
    mounts (then one stable sort by depth), hooks, intelRdt, additional GIDs.
    Raises EditError on failure.
    """
    work = _Config(config)
    if edits.get("env"):
        _apply_env(work, edits["env"])
    if edits.get("deviceNodes"):
        _apply_device_nodes(work, edits["deviceNodes"])
    if edits.get("netDevices"):
        net = work.obj("linux", "netDevices")
        for dev in edits["netDevices"]:
            net[dev["hostInterfaceName"]] = {"name": dev["name"]}
    if edits.get("mounts"):
        _apply_mounts(work, edits["mounts"])
    for hook in edits.get("hooks") or ():
        if hook.get("hookName") not in HOOK_NAMES:
            raise EditError("unknown hook name " + q(hook.get("hookName")))
        if not isinstance(hook.get("path"), str) or not hook["path"].startswith("/"):
            raise EditError(_relative_hook(hook["hookName"], hook.get("path")))
        work.list("hooks", hook["hookName"]).append(_oci_hook(hook))
    rdt = edits.get("intelRdt")
    if rdt is not None:
        work.obj("linux")["intelRdt"] = {key: value for key, value in rdt.items()
                                         if value not in (None, "", False, [])}
    if edits.get("additionalGids"):
        _apply_additional_gids(work, edits["additionalGids"])
    return work.root
