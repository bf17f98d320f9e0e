"""A CDI spec file: reading, validating, and writing.

A loaded spec is a `Spec`: its decoded document (a dict with canonical keys), the file it came
from, the priority of its directory, and its devices by name.
"""
import errno
import os

from . import parser
from .errors import CDIError, SpecError, q
from .safeio import UnsafeFile, read_regular_file, write_file_atomic

# A spec larger than this is refused rather than parsed (specs are a few hundred KiB at most).
MAX_SPEC_BYTES = 32 << 20


class Spec:
    __slots__ = ("path", "priority", "doc", "vendor", "cls", "devices")

    def __init__(self, doc, path, priority):
        self.doc = doc
        self.path = path
        self.priority = priority
        self.vendor, self.cls = parser.parse_qualifier(doc.get("kind", ""))
        self.devices = {device.get("name", ""): device for device in doc.get("devices") or ()}

    @property
    def kind(self):
        return self.doc.get("kind", "")

    @property
    def edits(self):
        return self.doc.get("containerEdits") or {}

    def qualified_names(self):
        return [parser.qualified_name(self.vendor, self.cls, name) for name in self.devices]


def validate_spec_doc(doc, path):
    """Raise SpecError for a decoded spec that the reference would reject, in its order."""
    from .container_edits import EditsInvalid, is_empty, validate_edits
    from .version import validate_version

    def invalid(field, reason):
        return SpecError(path, field, reason)

    try:
        validate_version(doc)
    except CDIError as err:
        raise invalid("cdiVersion", str(err)) from None
    vendor, cls = parser.parse_qualifier(doc.get("kind", ""))
    try:
        parser.validate_vendor_name(vendor)
        parser.validate_class_name(cls)
    except CDIError as err:
        raise invalid("kind", str(err)) from None
    try:
        validate_edits(doc.get("containerEdits"), "containerEdits")
    except EditsInvalid as err:
        raise invalid(err.field, err.reason) from None
    seen = set()
    for index, device in enumerate(doc.get("devices") or ()):
        device = device or {}
        name = device.get("name", "")
        where = f"devices[{index}]"
        try:
            parser.validate_device_name(name)
        except CDIError as err:
            raise invalid(f"{where}.name", f'failed add device {q(name)}: {err}') from None
        edits = device.get("containerEdits")
        if is_empty(edits):
            raise invalid(f"{where}.containerEdits", f'failed add device {q(name)}: invalid device, empty device edits')
        try:
            validate_edits(edits, f"{where}.containerEdits")
        except EditsInvalid as err:
            raise invalid(err.field, f'failed add device {q(name)}: invalid device {q(name)}: {err.reason}') from None
        if name in seen:
            raise invalid(f"{where}.name", f'invalid spec, multiple device {q(name)}')
        seen.add(name)
    if not seen:
        raise invalid("devices", "invalid spec, no devices")


def parse_spec(data, path, priority=0):
    """Decode and validate spec bytes; returns a Spec or raises SpecError."""
    from .decode import DecodeError, decode_spec  # PyYAML loads only when a file is parsed

    try:
        doc = decode_spec(data, path)
    except DecodeError as err:
        raise SpecError(path, err.field, "failed to unmarshal CDI Spec: " + err.reason, kind="parse") from None
    if doc is None:
        raise SpecError(path, "", "no Spec data", kind="nodata")
    # Devices given as `null` decode to None; the reference sees a zero-value device.
    if doc.get("devices"):
        doc["devices"] = [device or {} for device in doc["devices"]]
    validate_spec_doc(doc, path)
    return Spec(doc, path, priority)


def read_spec_bytes(path):
    """(bytes, stat) of a spec file, read without blocking on FIFOs or trusting its size."""
    try:
        return read_regular_file(path, MAX_SPEC_BYTES)
    except OSError as err:
        raise SpecError(path, "", os.strerror(err.errno), kind="read") from err
    except UnsafeFile as err:
        raise SpecError(path, "", str(err), kind="read") from None


def read_spec(path, priority=0):
    data, _ = read_spec_bytes(path)
    return parse_spec(data, path, priority)


# --- writing ------------------------------------------------------------------------------

def spec_file_name(vendor, cls, transient_id=""):
    """The reference's name for a generated spec file (without extension)."""
    name = f"{vendor}-{cls}"
    if transient_id:
        name += "_" + transient_id
    return name.replace("/", "_")


def _dump_yaml(doc):
    import yaml  # only the writer needs the emitter

    from .goyaml import resolve

    class Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):
        pass

    def represent_str(dumper, text):
        # PyYAML quotes what its own resolver would not read back as a string; the reference
        # reads with go-yaml's rules, where y, 0o660 and 1e3 are not strings either.
        style = "'" if not isinstance(resolve(text), str) else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)

    Dumper.add_representer(str, represent_str)
    return "---\n" + yaml.dump(doc, Dumper=Dumper, sort_keys=False, default_flow_style=False)


def spec_path(path, fmt=None):
    """PATH with the extension the format needs: FMT ("yaml" or "json") when given, else
    the one PATH has; ".yaml" is appended to a PATH that has neither."""
    if fmt is None:
        return path if path.endswith((".json", ".yaml")) else path + ".yaml"
    if path.endswith((".json", ".yaml")):
        if not path.endswith("." + fmt):
            raise CDIError(f"{q(path)}: the file name says {path.rpartition('.')[2]}, the format asked is {fmt}")
        return path
    return path + "." + fmt


def render_spec(doc, path, comment=""):
    """(doc, text): DOC as the file at PATH holds it (.json: JSON, else YAML, with COMMENT's
    lines first as "# " comments), validated by decoding it again as any reader would.

    A missing cdiVersion is filled with the minimum version the content needs."""
    from .version import minimum_version, normalize_version

    doc = dict(doc)
    if not doc.get("cdiVersion"):
        doc["cdiVersion"] = minimum_version(doc)
    elif normalize_version(doc["cdiVersion"]) is None:
        raise SpecError(path, "cdiVersion", "invalid version " + q(doc["cdiVersion"]))
    import json

    if path.endswith(".json"):
        text = json.dumps(doc, indent=2) + "\n"
    else:
        text = "".join(f"# {line}\n".replace("# \n", "#\n") for line in comment.splitlines()) + _dump_yaml(doc)
    # Round-trip through the strict decoder so what we write is exactly what we would load.
    parse_spec(text.encode(), path)
    return doc, text


def write_spec(doc, path, overwrite=True, comment=""):
    """Validate `doc` and write it atomically to `path` (.yaml or .json by extension, see
    spec_path() and render_spec()); returns the path written.

    The file is written to a temp file in the same directory, fsynced and renamed into
    place, so readers never see a partial spec, and mode 0644.
    """
    path = spec_path(path)
    _, text = render_spec(doc, path, comment)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, mode=0o755, exist_ok=True)
    if not overwrite and os.path.lexists(path):
        raise SpecError(path, "", os.strerror(errno.EEXIST), kind="read")
    write_file_atomic(path, text.encode(), 0o644, prefix="spec.", sync=True)  # .tmp: never scanned
    return path
