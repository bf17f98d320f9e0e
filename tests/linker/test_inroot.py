"""In-root file access: openat2(RESOLVE_IN_ROOT) and the O_NOFOLLOW walk that replaces it
on old kernels give the same answers, and neither ever leaves the tree."""
import errno
import os
import stat

import pytest

from shim._native import ffi, lib

MODES = {"openat2": lib.CDS_RESOLVE_OPENAT2, "walk": lib.CDS_RESOLVE_WALK}


@pytest.fixture
def tree(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("host secret\n")
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/file").write_text("inside\n")
    (root / "usr/lib").mkdir(parents=True)
    (root / "usr/lib/libx.so.1").write_text("lib\n")
    links = {
        "abs-out": str(outside / "secret"),          # host path: resolves inside the root
        "rel-out": "../../outside/secret",           # climbs: stops at the root
        "abs-in": "/etc/file",
        "rel-in": "etc/file",
        "chain": "abs-in",
        "loop-a": "loop-b", "loop-b": "loop-a",
        "lib": "usr/lib",
        "dotdot": "../../../../etc/file",
        "magic": "/proc/self/root/etc/passwd",
        "dangling": "/nowhere",
    }
    for name, target in links.items():
        os.symlink(target, root / name)
    return str(root), str(outside)


def _open(rootfd, path, flags, mode):
    previous = lib.cds_inroot_set_mode(mode)
    try:
        fd = lib.cds_inroot_open(rootfd, path.encode(), flags)
        return fd, ffi.errno
    finally:
        lib.cds_inroot_set_mode(previous)


def _read(fd):
    try:
        return os.read(fd, 100)
    finally:
        os.close(fd)


CASES = [
    ("/etc/file", os.O_RDONLY, b"inside\n"),
    ("etc/file", os.O_RDONLY, b"inside\n"),
    ("/abs-in", os.O_RDONLY, b"inside\n"),
    ("/rel-in", os.O_RDONLY, b"inside\n"),
    ("/chain", os.O_RDONLY, b"inside\n"),
    ("/dotdot", os.O_RDONLY, b"inside\n"),
    ("/../../etc/file", os.O_RDONLY, b"inside\n"),
    ("/lib/libx.so.1", os.O_RDONLY, b"lib\n"),
    ("/lib/../lib/libx.so.1", os.O_RDONLY, b"lib\n"),      # ".." of the link's target: /usr
    ("/lib/../etc/file", os.O_RDONLY, errno.ENOENT),
    ("/abs-out", os.O_RDONLY, errno.ENOENT),
    ("/rel-out", os.O_RDONLY, errno.ENOENT),
    ("/magic", os.O_RDONLY, errno.ENOENT),
    ("/dangling", os.O_RDONLY, errno.ENOENT),
    ("/loop-a", os.O_RDONLY, errno.ELOOP),
    ("/abs-in", os.O_RDONLY | os.O_NOFOLLOW, errno.ELOOP),
    ("/etc/file/x", os.O_RDONLY, errno.ENOTDIR),
    ("/etc/file", os.O_RDONLY | os.O_DIRECTORY, errno.ENOTDIR),
]


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("path,flags,expect", CASES)
def test_resolution(tree, mode, path, flags, expect):
    root, _ = tree
    rootfd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    try:
        fd, err = _open(rootfd, path, flags, MODES[mode])
        if isinstance(expect, bytes):
            assert fd >= 0, os.strerror(err)
            assert _read(fd) == expect
        else:
            assert fd < 0 and err == expect, (fd, os.strerror(err))
    finally:
        os.close(rootfd)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_o_path_nofollow_gives_the_link(tree, mode):
    root, _ = tree
    rootfd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    fd, err = _open(rootfd, "/abs-out", os.O_PATH | os.O_NOFOLLOW, MODES[mode])
    assert fd >= 0, os.strerror(err)
    assert stat.S_ISLNK(os.fstat(fd).st_mode)
    os.close(fd)
    fd, _ = _open(rootfd, "/", os.O_RDONLY | os.O_DIRECTORY, MODES[mode])
    assert os.fstat(fd).st_ino == os.stat(root).st_ino
    os.close(fd)
    os.close(rootfd)


def test_read_fd_refuses_fifos_dirs_and_big_files(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big"
    with open(big, "wb") as out:
        out.truncate(1 << 20)
    buf = ffi.new("uint8_t **")
    size = ffi.new("size_t *")
    st = ffi.new("struct cds_stat *")
    for path, limit, expect in ((fifo, 100, errno.EINVAL), (tmp_path, 100, errno.EISDIR),
                                (big, 1000, errno.EFBIG)):
        fd = lib.cds_open_host(str(path).encode())     # O_NONBLOCK: a FIFO does not block
        assert fd >= 0
        try:
            assert lib.cds_read_fd(fd, limit, buf, size, st) == -1
            assert ffi.errno == expect
        finally:
            os.close(fd)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_write_at_is_atomic_and_does_not_follow(tmp_path):
    target = tmp_path / "victim"
    target.write_text("untouched\n")
    os.symlink(target, tmp_path / "cache")
    dirfd = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    try:
        assert lib.cds_write_at(dirfd, b"cache", b"new", 3, 0o644, 0) == 0
        assert lib.cds_write_at(dirfd, b"../escape", b"x", 1, 0o644, 0) == -1
        assert ffi.errno == errno.EINVAL
    finally:
        os.close(dirfd)
    assert target.read_text() == "untouched\n"
    assert not os.path.islink(tmp_path / "cache")
    assert (tmp_path / "cache").read_bytes() == b"new"
    assert sorted(os.listdir(tmp_path)) == ["cache", "victim"]     # no temporary left


def _write_same(directory, name, data, mode):
    dirfd = os.open(directory, os.O_PATH | os.O_DIRECTORY)
    try:
        return lib.cds_write_same_at(dirfd, name.encode(), data, len(data), mode)
    finally:
        os.close(dirfd)


def test_write_same_at_leaves_our_file_holding_the_bytes(tmp_path):
    """cds_write_same_at (issue 47): a regular file of ours, one name, the mode and exactly the
    bytes is left as it is (its identity kept: a root reused run after run)."""
    path = tmp_path / "ld.so.cache"
    assert _write_same(tmp_path, "ld.so.cache", b"cache", 0o644) == 0
    before = os.stat(path)
    assert _write_same(tmp_path, "ld.so.cache", b"cache", 0o644) == 0
    after = os.stat(path)
    assert (after.st_ino, after.st_mtime_ns, after.st_ctime_ns) == (before.st_ino, before.st_mtime_ns,
                                                                    before.st_ctime_ns)
    assert stat.S_IMODE(after.st_mode) == 0o644 and path.read_bytes() == b"cache"


def _other_owner(path):
    os.chown(path, 1234, 1234)


def _hard_link(path):
    os.link(path, str(path) + ".twin")


def _other_mode(path):
    os.chmod(path, 0o600)


def _other_bytes(path):
    path.write_bytes(b"cachf")


@pytest.mark.parametrize("change", [_other_owner, _hard_link, _other_mode, _other_bytes],
                         ids=["owner", "hard-link", "mode", "bytes"])
def test_write_same_at_rewrites_anything_else(tmp_path, change):
    """Another owner, a second name (a hard link: a write through it would change the other), a
    different mode or other bytes: the file is replaced (a new inode), never written through."""
    path = tmp_path / "ld.so.cache"
    assert _write_same(tmp_path, "ld.so.cache", b"cache", 0o644) == 0
    change(path)
    before = os.stat(path)
    assert _write_same(tmp_path, "ld.so.cache", b"cache", 0o644) == 0
    after = os.stat(path)
    assert after.st_ino != before.st_ino
    assert (after.st_uid, stat.S_IMODE(after.st_mode), after.st_nlink) == (os.geteuid(), 0o644, 1)
    assert path.read_bytes() == b"cache"
    if change is _hard_link:
        assert (tmp_path / "ld.so.cache.twin").read_bytes() == b"cache"     # (the old inode, untouched)
        assert os.stat(tmp_path / "ld.so.cache.twin").st_ino == before.st_ino


def test_write_same_at_replaces_a_link_never_follows_it(tmp_path):
    """A symlink at the name, even to a file of ours holding exactly the bytes: replaced by a
    regular file; its target untouched."""
    target = tmp_path / "victim"
    target.write_bytes(b"cache")
    os.chmod(target, 0o644)
    os.symlink(target, tmp_path / "ld.so.cache")
    assert _write_same(tmp_path, "ld.so.cache", b"cache", 0o644) == 0
    assert not os.path.islink(tmp_path / "ld.so.cache")
    assert (tmp_path / "ld.so.cache").read_bytes() == b"cache"
    assert os.stat(tmp_path / "ld.so.cache").st_ino != os.stat(target).st_ino
    os.symlink("victim", tmp_path / "other")
    assert _write_same(tmp_path, "other", b"new", 0o644) == 0
    assert target.read_bytes() == b"cache" and not os.path.islink(tmp_path / "other")
    assert sorted(os.listdir(tmp_path)) == ["ld.so.cache", "other", "victim"]     # no temporary left


def test_list_dir(tmp_path):
    for name in ("a", "b.so", "é"):
        (tmp_path / name).write_text("")
    (tmp_path / "d").mkdir()
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    names = ffi.new("char **")
    types = ffi.new("uint8_t **")
    size = ffi.new("size_t *")
    try:
        count = lib.cds_list_dir(fd, names, types, size)
        got = ffi.buffer(names[0], size[0])[:].split(b"\0")[:count]
        kinds = ffi.buffer(types[0], count)[:]
        lib.cds_free(names[0])
        lib.cds_free(types[0])
    finally:
        os.close(fd)
    assert sorted(zip(got, kinds)) == sorted([(b"a", 8), (b"b.so", 8), ("é".encode(), 8), (b"d", 4)])
