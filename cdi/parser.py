"""Qualified device names (``vendor.com/class=name``) and the rules for their parts.

Rules and error texts follow the CDI library's pkg/parser: vendor and class start with an ASCII
letter, continue with ``[A-Za-z0-9_.-]`` and end alphanumeric; a device name starts and ends
alphanumeric and may hold ``[A-Za-z0-9_.:-]`` inside. There are no length limits.
"""
from .errors import NameError_, q

_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_QUALIFIER_INNER = _ALNUM | frozenset("_.-")
_NAME_INNER = _ALNUM | frozenset("_.:-")

EXPECTED_FORM = "vendor.com/class=name"


def qualified_name(vendor, cls, name):
    """The qualified device name of the given parts (not validated)."""
    return f"{vendor}/{cls}={name}"


def parse_qualifier(kind):
    """Split ``vendor/class`` at the first ``/``; ("", "") when either part is missing."""
    vendor, sep, cls = kind.partition("/")
    if not sep or not vendor or not cls:
        return "", ""
    return vendor, cls


def parse_device(device):
    """Split a device name into (vendor, class, name) without validating the parts.

    Returns ("", "", device) for host paths and strings that are not of the qualified form.
    """
    if not device or device[0] == "/":
        return "", "", device
    qualifier, sep, name = device.partition("=")
    if not sep or not qualifier or not name:
        return "", "", device
    vendor, cls = parse_qualifier(qualifier)
    if not vendor:
        return "", "", device
    return vendor, cls, name


def _go_scan(name, first_set, inner_set):
    """Check a name the way the Go code does: the first and last *bytes* as runes, the bytes
    between decoded as UTF-8 (an invalid or split sequence is U+FFFD). Returns
    (where, char) of the first problem ("first", "inner" or "last"), or None."""
    try:
        raw = name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate (a JSON escape such as \ud800): not a name
        raw = name.encode("utf-8", "surrogatepass")
    if chr(raw[0]) not in first_set:
        return "first", chr(raw[0])
    if len(raw) == 1:
        return None
    for char in raw[1:-1].decode("utf-8", "replace"):
        if char not in inner_set:
            return "inner", char
    if chr(raw[-1]) not in _ALNUM:
        return "last", chr(raw[-1])
    return None


def _qualifier_problem(name):
    if not name:
        return "empty name"
    problem = _go_scan(name, _LETTERS, _QUALIFIER_INNER)
    if problem is None:
        return None
    where, char = problem
    if where == "first":
        return f"{q(name)}, should start with letter"
    if where == "inner":
        return f"invalid character '{char}' in name {q(name)}"
    return f"{q(name)}, should end with a letter or digit"


def validate_vendor_name(vendor):
    problem = _qualifier_problem(vendor)
    if problem:
        raise NameError_(f"invalid vendor. {problem}")


def validate_class_name(cls):
    problem = _qualifier_problem(cls)
    if problem:
        raise NameError_(f"invalid class. {problem}")


def validate_device_name(name):
    if not name:
        raise NameError_("invalid (empty) device name")
    problem = _go_scan(name, _ALNUM, _NAME_INNER)
    if problem is None:
        return
    where, char = problem
    if where == "first":
        # The reference says "class" here; the text is kept as it is.
        raise NameError_(f"invalid class {q(name)}, should start with a letter or digit")
    if where == "inner":
        raise NameError_(f"invalid character '{char}' in device name {q(name)}")
    raise NameError_(f"invalid name {q(name)}, should end with a letter or digit")


def parse_qualified_name(device):
    """Parse and validate a qualified name; returns (vendor, class, name) or raises NameError_."""
    vendor, cls, name = parse_device(device)
    if not vendor:
        raise NameError_(f'unqualified device {q(device)}, missing vendor')
    if not cls:
        raise NameError_(f'unqualified device {q(device)}, missing class')
    if not name:
        raise NameError_(f'unqualified device {q(device)}, missing device name')
    try:
        validate_vendor_name(vendor)
        validate_class_name(cls)
        validate_device_name(name)
    except NameError_ as err:
        raise NameError_(f'invalid device {q(device)}: {err}') from None
    return vendor, cls, name


def is_qualified_name(device):
    try:
        parse_qualified_name(device)
    except NameError_:
        return False
    return True


def check_device_argument(device):
    """Validate a user-given ``--device`` value; the error shows the expected form."""
    try:
        return parse_qualified_name(device)
    except NameError_ as err:
        raise NameError_(f"{err} (expected a qualified CDI device name such as {EXPECTED_FORM})") from None
