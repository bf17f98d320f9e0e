"""stepleft.only_the_cache: when a step's recipe may hold the identities the step left (a reused
plain-folder root whose step rewrote only its linker cache, so the next step there changes nothing
and is replayed: tests/runtime/test_direct_runs.py). Each refusal: a step that wrote no cache,
one that changed a path other than the cache and /etc above it, one whose links, writes or mount
points left a path other than they found it, and an overlay root (an engine's next container
starts from the image again)."""
import os
import types

from shim._native import ffi
from shim.linker import stepleft
from test_file_memo import overlay_mounts

CACHE, ETC, DROPIN = b"f/etc/ld.so.cache", b"n/etc", b"n/etc/ld.so.conf.d/00-nvcr.conf"


def _root(at):
    os.makedirs(os.path.join(at, "etc/ld.so.conf.d"))
    with open(os.path.join(at, "etc/ld.so.cache"), "wb") as out:
        out.write(b"cache")
    with open(os.path.join(at, "etc/ld.so.conf.d/00-nvcr.conf"), "w") as out:
        out.write("/usr/lib/x86_64-linux-gnu\n")
    return at


def _now(rootfs, entry):
    identities = stepleft.identify(rootfs, [entry])
    return bytes(ffi.buffer(identities, ffi.sizeof("struct cds_identity")))


def _done(rootfs, wrote_cache=True):
    """A step's result that wrote the cache and whose drop-in write left the drop-in as it was."""
    return types.SimpleNamespace(
        root_files=[("/etc/ld.so.cache", b"cache", 0o644)] if wrote_cache else [],
        changed=[DROPIN], before={DROPIN: _now(rootfs, DROPIN)})


def test_a_step_that_rewrote_only_the_cache(tmp_path):
    rootfs = _root(str(tmp_path / "rootfs"))
    assert stepleft.only_the_cache([CACHE, ETC], _done(rootfs), rootfs)


def test_a_step_that_wrote_no_cache(tmp_path):
    rootfs = _root(str(tmp_path / "rootfs"))
    assert not stepleft.only_the_cache([ETC], _done(rootfs, wrote_cache=False), rootfs)


def test_a_step_that_changed_a_drop_in_it_looked_at(tmp_path):
    rootfs = _root(str(tmp_path / "rootfs"))
    assert not stepleft.only_the_cache([CACHE, ETC, DROPIN], _done(rootfs), rootfs)


def test_a_step_whose_write_left_a_drop_in_changed(tmp_path):
    rootfs = _root(str(tmp_path / "rootfs"))
    done = _done(rootfs)
    os.unlink(os.path.join(rootfs, "etc/ld.so.conf.d/00-nvcr.conf"))      # (a new inode: another identity)
    with open(os.path.join(rootfs, "etc/ld.so.conf.d/00-nvcr.conf"), "w") as out:
        out.write("/usr/lib/x86_64-linux-gnu\n")
    assert not stepleft.only_the_cache([CACHE, ETC], done, rootfs)


def test_never_on_an_overlay_root(tmp_path):
    lower = _root(str(tmp_path / "layer"))
    with overlay_mounts(lower, str(tmp_path), 1) as (rootfs,):
        assert not stepleft.only_the_cache([CACHE, ETC], _done(rootfs), rootfs)
