"""CDI device requests carried in container annotations (``cdi.k8s.io/<plugin>_<id>``)."""
from .errors import CDIError, q
from .parser import is_qualified_name, parse_qualified_name

ANNOTATION_PREFIX = "cdi.k8s.io/"
MAX_NAME_LENGTH = 63
_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")


def annotation_key(plugin_name, device_id, prefix=ANNOTATION_PREFIX):
    """The annotation key for a plugin's device (plugin by convention ``vendor.device-type``)."""
    if not plugin_name:
        raise CDIError("invalid plugin name, empty")
    if not device_id:
        raise CDIError("invalid deviceID, empty")
    name = plugin_name + "_" + device_id.replace("/", "_")
    if len(name) > MAX_NAME_LENGTH:
        raise CDIError(f'invalid plugin+deviceID {q(name)}, too long')
    if name[0] not in _ALNUM:
        raise CDIError(f"invalid name {q(name)}, first '{name[0]}' should be alphanumeric")
    for char in name[1:-1]:
        if char not in _ALNUM and char not in "_-.":
            raise CDIError(f"invalid name {q(name)}, invalid character '{char}'")
    if name[-1] not in _ALNUM:
        raise CDIError(f"invalid name {q(name)}, last '{name[-1]}' should be alphanumeric")
    return prefix + name


def annotation_value(devices):
    """The annotation value for a list of qualified device names (comma-joined)."""
    for device in devices:
        parse_qualified_name(device)  # its error is the reference's error
    return ",".join(devices)


def update_annotations(annotations, plugin_name, device_id, devices):
    """A copy of `annotations` with the request added; the input is never modified."""
    try:
        key = annotation_key(plugin_name, device_id)
    except CDIError as err:
        raise CDIError(f"CDI annotation failed: {err}") from None
    if key in (annotations or {}):
        raise CDIError(f"CDI annotation failed, key {q(key)} used")
    try:
        value = annotation_value(devices)
    except CDIError as err:
        raise CDIError(f"CDI annotation failed: {err}") from None
    annotations = dict(annotations or {})
    annotations[key] = value
    return annotations


def parse_annotations(annotations, prefixes=(ANNOTATION_PREFIX,)):
    """(keys, devices) requested by annotations whose key starts with one of `prefixes`.

    Keys are taken in sorted order (the reference's order across keys is Go map order, i.e.
    random); the order inside one value is kept. Any malformed name fails the whole parse.
    """
    keys, devices = [], []
    for key in sorted(annotations or {}):
        if not key.startswith(tuple(prefixes)):
            continue
        value = annotations[key]
        if not isinstance(value, str):
            raise CDIError(f'invalid CDI annotation {q(key)}: value is not a string')
        for device in value.split(","):
            if not is_qualified_name(device):
                raise CDIError(f'invalid CDI device name {q(device)}')
            devices.append(device)
        keys.append(key)
    return keys, devices
