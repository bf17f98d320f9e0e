"""JSON for the create path without importing the json package.

`import json` pulls in `re` and `enum`, which cost more than all the other work of a create.
The C scanner and string encoder of CPython's `_json` module do the real work here, exactly as
json.loads/json.dumps would; anything unusual falls back to `json`.
"""
try:
    import _json
except ImportError:  # pragma: no cover - every CPython build has it
    _json = None

_WHITESPACE = " \t\n\r"
_MAX_INT_DIGITS = 4000  # below CPython's int/str conversion limit (4300 digits)

# How many of the numbers below (made only by `loads`) are alive in this process. While none
# is, no value can hold one, and `dumps` hands the whole value to the C encoder, which would
# write them as plain floats and ints (far faster than the Python walk for a config.json).
_live = [0]


class _Counted:
    """Counts its instances in _live while they exist (numbers hold no references: no cycles)."""

    __slots__ = ()

    def __del__(self):
        _live[0] -= 1


class Number(_Counted, float):
    """A JSON number Python would not write back as it was given (any fraction or exponent,
    1e400, -0.0, NaN, Infinity): its value for the code that reads it, its text for writing.
    runc refuses `Infinity`, so 1e400 in a field it ignores must stay 1e400."""

    __slots__ = ("text",)

    def __new__(cls, text):
        number = float.__new__(cls, text)
        number.text = text
        _live[0] += 1
        return number


class BigNumber(_Counted):
    """An integer too long for int() (CPython refuses more than 4,300 digits): kept as text.
    Go skips such a number in a field it does not know; we write it back unchanged."""

    __slots__ = ("text",)

    def __init__(self, text):
        self.text = text
        _live[0] += 1

    def __repr__(self):
        return f"BigNumber({self.text[:20]}...)"


class NegativeZero(_Counted, int):
    """-0: zero for the code that reads it, "-0" when written."""

    __slots__ = ()
    text = "-0"

    def __new__(cls):
        _live[0] += 1
        return int.__new__(cls, 0)


def _parse_int(text):
    if len(text) > _MAX_INT_DIGITS:
        return BigNumber(text)
    return int(text) if text != "-0" else NegativeZero()


class _Context:
    """The attributes _json.make_scanner reads from a JSONDecoder."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = Number
    parse_int = staticmethod(_parse_int)
    parse_constant = Number

    def __init__(self):
        self.memo = {}


def loads(data):
    """json.loads for bytes or str; raises ValueError (json.JSONDecodeError) when invalid."""
    if _json is None:
        import json

        return json.loads(data)
    text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
    if text.startswith("\ufeff"):
        import json

        return json.loads(text)  # let json raise its own error for a BOM
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        value, end = _json.make_scanner(_Context())(text, start)
    except StopIteration:
        import json

        return json.loads(text)  # re-parse only to raise json's precise error
    if text[end:].strip(_WHITESPACE):
        import json

        return json.loads(text)
    return value


def dumps(value):
    """Compact JSON text (separators "," and ":"), non-ASCII kept as it is; numbers read by
    `loads` are written back as they were given."""
    if not _live[0] and _json is not None:
        try:
            return "".join(_c_encoder()(value, 0))
        except (TypeError, ValueError):
            pass  # an unknown type: the walk below names it
    out = []
    _encode(value, out.append, _json.encode_basestring if _json else _slow_string)
    return "".join(out)


def dumpb(value):
    """dumps as UTF-8 bytes. A string holding a lone surrogate (from a JSON escape such as
    \\ud800, valid JSON that UTF-8 cannot carry) is written with that escape."""
    text = dumps(value)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        out = []
        _encode(value, out.append, _string_with_surrogates)
        return "".join(out).encode("utf-8")


_encoder = []


def _c_encoder():
    """CPython's C encoder with the compact separators. (A key that is not a string, which only
    our own code could put in a config, is written as json.dumps writes it: 1 as "1".)"""
    if not _encoder:
        def refuse(value):
            raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")

        _encoder.append(_json.make_encoder(None, refuse, _json.encode_basestring, None, ":", ",",
                                           False, False, True))
    return _encoder[0]


def _string_with_surrogates(value):
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return _json.encode_basestring_ascii(value) if _json else _slow_string(value, ascii=True)
    return _json.encode_basestring(value) if _json else _slow_string(value)


def _encode(value, emit, string):
    if isinstance(value, str):
        emit(string(value))
    elif value is None:
        emit("null")
    elif value is True:
        emit("true")
    elif value is False:
        emit("false")
    elif isinstance(value, (Number, BigNumber, NegativeZero)):
        emit(value.text)
    elif isinstance(value, int):
        emit(int.__repr__(value))
    elif isinstance(value, float):
        if value != value:
            emit("NaN")
        elif value in (float("inf"), float("-inf")):
            emit("Infinity" if value > 0 else "-Infinity")
        else:
            emit(float.__repr__(value))
    elif isinstance(value, dict):
        emit("{")
        first = True
        for key, item in value.items():
            if not first:
                emit(",")
            first = False
            if not isinstance(key, str):
                raise TypeError(f"JSON object keys must be strings, not {type(key).__name__}")
            emit(string(key))
            emit(":")
            _encode(item, emit, string)
        emit("}")
    elif isinstance(value, (list, tuple)):
        emit("[")
        for index, item in enumerate(value):
            if index:
                emit(",")
            _encode(item, emit, string)
        emit("]")
    else:
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _slow_string(value, ascii=False):  # pragma: no cover
    import json

    return json.dumps(value, ensure_ascii=ascii)
