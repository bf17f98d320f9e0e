"""Hostile images: links out of the root, FIFOs, huge and crafted files. Each case proves
with inotify that no decoy outside the root was opened, read or written, and checks for a
clear error or a safe result (a cache of what is really inside the root)."""
import os
import struct
import subprocess
import sys
import textwrap
import time

import pytest

from ldcache_helpers import Untouched, build_library, elfgen, listing
from shim.ldconfig import ldcache

LIB = "usr/lib/x86_64-linux-gnu"


@pytest.fixture(autouse=True, params=["openat2", "walk"])
def resolver(request):
    """Every case twice: with openat2(RESOLVE_IN_ROOT) and with the O_NOFOLLOW walk that
    stands in for it on kernels without openat2."""
    from shim._native import lib
    mode = lib.CDS_RESOLVE_OPENAT2 if request.param == "openat2" else lib.CDS_RESOLVE_WALK
    previous = lib.cds_inroot_set_mode(mode)
    yield request.param
    lib.cds_inroot_set_mode(previous)


@pytest.fixture
def world(tmp_path):
    """A root four levels down, decoys next to it and at every level above it (where a
    "../../../" would land), each with an ld.so.conf, a cache and a library."""
    base = str(tmp_path)
    root = os.path.join(base, "a", "b", "c", "root")
    os.makedirs(os.path.join(root, "etc"))
    os.makedirs(os.path.join(root, LIB))
    elfgen.write_elf(os.path.join(root, LIB, "libinside.so.1"), soname="libinside.so.1")
    secret_cache = _cache_with("libHOSTSECRET.so.1")
    decoys = []
    for level in (base, os.path.join(base, "a"), os.path.join(base, "a", "b"),
                  os.path.join(base, "a", "b", "c"), os.path.join(base, "host")):
        etc = os.path.join(level, "etc")
        lib = os.path.join(level, "lib")
        os.makedirs(etc, exist_ok=True)
        os.makedirs(lib, exist_ok=True)
        with open(os.path.join(etc, "ld.so.conf"), "w") as out:
            out.write(f"{lib}\n/decoy\n")
        with open(os.path.join(etc, "ld.so.cache"), "wb") as out:
            out.write(secret_cache)
        elfgen.write_elf(os.path.join(lib, "libsecret.so.1"), soname="libHOSTSECRET.so.1")
        decoys += [etc, lib]
    return {"base": base, "root": root, "host": os.path.join(base, "host"), "decoys": decoys}


def _cache_with(soname):
    from shim._native import ffi, lib
    b = ffi.gc(lib.cds_builder_new(lib.CDS_TARGET_X86_64), lib.cds_builder_free)
    lib.cds_builder_add(b, soname.encode(), f"/lib/{soname}".encode(), 0x303, 0, 0, ffi.NULL, 0)
    out = ffi.new("uint8_t **")
    size = ffi.new("size_t *")
    lib.cds_builder_build(b, lib.CDS_FORMAT_NEW, b"decoy", out, size)
    data = ffi.buffer(out[0], size[0])[:]
    lib.cds_free(out[0])
    return data


def _sonames(data):
    return {e.soname for e in ldcache.read_cache(data).entries}


def _safe_plan(world, folders=(), **options):
    """plan() under the watcher; returns the plan after checking no decoy was touched and
    that nothing of the host leaked into the cache."""
    with Untouched(*world["decoys"]) as watch:
        plan = ldcache.plan(world["root"], folders, **options)
    watch.assert_untouched()
    assert "libHOSTSECRET.so.1" not in _sonames(plan.cache)
    return plan


def test_etc_symlinked_to_a_host_directory(world):
    etc = os.path.join(world["root"], "etc")
    os.rmdir(etc)
    os.symlink(os.path.join(world["host"], "etc"), etc)          # absolute, host path
    plan = _safe_plan(world)
    assert plan.mode == "full"
    assert "libinside.so.1" in _sonames(plan.cache)


def test_etc_symlinked_out_by_dotdot(world):
    etc = os.path.join(world["root"], "etc")
    os.rmdir(etc)
    os.symlink("../../../../host/etc", etc)
    plan = _safe_plan(world)
    assert "libinside.so.1" in _sonames(plan.cache)


@pytest.mark.parametrize("target", ["{host}/etc/ld.so.cache", "../../../../../host/etc/ld.so.cache",
                                    "/../../../../etc/ld.so.cache"])
def test_cache_symlinked_to_a_host_file(world, target):
    link = os.path.join(world["root"], "etc/ld.so.cache")
    os.symlink(target.format(host=world["host"]), link)
    plan = _safe_plan(world)
    # Inside the root the link names nothing, or (the last one) itself.
    assert plan.mode == "full" and ("No such file" in plan.reason or "levels of symbolic" in plan.reason)
    with Untouched(*world["decoys"]) as watch:
        with pytest.raises(ldcache.LdcacheError, match="No such file|levels of symbolic"):
            ldcache.read_root_cache(world["root"])
    watch.assert_untouched()
    # Writing the new cache replaces the link, it does not write through it.
    with Untouched(*world["decoys"]) as watch:
        ldcache.update(world["root"], [])
    watch.assert_untouched()
    assert not os.path.islink(link)
    assert "libinside.so.1" in _sonames(open(link, "rb").read())


def test_cache_symlinked_to_another_file_inside(world):
    """A link that stays inside the root is followed inside the root (like the loader)."""
    inside = os.path.join(world["root"], "var/cache.bin")
    os.makedirs(os.path.dirname(inside))
    with open(inside, "wb") as out:
        out.write(_cache_with("libINSIDE.so.1"))
    os.symlink("/var/cache.bin", os.path.join(world["root"], "etc/ld.so.cache"))
    with Untouched(*world["decoys"]) as watch:
        cache = ldcache.read_root_cache(world["root"])
    watch.assert_untouched()
    assert [e.soname for e in cache.entries] == ["libINSIDE.so.1"]


def test_include_climbing_out(world):
    with open(os.path.join(world["root"], "etc/ld.so.conf"), "w") as out:
        out.write("include ../../../etc/*\ninclude /../../../../etc/*.conf\n"
                  "include ../../../../host/etc/ld.so.conf\n/../../../../host/lib\n")
    plan = _safe_plan(world)
    assert "libinside.so.1" in _sonames(plan.cache)
    # ld.so.conf includes itself through /etc/*: ldconfig would recurse until it crashes.
    assert any("nested deeper" in w for w in plan.warnings)


@pytest.mark.parametrize("how", ["absolute", "dotdot"])
def test_library_dirs_symlinked_out(world, how):
    libdir = os.path.join(world["root"], LIB)
    os.rename(libdir, libdir + ".real")
    target = os.path.join(world["host"], "lib") if how == "absolute" else "../../../../../../host/lib"
    os.symlink(target, libdir)
    os.makedirs(os.path.join(world["root"], "opt"))
    os.symlink(target, os.path.join(world["root"], "opt/drv"))
    with open(os.path.join(world["root"], "etc/ld.so.conf"), "w") as out:
        out.write(f"/{LIB}.real\n")
    real = os.path.join(world["root"], LIB + ".real")
    os.symlink(os.path.join(world["host"], "lib/libsecret.so.1"), os.path.join(real, "libevil.so.1"))
    os.symlink("../../../../../../../host/lib/libsecret.so.1", os.path.join(real, "libevil2.so.1"))
    plan = _safe_plan(world, ["/opt/drv"])
    assert "libinside.so.1" in _sonames(plan.cache)
    assert not {"libevil.so.1", "libevil2.so.1"} & _sonames(plan.cache)


def _in_subprocess(code, timeout=30):
    """Run CODE in a fresh interpreter: a hang there fails the test instead of the suite."""
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, time.monotonic() - start


def test_fifos_never_block(world, resolver):
    root = world["root"]
    os.mkfifo(os.path.join(root, "etc/ld.so.cache"))
    os.makedirs(os.path.join(root, "etc/ld.so.conf.d"))
    os.mkfifo(os.path.join(root, "etc/ld.so.conf.d/fifo.conf"))
    with open(os.path.join(root, "etc/ld.so.conf"), "w") as out:
        out.write("include /etc/ld.so.conf.d/*.conf\n")
    os.mkfifo(os.path.join(root, LIB, "libfifo.so.1"))
    os.symlink("libfifo.so.1", os.path.join(root, LIB, "libfifo2.so.1"))
    os.symlink("/etc/ld.so.cache", os.path.join(root, LIB, "libfifo3.so.1"))
    out, took = _in_subprocess(f"""
        from shim.ldconfig import ldcache
        from shim._native import lib
        lib.cds_inroot_set_mode(lib.CDS_RESOLVE_WALK if {resolver!r} == "walk" else lib.CDS_RESOLVE_OPENAT2)
        plan = ldcache.plan({root!r}, [])
        print(plan.mode, "|", plan.reason, "|", sorted(e.soname for e in ldcache.read_cache(plan.cache).entries))
        print(any("FIFO" in w for w in plan.warnings))
        try:
            ldcache.read_root_cache({root!r})
        except ldcache.LdcacheError as err:
            print("error:", err)
    """)
    assert "a FIFO, refused" in out
    assert "'libinside.so.1'" in out and "libfifo" not in out.split("|")[2]
    assert "True" in out
    assert took < 20


def test_devices_are_not_opened(world):
    root = world["root"]
    os.mknod(os.path.join(root, LIB, "libdev.so.1"), 0o600 | 0o020000, os.makedev(1, 3))
    os.makedirs(os.path.join(root, "dev"))
    os.mknod(os.path.join(root, "dev/zero"), 0o600 | 0o020000, os.makedev(1, 5))
    os.symlink("/dev/zero", os.path.join(root, LIB, "libzero.so.1"))
    plan = _safe_plan(world)
    assert _sonames(plan.cache) == {"libinside.so.1"}
    assert ("/usr/lib/x86_64-linux-gnu/libzero.so.1", "Invalid argument") in plan.skipped


def test_two_gib_sparse_cache(world):
    path = os.path.join(world["root"], "etc/ld.so.cache")
    with open(path, "wb") as out:
        out.write(_cache_with("libfake.so.1"))
        out.truncate(2 << 30)
    start = time.monotonic()
    plan = _safe_plan(world)
    assert time.monotonic() - start < 5
    assert plan.mode == "full" and "larger than" in plan.reason
    with pytest.raises(ldcache.LdcacheError, match="larger than"):
        ldcache.read_root_cache(world["root"])


def _crafted_caches():
    good = bytearray(_cache_with("libgood.so.1"))
    count = bytearray(good)
    struct.pack_into("<I", count, 20, 0x0FFFFFFF)
    offset = bytearray(good)
    struct.pack_into("<I", offset, 48 + 4, 0x7FFFFFF0)
    nul = bytearray(good[:48 + 24]) + b"x" * 64
    ext = bytearray(good)
    struct.pack_into("<I", ext, 32, 0xFFFFFFF0)
    return {"count": bytes(count), "offset": bytes(offset), "no-nul": bytes(nul), "extension": bytes(ext)}


@pytest.mark.parametrize("case", sorted(_crafted_caches()))
def test_crafted_caches(world, case):
    data = _crafted_caches()[case]
    with open(os.path.join(world["root"], "etc/ld.so.cache"), "wb") as out:
        out.write(data)
    plan = _safe_plan(world)
    assert plan.mode == "full" and "ld.so.cache" in plan.reason
    assert _sonames(plan.cache) == {"libinside.so.1"}
    with pytest.raises(ldcache.LdcacheError):
        ldcache.read_root_cache(world["root"])


def test_bogus_elf_files_are_skipped(world):
    libdir = os.path.join(world["root"], LIB)
    good = bytearray(elfgen.make_elf(soname="libbogus.so.1"))
    for i, (field, fmt, value) in enumerate([(32, "<Q", 2**63), (56, "<H", 0xFFFF), (32, "<Q", len(good) - 8),
                                             (16, "<H", 2), (4, "<B", 7)]):
        data = bytearray(good)
        struct.pack_into(fmt, data, field, value)
        with open(os.path.join(libdir, f"libbogus{i}.so.1"), "wb") as out:
            out.write(data)
    with open(os.path.join(libdir, "libhuge.so.1"), "wb") as out:
        out.write(b"\x7fELF\x02\x01\x01" + b"\xff" * 1000)
        out.truncate(1 << 30)
    start = time.monotonic()
    plan = _safe_plan(world)
    assert time.monotonic() - start < 10
    assert "libinside.so.1" in _sonames(plan.cache)
    skipped = dict(plan.skipped)
    assert len([p for p in skipped if "libbogus" in p]) >= 4


def test_huge_and_odd_config_files(world):
    conf = os.path.join(world["root"], "etc/ld.so.conf")
    with open(conf, "wb") as out:
        out.write(b"/opt/a\n" * 10 + b"\0garbage\n")
        out.truncate(4 << 20)
    plan = _safe_plan(world)
    assert any("larger than" in w for w in plan.warnings)
    assert "libinside.so.1" in _sonames(plan.cache)


def test_listing_of_hostile_caches_is_an_error_not_a_crash(world, tmp_path):
    for name, data in _crafted_caches().items():
        path = tmp_path / name
        path.write_bytes(data)
        proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "cdi-shim"), "ldcache",
                               "list", "--cache", str(path)], capture_output=True, text=True)
        assert proc.returncode == 1
        assert proc.stderr.startswith("Error: ") and len(proc.stderr.strip().splitlines()) == 1


def test_write_in_root_never_leaves_it(world):
    etc = os.path.join(world["root"], "etc")
    os.rename(etc, etc + ".orig")
    os.symlink(os.path.join(world["host"], "etc"), etc)
    with Untouched(*world["decoys"]) as watch:
        with pytest.raises(ldcache.LdcacheError):
            ldcache.write_in_root(world["root"], "/etc/ld.so.cache", b"x")
    watch.assert_untouched()


def test_real_library_in_hostile_neighbourhood(world):
    """A real (gcc-built) library next to all that is still found."""
    build_library(os.path.join(world["root"], LIB, "libreal.so.1.2"), "libreal.so.1")
    os.symlink("libreal.so.1.2", os.path.join(world["root"], LIB, "libreal.so.1"))
    plan = _safe_plan(world)
    cache = ldcache.read_cache(plan.cache)
    assert cache.lookup("libreal.so.1") == ["/usr/lib/x86_64-linux-gnu/libreal.so.1"]
    assert listing(plan.cache).count(b"=>") == len(cache.entries)


# ---- include globs that would cost exponential time (issue 14, finding 3) ----------------

def _self_links(root, directory="g", links=10):
    """DIRECTORY holds LINKS links to "." and x.conf, which names /opt/x (one library)."""
    g = os.path.join(root, directory)
    os.makedirs(g)
    for i in range(links):
        os.symlink(".", os.path.join(g, f"l{i}"))
    with open(os.path.join(g, "x.conf"), "w") as out:
        out.write("/opt/x\n")
    os.makedirs(os.path.join(root, "opt/x"))
    elfgen.write_elf(os.path.join(root, "opt/x/libx.so.1"), soname="libx.so.1")


def test_include_glob_over_self_links_is_linear(world, resolver):
    """/g holds 10 links to "."; `include /g/*/*/*/*/*/*/*.conf` names 10**7 paths of one
    file (6 levels took 29 s and 2.4 GB, 7 ran out of memory). Globs look into each
    directory once (by identity), so this costs a few listings; the file is still read."""
    root = world["root"]
    _self_links(root)
    with open(os.path.join(root, "etc/ld.so.conf"), "w") as out:
        out.write("include /g/" + "*/" * 6 + "*.conf\n")
    out, took = _in_subprocess(f"""
        import os, resource
        if "libasan" not in os.environ.get("LD_PRELOAD", ""):   # ASan reserves terabytes of
            resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))   # shadow: maxrss bounds it there
        from shim.ldconfig import ldcache
        from shim._native import lib
        lib.cds_inroot_set_mode(lib.CDS_RESOLVE_WALK if {resolver!r} == "walk" else lib.CDS_RESOLVE_OPENAT2)
        plan = ldcache.plan({root!r}, [])
        print(sorted(e.soname for e in ldcache.read_cache(plan.cache).entries))
        with open("/proc/self/status") as status:   # this process's own peak (ru_maxrss counts
            print(next(l.split()[1] for l in status if l.startswith("VmHWM:")))   # the parent's too)
    """, timeout=60)
    sonames, maxrss = out.splitlines()
    assert "'libx.so.1'" in sonames and "'libinside.so.1'" in sonames
    assert took < 10, took
    # ASan's own start-up holds ~280 MiB; the unbounded glob took 2.4 GB
    limit = (600 << 10) if "libasan" in os.environ.get("LD_PRELOAD", "") else (200 << 10)
    assert int(maxrss) < limit, f"{maxrss} KiB"


def test_include_glob_over_too_many_directories(world):
    """Real directories, not links: 70 x 70 under /d, `include /d/*/*/*.conf` looks into
    4,971 directories. Past the bound the plan stops with an error naming the file, the
    line and the bound."""
    root = world["root"]
    for i in range(70):
        for j in range(70):
            os.makedirs(os.path.join(root, f"d/{i}/{j}"))
    with open(os.path.join(root, "etc/ld.so.conf"), "w") as out:
        out.write("/opt/a\ninclude /d/*/*/*.conf\n")
    with pytest.raises(ldcache.LdcacheLimitError) as caught:
        ldcache.plan(root, [])
    assert str(caught.value) == ("/etc/ld.so.conf: include /d/*/*/*.conf: include globs looked into more "
                                 f"than {ldcache.MAX_GLOB_DIRS} directories (the bound on include globs)")
    assert ldcache.MAX_GLOB_DIRS == 4096


def test_include_globs_over_too_many_names(world):
    """One directory of 2,000 entries matched by 600 include lines of distinct patterns:
    1.2 million names to match. Past the bound the plan stops with an error."""
    root = world["root"]
    os.makedirs(os.path.join(root, "e"))
    for i in range(2000):
        open(os.path.join(root, f"e/f{i}"), "w").close()
    os.makedirs(os.path.join(root, "etc/ld.so.conf.d"))
    with open(os.path.join(root, "etc/ld.so.conf.d/many.conf"), "w") as out:
        out.write("".join(f"include /e/*.c{i}\n" for i in range(600)))
    with open(os.path.join(root, "etc/ld.so.conf"), "w") as out:
        out.write("include /etc/ld.so.conf.d/*.conf\n")
    with pytest.raises(ldcache.LdcacheLimitError) as caught:
        ldcache.plan(root, [])
    message = str(caught.value)
    assert message.startswith("/etc/ld.so.conf.d/many.conf: include /e/*.c"), message
    assert message.endswith(f"include globs matched more than {ldcache.MAX_GLOB_NAMES} names "
                            "(the bound on include globs)"), message


def test_repeated_include_lines_cost_one_glob(world):
    """An ld.so.conf of 40,000 identical include lines: one glob, not 40,000."""
    root = world["root"]
    _self_links(root)
    with open(os.path.join(root, "etc/ld.so.conf"), "w") as out:
        out.write("include /g/*/*.conf\n" * 40000)
    start = time.monotonic()
    plan = ldcache.plan(root, [])
    assert "libx.so.1" in _sonames(plan.cache)
    assert time.monotonic() - start < 5


def test_deadline_stops_the_plan(world):
    """The wall-clock bound: a plan past its deadline stops with an error saying so and where."""
    root = world["root"]
    with open(os.path.join(root, "etc/ld.so.conf"), "w") as out:
        out.write(f"/{LIB}\n")
    with pytest.raises(ldcache.LdcacheLimitError) as caught:
        ldcache.plan(root, [], deadline=ldcache.Deadline(0))
    assert str(caught.value).startswith("not done within 0 s (the bound on the linker step), at "), caught.value
    plan = ldcache.plan(root, [], deadline=ldcache.Deadline(30))
    assert "libinside.so.1" in _sonames(plan.cache)
