"""YAML scalars read the way the reference reads them.

The CDI library decodes spec files with sigs.k8s.io/yaml v1.4.0, in two steps:

1. its copy of go-yaml v2 (``sigs.k8s.io/yaml/goyaml.v2``) decodes the document into untyped Go
   values; a plain (unquoted, untagged) scalar is resolved by ``resolve()`` in resolve.go to
   null, a bool, an int, a float64 or a string;
2. ``yamlToJSONTarget`` writes those values as JSON, first turning numbers and bools into
   strings where the target field is a string (``convertToJSONableObject``), and
   ``encoding/json`` decodes that JSON into the Spec struct.

`resolve` is step 1 for one scalar; `to_string` and `json_number` give what step 2 makes of the
result for a string field and for a numeric field. PyYAML's own YAML 1.1 resolver differs from
go-yaml's (it has no ``0o`` octal, no ``1e3`` without a dot, no ``y``/``n`` booleans, but does
have base-60 numbers), so plain scalars never go through it.
"""
import math
import re
import struct
from decimal import Decimal
from fractions import Fraction

# resolve.go's resolveMap: words looked up before anything else.
_WORDS = {
    **dict.fromkeys(("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"), True),
    **dict.fromkeys(("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"), False),
    **dict.fromkeys(("", "~", "null", "Null", "NULL"), None),
    **dict.fromkeys((".nan", ".NaN", ".NAN"), math.nan),
    **dict.fromkeys((".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"), math.inf),
    **dict.fromkeys(("-.inf", "-.Inf", "-.INF"), -math.inf),
}
# resolve.go's resolveTable: a scalar whose first character is not one of these is a string.
_NUMBER_START = frozenset("+-0123456789")
_HINTED = _NUMBER_START | frozenset("yYnNtTfFoO~.")
# resolve.go's yamlStyleFloat, the gate in front of strconv.ParseFloat for digits and signs.
_YAML_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
# What strconv.ParseFloat accepts of a text starting with ".": digits with "_" between them
# (checked by _underscores_ok), an optional exponent.
_DOT_FLOAT = re.compile(r"\.[0-9_]*[0-9][0-9_]*([eE][-+]?[0-9][0-9_]*)?")

_UINT64_MAX = (1 << 64) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_PREFIX_BASES = {"b": 2, "o": 8, "x": 16}
_DIGITS = {char: value for value, char in enumerate("0123456789abcdefghijklmnopqrstuvwxyz")}


def _parse_uint(text, base):
    """strconv.ParseUint(text, base, 64), base 0 or 2, underscores already removed; None on error."""
    if not text:
        return None
    if base == 0:
        base = 10
        if text[0] == "0":
            if len(text) >= 3 and text[1].lower() in _PREFIX_BASES:
                base, text = _PREFIX_BASES[text[1].lower()], text[2:]
            else:  # a leading 0 is octal; "0" alone is 0
                base, text = 8, text[1:]
    number = 0
    for char in text:
        digit = _DIGITS.get(char.lower()) if char.isascii() else None
        if digit is None or digit >= base:
            return None
        number = number * base + digit
        if number > _UINT64_MAX:
            return None
    return number


def _parse_int(text, base):
    """strconv.ParseInt(text, base, 64): an optional sign, then ParseUint; None on error."""
    negative = text[:1] == "-"
    if text[:1] in ("+", "-"):
        text = text[1:]
    number = _parse_uint(text, base)
    if number is None:
        return None
    number = -number if negative else number
    return number if _INT64_MIN <= number <= _INT64_MAX else None


_MISPLACED_UNDERSCORE = re.compile(r"(?<![0-9])_|_(?![0-9])")


def _underscores_ok(text):
    """strconv's underscoreOK for a decimal text: each "_" sits between two digits."""
    return _MISPLACED_UNDERSCORE.search(text) is None


def _parse_float(text):
    """strconv.ParseFloat(text, 64) of a text already known to be well-formed; None when it is
    out of range (Go returns ErrRange and resolve() then keeps the text). Underflow is 0, as in Go."""
    value = float(text)
    return None if math.isinf(value) else value


def resolve(text):
    """The value go-yaml v2 gives a plain scalar: None, bool, int, float or the text itself.

    Follows resolve() in sigs.k8s.io/yaml v1.4.0 goyaml.v2/resolve.go step by step. Timestamps
    are left out on purpose: decoded into an untyped value, go-yaml v2 keeps a timestamp as its
    text (decode.go, "for backward compatibility reasons"), which is what we return anyway.
    """
    if not text:
        return None
    if text[0] not in _HINTED:
        return text
    if text in _WORDS:
        return _WORDS[text]
    if text[0] == ".":
        # ParseFloat on the text as written: underscores are Go's float-literal separators.
        if _DOT_FLOAT.fullmatch(text) and _underscores_ok(text):
            value = _parse_float(text.replace("_", ""))
            if value is not None:
                return value
        return text
    if text[0] not in _NUMBER_START:
        return text
    plain = text.replace("_", "")  # every underscore goes, wherever it is
    number = _parse_int(plain, 0)  # base 0: 0x, 0o, 0b, and a leading 0 for octal
    if number is None:
        number = _parse_uint(plain, 0)  # up to 2**64 - 1
    if number is not None:
        return number
    if _YAML_FLOAT.fullmatch(plain):  # 1.5, 1e3, 1., .5, and integers too long for 64 bits
        value = _parse_float(plain)
        if value is not None:
            return value
    if plain.startswith("0b"):
        # The binary fallback takes a sign after the prefix: "0b-101" is -5.
        number = _parse_int(plain[2:], 2)
        if number is None:
            number = _parse_uint(plain[2:], 2)
    elif plain.startswith("-0b"):
        number = _parse_int("-" + plain[3:], 2)
    return text if number is None else number


_TAG_NAMES = {type(None): "null", bool: "bool", int: "int", float: "float", str: "str"}


def resolve_tagged(tag, text):
    """The value of a scalar with an explicit tag (``!!int 0o10``): go-yaml v2 resolves the text
    as if it were plain and fails unless it has that type; an int is accepted as a float.

    `tag` is "str", "int", "float", "bool" or "null". Raises ValueError with go-yaml's message.
    """
    if tag == "str":
        return text
    value = resolve(text)
    found = _TAG_NAMES[type(value)]
    if found == tag:
        return value
    if tag == "float" and found == "int":
        return float(value)
    raise ValueError(f"cannot decode !!{found} `{text}` as a !!{tag}")


# --- step 2: the JSON round trip -----------------------------------------------------------

def to_string(value):
    """A resolved scalar as sigs.k8s.io/yaml passes it to a string field (yaml.go,
    convertToJSONableObject): ints in decimal, floats by strconv.FormatFloat(f, 'g', -1, 32),
    bools as true/false, strings unchanged. (None is the caller's: Go leaves the field empty.)"""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return format_float32_g(value)
    return value


def json_number(value):
    """The JSON number encoding/json writes for a resolved int or float, as the JSON decoder
    then reads it into a numeric field; None for anything else, and for NaN and ±Inf, which
    json.Marshal refuses ("json: unsupported value").

    Floats follow encoding/json's floatEncoder: the shortest digits, in 'f' format unless the
    magnitude is below 1e-6 or at least 1e21. So 1.0 is "1", 1e3 is "1000", -0.0 is "-0",
    1.5 is "1.5", and 1e21 is "1e+21" (no integer field takes those last two).
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if not isinstance(value, float) or math.isnan(value) or math.isinf(value):
        return None
    if value != 0 and not 1e-6 <= abs(value) < 1e21:
        return re.sub(r"e-0(\d)$", r"e-\1", repr(value))  # repr's digits are Go's shortest ones
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    digits = Decimal(repr(abs(value)))
    if value.is_integer():
        return sign + str(int(digits))
    return sign + format(digits, "f")


# --- strconv.FormatFloat(f, 'g', -1, 32) ---------------------------------------------------

_FLOAT32 = struct.Struct("<f")
_BITS32 = struct.Struct("<I")


def _to_float32(value):
    """float32(value) in Go: rounded to nearest, ±Inf past the largest float32."""
    try:
        return _FLOAT32.unpack(_FLOAT32.pack(value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


def _shortest_float32_digits(value):
    """(digits, point) of the shortest decimal that reads back as the positive float32 `value`
    (the closest one where there is a choice), as Go's shortest formatting finds it:
    value ≈ 0.<digits> × 10**point."""
    exact = Fraction(value)
    bits = _BITS32.unpack(_FLOAT32.pack(value))[0]
    below = Fraction(_FLOAT32.unpack(_BITS32.pack(bits - 1))[0])
    above = Fraction(2) ** 128 if bits + 1 == 0x7F800000 else Fraction(_FLOAT32.unpack(_BITS32.pack(bits + 1))[0])
    low, high = (below + exact) / 2, (exact + above) / 2
    even = bits % 2 == 0  # an even mantissa owns the halfway points (round half to even)
    top = Decimal(value).adjusted()  # exponent of the leading digit
    for count in range(1, 10):  # 9 digits always suffice for a float32
        exponent = top - count + 1
        unit = Fraction(10) ** exponent
        nearest = round(exact / unit)
        fits = [k for k in (nearest, nearest - 1, nearest + 1)
                if low < k * unit < high or (even and k * unit in (low, high))]
        if fits:
            digits = str(min(fits, key=lambda k: abs(k * unit - exact)))
            return digits.rstrip("0"), len(digits) + exponent
    raise AssertionError(f"no shortest form for {value!r}")  # pragma: no cover


def format_float32_g(value):
    """strconv.FormatFloat(value, 'g', -1, 32): the value rounded to float32, its shortest
    digits, %e form when the decimal exponent is below -4 or at least 6 (1e+06), else %f."""
    if math.isnan(value):
        return "NaN"
    value = _to_float32(value)
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if value == 0:
        return sign + "0"
    digits, point = _shortest_float32_digits(abs(value))
    exponent = point - 1
    if exponent < -4 or exponent >= 6:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mantissa}e{'-' if exponent < 0 else '+'}{abs(exponent):02d}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return sign + digits + "0" * (point - len(digits))
    return f"{sign}{digits[:point]}.{digits[point:]}"
