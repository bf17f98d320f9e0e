"""Our NRI message table (shim/nri/messages.py) against upstream's api.proto.

data/nri-api.proto is containerd/nri's pkg/api/api.proto at commit 8ec8b285 (Apache-2.0, its
header kept), compiled here by grpcio-tools' protoc: every field we declare must have
upstream's number, label and type (an enum is declared as int32: the same varint)."""
import os
import subprocess
import sys

from google.protobuf import descriptor_pb2

from shim.nri.messages import NRI_MESSAGES, NRI_PACKAGE, TTRPC_MESSAGES, file_descriptor, nri, ttrpc

HERE = os.path.dirname(os.path.abspath(__file__))
F = descriptor_pb2.FieldDescriptorProto


def upstream(tmp_path):
    out = tmp_path / "api.pb"
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", os.path.join(HERE, "data"),
                    f"--descriptor_set_out={out}", "nri-api.proto"], check=True)
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    assert files.file[0].package == NRI_PACKAGE
    return {message.name: message for message in files.file[0].message_type}


def test_every_field_matches_upstream(tmp_path):
    theirs = upstream(tmp_path)
    ours = file_descriptor("x.proto", NRI_PACKAGE, NRI_MESSAGES)
    checked = 0
    for message in ours.message_type:
        assert message.name in theirs, f"{message.name} is not an NRI message"
        their_fields = {field.name: field for field in theirs[message.name].field}
        for field in message.field:
            their = their_fields.get(field.name)
            assert their is not None, f"{message.name}.{field.name} is not upstream's"
            assert (field.number, field.label) == (their.number, their.label), f"{message.name}.{field.name}"
            if their.type == F.TYPE_ENUM:
                assert field.type == F.TYPE_INT32, f"{message.name}.{field.name}"
            else:
                assert field.type == their.type, f"{message.name}.{field.name}"
                if their.type == F.TYPE_MESSAGE and not field.type_name.endswith("Entry"):
                    assert field.type_name == their.type_name, f"{message.name}.{field.name}"
            checked += 1
    assert checked > 80


def test_the_services_methods_are_upstreams():
    text = open(os.path.join(HERE, "data", "nri-api.proto")).read()
    for method in ("RegisterPlugin(RegisterPluginRequest) returns (Empty)",
                   "Configure(ConfigureRequest) returns (ConfigureResponse)",
                   "Synchronize(SynchronizeRequest) returns (SynchronizeResponse)",
                   "CreateContainer(CreateContainerRequest) returns (CreateContainerResponse)",
                   "StateChange(StateChangeEvent) returns (Empty)", "Shutdown(Empty) returns (Empty)"):
        assert f"rpc {method};" in text
    assert "CREATE_CONTAINER = 4;" in text


def test_ttrpc_request_and_response_round_trip():
    # containerd/ttrpc request.proto: Request{service=1, method=2, payload=3, timeout_nano=4,
    # metadata=5}, Response{status=1 (google.rpc.Status: code=1, message=2), payload=2}
    assert [(f[0], f[1]) for f in TTRPC_MESSAGES["Request"]] == [("service", 1), ("method", 2), ("payload", 3),
                                                                 ("timeout_nano", 4), ("metadata", 5)]
    wire = ttrpc.Request(service="s", method="m", payload=b"\x01").SerializeToString()
    assert wire == b"\n\x01s\x12\x01m\x1a\x01\x01"
    wire = ttrpc.Response(payload=b"p", status={"code": 2, "message": "no"}).SerializeToString()
    assert wire == b"\n\x06\x08\x02\x12\x02no\x12\x01p"
    assert nri.ConfigureResponse(events=8).SerializeToString() == b"\x10\x08"
