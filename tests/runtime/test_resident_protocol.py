"""The resident process's request format (shim/runtime/resident.py), as the C front end writes it."""
import struct

import pytest

from shim.config import load_config
from shim.runtime.resident import MAGIC, ForeignRequest, ResidentError, parse_request


def request(fields, length=None):
    body = b"".join(f + b"\0" for f in fields)
    return MAGIC + struct.pack("<I", len(body) if length is None else length) + body


def test_round_trip():
    data = request([b"1.2.3", b"/run/b", b"22", b"3", b"--root", b"/r", b"create", b"PATH=/bin", b"A=x=y"])
    parsed = parse_request(data, [8])
    assert (parsed.version, parsed.cwd, parsed.umask) == ("1.2.3", "/run/b", 0o22)
    assert parsed.argv == ["--root", "/r", "create"]
    assert parsed.env == {"PATH": "/bin", "A": "x=y"} and parsed.claim_fd == 8


def test_argument_with_non_utf8_bytes_survives():
    parsed = parse_request(request([b"v", b"/", b"0", b"1", b"/b\xff"]), [3])
    assert parsed.argv[0].encode("utf-8", "surrogateescape") == b"/b\xff"


@pytest.mark.parametrize("data, fds, reason", [
    (b"HTTP/1.1 GET", [3], "not a cdi-shim request"),
    (request([b"v", b"/", b"0", b"0"], length=99), [3], "truncated"),
    (request([b"v", b"/", b"0", b"0"]), [], "expected the caller's claim, got 0"),
    (request([b"v", b"/", b"0", b"0"]), [2, 3], "expected the caller's claim, got 2"),
    (request([b"v", b"/", b"9x", b"0"]), [3], "malformed request header"),
    (request([b"v", b"/"]), [3], "malformed request header"),
    (request([b"v", b"/", b"0", b"5", b"create"]), [3], "malformed request argv"),
    (request([b"v", b"/", b"0", b"-1"]), [3], "malformed request argv"),
    (request([b"v", b"/", b"7" * 40, b"0"]), [3], "umask '7777777777777777777777777777777777777777' out of range"),
    (request([b"v", b"/", b"1000", b"0"]), [3], "umask '1000' out of range"),
    (request([b"v", b"/", b"-1", b"0"]), [3], "umask '-1' out of range"),
])
def test_malformed_requests(data, fds, reason):
    with pytest.raises(ResidentError, match=reason):
        parse_request(data, fds)


def test_resident_socket_config_key(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('resident-socket = "/run/x.sock"\n')
    assert load_config(str(path)).resident_socket == "/run/x.sock"
    assert load_config(str(tmp_path / "missing.toml")).resident_socket == "/run/cdi-shim/runtime.sock"


def test_a_request_of_another_protocol_is_told_apart():
    """A front end of another release (protocol 2 sent its stderr and claim, and the same
    header): declined, and its version said, not refused as garbage."""
    old = b"CDSHIM2\0" + struct.pack("<I", 12) + b"0.1.9\0/\0022\0000\0"
    with pytest.raises(ForeignRequest) as caught:
        parse_request(old, [2, 3])
    assert caught.value.version == "version 0.1.9, protocol CDSHIM2"
    with pytest.raises(ForeignRequest) as caught:
        parse_request(b"CDSHIM9\0" + b"\xff" * 8, [])
    assert caught.value.version == "protocol CDSHIM9"


def test_the_protocol_and_its_bounds_are_defined_once():
    """csrc/engine/resident.h is the one definition: the front end compiles it, the server reads
    it through shim._native, and neither spells a bound or the magic of its own; the table of
    limits in docs/install.md says the same numbers."""
    import os
    import re

    from shim.runtime import resident

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    front = ""
    for name in sorted(os.listdir(os.path.join(root, "csrc/frontend"))):   # the front end's sources
        if name.endswith(".c"):
            with open(os.path.join(root, "csrc/frontend", name)) as f:
                front += f.read()
    with open(os.path.join(root, "shim/runtime/resident.py")) as f:
        server = f.read()
    assert '#include "../engine/resident.h"' in front
    for name in ("CDS_RESIDENT_PROTOCOL", "CDS_RESIDENT_CLAIM_WAIT_MS", "CDS_RESIDENT_ANSWER_WAIT_MS",
                 "CDS_RESIDENT_MAX_ANSWER"):
        assert name in front, name
    assert "CDSHIM" not in front.replace("CDS_RESIDENT", "") and not re.search(r"tv_sec = \d", front)
    assert f'"{(resident.CLAIM + resident.PERMIT).decode()}"' in front   # the claim's two bytes, in order
    assert not re.search(r"^(MAX_REQUEST|REQUEST_TIMEOUT|MAX_PENDING|MAX_MESSAGES) = \d", server, re.M)
    assert resident.MAGIC == b"CDSHIM%d\0" % resident.PROTOCOL
    with open(os.path.join(root, "docs", "install.md")) as f:
        page = f.read()
    table = page[page.index("## The resident process"):]
    table = table[table.index("### Its limits"):]
    table = table[:table.index("\n\n", table.index("| Limit |"))]
    assert f"| claim wait | {resident.CLAIM_WAIT:g} s |" in table
    assert f"| answer wait | {resident.ANSWER_WAIT:g} s from the request" in table
    assert f"| request read | {resident.REQUEST_TIMEOUT:g} s for a whole request; " \
        f"{resident.REPLY_TIMEOUT:g} s" in table
    assert f"| request size | {resident.MAX_REQUEST >> 20} MiB |" in table
    assert f"| unfinished requests a worker reads at once | {resident.MAX_PENDING} |" in table
    assert f"| a create's messages carried back | {resident.MAX_MESSAGES >> 10} KiB |" in table
