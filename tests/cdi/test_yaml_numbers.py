"""YAML numbers in spec files, read as the CDI library reads them (issue 15).

The library decodes specs with sigs.k8s.io/yaml v1.4.0 (pkg/cdi/spec.go ParseSpec), and so do
we in effect. What it does with a scalar, from the sources (citations are to these files):

  resolve.go  sigs.k8s.io/yaml v1.4.0 goyaml.v2/resolve.go, resolve(): go-yaml v2 reads a
              plain scalar as
    R1 a word of resolveMap: y/yes/on/true… → true, n/no/off/false… → false, ~/null/"" → null,
       .inf/+.inf/-.inf/.nan (only these spellings) → float;
    R2 a string when its first character is not in resolveTable (+ - 0-9 . and the letters
       of the words);
    R3 first character ".": strconv.ParseFloat(text) as written (Go float-literal
       underscores between digits are allowed); a failure leaves the string;
    R4 otherwise every "_" is removed, then strconv.ParseInt(text, 0, 64): optional sign,
       prefixes 0x 0o 0b (any case) and a leading 0 for octal → int;
    R5 then strconv.ParseUint(text, 0, 64) → uint64 up to 2**64-1 (no sign);
    R6 then, if yamlStyleFloat `^[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?$`
       matches, strconv.ParseFloat → float64 (so 1e3, 08, and integers too long for 64 bits);
       out of range (1e999) is an error and leaves the string;
    R7 then a text starting "0b" is tried again as ParseInt(rest, 2): "0b-101" is -5;
    R8 no base-60 (1:30) — "purposefully unsupported" — and a timestamp decoded into an untyped
       value stays its text (decode.go scalar(), "for backward compatibility").
  yaml.go     sigs.k8s.io/yaml v1.4.0 yaml.go convertToJSONableObject(), then json.Marshal:
    J1 into a string field: int → decimal, float → strconv.FormatFloat(f, 'g', -1, 32)
       (float32 precision; %e when the exponent is < -4 or >= 6; +Inf -Inf NaN), bool →
       true/false;
    J2 elsewhere a float64 is written by encoding/json's floatEncoder: shortest digits, 'f'
       format unless |f| < 1e-6 or >= 1e21 ('e'); NaN and ±Inf are refused ("unsupported
       value"), which fails the whole file;
    J3 encoding/json then reads a number into an integer field with strconv.ParseInt /
       ParseUint(text, 10, 64) and an overflow check for the field's size: 1.0 → "1" is 1,
       1.5 and 1e+21 are refused, "-0" (from -0.0) is 0 for int64 and refused for uint32.

Field types (specs-go/config.go): major, minor int64; fileMode os.FileMode (uint32); uid,
gid *uint32; additionalGids []uint32; hook timeout *int (64 bits).
"""
import random
import re

import pytest

from cdi.decode import DecodeError, decode_spec
from cdi.spec import parse_spec, write_spec, read_spec

INT64, UINT32 = "int64", "uint32"
OVER = "overflows"  # a number outside the field's range
REFUSED = "refused"  # not a number the field takes (a string, a bool, a fraction, .inf)

# Every numeric field: where its value goes in a document, its path, its Go type.
_NODE = "devices:\n- containerEdits:\n    deviceNodes:\n    - path: /dev/x\n      {key}: {text}\n"
_HOOK = "devices:\n- containerEdits:\n    hooks:\n    - hookName: prestart\n      path: /x\n      {key}: {text}\n"
_GIDS = "devices:\n- containerEdits:\n    additionalGids:\n    - {text}\n"
NUMERIC_FIELDS = [
    (_NODE.replace("{key}", "major"), "devices[0].containerEdits.deviceNodes[0].major", INT64),
    (_NODE.replace("{key}", "minor"), "devices[0].containerEdits.deviceNodes[0].minor", INT64),
    (_NODE.replace("{key}", "fileMode"), "devices[0].containerEdits.deviceNodes[0].fileMode", UINT32),
    (_NODE.replace("{key}", "uid"), "devices[0].containerEdits.deviceNodes[0].uid", UINT32),
    (_NODE.replace("{key}", "gid"), "devices[0].containerEdits.deviceNodes[0].gid", UINT32),
    (_GIDS, "devices[0].containerEdits.additionalGids[0]", UINT32),
    (_HOOK.replace("{key}", "timeout"), "devices[0].containerEdits.hooks[0].timeout", INT64),
]
STRING_FIELDS = [
    ("devices:\n- containerEdits:\n    hooks:\n    - hookName: prestart\n      path: /x\n"
     "      args:\n      - {text}\n", "devices[0].containerEdits.hooks[0].args[0]"),
    ("devices:\n- name: {text}\n", "devices[0].name"),
]

_PATH_TOKEN = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _at(doc, path):
    for key, index in _PATH_TOKEN.findall(path):
        doc = doc[int(index)] if index else doc[key]
    return doc


def decoded(template, path, text):
    """The value decoded at `path`, or the DecodeError."""
    try:
        return _at(decode_spec(template.replace("{text}", text).encode()), path)
    except DecodeError as err:
        return err


def check_numeric(text, expected, template, path, go_type):
    got = decoded(template, path, text)
    if expected == OVER:
        assert isinstance(got, DecodeError), (text, path, got)
        assert (got.field, got.reason) == (path, f"number {text} overflows {go_type}")
    elif expected == REFUSED:
        assert isinstance(got, DecodeError), (text, path, got)
        assert got.field == path and got.reason.startswith("cannot unmarshal "), got.reason
        assert got.reason.endswith(f" {text!r} into {go_type}"), got.reason
    else:
        assert got == expected and type(got) is type(expected), (text, path, got)


# --- the cases --------------------------------------------------------------------------

def node_of(text):
    return decode_spec(text.encode())["devices"][0]["containerEdits"]["deviceNodes"][0]


def test_file_mode_0o660_is_432():
    assert node_of(_NODE.format(key="fileMode", text="0o660"))["fileMode"] == 432


def test_exponent_without_a_dot_is_a_number():
    assert node_of(_NODE.format(key="fileMode", text="1e3"))["fileMode"] == 1000


@pytest.mark.parametrize("template, path, go_type", NUMERIC_FIELDS, ids=lambda v: str(v).rsplit(".", 1)[-1])
def test_whole_float_is_accepted_in_every_integer_field(template, path, go_type):
    check_numeric("1.0", 1, template, path, go_type)
    check_numeric("1e3", 1000, template, path, go_type)
    check_numeric("0o660", 432, template, path, go_type)


@pytest.mark.parametrize("template, path, go_type", NUMERIC_FIELDS, ids=lambda v: str(v).rsplit(".", 1)[-1])
def test_fraction_is_refused_in_every_integer_field(template, path, go_type):
    check_numeric("1.5", REFUSED, template, path, go_type)


def test_numbers_in_text_fields_are_printed_as_go_prints_them():
    doc = decode_spec(b"devices:\n- containerEdits:\n    hooks:\n    - hookName: prestart\n"
                      b"      path: /x\n      args: [0o660, 1e3]\n")
    assert doc["devices"][0]["containerEdits"]["hooks"][0]["args"] == ["432", "1000"]


@pytest.mark.parametrize("text, value", [
    ("0660", 432), ("0x1b6", 438), ("0b101", 5), ("1_000", 1000), ("+5", 5), ("00", 0)])
def test_forms_that_already_matched_still_do(text, value):
    for template, path, go_type in NUMERIC_FIELDS:
        check_numeric(text, value, template, path, go_type)
    for template, path in STRING_FIELDS:
        assert decoded(template, path, text) == str(value)


def test_null_leaves_numeric_fields_unset_and_names_empty():
    for template, path, _ in NUMERIC_FIELDS:
        assert decoded(template, path, "~") is None
    assert decoded(STRING_FIELDS[1][0], "devices[0].name", "~") == ""


def test_spec_with_go_numbers_loads_and_its_devices_resolve():
    """The file is no longer dropped: every device of it is there, with Go's values."""
    spec = parse_spec(b"""cdiVersion: 0.5.0
kind: vendor.com/gpu
devices:
- name: 0660
  containerEdits:
    deviceNodes:
    - {path: /dev/x, type: c, major: 1.0, minor: 1e1, fileMode: 0o660, uid: 1.0, gid: 2e0}
    hooks:
    - {hookName: createContainer, path: /bin/hook, args: [hook, 0o660, 1e3, 0.5], timeout: 1e1}
- name: 0x1b6
  containerEdits:
    env: [A=1]
""", "/etc/cdi/vendor.yaml")
    assert spec.qualified_names() == ["vendor.com/gpu=432", "vendor.com/gpu=438"]
    edits = spec.devices["432"]["containerEdits"]
    assert edits["deviceNodes"] == [{"path": "/dev/x", "type": "c", "major": 1, "minor": 10,
                                     "fileMode": 432, "uid": 1, "gid": 2}]
    assert edits["hooks"][0]["args"] == ["hook", "432", "1000", "0.5"]
    assert edits["hooks"][0]["timeout"] == 10


def test_decode_error_names_file_field_and_value():
    from cdi.errors import SpecError

    with pytest.raises(SpecError) as info:
        parse_spec(b"cdiVersion: 0.3.0\nkind: a/b\ndevices:\n- name: x\n  containerEdits:\n"
                   b"    deviceNodes:\n    - {path: /dev/x, major: 1.5}\n", "/etc/cdi/x.yaml")
    assert str(info.value) == ('failed to parse CDI Spec "/etc/cdi/x.yaml": '
                               "devices[0].containerEdits.deviceNodes[0].major: "
                               "failed to unmarshal CDI Spec: cannot unmarshal number '1.5' into int64")


def test_written_strings_read_back_as_strings(tmp_path):
    """write_spec quotes the texts go-yaml would read as something else (y, 0o660, 1e3)."""
    texts = ["y", "n", "0o660", "1e3", "08", "0b-101", "-.0", "1:30", "on", "~", "plain"]
    doc = {"cdiVersion": "0.3.0", "kind": "vendor.com/gpu", "devices": [{"name": "a", "containerEdits": {
        "hooks": [{"hookName": "prestart", "path": "/x", "args": texts}]}}]}
    path = write_spec(doc, str(tmp_path / "spec"))
    assert read_spec(path).devices["a"]["containerEdits"]["hooks"][0]["args"] == texts


# --- the table of what Go's decoder gives ----------------------------------------------------------
# (text, int64 field, uint32 field, string field, rule): rules as in the module docstring.

G32_MAX = (1 << 32) - 1
GO_TABLE = [
    ("0", 0, 0, "0", "R4"),
    ("00", 0, 0, "0", "R4: a leading 0 is octal, the rest is 0"),
    ("-0", 0, 0, "0", "R4: int 0; J3 '0'"),
    ("0660", 432, 432, "432", "R4 octal"),
    ("0o660", 432, 432, "432", "R4: ParseInt base 0 knows 0o (Go 1.13)"),
    ("0O660", 432, 432, "432", "R4: prefixes in any case"),
    ("0x1b6", 438, 438, "438", "R4"),
    ("0X1B6", 438, 438, "438", "R4"),
    ("0b101", 5, 5, "5", "R4"),
    ("0B101", 5, 5, "5", "R4"),
    ("1_000", 1000, 1000, "1000", "R4: underscores removed"),
    ("1__0_0", 100, 100, "100", "R4: all of them, anywhere"),
    ("0x_1b6", 438, 438, "438", "R4"),
    ("0_x10", 16, 16, "16", "R4: removed before the prefix is read"),
    ("1_", 1, 1, "1", "R4"),
    ("+_1", 1, 1, "1", "R4"),
    ("_1", REFUSED, REFUSED, "_1", "R2: '_' starts no number"),
    ("+5", 5, 5, "5", "R4"),
    ("-5", -5, OVER, "-5", "R4; J3 ParseUint refuses a sign"),
    ("+0x10", 16, 16, "16", "R4: sign before the prefix"),
    ("-0x10", -16, OVER, "-16", "R4"),
    ("-0o17", -15, OVER, "-15", "R4"),
    ("0b-101", -5, OVER, "-5", "R7: sign after the 0b prefix"),
    ("0b+101", 5, 5, "5", "R7"),
    ("-0b-101", REFUSED, REFUSED, "-0b-101", "R7 takes no second sign: a string"),
    ("0B-101", REFUSED, REFUSED, "0B-101", "R7 is for lower-case 0b only"),
    ("08", 8, 8, "8", "R4 fails (8 is no octal digit), R6 float 8"),
    ("089", 89, 89, "89", "R6"),
    ("09.5", REFUSED, REFUSED, "9.5", "R6; J3"),
    ("0x", REFUSED, REFUSED, "0x", "R4-R7 all fail: a string"),
    ("0o", REFUSED, REFUSED, "0o", "R4: too short for a prefix, 'o' is no octal digit"),
    ("0b", REFUSED, REFUSED, "0b", "R4, R7"),
    ("0b2", REFUSED, REFUSED, "0b2", "R4, R7"),
    ("0o8", REFUSED, REFUSED, "0o8", "R4"),
    ("+", REFUSED, REFUSED, "+", "R4-R7 fail"),
    ("1e3", 1000, 1000, "1000", "R6: no dot needed; J2 '1000'"),
    ("1E3", 1000, 1000, "1000", "R6"),
    ("1e+3", 1000, 1000, "1000", "R6"),
    ("1_0e1_0", 10 ** 11, OVER, "1e+11", "R4 removes '_', R6; J1 %e from exponent 6"),
    ("1.0", 1, 1, "1", "R6; J2 writes 1.0 as 1"),
    ("1.", 1, 1, "1", "R6"),
    ("1.5", REFUSED, REFUSED, "1.5", "R6; J3 refuses 1.5"),
    ("1_000.5", REFUSED, REFUSED, "1000.5", "R4 removes '_', R6"),
    ("1500e-3", REFUSED, REFUSED, "1.5", "R6"),
    ("1000e-3", 1, 1, "1", "R6"),
    ("0.1", REFUSED, REFUSED, "0.1", "R6"),
    (".5", REFUSED, REFUSED, "0.5", "R3"),
    (".0", 0, 0, "0", "R3"),
    (".5e1", 5, 5, "5", "R3"),
    (".5_5", REFUSED, REFUSED, "0.55", "R3: Go float literal, '_' between digits"),
    ("._5", REFUSED, REFUSED, "._5", "R3: '_' after '.' is a syntax error: a string"),
    (".", REFUSED, REFUSED, ".", "R3"),
    ("+.5", REFUSED, REFUSED, "0.5", "R6"),
    ("-.0", 0, REFUSED, "-0", "R6 -0.0; J2 '-0'; J3 ParseUint refuses '-0'"),
    ("-0.0", 0, REFUSED, "-0", "R6; J2; J3"),
    ("1e6", 10 ** 6, 10 ** 6, "1e+06", "R6; J1 %e for exponent >= 6"),
    ("123456", 123456, 123456, "123456", "R4"),
    ("1234567.0", 1234567, 1234567, "1.234567e+06", "R6; J1"),
    ("3.14159265358979", REFUSED, REFUSED, "3.1415927", "R6; J1 float32 precision"),
    ("16777217.0", 16777217, 16777217, "1.6777216e+07", "R6; J2 float64 keeps it, J1 float32 does not"),
    ("9007199254740993.0", 9007199254740992, OVER, "9.007199e+15", "R6 rounds to float64"),
    ("1e-7", REFUSED, REFUSED, "1e-07", "R6; J2 'e' format below 1e-6"),
    ("1e20", OVER, OVER, "1e+20", "R6; J2 '100000000000000000000'; J3 overflow"),
    ("1e21", REFUSED, REFUSED, "1e+21", "R6; J2 '1e+21' is no integer literal"),
    ("4294967295", G32_MAX, G32_MAX, "4294967295", "R4"),
    ("0xffffffff", G32_MAX, G32_MAX, "4294967295", "R4"),
    ("4.294967295e9", G32_MAX, G32_MAX, "4.2949673e+09", "R6; J2 '4294967295'"),
    ("4294967296", 1 << 32, OVER, "4294967296", "R4; J3 uint32 overflow"),
    ("9223372036854775807", (1 << 63) - 1, OVER, "9223372036854775807", "R4"),
    ("-9223372036854775808", -(1 << 63), OVER, "-9223372036854775808", "R4"),
    ("9223372036854775808", OVER, OVER, "9223372036854775808", "R5 uint64; J3 int64 overflow"),
    ("0x8000000000000000", OVER, OVER, "9223372036854775808", "R5"),
    ("18446744073709551615", OVER, OVER, "18446744073709551615", "R5"),
    ("18446744073709551616", OVER, OVER, "1.8446744e+19", "R6: past uint64, a float"),
    ("+18446744073709551615", OVER, OVER, "1.8446744e+19", "R4 overflows, R5 takes no sign, R6"),
    ("+0x8000000000000000", REFUSED, REFUSED, "+0x8000000000000000", "R5 no sign, R6 no match"),
    ("-9223372036854775809", OVER, OVER, "-9.223372e+18", "R6; J2 '-9223372036854776000'"),
    ("0x10000000000000000", REFUSED, REFUSED, "0x10000000000000000", "R5 overflows, R6 no match: a string"),
    ("-0x8000000000000001", REFUSED, REFUSED, "-0x8000000000000001", "R4 overflows, R5 no sign: a string"),
    ("1e999", REFUSED, REFUSED, "1e999", "R6: ParseFloat range error leaves the string"),
    (".inf", REFUSED, REFUSED, "+Inf", "R1; J2 unsupported; J1"),
    ("+.inf", REFUSED, REFUSED, "+Inf", "R1"),
    ("-.Inf", REFUSED, REFUSED, "-Inf", "R1"),
    (".NaN", REFUSED, REFUSED, "NaN", "R1"),
    ("-.nan", REFUSED, REFUSED, "-.nan", "R1 has no signed NaN: a string"),
    (".iNf", REFUSED, REFUSED, ".iNf", "R1 spellings only; R3 fails"),
    ("1:30", REFUSED, REFUSED, "1:30", "R8 no base 60 (PyYAML would read 90)"),
    ("2001-12-14", REFUSED, REFUSED, "2001-12-14", "R8 timestamp kept as text"),
    ("y", REFUSED, REFUSED, "true", "R1 (PyYAML reads 'y' as a string)"),
    ("n", REFUSED, REFUSED, "false", "R1"),
    ("On", REFUSED, REFUSED, "true", "R1"),
    ("OFF", REFUSED, REFUSED, "false", "R1"),
    ("abc", REFUSED, REFUSED, "abc", "R2"),
]


@pytest.mark.parametrize("text, as_int64, as_uint32, as_string, rule", GO_TABLE,
                         ids=[row[0] for row in GO_TABLE])
def test_go_decoder_table(text, as_int64, as_uint32, as_string, rule):
    for template, path, go_type in NUMERIC_FIELDS:
        check_numeric(text, as_int64 if go_type == INT64 else as_uint32, template, path, go_type)
    got = decoded(STRING_FIELDS[0][0], STRING_FIELDS[0][1], text)
    assert got == as_string, (text, rule, got)


@pytest.mark.parametrize("text, as_int64, as_string", [
    ("!!int 0o660", 432, "432"),        # resolve(tag, text): the text is read as if plain
    ("!!float 1", 1, "1"),              # an int is taken as a !!float (the deferred check)
    ("!!str 5", REFUSED, "5"),          # !!str: the text, whatever it looks like
    ("'0o660'", REFUSED, "0o660"),      # quoted: a string (decode.go scalar(), no tag)
    ('"1e3"', REFUSED, "1e3"),
])
def test_quoted_and_tagged_scalars(text, as_int64, as_string):
    template, path, go_type = NUMERIC_FIELDS[0]
    got = decoded(template, path, text)
    if as_int64 == REFUSED:
        assert isinstance(got, DecodeError) and got.reason.startswith("cannot unmarshal string"), got
    else:
        assert got == as_int64
    assert decoded(STRING_FIELDS[0][0], STRING_FIELDS[0][1], text) == as_string


def test_tag_that_does_not_fit_the_text_is_an_error():
    got = decoded(NUMERIC_FIELDS[0][0], NUMERIC_FIELDS[0][1], "!!int 1.5")
    assert isinstance(got, DecodeError)
    assert got.reason == "yaml: cannot decode !!float `1.5` as a !!int"


# --- seeded property test -----------------------------------------------------------------------
# Numbers drawn at random and written in every YAML form; the expected Go value follows from
# the form's rule (not from our code): an int form gives the exact int (R4/R5), a float form
# the float64 of its value (R6/R3), and the field then takes it by J1-J3. Float forms stay
# within values float64 and float32 hold exactly, so that J1's printing is plain: integers
# below 2**24 and halves below 2**15.

SEED = 15
CASES = 2000


def _octal_or_decimal(n):
    """'0' + decimal digits: octal when every digit is < 8 (R4), else a float (R6)."""
    digits = str(n)
    return ("0" + digits, ("int", int(digits, 8)) if set(digits) <= set("01234567") else ("float", n))


def _with_underscores(rng, text):
    """Underscores anywhere after the first character; R4 removes them all."""
    chars = list(text)
    for _ in range(rng.randint(1, 3)):
        chars.insert(rng.randint(1, len(chars)), "_")
    return "".join(chars)


def _mixed_case(rng, text):
    return "".join(c.upper() if rng.random() < 0.5 else c for c in text)


def _int_forms(rng, n):
    """(text, ("int", value)) for n in every integer notation; n may be negative."""
    # A "+" only below 2**63: ParseUint (R5) takes no sign, so larger ones are left to R6
    # (the table has those).
    sign = "-" if n < 0 else rng.choice(["", "+"]) if n < 1 << 63 else ""
    m = abs(n)
    forms = [
        sign + str(m),
        sign + "0o" + format(m, "o"), sign + "0O" + format(m, "o"),
        sign + "0x" + _mixed_case(rng, format(m, "x")), sign + "0X" + format(m, "X"),
        sign + "0b" + format(m, "b"), sign + "0B" + format(m, "b"),
    ]
    if m:
        forms.append(sign + "0" + format(m, "o"))  # leading-zero octal
    forms.append(_with_underscores(rng, rng.choice(forms)))
    return [(text, ("int", n)) for text in forms]


def _float_forms(rng, n):
    """(text, ("float", value)) for an integer n or a half n+0.5 in float notations."""
    sign = "-" if n < 0 or (n == 0 and rng.random() < 0.5) else rng.choice(["", "+"])
    m = abs(n)
    if m != int(m):  # a half: k.5
        k = int(m)
        forms = [f"{sign}{k}.5", f"{sign}{k * 10 + 5}e-1", f"{sign}{k}.50"]
        if k == 0:
            forms.append(f"{sign}.5")
        return [(text, ("float", n)) for text in forms]
    m = int(m)
    zeros = len(str(m)) - len(str(m).rstrip("0"))
    forms = [f"{sign}{m}.0", f"{sign}{m}.", f"{sign}{m}e0", f"{sign}{m}E+0", f"{sign}{m * 100}e-2",
             _with_underscores(rng, f"{sign}{m}.0")]
    if zeros and m:
        forms.append(f"{sign}{str(m)[:len(str(m)) - zeros]}e{zeros}")  # 1e3
    if len(str(m)) > 1:
        forms.append(f"{sign}{str(m)[0]}.{str(m)[1:]}e{len(str(m)) - 1}")  # 1.234e3
    return [(text, ("float", n)) for text in forms]


def _go_g32(value):
    """FormatFloat(value, 'g', -1, 32) for the exact values drawn here (J1)."""
    sign = "-" if value < 0 or (value == 0 and str(value).startswith("-")) else ""
    m = abs(value)
    if m != int(m):
        return f"{sign}{int(m)}.5"
    digits = str(int(m))
    exponent = len(digits) - 1
    if exponent < 6:
        return sign + digits
    short = digits.rstrip("0")
    return f"{sign}{short[0]}{'.' + short[1:] if len(short) > 1 else ''}e+{exponent:02d}"


def _expected(kind, value, negative_zero, go_type):
    low, high = ((-(1 << 63), (1 << 63) - 1) if go_type == INT64 else (0, G32_MAX))
    if kind == "float" and value != int(value):
        return REFUSED  # J3: a fraction
    number = int(value)
    if not low <= number <= high:
        return OVER
    if go_type == UINT32 and negative_zero:
        return REFUSED  # J2 writes -0.0 as "-0", J3 ParseUint refuses it
    return number


def _draw(rng):
    """A random value for an int form or a float form."""
    if rng.random() < 0.6:
        bound = rng.choice([8, 256, 1 << 16, 1 << 32, 1 << 63, 1 << 64])
        n = rng.randrange(0, bound)
        if rng.random() < 0.3:
            n = bound - rng.randrange(1, 3) + rng.randrange(0, 3)  # around a limit
        n = min(n, (1 << 64) - 1)
        if rng.random() < 0.3:
            n = -min(n, 1 << 63)
        return _int_forms(rng, n)
    if rng.random() < 0.3:
        n = rng.randrange(0, 1 << 15) + 0.5
    else:
        n = rng.choice([rng.randrange(0, 1000), rng.randrange(0, 1 << 24), 10 ** rng.randrange(0, 7)])
    return _float_forms(rng, -n if rng.random() < 0.3 else n)


def test_seeded_numbers_in_every_form_and_every_numeric_field():
    rng = random.Random(SEED)
    checked = 0
    for _ in range(CASES):
        text, (kind, value) = rng.choice(_draw(rng))
        negative_zero = kind == "float" and value == 0 and text.startswith("-")
        for template, path, go_type in NUMERIC_FIELDS:
            check_numeric(text, _expected(kind, value, negative_zero, go_type), template, path, go_type)
        as_string = str(value) if kind == "int" else _go_g32(-0.0 if negative_zero else value)
        assert decoded(STRING_FIELDS[0][0], STRING_FIELDS[0][1], text) == as_string, text
        checked += 1
    assert checked == CASES
