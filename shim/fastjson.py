"""JSON for the create path without importing the json package.

`import json` pulls in `re` and `enum`, about 8 ms on these machines, more than all the other
work of a create. The C scanner and string encoder of CPython's `_json` module do the real
work here, exactly as json.loads/json.dumps would; anything unusual falls back to `json`.
"""
try:
    import _json
except ImportError:  # pragma: no cover - every CPython build has it
    _json = None

_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}
_WHITESPACE = " \t\n\r"


class _Context:
    """The attributes _json.make_scanner reads from a JSONDecoder."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__

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
    """Compact JSON text (separators "," and ":"), non-ASCII kept as it is."""
    out = []
    _encode(value, out.append)
    return "".join(out)


def _encode(value, emit):
    if isinstance(value, str):
        emit(_json.encode_basestring(value) if _json else _slow_string(value))
    elif value is None:
        emit("null")
    elif value is True:
        emit("true")
    elif value is False:
        emit("false")
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
            _encode(key, emit)
            emit(":")
            _encode(item, emit)
        emit("}")
    elif isinstance(value, (list, tuple)):
        emit("[")
        for index, item in enumerate(value):
            if index:
                emit(",")
            _encode(item, emit)
        emit("]")
    else:
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _slow_string(value):  # pragma: no cover
    import json

    return json.dumps(value, ensure_ascii=False)
