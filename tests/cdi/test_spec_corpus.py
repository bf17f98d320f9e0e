"""The spec corpus: every file under tests/data/specs/{valid,invalid} against its expectation.

Expectations live in each directory's expected.yaml and were written from
reference/cdi-semantics.md (rules, minimum versions, and the CDI library's message texts), not
from this package's output. A file without an expectation, or an expectation without a file,
fails the run.
"""
import re
from pathlib import Path

import pytest
import yaml

from cdi.errors import SpecError
from cdi.spec import parse_spec, read_spec
from cdi.version import minimum_version

SPECS = Path(__file__).resolve().parent.parent / "data" / "specs"
VALID = SPECS / "valid"
INVALID = SPECS / "invalid"
EXPECTED = "expected.yaml"
INVALID_KEYS = {"kind", "field", "reason", "reason_prefix", "reason_contains"}
VALID_KEYS = {"min_version", "devices", "vendor", "class", "values"}


def _expectations(directory):
    with open(directory / EXPECTED) as f:
        return yaml.safe_load(f) or {}


def _spec_files(directory):
    return sorted(p.name for p in directory.iterdir() if p.is_file() and p.name != EXPECTED)


def _params(directory):
    return [pytest.param(name, id=name) for name in _spec_files(directory)]


_TOKEN = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _lookup(doc, path):
    """The value at a field path such as ``devices[0].containerEdits.env[1]``."""
    value = doc
    for match in _TOKEN.finditer(path):
        key, index = match.groups()
        value = value[int(index)] if index is not None else value[key]
    return value


# --- the corpus itself ----------------------------------------------------------------------

@pytest.mark.parametrize("directory", [VALID, INVALID], ids=["valid", "invalid"])
def test_every_file_has_an_expectation_and_back(directory):
    files = set(_spec_files(directory))
    expected = set(_expectations(directory))
    assert sorted(files - expected) == [], "spec files without an expectation"
    assert sorted(expected - files) == [], "expectations without a spec file"


def test_corpus_size():
    assert len(_spec_files(INVALID)) >= 70
    assert len(_spec_files(VALID)) >= 15


def test_corpus_mixes_json_and_yaml():
    for directory in (VALID, INVALID):
        suffixes = {Path(name).suffix for name in _spec_files(directory)}
        assert suffixes == {".json", ".yaml"}, directory


# --- invalid specs ---------------------------------------------------------------------------

def _expected_invalid(name):
    expected = _expectations(INVALID)
    assert name in expected, f"{name} has no entry in invalid/{EXPECTED}"
    exp = expected[name]
    assert set(exp) <= INVALID_KEYS, f"unknown keys in the expectation of {name}"
    assert "reason" in exp or "reason_prefix" in exp, name
    return exp


def _check_error(err, path, exp):
    assert (err.kind, err.field) == (exp["kind"], exp["field"]), err.reason
    if "reason" in exp:
        assert err.reason == exp["reason"]
    else:
        assert err.reason.startswith(exp["reason_prefix"]), err.reason
        for part in exp.get("reason_contains", ()):
            assert part in err.reason
    assert err.path == path


@pytest.mark.parametrize("name", _params(INVALID))
def test_invalid_spec(name):
    exp = _expected_invalid(name)
    path = str(INVALID / name)
    with pytest.raises(SpecError) as info:
        read_spec(path)
    err = info.value
    _check_error(err, path, exp)
    text = str(err)
    assert path in text
    # The reference's framing of each kind of failure (spec.go ReadSpec / newSpec).
    if err.kind == "nodata":
        assert text == f'failed to parse CDI Spec "{path}", no Spec data'
    elif err.kind == "parse":
        assert text.startswith(f'failed to parse CDI Spec "{path}": ')
        assert text.endswith(err.reason)
    else:
        assert text.startswith(f'invalid CDI Spec "{path}": ')
        assert text.endswith(err.reason)


@pytest.mark.parametrize("name", _params(INVALID))
def test_invalid_spec_from_bytes_matches_file(name):
    """parse_spec on the file's bytes fails exactly as read_spec does."""
    exp = _expected_invalid(name)
    path = str(INVALID / name)
    with pytest.raises(SpecError) as info:
        parse_spec((INVALID / name).read_bytes(), path)
    _check_error(info.value, path, exp)


# --- valid specs -----------------------------------------------------------------------------

def _expected_valid(name):
    expected = _expectations(VALID)
    assert name in expected, f"{name} has no entry in valid/{EXPECTED}"
    exp = expected[name]
    assert set(exp) <= VALID_KEYS, f"unknown keys in the expectation of {name}"
    assert {"min_version", "devices"} <= set(exp), name
    return exp


@pytest.mark.parametrize("name", _params(VALID))
def test_valid_spec(name):
    exp = _expected_valid(name)
    path = str(VALID / name)
    spec = read_spec(path)
    names = [f"{spec.vendor}/{spec.cls}={device}" for device in spec.devices]
    assert names == exp["devices"]
    assert minimum_version(spec.doc) == exp["min_version"]
    if "vendor" in exp:
        assert spec.vendor == exp["vendor"]
    if "class" in exp:
        assert spec.cls == exp["class"]
    for field, value in (exp.get("values") or {}).items():
        got = _lookup(spec.doc, field)
        assert got == value and type(got) is type(value), f"{field}: {got!r} != {value!r}"


@pytest.mark.parametrize("name", _params(VALID))
def test_valid_spec_from_bytes_matches_file(name):
    exp = _expected_valid(name)
    spec = parse_spec((VALID / name).read_bytes(), str(VALID / name))
    assert [f"{spec.vendor}/{spec.cls}={device}" for device in spec.devices] == exp["devices"]


# --- version gates over several devices ------------------------------------------------------

@pytest.mark.parametrize("edits, needs", [
    ({"deviceNodes": [{"path": "/dev/x", "hostPath": "/dev/y"}]}, "0.5.0"),
    ({"mounts": [{"hostPath": "/h", "containerPath": "/c", "type": "bind"}]}, "0.4.0"),
])
@pytest.mark.parametrize("position", [0, 1, 2])
def test_version_gates_check_every_device_v1_1_0_checks_only_the_last(edits, needs, position):
    # v1.1.0's requiresV050/requiresV040 (specs-go/version.go) append &d.ContainerEdits of the
    # range variable; specs-go's go.mod says go 1.19, so that variable is shared and only the
    # last device's edits are seen: with the feature at position 0 or 1, v1.1.0 answers 0.3.0.
    devices = [{"name": f"d{index}", "containerEdits": {"env": ["A=1"]}} for index in range(3)]
    devices[position]["containerEdits"] = edits
    assert minimum_version({"kind": "vendor.com/device", "devices": devices}) == needs
