"""Equivalence with glibc: our cache for a root equals the one glibc's ldconfig writes for
it after the toolkit's update-ldcache, byte for byte (with ldconfig's generator string; with
ours, only the generator string and its length field differ), and so does `ldconfig -p`.

Corpus: a generated library-rich tree (libtree.py), a debootstrap'ed Debian 12, a root with
32-bit, x32 and glibc-hwcaps/legacy hwcap subdirectories, one with duplicate sonames across
and within directories, one without any cache or ld.so.conf, a non-Debian (lib64) one.
"""
import collections
import os
import subprocess

import pytest

import libtree
from ldcache_helpers import (elfgen, fake_driver, build_library, generator_of, listing, roots,
                      strip_generator, toolkit_ldconfig)
from shim.ldconfig import ldcache
from tests.helpers import file_memo

FOLDER = "/usr/local/nvidia/lib"


def assert_equivalent(root, folders, workdir, expect_mode=None, extra=None, oracle_root=None,
                      **options):
    """Our plan (links as ldconfig makes them) against the oracle, three ways."""
    expected = toolkit_ldconfig(oracle_root or root, folders, workdir)
    plan = ldcache.plan(root, folders, extra, links="ldconfig",
                        generator=generator_of(expected), **options)
    if expect_mode:
        assert plan.mode == expect_mode, plan.reason
    ours_listing, glibc_listing = listing(plan.cache), listing(expected)
    assert ours_listing == glibc_listing
    assert plan.cache == expected
    # Our own generator string: the files differ in that string (and its size) only.
    own = ldcache.plan(root, folders, extra, links="ldconfig", **options)
    assert own.cache != expected
    assert strip_generator(own.cache) == strip_generator(expected)
    assert generator_of(own.cache) == ldcache.GENERATOR
    # A resident worker's file memo changes nothing: the plan that fills it and the plan
    # that uses it (files stat'ed, listings remembered) give glibc's cache too.
    with file_memo(True, forget=True):
        for _ in range(2):
            again = ldcache.plan(root, folders, extra, links="ldconfig",
                                 generator=generator_of(expected), **options)
            assert again.cache == expected
    return plan


# ---- the generated library tree ---------------------------------------------------

@pytest.fixture(scope="module")
def host_with_driver(host_tree, workdir):
    root = roots.copy_tree(host_tree, os.path.join(workdir, "host-driver"))
    fake_driver(os.path.join(root, FOLDER.lstrip("/")), links=True)
    return root


def cache_names(plan):
    return collections.Counter(e.soname for e in ldcache.read_cache(plan.cache).entries)


def test_host_tree_full(host_tree, host_tree_manifest, workdir):
    plan = assert_equivalent(host_tree, [], workdir, mode="full")
    # every name the tree was built to have, each once per directory, and nothing else
    assert cache_names(plan) == libtree.cache_names(host_tree_manifest)
    assert plan.entries == host_tree_manifest["entries"] > 500


def test_host_tree_incremental_with_driver_folder(host_with_driver, workdir):
    assert_equivalent(host_with_driver, [FOLDER], workdir, expect_mode="incremental")


def test_host_tree_full_with_driver_folder(host_with_driver, workdir):
    assert_equivalent(host_with_driver, [FOLDER], workdir, expect_mode="full", mode="full")


def test_host_tree_folder_already_configured_is_rescanned(host_with_driver, workdir, scratch):
    """A folder the image lists itself stays where it is; changed since the cache, it is
    scanned again."""
    root = roots.copy_tree(host_with_driver, os.path.join(scratch, "root"))
    with open(os.path.join(root, "etc/ld.so.conf.d/zz-driver.conf"), "w") as out:
        out.write(FOLDER + "\n")
    subprocess.run(["ldconfig", "-X", "-r", root], check=True)
    build_library(os.path.join(root, FOLDER.lstrip("/"), "libnvidia-new.so.1"), "libnvidia-new.so.1")
    assert_equivalent(root, [FOLDER], workdir, expect_mode="incremental")


def test_host_tree_extra_files_count_as_mounted(host_tree, host_tree_manifest, workdir, scratch):
    """Host files that will be bind-mounted: same cache as with the files in place."""
    host_driver = os.path.join(scratch, "host-driver")
    made = fake_driver(host_driver)
    extra = {f"{FOLDER}/{os.path.basename(path)}": path for path in made.values()}
    mounted = roots.copy_tree(host_tree, os.path.join(scratch, "mounted"))
    os.makedirs(os.path.join(mounted, FOLDER.lstrip("/")))
    for container, host in extra.items():
        os.link(host, os.path.join(mounted, container.lstrip("/")))
    plan = assert_equivalent(host_tree, [FOLDER], workdir, extra=extra, oracle_root=mounted,
                             expect_mode="incremental")
    assert not os.path.exists(os.path.join(host_tree, FOLDER.lstrip("/")))
    assert cache_names(plan) == libtree.cache_names(host_tree_manifest, list(made))
    assert plan.entries == host_tree_manifest["entries"] + len(made)


def test_existing_links_mode_names_the_files(host_tree, workdir, scratch):
    """Without soname links in the folder (nothing creates them), the default mode names
    the versioned files; everything else equals ldconfig's cache."""
    root = roots.copy_tree(host_tree, os.path.join(scratch, "root"))
    fake_driver(os.path.join(root, FOLDER.lstrip("/")), links=False)
    expected = ldcache.read_cache(toolkit_ldconfig(root, [FOLDER], workdir))
    ours = ldcache.read_cache(ldcache.plan_cache(root, [FOLDER]))
    assert [e.soname for e in ours.entries] == [e.soname for e in expected.entries]
    differ = [(o.path, e.path) for o, e in zip(ours.entries, expected.entries) if o.path != e.path]
    assert sorted(differ) == sorted([
        (f"{FOLDER}/libcuda.so.550.54.15", f"{FOLDER}/libcuda.so.1"),
        (f"{FOLDER}/libnvidia-ml.so.550.54.15", f"{FOLDER}/libnvidia-ml.so.1"),
        (f"{FOLDER}/libnvidia-ptxjitcompiler.so.550.54.15", f"{FOLDER}/libnvidia-ptxjitcompiler.so.1"),
    ])


# ---- debootstrap'ed Debian 12 -------------------------------------------------------

def test_debian_rootfs_own_cache(debian_root, workdir):
    """With no folder our full scan is what the image's ldconfig wrote (modulo generator)."""
    with open(os.path.join(debian_root, "etc/ld.so.cache"), "rb") as image:
        image_cache = image.read()
    plan = ldcache.plan(debian_root, [], mode="full", generator=generator_of(image_cache))
    assert listing(plan.cache) == listing(image_cache)


def test_debian_rootfs_with_driver(debian_root, workdir, scratch):
    root = roots.copy_tree(debian_root, os.path.join(scratch, "debian"))
    fake_driver(os.path.join(root, FOLDER.lstrip("/")), links=True)
    assert_equivalent(root, [FOLDER], workdir, expect_mode="incremental")
    assert_equivalent(root, [FOLDER], workdir, expect_mode="full", mode="full")


@pytest.mark.parametrize("configured", [False, True], ids=["compat-unconfigured", "compat-also-in-image-conf"])
def test_cuda_compat_dropin_goes_first(debian_root, workdir, scratch, configured):
    """enable-cuda-compat's 00-compat-*.conf (before the update-ldcache drop-in, whether the
    image configures the folder too or not): plan(compat=...) is glibc's cache byte for byte."""
    compat = "/usr/local/cuda/compat"
    root = roots.copy_tree(debian_root, os.path.join(scratch, "debian"))
    fake_driver(os.path.join(root, FOLDER.lstrip("/")), links=True)
    fake_driver(os.path.join(root, compat.lstrip("/")), version="560.28.03", names=("cuda",), links=True)
    if configured:
        with open(os.path.join(root, "etc/ld.so.conf.d/zz-cuda.conf"), "w") as out:
            out.write(compat + "\n")
    expected = toolkit_ldconfig(root, [FOLDER], workdir, compat=[compat])
    plan = ldcache.plan(root, [FOLDER], links="ldconfig", generator=generator_of(expected), compat=[compat])
    assert plan.mode == "full"
    assert listing(plan.cache) == listing(expected)
    assert plan.cache == expected
    cuda = [line for line in listing(plan.cache).splitlines() if line.strip().startswith(b"libcuda.so.1 ")]
    assert len(cuda) == 2 and compat.encode() in cuda[0], cuda  # the loader takes the first
    assert ldcache.plan(root, [FOLDER], links="ldconfig").cache != plan.cache


def test_stale_and_unconfigured_directories(host_with_driver, workdir, scratch):
    """The cache is a memo per directory: a directory changed since (a library added) is
    scanned again; entries of a directory no longer configured are left out."""
    root = roots.copy_tree(host_with_driver, os.path.join(scratch, "root"))
    with open(os.path.join(root, "etc/ld.so.conf.d/zz-old.conf"), "w") as out:
        out.write("/opt/old\n")
    build_library(os.path.join(root, "opt/old/libold.so.1"), "libold.so.1")
    subprocess.run(["ldconfig", "-X", "-r", root], check=True)
    os.unlink(os.path.join(root, "etc/ld.so.conf.d/zz-old.conf"))
    os.utime(os.path.join(root, "etc/ld.so.conf.d"), (1, 1))     # keep the config "older"
    os.utime(os.path.join(root, "etc/ld.so.conf"), (1, 1))
    for name in os.listdir(os.path.join(root, "etc/ld.so.conf.d")):
        os.utime(os.path.join(root, "etc/ld.so.conf.d", name), (1, 1))
    libdir = os.path.join(root, "usr/lib/x86_64-linux-gnu")
    build_library(os.path.join(libdir, "libnewer.so.3.0"), "libnewer.so.3")
    os.symlink("libnewer.so.3.0", os.path.join(libdir, "libnewer.so.3"))
    plan = assert_equivalent(root, [FOLDER], workdir, expect_mode="incremental")
    cache = ldcache.read_cache(plan.cache)
    assert cache.lookup("libnewer.so.3") == ["/lib/x86_64-linux-gnu/libnewer.so.3"]
    assert cache.lookup("libold.so.1") == []
    assert any("not configured" in w for w in plan.warnings)


def test_extras_into_the_image_library_directory(host_tree, workdir, scratch):
    """The toolkit's specs mount the driver into the image's own library directory: the
    cache's entries for it stay, the mounted files are added to them."""
    host = os.path.join(scratch, "driver")
    made = fake_driver(host)
    libdir = "/usr/lib/x86_64-linux-gnu"
    extra = {f"{libdir}/{os.path.basename(p)}": p for p in made.values()}
    mounted = roots.copy_tree(host_tree, os.path.join(scratch, "mounted"))
    for container, src in extra.items():
        os.link(src, os.path.join(mounted, container.lstrip("/")))
    plan = assert_equivalent(host_tree, [libdir], workdir, extra=extra, oracle_root=mounted,
                             expect_mode="incremental")
    assert ldcache.read_cache(plan.cache).lookup("libcuda.so.1") == ["/lib/x86_64-linux-gnu/libcuda.so.1"]
    # One extra hiding a file of the directory: that directory is scanned again.
    victim = sorted(n for n in os.listdir(os.path.join(host_tree, libdir.lstrip("/")))
                    if n.startswith("libz.so.1."))[0]
    extra[f"{libdir}/{victim}"] = made["libcuda.so.1"]
    mounted2 = roots.copy_tree(host_tree, os.path.join(scratch, "mounted2"))
    for container, src in extra.items():
        dest = os.path.join(mounted2, container.lstrip("/"))
        if os.path.lexists(dest):
            os.unlink(dest)
        os.link(src, dest)
    assert_equivalent(host_tree, [libdir], workdir, extra=extra, oracle_root=mounted2,
                      expect_mode="incremental")


def test_extras_that_are_no_library_file_hide_what_they_cover(scratch):
    """A mount with a library's name whose host source is a directory (or is missing) adds
    nothing to the cache and is listed as skipped with the reason; the image's file it covers
    is no longer listed (the container will not see it)."""
    libdir = "/usr/lib/x86_64-linux-gnu"
    root = os.path.join(scratch, "root")
    os.makedirs(os.path.join(root, libdir.lstrip("/")))
    os.makedirs(os.path.join(root, "etc"))
    with open(os.path.join(root, "etc/ld.so.conf"), "w") as out:
        out.write(libdir + "\n")
    build_library(os.path.join(root, libdir.lstrip("/"), "libcovered.so.1"), "libcovered.so.1")
    build_library(os.path.join(root, libdir.lstrip("/"), "libkept.so.2"), "libkept.so.2")
    directory = os.path.join(scratch, "a-directory")
    os.makedirs(directory)
    extra = {f"{libdir}/libcovered.so.1": directory, f"{libdir}/libgone.so.3": os.path.join(scratch, "missing")}
    plan = ldcache.plan(root, [libdir], extra)
    assert sorted(plan.skipped) == [(f"{libdir}/libcovered.so.1", "Is a directory"),
                                    (f"{libdir}/libgone.so.3", "No such file or directory")]
    assert [e.soname for e in ldcache.read_cache(plan.cache).entries] == ["libkept.so.2"]


def test_debian_rootfs_two_folders_one_in_system_dir(debian_root, workdir, scratch):
    root = roots.copy_tree(debian_root, os.path.join(scratch, "debian"))
    fake_driver(os.path.join(root, FOLDER.lstrip("/")), links=True)
    vdpau = os.path.join(root, "usr/lib/x86_64-linux-gnu/vdpau")
    build_library(os.path.join(vdpau, "libvdpau_nvidia.so.550.54.15"), "libvdpau_nvidia.so.1")
    os.symlink("libvdpau_nvidia.so.550.54.15", os.path.join(vdpau, "libvdpau_nvidia.so.1"))
    folders = [FOLDER, "/usr/lib/x86_64-linux-gnu/vdpau", "/lib/x86_64-linux-gnu"]
    assert_equivalent(root, folders, workdir, expect_mode="incremental")


# ---- synthetic roots ----------------------------------------------------------------

def _elf(root, path, **kwargs):
    full = os.path.join(root, path.lstrip("/"))
    os.makedirs(os.path.dirname(full), exist_ok=True)
    elfgen.write_elf(full, **kwargs)
    return full


def _link(root, target, path):
    full = os.path.join(root, path.lstrip("/"))
    os.makedirs(os.path.dirname(full), exist_ok=True)
    os.symlink(target, full)


def _write(root, path, text):
    full = os.path.join(root, path.lstrip("/"))
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w" if isinstance(text, str) else "wb") as out:
        out.write(text)


@pytest.fixture(scope="module")
def multiarch_root(workdir):
    """32-bit (i386, x32), glibc-hwcaps and legacy hwcap subdirectories, typed directories,
    odd files ldconfig skips."""
    root = os.path.join(workdir, "multiarch")
    os.makedirs(os.path.join(root, "usr/lib"))
    os.symlink("usr/lib", os.path.join(root, "lib"))
    _write(root, "/etc/ld.so.conf", "# test\ninclude /etc/ld.so.conf.d/*.conf\n"
           "/opt/typed=libc6\n/opt/slashes///\n  /opt/spaces  \nhwcap 0 nosegneg\n")
    _write(root, "/etc/ld.so.conf.d/i386.conf", "/usr/lib/i386-linux-gnu\n/lib/i386-linux-gnu\n")
    _write(root, "/etc/ld.so.conf.d/x32.conf", "/usr/libx32\n")
    _write(root, "/etc/debian_version", "12\n")
    em = elfgen
    lib = "/usr/lib/x86_64-linux-gnu"
    _elf(root, f"{lib}/liba.so.1.0", soname="liba.so.1", needed=["libc.so.6"])
    _link(root, "liba.so.1.0", f"{lib}/liba.so.1")
    _link(root, "liba.so.1", f"{lib}/liba.so")
    for sub, isa in (("x86-64-v2", 0x3), ("x86-64-v3", 0x7), ("x86-64-v4", 0xf)):
        _elf(root, f"{lib}/glibc-hwcaps/{sub}/liba.so.1.0", soname="liba.so.1", isa_needed=isa)
        _link(root, "liba.so.1.0", f"{lib}/glibc-hwcaps/{sub}/liba.so.1")
    os.makedirs(os.path.join(root, lib.lstrip("/"), "glibc-hwcaps/empty-hwcap"))
    _write(root, f"{lib}/glibc-hwcaps/a-file", "not a directory\n")
    for sub in ("tls", "haswell", "x86_64", "tls/x86_64", "avx512_1", "xeon_phi"):
        _elf(root, f"{lib}/{sub}/liba.so.1", soname="liba.so.1")
    _elf(root, f"{lib}/libabi.so.2", soname="libabi.so.2", abi_tag=(0, 3, 2, 0))
    _elf(root, f"{lib}/libhurd.so.2", soname="libhurd.so.2", abi_tag=(1, 0, 0, 0))
    _elf(root, f"{lib}/libnosoname.so.3")
    _elf(root, f"{lib}/libarm64.so.1", soname="libarm64.so.1", machine=em.EM_AARCH64)
    _elf(root, f"{lib}/libexec.so.1", soname="libexec.so.1", etype=em.ET_EXEC)
    _write(root, f"{lib}/libscript.so", "/* GNU ld script */\nGROUP ( libc.so.6 )\n")
    _write(root, f"{lib}/libempty.so.1", b"")
    _write(root, f"{lib}/libtiny.so.1", b"\x7fELF\x02\x01")
    _write(root, f"{lib}/libaout.so.4.2.1", b"\x0b\x01" + b"\0" * 126)
    _write(root, f"{lib}/libfoo.so.1.#prelink#.ABCDEF", b"x")
    _elf(root, f"{lib}/ld-linux-x86-64.so.2", soname="ld-linux-x86-64.so.2")
    _elf(root, f"{lib}/notalib.so.1", soname="notalib.so.1")
    i386 = "/usr/lib/i386-linux-gnu"
    _elf(root, f"{i386}/libc.so.6", soname="libc.so.6", elfclass=32, machine=em.EM_386,
         interp="/lib/ld-linux.so.2")
    _elf(root, f"{i386}/libplain.so.1", soname="libplain.so.1", elfclass=32, machine=em.EM_386)
    _elf(root, f"{i386}/libneedsc.so.1", soname="libneedsc.so.1", elfclass=32, machine=em.EM_386,
         needed=["libc.so.6"])
    _elf(root, f"{i386}/libisa.so.1", soname="libisa.so.1", elfclass=32, machine=em.EM_386,
         isa_needed=0x3)
    _elf(root, "/lib/i386-linux-gnu/libother.so.1", soname="libother.so.1", elfclass=32,
         machine=em.EM_386, needed=["libm.so.6"])
    _elf(root, "/usr/libx32/libx.so.1", soname="libx.so.1", elfclass=32, machine=em.EM_X86_64)
    _elf(root, "/opt/typed/libtyped.so.1", soname="libtyped.so.1", elfclass=32, machine=em.EM_386)
    _elf(root, "/opt/slashes/libslash.so.1", soname="libslash.so.1")
    _elf(root, "/opt/spaces/libspace.so.1", soname="libspace.so.1")
    return root


def test_multiarch_hwcaps_root(multiarch_root, workdir):
    plan = assert_equivalent(multiarch_root, [], workdir, mode="full")
    cache = ldcache.read_cache(plan.cache)
    hwcaps = {e.hwcaps for e in cache.entries if e.hwcaps}
    assert hwcaps == {"x86-64-v2", "x86-64-v3", "x86-64-v4"}
    assert {e.isa_level for e in cache.entries if e.hwcaps} == {1, 2, 3}
    assert any(e.hwcap == 1 << 63 for e in cache.entries)           # tls
    assert any(e.flags == 0x0803 for e in cache.entries)            # x32
    assert any(e.flags == 0x0001 for e in cache.entries)            # i386 without libc6 hint
    assert not any(e.soname == "libarm64.so.1" for e in cache.entries)


def test_multiarch_hwcaps_root_with_folder_incremental(multiarch_root, workdir, scratch):
    root = roots.copy_tree(multiarch_root, os.path.join(scratch, "root"))
    subprocess.run(["ldconfig", "-X", "-r", root], check=True, stderr=subprocess.DEVNULL)
    folder = "/opt/driver"
    _elf(root, f"{folder}/libdrv.so.1", soname="libdrv.so.1")
    _elf(root, f"{folder}/glibc-hwcaps/x86-64-v3/libdrv.so.1", soname="libdrv.so.1", isa_needed=7)
    _elf(root, f"{folder}/tls/libdrv.so.1", soname="libdrv.so.1")
    assert_equivalent(root, [folder], workdir, expect_mode="incremental")


@pytest.mark.parametrize("fmt", ["compat", "old"])
def test_other_formats(multiarch_root, workdir, fmt):
    """ldconfig -c compat / -c old: the same bytes (compat: where no legacy hwcap entries
    meet glibc's own bug in that writer, so only the clean subtree)."""
    root = os.path.join(workdir, f"formats-{fmt}")
    os.makedirs(os.path.join(root, "etc"))
    roots.copy_tree(os.path.join(multiarch_root, "usr"), os.path.join(root, "usr"))
    for sub in ("tls", "haswell", "x86_64", "avx512_1", "xeon_phi"):
        subprocess.run(["rm", "-rf", os.path.join(root, "usr/lib/x86_64-linux-gnu", sub)], check=True)
    expected = toolkit_ldconfig(root, [], workdir, extra_args=["-c", fmt])
    gen = generator_of(expected) if fmt == "compat" else None
    ours = ldcache.plan(root, [], mode="full", links="ldconfig", format=fmt, generator=gen).cache
    assert listing(ours) == listing(expected)
    assert ours == expected


@pytest.fixture(scope="module")
def duplicates_root(workdir):
    """The same sonames in several directories and several times in one directory."""
    root = os.path.join(workdir, "duplicates")
    _write(root, "/etc/ld.so.conf", "/opt/a\n/opt/b\ninclude /etc/ld.so.conf.d/*.conf\n/opt/c\n")
    _write(root, "/etc/ld.so.conf.d/d.conf", "/opt/d\n/opt/a\n")
    for d in ("/opt/a", "/opt/b", "/opt/c", "/opt/d"):
        _elf(root, f"{d}/libdup.so.1.0", soname="libdup.so.1")
        _link(root, "libdup.so.1.0", f"{d}/libdup.so.1")
    # In one directory: two versions, a link, a dev link, numbered names libcmp orders.
    _elf(root, "/opt/b/libdup.so.1.9", soname="libdup.so.1")
    _elf(root, "/opt/b/libdup.so.1.10", soname="libdup.so.1")
    _link(root, "libdup.so.1.10", "/opt/b/libdup.so")
    _elf(root, "/opt/c/libnum.so.01", soname="libnum.so.01")
    _elf(root, "/opt/c/libnum.so.1", soname="libnum.so.1")
    _elf(root, "/opt/c/libmixed.so.2", soname="libmixed.so.2")
    _elf(root, "/opt/c/libmixed32.so.2", soname="libmixed.so.2", elfclass=32, machine=elfgen.EM_386)
    _link(root, "../a/libdup.so.1.0", "/opt/d/libup.so.1")
    _link(root, "/opt/b/libdup.so.1.9", "/opt/d/libabs.so.1")
    _link(root, "libmissing.so.1.0", "/opt/d/libstale.so.1")
    _link(root, "libloop2.so.1", "/opt/d/libloop1.so.1")
    _link(root, "libloop1.so.1", "/opt/d/libloop2.so.1")
    _link(root, "/opt/a", "/opt/d/tls")
    os.makedirs(os.path.join(root, "opt/e"))
    _link(root, "/opt/e", "/opt/f")
    _write(root, "/etc/ld.so.conf.d/e.conf", "/opt/e\n/opt/f\n")
    _elf(root, "/opt/e/libe.so.1", soname="libé.so.1")
    return root


def test_duplicate_sonames(duplicates_root, workdir):
    plan = assert_equivalent(duplicates_root, [], workdir, mode="full")
    cache = ldcache.read_cache(plan.cache)
    assert cache.lookup("libdup.so.1")[0] == "/opt/a/libdup.so.1"
    assert len(cache.lookup("libdup.so.1")) >= 4


def test_duplicate_sonames_folder_where_the_dropin_is(duplicates_root, workdir, scratch):
    """The folder goes where ld.so.conf reads 00-nvcr-*.conf: after the directories listed
    before the include line, ahead of everything the include brings."""
    root = roots.copy_tree(duplicates_root, os.path.join(scratch, "root"))
    _elf(root, "/opt/new/libdup.so.1.0", soname="libdup.so.1")
    plan = assert_equivalent(root, ["/opt/new"], workdir, mode="full")
    assert ldcache.read_cache(plan.cache).lookup("libdup.so.1")[:4] == [
        "/opt/a/libdup.so.1", "/opt/b/libdup.so.1", "/opt/new/libdup.so.1", "/opt/d/libdup.so.1"]


def test_no_cache_no_conf(workdir, scratch):
    """No ld.so.conf, no cache: the toolkit writes ld.so.conf, we scan everything."""
    root = os.path.join(scratch, "bare")
    _elf(root, "/usr/lib/x86_64-linux-gnu/libbare.so.1", soname="libbare.so.1")
    _elf(root, "/usr/lib/libbare2.so.1", soname="libbare2.so.1")
    _elf(root, "/usr/lib64/libbare3.so.1", soname="libbare3.so.1")
    _elf(root, "/opt/drv/libdrv.so.1", soname="libdrv.so.1")
    plan = assert_equivalent(root, ["/opt/drv"], workdir, expect_mode="full")
    assert "no such file" in plan.reason.lower()
    assert not os.path.exists(os.path.join(root, "etc"))


def test_non_debian_lib64(workdir, scratch):
    """A RHEL-like image: system libraries in /usr/lib64, which only the toolkit's zz drop-in
    makes a Debian host's ldconfig see."""
    root = os.path.join(scratch, "ubi")
    _write(root, "/etc/ld.so.conf", "include ld.so.conf.d/*.conf\n")
    _write(root, "/etc/ld.so.conf.d/x.conf", "/opt/x\n")
    _elf(root, "/usr/lib64/libc.so.6", soname="libc.so.6")
    _elf(root, "/opt/x/libx.so.1", soname="libx.so.1")
    _link(root, "usr/lib64", "/lib64")
    subprocess.run(["ldconfig", "-X", "-r", root], check=True, stderr=subprocess.DEVNULL)
    _elf(root, "/opt/drv/libdrv.so.1", soname="libdrv.so.1")
    # The image's cache (by a Debian ldconfig) has nothing of /lib64, which has libraries:
    # that directory is scanned, the rest comes from the cache.
    plan = assert_equivalent(root, ["/opt/drv"], workdir, expect_mode="incremental")
    cache = ldcache.read_cache(plan.cache)
    assert cache.lookup("libc.so.6") == ["/lib64/libc.so.6"]
    assert_equivalent(root, ["/opt/drv"], workdir, expect_mode="full", mode="full")


def test_conf_without_include_puts_folders_first(workdir, scratch):
    """An ld.so.conf that never reads ld.so.conf.d: the folders still come first (the toolkit's
    drop-in would be ignored there; ldconfig's command-line directories are the oracle)."""
    root = os.path.join(scratch, "noinclude")
    _write(root, "/etc/ld.so.conf", "/opt/img\n")
    _write(root, "/etc/debian_version", "12\n")
    _elf(root, "/opt/img/libimg.so.1", soname="libimg.so.1")
    _elf(root, "/opt/img/libdup.so.1", soname="libdup.so.1")
    _elf(root, "/opt/drv/libdup.so.1", soname="libdup.so.1")
    out = os.path.join(scratch, "oracle.cache")
    subprocess.run(["ldconfig", "-X", "-r", root, "-C", "/oracle.cache", "/opt/drv"], check=True)
    with open(os.path.join(root, "oracle.cache"), "rb") as f:
        expected = f.read()
    os.unlink(os.path.join(root, "oracle.cache"))
    del out
    ours = ldcache.plan(root, ["/opt/drv"], links="ldconfig", generator=generator_of(expected))
    assert ours.cache == expected
    assert ldcache.read_cache(ours.cache).lookup("libdup.so.1")[0] == "/opt/drv/libdup.so.1"


def test_extra_files_in_glibc_hwcaps_subdirectories(host_tree, workdir, scratch):
    """Extra files whose directories (a folder and its glibc-hwcaps subdirectory) do not exist
    yet: they exist once mounted, and the cache says so."""
    host = os.path.join(scratch, "host")
    plain = build_library(os.path.join(host, "libhw.so.1"), "libhw.so.1")
    v3 = build_library(os.path.join(host, "v3", "libhw.so.1"), "libhw.so.1", flags=["-Wl,-z,x86-64-v3"])
    extra = {f"{FOLDER}/libhw.so.1": plain, f"{FOLDER}/glibc-hwcaps/x86-64-v3/libhw.so.1": v3}
    mounted = roots.copy_tree(host_tree, os.path.join(scratch, "mounted"))
    for container, src in extra.items():
        dest = os.path.join(mounted, container.lstrip("/"))
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        os.link(src, dest)
    plan = assert_equivalent(host_tree, [FOLDER], workdir, extra=extra, oracle_root=mounted)
    cache = ldcache.read_cache(plan.cache)
    assert cache.lookup("libhw.so.1") == [f"{FOLDER}/glibc-hwcaps/x86-64-v3/libhw.so.1",
                                          f"{FOLDER}/libhw.so.1"]
    assert [e.isa_level for e in cache.entries if e.hwcaps and e.soname == "libhw.so.1"] == [2]


def test_musl_image_gets_a_path_file(scratch):
    """musl reads /etc/ld-musl-<arch>.path, not a cache: the folders go first, then what the
    file had (or musl's default when there was none)."""
    root = os.path.join(scratch, "alpine")
    _write(root, "/lib/ld-musl-x86_64.so.1", b"\x7fELF musl loader stand-in")
    _elf(root, "/usr/lib/libz.so.1", soname="libz.so.1")
    plan = ldcache.plan(root, [FOLDER, "/usr/lib"])
    assert plan.musl == {"/etc/ld-musl-x86_64.path": f"{FOLDER}\n/lib\n/usr/local/lib\n/usr/lib\n".encode()}
    assert set(plan.files) == {"/etc/ld.so.cache", "/etc/ld-musl-x86_64.path"}
    _write(root, "/etc/ld-musl-x86_64.path", "/opt/x:/usr/lib\n")
    plan = ldcache.plan(root, [FOLDER])
    assert plan.musl["/etc/ld-musl-x86_64.path"] == f"{FOLDER}\n/opt/x\n/usr/lib\n".encode()
    ldcache.update(root, [FOLDER])
    with open(os.path.join(root, "etc/ld-musl-x86_64.path"), "rb") as f:
        assert f.read() == f"{FOLDER}\n/opt/x\n/usr/lib\n".encode()
    # Folders the file already has are not repeated.
    assert ldcache.plan(root, [FOLDER]).musl["/etc/ld-musl-x86_64.path"] == \
        f"{FOLDER}\n/opt/x\n/usr/lib\n".encode()


def test_glibc_image_gets_no_path_file(host_tree):
    assert ldcache.plan(host_tree, [FOLDER]).musl == {}


def test_include_globs_reaching_a_directory_by_several_paths(workdir, scratch):
    """Links to "." and to another directory under /g: glob(3) lists x.conf under every
    path (3 + 9 of them here) and ldconfig reads it that often; we look into each directory
    once (issue 14, finding 3: over ten such links and seven levels, glob(3) lists 10**7
    paths). The cache is the same."""
    root = os.path.join(scratch, "aliased")
    _write(root, "/etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\ninclude /g/*/*.conf\n"
           "/opt/z\ninclude /g/*/*/*.conf\n")
    _write(root, "/etc/ld.so.conf.d/a.conf", "/opt/a\n")
    _write(root, "/g/x.conf", "/opt/x\n/opt/a\n")
    _write(root, "/h/y.conf", "/opt/y\n/opt/x\n")
    for i in range(3):
        _link(root, ".", f"/g/l{i}")
    _link(root, "../h", "/g/sub")
    for name in ("a", "x", "y", "z"):
        _elf(root, f"/opt/{name}/lib{name}.so.1", soname=f"lib{name}.so.1")
        _elf(root, f"/opt/{name}/libdup.so.1", soname="libdup.so.1")
    plan = assert_equivalent(root, ["/opt/drv"], workdir, expect_mode="full")
    assert ldcache.read_cache(plan.cache).lookup("libdup.so.1") == [
        f"/opt/{name}/libdup.so.1" for name in ("a", "x", "y", "z")]


def test_a_directory_mount_with_links_is_listed_as_ldconfig_lists_it(host_tree, workdir, scratch):
    """A folder bound whole (the one-mount layout, docs/one-mount.md) holding the driver's files,
    their SONAME links and the dev links applications dlopen (libcuda.so -> libcuda.so.1):
    read through the mount's host source, the cache equals glibc's for a root with that
    content at the folder (ldconfig keys a link by its own name: libcuda.so is an entry)."""
    folder = "/usr/local/nvidia/lib64"
    host = os.path.join(scratch, "host-lib64")
    os.makedirs(host)
    fake_driver(host, links=True)
    os.symlink("libcuda.so.1", os.path.join(host, "libcuda.so"))
    oracle = roots.copy_tree(host_tree, os.path.join(scratch, "oracle"))
    os.makedirs(os.path.join(oracle, folder.lstrip("/")))
    for name in os.listdir(host):
        source = os.path.join(host, name)
        dest = os.path.join(oracle, folder.lstrip("/"), name)
        if os.path.islink(source):
            os.symlink(os.readlink(source), dest)
        else:
            os.link(source, dest)
    expected = toolkit_ldconfig(oracle, [folder], workdir)
    plan = ldcache.plan(host_tree, [folder], links="existing", generator=generator_of(expected),
                        mounts=[(folder, host)])
    assert listing(plan.cache) == listing(expected)
    assert plan.cache == expected
    assert ldcache.read_cache(plan.cache).lookup("libcuda.so") == [f"{folder}/libcuda.so"]
