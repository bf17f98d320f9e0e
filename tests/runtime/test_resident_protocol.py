"""The resident process's request format (shim/runtime/resident.py), as the C front end writes it."""
import struct

import pytest

from shim.config import load_config
from shim.runtime.resident import MAGIC, ResidentError, parse_request


def request(fields, length=None):
    body = b"".join(f + b"\0" for f in fields)
    return MAGIC + struct.pack("<I", len(body) if length is None else length) + body


def test_round_trip():
    data = request([b"1.2.3", b"/run/b", b"22", b"3", b"--root", b"/r", b"create", b"PATH=/bin", b"A=x=y"])
    parsed = parse_request(data, [7, 8])
    assert (parsed.version, parsed.cwd, parsed.umask) == ("1.2.3", "/run/b", 0o22)
    assert parsed.argv == ["--root", "/r", "create"]
    assert parsed.env == {"PATH": "/bin", "A": "x=y"} and (parsed.stderr_fd, parsed.claim_fd) == (7, 8)


def test_argument_with_non_utf8_bytes_survives():
    parsed = parse_request(request([b"v", b"/", b"0", b"1", b"/b\xff"]), [2, 3])
    assert parsed.argv[0].encode("utf-8", "surrogateescape") == b"/b\xff"


@pytest.mark.parametrize("data, fds, reason", [
    (b"HTTP/1.1 GET", [2, 3], "not a cdi-shim request"),
    (request([b"v", b"/", b"0", b"0"], length=99), [2, 3], "truncated"),
    (request([b"v", b"/", b"0", b"0"]), [], "expected the caller's stderr and its claim, got 0"),
    (request([b"v", b"/", b"0", b"0"]), [2], "expected the caller's stderr and its claim, got 1"),
    (request([b"v", b"/", b"0", b"0"]), [2, 3, 4], "expected the caller's stderr and its claim, got 3"),
    (request([b"v", b"/", b"9x", b"0"]), [2, 3], "malformed request header"),
    (request([b"v", b"/"]), [2, 3], "malformed request header"),
    (request([b"v", b"/", b"0", b"5", b"create"]), [2, 3], "malformed request argv"),
    (request([b"v", b"/", b"0", b"-1"]), [2, 3], "malformed request argv"),
    (request([b"v", b"/", b"7" * 40, b"0"]), [2, 3], "umask '7777777777777777777777777777777777777777' out of range"),
    (request([b"v", b"/", b"1000", b"0"]), [2, 3], "umask '1000' out of range"),
    (request([b"v", b"/", b"-1", b"0"]), [2, 3], "umask '-1' out of range"),
])
def test_malformed_requests(data, fds, reason):
    with pytest.raises(ResidentError, match=reason):
        parse_request(data, fds)


def test_resident_socket_config_key(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('resident-socket = "/run/x.sock"\n')
    assert load_config(str(path)).resident_socket == "/run/x.sock"
    assert load_config(str(tmp_path / "missing.toml")).resident_socket == "/run/cdi-shim/runtime.sock"
