"""Strict decoding of a spec document into plain, typed Python values.

The reference decodes specs with sigs.k8s.io/yaml's UnmarshalStrict: go-yaml v2 (YAML 1.1, so
JSON too) into JSON, then encoding/json: unknown and duplicate keys rejected, struct keys
matched exactly first and then case-insensitively, and scalars coerced to strings where the
field is a string (``name: 0`` is "0"). We compose the document with libyaml when PyYAML has it,
resolve plain scalars by go-yaml's rules (goyaml.py; PyYAML's YAML 1.1 resolver differs), and
walk the node tree against a small schema, so each error carries the field path and the bad
value.
"""
import re

import yaml

from . import goyaml
from .errors import CDIError, q

try:  # libyaml's C parser; the pure-Python one gives the same nodes, only slower.
    from yaml import CSafeLoader as _BaseLoader
except ImportError:  # pragma: no cover - depends on how PyYAML was built
    from yaml import SafeLoader as _BaseLoader

# Plain scalars without a tag keep this tag; goyaml.resolve gives them their value.
_PLAIN_TAG = "!cdi-shim/plain"
# Explicit tags that go-yaml checks against its own reading of the text.
_CHECKED_TAGS = {f"tag:yaml.org,2002:{name}": name for name in ("int", "float", "bool", "null")}


class _Loader(_BaseLoader):
    def resolve(self, kind, value, implicit):
        if kind is yaml.ScalarNode and implicit[0]:
            return _PLAIN_TAG
        return super().resolve(kind, value, implicit)


# A limit on visited nodes guards against alias bombs ("billion laughs").
MAX_NODES = 1_000_000

# encoding/json reads a JSON number into an integer field with strconv.ParseInt/ParseUint,
# base 10: only a plain integer literal is taken.
_INTEGER_LITERAL = re.compile(r"-?[0-9]+")


class DecodeError(CDIError):
    def __init__(self, field, reason):
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}" if field else reason)


# --- schema -------------------------------------------------------------------------------

class Scalar:
    def __init__(self, kind, low=None, high=None):
        self.kind, self.low, self.high = kind, low, high  # kind: str, int, bool


class ListOf:
    def __init__(self, item):
        self.item = item


class MapOf:
    def __init__(self, value):
        self.value = value


class Struct:
    def __init__(self, name, fields):
        self.name = name
        self.fields = fields
        self.folded = {key.lower(): key for key in fields}


STRING = Scalar("str")
BOOL = Scalar("bool")
INT64 = Scalar("int", -(1 << 63), (1 << 63) - 1)
UINT32 = Scalar("int", 0, (1 << 32) - 1)
INT = INT64

DEVICE_NODE = Struct("DeviceNode", {
    "path": STRING, "hostPath": STRING, "type": STRING, "major": INT64, "minor": INT64,
    "fileMode": UINT32, "permissions": STRING, "uid": UINT32, "gid": UINT32,
})
MOUNT = Struct("Mount", {"hostPath": STRING, "containerPath": STRING, "options": ListOf(STRING),
                         "type": STRING})
HOOK = Struct("Hook", {"hookName": STRING, "path": STRING, "args": ListOf(STRING),
                       "env": ListOf(STRING), "timeout": INT})
INTEL_RDT = Struct("IntelRdt", {"closID": STRING, "l3CacheSchema": STRING, "memBwSchema": STRING,
                                "schemata": ListOf(STRING), "enableMonitoring": BOOL})
NET_DEVICE = Struct("LinuxNetDevice", {"hostInterfaceName": STRING, "name": STRING})
CONTAINER_EDITS = Struct("ContainerEdits", {
    "env": ListOf(STRING), "deviceNodes": ListOf(DEVICE_NODE), "netDevices": ListOf(NET_DEVICE),
    "hooks": ListOf(HOOK), "mounts": ListOf(MOUNT), "intelRdt": INTEL_RDT,
    "additionalGids": ListOf(UINT32),
})
DEVICE = Struct("Device", {"name": STRING, "annotations": MapOf(STRING),
                           "containerEdits": CONTAINER_EDITS})
SPEC = Struct("Spec", {"cdiVersion": STRING, "kind": STRING, "annotations": MapOf(STRING),
                       "devices": ListOf(DEVICE), "containerEdits": CONTAINER_EDITS})

# --- walking ------------------------------------------------------------------------------


def _scalar_value(node, field):
    """The value go-yaml v2 gives a scalar node: None, bool, int, float or str."""
    if node.tag == _PLAIN_TAG:
        return goyaml.resolve(node.value)
    if node.tag in _CHECKED_TAGS:
        try:
            return goyaml.resolve_tagged(_CHECKED_TAGS[node.tag], node.value)
        except ValueError as err:
            raise DecodeError(field, "yaml: " + str(err)) from None
    # Quoted scalars, !!str, and tags go-yaml does not resolve: the text as written.
    return node.value


def _describe(node, value=None):
    if isinstance(node, yaml.MappingNode):
        return "object"
    if isinstance(node, yaml.SequenceNode):
        return "array"
    if value is None:
        return "null"
    kind = ("bool" if isinstance(value, bool) else "number" if isinstance(value, (int, float))
            else "string")
    return f"{kind} {node.value!r}"


class _Walker:
    def __init__(self):
        self.budget = MAX_NODES

    def value(self, node, schema, field):
        self.budget -= 1
        if self.budget < 0:
            raise DecodeError(field, f"document too large (more than {MAX_NODES} nodes after aliases)")
        value = None  # a scalar's value, as go-yaml reads it
        if isinstance(node, yaml.ScalarNode):
            value = _scalar_value(node, field)
            if value is None:
                # Go leaves the zero value: "" for a string, false for a bool, nil for the rest
                # (pointers, lists, objects; a nil entry of a list of objects is kept as None).
                if isinstance(schema, Scalar) and schema.kind != "int":
                    return "" if schema.kind == "str" else False
                return None
        if isinstance(schema, Scalar):
            return self.scalar(node, value, schema, field)
        if isinstance(schema, ListOf):
            if not isinstance(node, yaml.SequenceNode):
                raise DecodeError(field, f"cannot unmarshal {_describe(node, value)} into a list")
            return [self.value(item, schema.item, f"{field}[{index}]")
                    for index, item in enumerate(node.value)]
        if not isinstance(node, yaml.MappingNode):
            what = "a map" if isinstance(schema, MapOf) else schema.name
            raise DecodeError(field, f"cannot unmarshal {_describe(node, value)} into {what}")
        if isinstance(schema, MapOf):
            return self.mapping(node, schema, field)
        return self.struct(node, schema, field)

    def _keys(self, node, field):
        seen = set()
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise DecodeError(field, f"mapping key {_describe(key_node)} is not a scalar")
            key = key_node.value
            if key in seen:
                raise DecodeError(_join(field, key), f'mapping key {q(key)} already defined '
                                  f"(line {key_node.start_mark.line + 1})")
            seen.add(key)
            yield key, value_node

    def mapping(self, node, schema, field):
        result = {}
        for key, value_node in self._keys(node, field):
            value = self.value(value_node, schema.value, f"{field}[{key!r}]")
            result[key] = "" if value is None else value
        return result

    def struct(self, node, schema, field):
        result = {}
        for key, value_node in self._keys(node, field):
            name = key if key in schema.fields else schema.folded.get(key.lower())
            if name is None:
                raise DecodeError(_join(field, key), f'unknown field {q(key)}')
            result[name] = self.value(value_node, schema.fields[name], _join(field, name))
        return result

    def scalar(self, node, value, schema, field):
        def refused():
            return DecodeError(field, f"cannot unmarshal {_describe(node, value)} into {_type_name(schema)}")

        if not isinstance(node, yaml.ScalarNode):
            raise refused()
        if schema.kind == "str":
            # Numbers and bools are printed (``010`` is "8", ``1e3`` is "1000", ``on`` is "true").
            return goyaml.to_string(value)
        if schema.kind == "bool":
            if not isinstance(value, bool):
                raise refused()
            return value
        # A number reaches the field as the JSON encoding/json writes for it: 1.0 and 1e3 are
        # the integers 1 and 1000, 1.5 and .inf are refused.
        literal = goyaml.json_number(value)
        if literal is None or not _INTEGER_LITERAL.fullmatch(literal):
            raise refused()
        number = int(literal)
        if not schema.low <= number <= schema.high:
            raise DecodeError(field, f"number {node.value} overflows {_type_name(schema)}")
        if schema.low == 0 and literal.startswith("-"):  # -0.0 is "-0", which ParseUint refuses
            raise refused()
        return number


def _type_name(schema):
    if schema.kind == "int":
        return "uint32" if schema.low == 0 else "int64"
    return {"str": "string", "bool": "bool"}[schema.kind]


def _join(field, key):
    return f"{field}.{key}" if field else key


def decode_spec(data, name=None):
    """Decode spec bytes into a dict with canonical keys; None for an empty document.

    Raises DecodeError (with the field path) on any syntax, type, unknown-key or duplicate-key
    problem; a syntax error's position names NAME (the file), not PyYAML's "<byte string>".
    Only the first YAML document is read, as the reference does.
    """
    try:
        documents = yaml.compose_all(data, Loader=_Loader)
        node = next(documents, None)
    except yaml.YAMLError as err:
        text = " ".join(str(err).split())
        if name:  # libyaml's marks are read-only: their text is mended instead
            text = text.replace('"<byte string>"', q(name))
        raise DecodeError("", "yaml: " + text) from None
    if node is None or (isinstance(node, yaml.ScalarNode) and _scalar_value(node, "") is None):
        return None
    return _Walker().value(node, SPEC, "")
