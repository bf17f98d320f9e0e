"""Exception types shared by the cdi modules."""


class CDIError(Exception):
    """Base class of every error this package raises on purpose."""


class NameError_(CDIError):
    """A malformed vendor, class, device or qualified device name."""


class SpecError(CDIError):
    """A spec file that cannot be read, parsed or validated.

    `path` is the file, `field` the field path inside it (``devices[2].containerEdits.env[0]``,
    "" for the whole document) and `reason` the reference library's text.
    """

    def __init__(self, path, field, reason, kind="invalid"):
        self.path = path
        self.field = field
        self.reason = reason
        self.kind = kind  # "read", "parse", "nodata" or "invalid"
        super().__init__(str(self))

    def __str__(self):
        where = f"{self.field}: " if self.field else ""
        if self.kind == "read":
            return f'failed to read CDI Spec {q(self.path)}: {self.reason}'
        if self.kind == "nodata":
            return f'failed to parse CDI Spec {q(self.path)}, no Spec data'
        if self.kind == "parse":
            return f'failed to parse CDI Spec {q(self.path)}: {where}{self.reason}'
        return f'invalid CDI Spec {q(self.path)}: {where}{self.reason}'


class EditError(CDIError):
    """Edits that could not be applied to an OCI config (the config is left untouched)."""


class UnresolvableDevicesError(CDIError):
    """Requested devices that no loaded spec defines."""

    def __init__(self, unresolved, detail=""):
        self.unresolved = list(unresolved)
        self.detail = detail
        super().__init__(str(self))

    def __str__(self):
        text = "unresolvable CDI devices " + ", ".join(self.unresolved)
        return f"{text}; {self.detail}" if self.detail else text


_ESCAPES = {"\a": r"\a", "\b": r"\b", "\f": r"\f", "\n": r"\n", "\r": r"\r", "\t": r"\t",
            "\v": r"\v", "\\": r"\\", '"': r"\""}


def q(value):
    """Quote like Go's %q, so messages match the reference's byte for byte."""
    out = ['"']
    for char in str(value):
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif char.isprintable():
            out.append(char)
        elif ord(char) < 0x80:
            out.append(f"\\x{ord(char):02x}")
        elif ord(char) < 0x10000:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    out.append('"')
    return "".join(out)
