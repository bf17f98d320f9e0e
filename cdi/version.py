"""cdiVersion: the known versions, the minimum a spec needs, and the version gate."""
from .errors import CDIError, q

CURRENT_VERSION = "1.1.0"

# Newest first, as the reference walks them.
KNOWN_VERSIONS = ("1.1.0", "1.0.0", "0.8.0", "0.7.0", "0.6.0", "0.5.0", "0.4.0", "0.3.0", "0.2.0", "0.1.0")
EARLIEST_VERSION = "0.3.0"


def _key(version):
    return tuple(int(part) for part in version.split("."))


def normalize_version(version):
    """Strip one optional leading ``v``; None when the rest is not a known version."""
    bare = version[1:] if version.startswith("v") else version
    return bare if bare in KNOWN_VERSIONS else None


def _edits_blocks(spec):
    yield spec.get("containerEdits") or {}
    for device in spec.get("devices") or ():
        yield (device or {}).get("containerEdits") or {}


def _items(edits, key):
    return [item for item in edits.get(key) or () if item]  # nil entries are rejected later


def _requires_v110(spec):
    for edits in _edits_blocks(spec):
        rdt = edits.get("intelRdt")
        if rdt is not None and (rdt.get("schemata") is not None or rdt.get("enableMonitoring")):
            return True
        if edits.get("netDevices"):
            return True
    return False


def _requires_v070(spec):
    return any(edits.get("intelRdt") is not None or edits.get("additionalGids")
               for edits in _edits_blocks(spec))


def _requires_v060(spec):
    if spec.get("annotations"):
        return True
    if any((device or {}).get("annotations") for device in spec.get("devices") or ()):
        return True
    _, _, cls = spec.get("kind", "").partition("/")
    return "." in cls


def _requires_v050(spec):
    for device in spec.get("devices") or ():
        name = (device or {}).get("name", "")
        if name and "0" <= name[0] <= "9":
            return True
    return any(node.get("hostPath") for edits in _edits_blocks(spec) for node in _items(edits, "deviceNodes"))


def _requires_v040(spec):
    return any(mount.get("type") for edits in _edits_blocks(spec) for mount in _items(edits, "mounts"))


_GATES = (("1.1.0", _requires_v110), ("0.7.0", _requires_v070), ("0.6.0", _requires_v060),
          ("0.5.0", _requires_v050), ("0.4.0", _requires_v040))


def minimum_version(spec):
    """The oldest cdiVersion that can express every field the (decoded) spec uses."""
    for version, required in _GATES:
        if required(spec):
            return version
    return EARLIEST_VERSION


def validate_version(spec):
    """Raise CDIError unless the spec's cdiVersion is known and new enough for its content."""
    declared = spec.get("cdiVersion", "")
    version = normalize_version(declared)
    if version is None:
        raise CDIError(f'invalid version {q(declared)}')
    needed = minimum_version(spec)
    if _key(needed) > _key(version):
        raise CDIError(f"the spec version must be at least v{needed}")
    return version
