"""config.json read, edited and written back (shim/fastjson.py, shim/bundle.py): whatever the
runtime does not edit goes back as it was given (issue 14, finding 10)."""
import json
import os

import pytest

from shim import fastjson
from shim.bundle import read_config, write_config


@pytest.mark.parametrize("text", [
    "1e400", "-1e400", "1E+2", "1.10", "-0.0", "0.1", "1e-400", "123456789012345678901234567890.5",
    "-0", "1" * 5000, "-" + "9" * 4301, "Infinity", "-Infinity", "NaN",
])
def test_numbers_round_trip_exactly(text):
    assert fastjson.dumps(fastjson.loads(f'{{"x":[{text}],"y":{text}}}')) == f'{{"x":[{text}],"y":{text}}}'


def test_numbers_keep_their_value_for_the_code_that_reads_them():
    value = fastjson.loads('{"a": 1.5, "b": 7, "c": 1e400}')
    assert value["a"] == 1.5 and isinstance(value["a"], float)
    assert value["b"] == 7 and type(value["b"]) is int
    assert value["c"] == float("inf")
    assert fastjson.dumps({"made": 2.5, "here": 3}) == '{"made":2.5,"here":3}'


@pytest.mark.parametrize("text", [r'"X=\ud800"', r'"\udfff tail"', r'"pair \ud83d\ude00 ok"', '"caf\u00e9"'])
def test_strings_round_trip_to_the_same_json_value(text):
    value = fastjson.loads("[" + text + "]")
    data = fastjson.dumpb(value)
    assert isinstance(data, bytes)
    data.decode("utf-8")  # always valid UTF-8
    assert json.loads(data) == json.loads("[" + text + "]")


def test_lone_surrogate_in_env_is_written_back_escaped(tmp_path):
    (tmp_path / "config.json").write_bytes(b'{"process": {"env": ["X=\\ud800", "Y=caf\xc3\xa9"]}, "u": 1e400}')
    config, _, info = read_config(str(tmp_path))
    config["process"]["env"].append("Z=1")
    write_config(str(tmp_path), config, info.st_mode)
    assert (tmp_path / "config.json").read_bytes() == \
        b'{"process":{"env":["X=\\ud800","Y=caf\xc3\xa9","Z=1"]},"u":1e400}'
    assert sorted(os.listdir(tmp_path)) == ["config.json"]


def test_the_c_encoder_is_used_only_while_no_exact_number_is_alive():
    """dumps hands a value to CPython's C encoder only while no number that must be written as
    it was read (1.50, -0, 1e400) exists in the process: the C encoder would write 1.5, 0, inf."""
    from shim import fastjson

    plain = {"a": [1, "é", None, True, {"b": -3}], "c": 2.5}
    assert fastjson._live[0] == 0
    assert fastjson.dumps(plain) == '{"a":[1,"é",null,true,{"b":-3}],"c":2.5}'
    exact = fastjson.loads('{"n": 1.50, "z": -0, "big": 1e400, "nan": NaN}')
    assert fastjson._live[0] == 4
    assert fastjson.dumps(exact) == '{"n":1.50,"z":-0,"big":1e400,"nan":NaN}'
    assert fastjson.dumps(dict(plain, inner=exact)).endswith('"inner":{"n":1.50,"z":-0,"big":1e400,"nan":NaN}}')
    del exact
    assert fastjson._live[0] == 0
