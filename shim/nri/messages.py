"""The protobuf messages of NRI's API and of ttrpc, built at import from one table.

The wire format is protobuf's; the field numbers are the facts that carry over from
containerd/nri's pkg/api/api.proto (package nri.pkg.api.v1alpha1) and containerd/ttrpc's
request.proto (package ttrpc). Only what the plugin reads or writes is declared: a message's
other fields are kept as unknown fields by the protobuf runtime and skipped, so a newer
runtime's additions do no harm. tests/nri/test_messages.py checks every field here against a
copy of upstream's api.proto (number, type, label).

No generated code: the table becomes a FileDescriptorProto, and the protobuf runtime makes the
classes. Enums are declared as int32 fields (the same varint on the wire).
"""
from types import SimpleNamespace

from google.protobuf import descriptor_pb2, descriptor_pool

NRI_PACKAGE = "nri.pkg.api.v1alpha1"
TTRPC_PACKAGE = "ttrpc"

# message: [(field, number, type, repeated)]; a type is a scalar name, "map" (string to
# string), or another message's name in the same package.
NRI_MESSAGES = {
    "Empty": [],
    "RegisterPluginRequest": [("plugin_name", 1, "string", False), ("plugin_idx", 2, "string", False),
                              ("NRI_version", 3, "string", False)],
    "ConfigureRequest": [("config", 1, "string", False), ("runtime_name", 2, "string", False),
                         ("runtime_version", 3, "string", False), ("registration_timeout", 4, "int64", False),
                         ("request_timeout", 5, "int64", False), ("NRI_version", 6, "string", False)],
    "ConfigureResponse": [("events", 2, "int32", False)],
    "SynchronizeRequest": [("pods", 1, "PodSandbox", True), ("containers", 2, "Container", True),
                           ("more", 3, "bool", False)],
    "SynchronizeResponse": [("update", 1, "ContainerUpdate", True), ("more", 2, "bool", False)],
    "CreateContainerRequest": [("pod", 1, "PodSandbox", False), ("container", 2, "Container", False)],
    "CreateContainerResponse": [("adjust", 1, "ContainerAdjustment", False),
                                ("update", 2, "ContainerUpdate", True), ("evict", 3, "ContainerEviction", True)],
    "StateChangeEvent": [("event", 1, "int32", False), ("pod", 2, "PodSandbox", False),
                         ("container", 3, "Container", False)],
    "ContainerUpdate": [("container_id", 1, "string", False), ("ignore_failure", 3, "bool", False)],
    "ContainerEviction": [("container_id", 1, "string", False), ("reason", 2, "string", False)],
    "PodSandbox": [("id", 1, "string", False), ("name", 2, "string", False), ("uid", 3, "string", False),
                   ("namespace", 4, "string", False), ("labels", 5, "map", False),
                   ("annotations", 6, "map", False), ("runtime_handler", 7, "string", False)],
    "Container": [("id", 1, "string", False), ("pod_sandbox_id", 2, "string", False), ("name", 3, "string", False),
                  ("state", 4, "int32", False), ("labels", 5, "map", False), ("annotations", 6, "map", False),
                  ("args", 7, "string", True), ("env", 8, "string", True), ("mounts", 9, "Mount", True),
                  ("hooks", 10, "Hooks", False), ("linux", 11, "LinuxContainer", False),
                  ("user", 21, "User", False)],      # (NRI 0.9 on: absent from containerd 1.7's)
    "User": [("uid", 1, "uint32", False), ("gid", 2, "uint32", False), ("additional_gids", 3, "uint32", True)],
    "Mount": [("destination", 1, "string", False), ("type", 2, "string", False), ("source", 3, "string", False),
              ("options", 4, "string", True)],
    "Hooks": [("prestart", 1, "Hook", True), ("create_runtime", 2, "Hook", True),
              ("create_container", 3, "Hook", True), ("start_container", 4, "Hook", True),
              ("poststart", 5, "Hook", True), ("poststop", 6, "Hook", True)],
    "Hook": [("path", 1, "string", False), ("args", 2, "string", True), ("env", 3, "string", True),
             ("timeout", 4, "OptionalInt", False)],
    "LinuxContainer": [("namespaces", 1, "LinuxNamespace", True), ("devices", 2, "LinuxDevice", True),
                       ("resources", 3, "LinuxResources", False)],
    "LinuxNamespace": [("type", 1, "string", False), ("path", 2, "string", False)],
    "LinuxDevice": [("path", 1, "string", False), ("type", 2, "string", False), ("major", 3, "int64", False),
                    ("minor", 4, "int64", False), ("file_mode", 5, "OptionalFileMode", False),
                    ("uid", 6, "OptionalUInt32", False), ("gid", 7, "OptionalUInt32", False)],
    "LinuxDeviceCgroup": [("allow", 1, "bool", False), ("type", 2, "string", False),
                          ("major", 3, "OptionalInt64", False), ("minor", 4, "OptionalInt64", False),
                          ("access", 5, "string", False)],
    "LinuxResources": [("devices", 7, "LinuxDeviceCgroup", True)],
    "ContainerAdjustment": [("annotations", 2, "map", False), ("mounts", 3, "Mount", True),
                            ("env", 4, "KeyValue", True), ("hooks", 5, "Hooks", False),
                            ("linux", 6, "LinuxContainerAdjustment", False)],
    "LinuxContainerAdjustment": [("devices", 1, "LinuxDevice", True), ("resources", 2, "LinuxResources", False)],
    "KeyValue": [("key", 1, "string", False), ("value", 2, "string", False)],
    "OptionalInt": [("value", 1, "int64", False)],
    "OptionalInt64": [("value", 1, "int64", False)],
    "OptionalUInt32": [("value", 1, "uint32", False)],
    "OptionalFileMode": [("value", 1, "uint32", False)],
}

TTRPC_MESSAGES = {
    "Request": [("service", 1, "string", False), ("method", 2, "string", False), ("payload", 3, "bytes", False),
                ("timeout_nano", 4, "int64", False), ("metadata", 5, "KeyValue", True)],
    # google.rpc.Status: code and message (its details, Any, are not read)
    "Status": [("code", 1, "int32", False), ("message", 2, "string", False)],
    "Response": [("status", 1, "Status", False), ("payload", 2, "bytes", False)],
    "KeyValue": [("key", 1, "string", False), ("value", 2, "string", False)],
}

# NRI's Event enum: the events a plugin subscribes to (ConfigureResponse.events is a mask of
# 1 << (event - 1)).
CREATE_CONTAINER = 4

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {"string": _F.TYPE_STRING, "bool": _F.TYPE_BOOL, "int32": _F.TYPE_INT32, "int64": _F.TYPE_INT64,
            "uint32": _F.TYPE_UINT32, "uint64": _F.TYPE_UINT64, "bytes": _F.TYPE_BYTES}


def _map_entry_name(field):
    return "".join(part.capitalize() for part in field.split("_")) + "Entry"


def file_descriptor(name, package, messages):
    """The FileDescriptorProto of MESSAGES (the table's shape) in PACKAGE."""
    proto = descriptor_pb2.FileDescriptorProto(name=name, package=package, syntax="proto3")
    for message, fields in messages.items():
        out = proto.message_type.add(name=message)
        for field, number, kind, repeated in fields:
            spec = out.field.add(name=field, number=number, json_name=field)
            spec.label = _F.LABEL_REPEATED if repeated or kind == "map" else _F.LABEL_OPTIONAL
            if kind in _SCALARS:
                spec.type = _SCALARS[kind]
            elif kind == "map":
                entry = out.nested_type.add(name=_map_entry_name(field))
                entry.options.map_entry = True
                entry.field.add(name="key", number=1, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
                entry.field.add(name="value", number=2, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
                spec.type = _F.TYPE_MESSAGE
                spec.type_name = f".{package}.{message}.{entry.name}"
            else:
                if kind not in messages:
                    raise ValueError(f"{message}.{field}: no message {kind}")
                spec.type = _F.TYPE_MESSAGE
                spec.type_name = f".{package}.{kind}"
    return proto


def _classes(pool, package, messages):
    try:
        from google.protobuf.message_factory import GetMessageClass
    except ImportError:    # protobuf < 4.21
        from google.protobuf.message_factory import MessageFactory

        GetMessageClass = MessageFactory(pool).GetPrototype
    return SimpleNamespace(**{name: GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}"))
                              for name in messages})


def _build():
    pool = descriptor_pool.DescriptorPool()     # our own: nothing registered globally
    pool.Add(file_descriptor("cdi_shim/nri/api.proto", NRI_PACKAGE, NRI_MESSAGES))
    pool.Add(file_descriptor("cdi_shim/nri/ttrpc.proto", TTRPC_PACKAGE, TTRPC_MESSAGES))
    return _classes(pool, NRI_PACKAGE, NRI_MESSAGES), _classes(pool, TTRPC_PACKAGE, TTRPC_MESSAGES)


nri, ttrpc = _build()
