"""Strict decoding: YAML 1.1 scalars, Go's case-insensitive keys, unknown and duplicate keys."""
import pytest

from cdi.decode import DecodeError, decode_spec
from cdi.spec import parse_spec, write_spec, read_spec
from cdi.errors import SpecError


def decode(text):
    return decode_spec(text.encode())


def test_yaml_11_octal_file_mode():
    doc = decode("devices: [{containerEdits: {deviceNodes: [{path: /dev/x, fileMode: 0660}]}}]")
    assert doc["devices"][0]["containerEdits"]["deviceNodes"][0]["fileMode"] == 432


def test_scalars_coerced_to_string_fields():
    doc = decode("cdiVersion: 0.5\nkind: a/b\ndevices: [{name: 0}, {name: true}]")
    assert doc["cdiVersion"] == "0.5" and [d["name"] for d in doc["devices"]] == ["0", "true"]


def test_keys_match_case_insensitively_like_go():
    doc = decode("CDIVersion: 0.3.0\nKind: a/b\nDEVICES: [{NAME: x, containeredits: {ENV: [A=1]}}]")
    assert doc == {"cdiVersion": "0.3.0", "kind": "a/b",
                   "devices": [{"name": "x", "containerEdits": {"env": ["A=1"]}}]}


def test_case_variant_keys_last_wins_like_go():
    # encoding/json assigns both to the same field; the later one wins (not an error in Go).
    assert decode("kind: a/b\nKind: c/d\n")["kind"] == "c/d"


def test_exact_duplicate_key_is_an_error():
    with pytest.raises(DecodeError) as info:
        decode("kind: a/b\nkind: c/d\n")
    assert info.value.field == "kind" and 'mapping key "kind" already defined (line 2)' in info.value.reason


@pytest.mark.parametrize("text, field, reason", [
    ("bogus: 1", "bogus", 'unknown field "bogus"'),
    ("devices: [{containerEdits: {intelRdt: {enableCMT: true}}}]",
     "devices[0].containerEdits.intelRdt.enableCMT", 'unknown field "enableCMT"'),
    ("devices: [{containerEdits: {deviceNodes: [{path: x, major: abc}]}}]",
     "devices[0].containerEdits.deviceNodes[0].major", "cannot unmarshal string 'abc' into int64"),
    ("devices: [{containerEdits: {deviceNodes: [{path: x, uid: -1}]}}]",
     "devices[0].containerEdits.deviceNodes[0].uid", "number -1 overflows uint32"),
    ("devices: [{containerEdits: {additionalGids: [4294967296]}}]",
     "devices[0].containerEdits.additionalGids[0]", "number 4294967296 overflows uint32"),
    ("devices: [{containerEdits: {env: A=1}}]", "devices[0].containerEdits.env",
     "cannot unmarshal string 'A=1' into a list"),
    ("kind: [a]", "kind", "cannot unmarshal array into string"),
    ("devices: {a: 1}", "devices", "cannot unmarshal object into a list"),
    ("- a\n- b", "", "cannot unmarshal array into Spec"),
])
def test_decode_errors_name_field_and_value(text, field, reason):
    with pytest.raises(DecodeError) as info:
        decode(text)
    assert (info.value.field, info.value.reason) == (field, reason)


def test_alias_bomb_is_refused():
    # 2,000 aliases of a device holding 2,000 aliases of a node: 4 million nodes once expanded.
    nodes = "[&n {path: /dev/x}" + ", *n" * 1999 + "]"
    doc = "devices: [&d {name: a, containerEdits: {deviceNodes: " + nodes + "}}" + ", *d" * 1999 + "]\n"
    assert len(doc) < 40_000
    with pytest.raises(DecodeError, match="document too large"):
        decode(doc)


def test_empty_and_null_documents():
    for text in ("", "null", "# only a comment\n", "---\n"):
        with pytest.raises(SpecError) as info:
            parse_spec(text.encode(), "/p/empty.yaml")
        assert str(info.value) == 'failed to parse CDI Spec "/p/empty.yaml", no Spec data'


def test_only_first_document_is_read():
    spec = parse_spec(b'cdiVersion: 0.3.0\nkind: a/b\ndevices: [{name: x, containerEdits: {env: [A=1]}}]\n'
                      b"---\nthis: is ignored\n", "/p/x.yaml")
    assert list(spec.devices) == ["x"]


def test_write_spec_fills_minimum_version_and_round_trips(tmp_path):
    doc = {"kind": "vendor.com/gpu", "devices": [{"name": "0", "containerEdits": {
        "deviceNodes": [{"path": "/dev/x", "hostPath": "/dev/null", "fileMode": 0o660}]}}]}
    path = write_spec(doc, str(tmp_path / "vendor.com-gpu"))
    assert path.endswith(".yaml")
    text = open(path).read()
    assert text.startswith("---\n") and "cdiVersion: 0.5.0" in text
    assert read_spec(path).doc == dict(doc, cdiVersion="0.5.0")
    assert [name for name in __import__("os").listdir(tmp_path)] == ["vendor.com-gpu.yaml"]


def test_write_spec_refuses_invalid_without_leaving_files(tmp_path):
    with pytest.raises(SpecError):
        write_spec({"kind": "bad", "devices": []}, str(tmp_path / "x.json"))
    assert list(tmp_path.iterdir()) == []
