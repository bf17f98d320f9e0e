"""The CRI message table (shim/bench/cri_messages.py) against its reference, data/cri-api.proto.

data/cri-api.proto is the subset of k8s.io/cri-api's pkg/apis/runtime/v1/api.proto the benchmark
and the lab use, in proto syntax with upstream's names and numbers (upstream's own numbers for
the fields the lab sets are pinned once more in tests/cri/test_cri_client.py). It is compiled
here by grpcio-tools' protoc: every message, field and enum value of the table must be the
proto's, and the proto must hold nothing the table lacks (the table drifts from neither)."""
import os
import subprocess
import sys

from google.protobuf import descriptor_pb2

from shim.bench.cri_messages import ENUMS, MESSAGES, PACKAGE, RPCS, enum_name, pb, wire_table

HERE = os.path.dirname(os.path.abspath(__file__))
F = descriptor_pb2.FieldDescriptorProto


def reference(tmp_path):
    out = tmp_path / "cri.pb"
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", os.path.join(HERE, "data"),
                    f"--descriptor_set_out={out}", "cri-api.proto"], check=True)
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    assert files.file[0].package == PACKAGE
    return files.file[0]


def test_every_message_and_field_is_the_protos(tmp_path):
    proto = reference(tmp_path)
    theirs = {message.name: message for message in proto.message_type}
    assert sorted(theirs) == sorted(MESSAGES), "the table and data/cri-api.proto hold different messages"
    checked = 0
    for name, fields in MESSAGES.items():
        their_fields = {field.name: field for field in theirs[name].field}
        assert sorted(their_fields) == sorted(field for field, *_ in fields), name
        for field, number, kind, repeated in fields:
            their = their_fields[field]
            where = f"{name}.{field}"
            assert their.number == number, where
            if their.type == F.TYPE_MESSAGE and their.type_name.endswith("Entry"):
                assert kind == "map", where
                continue
            assert (their.label == F.LABEL_REPEATED) == repeated, where
            if their.type == F.TYPE_ENUM:
                assert their.type_name == f".{PACKAGE}.{kind}", where
            elif their.type == F.TYPE_MESSAGE:
                assert their.type_name == f".{PACKAGE}.{kind}", where
            else:
                assert F.Type.Name(their.type) == f"TYPE_{kind.upper()}", where
            checked += 1
    assert checked > 100


def test_every_enum_value_is_the_protos(tmp_path):
    proto = reference(tmp_path)
    theirs = {enum.name: {value.name: value.number for value in enum.value} for enum in proto.enum_type}
    assert theirs == ENUMS
    assert (pb.POD, pb.CONTAINER, pb.NODE, pb.CONTAINER_EXITED) == (0, 1, 2, 2)
    assert enum_name("ContainerState", 1) == "CONTAINER_RUNNING" and enum_name("ContainerState", 9) == "9"


def test_every_rpc_is_the_protos(tmp_path):
    proto = reference(tmp_path)
    methods = {f"/{PACKAGE}.{service.name}/{method.name}": (method.input_type, method.output_type)
               for service in proto.service for method in service.method}
    ours = {service + name: (f".{PACKAGE}.{request}", f".{PACKAGE}.{response}")
            for name, (service, request, response) in RPCS.items()}
    assert ours == methods


def test_the_built_classes_speak_the_wire_format():
    """A few bytes by hand: enum fields go as varints, maps as entries, CDI_devices as field 17."""
    config = pb.NamespaceOption(network=pb.NODE, pid=pb.CONTAINER)
    assert config.SerializeToString() == b"\x08\x02\x10\x01"
    spec = pb.ContainerConfig(CDI_devices=[pb.CDIDevice(name="v/c=0")], annotations={"k": "v"})
    assert spec.SerializeToString() == b"\x52\x06\x0a\x01k\x12\x01v" + b"\x8a\x01\x07\x0a\x05v/c=0"
    assert wire_table()["ContainerStatus"][2] == ("state", 3, "int32", False)
