"""The memo of host files read as extras (shim.ldcache.remember_host_files), which the
runtime's resident workers turn on: a plan with it equals glibc's ldconfig exactly as one
without it, later plans stat the driver files instead of reading them, and any change to a
file (rewritten in place, replaced by rename, a new SONAME) is seen."""
import os
import time

import pytest

from ldcache_helpers import build_library, fake_driver, generator_of, roots, toolkit_ldconfig
from shim import ldcache
from test_equivalence import assert_equivalent

LIBDIR = "/usr/lib/x86_64-linux-gnu"


@pytest.fixture
def memo():
    previous = ldcache.remember_host_files(True)
    yield
    ldcache.remember_host_files(previous)


def mounted_copy(host_tree, scratch, extra, name):
    """The tree with EXTRA's host files where the mounts put them (glibc's view)."""
    mounted = roots.copy_tree(host_tree, os.path.join(scratch, name))
    for container, src in extra.items():
        dest = os.path.join(mounted, container.lstrip("/"))
        if os.path.lexists(dest):
            os.unlink(dest)
        os.link(src, dest)
    return mounted


def test_memo_hits_and_still_equals_glibc(host_tree, workdir, scratch, memo):
    made = fake_driver(os.path.join(scratch, "driver"))
    extra = {f"{LIBDIR}/{os.path.basename(p)}": p for p in made.values()}
    # glibc's answer first: copying trees hard-links the driver files, which changes their
    # ctime (and so, rightly, their identity for the memo)
    expected = toolkit_ldconfig(mounted_copy(host_tree, scratch, extra, "mounted"), [LIBDIR], workdir)
    generator = generator_of(expected)
    hits0, misses0, _ = ldcache.host_memo_stats()
    first = ldcache.plan(host_tree, [LIBDIR], extra, links="ldconfig", generator=generator)
    hits1, misses1, entries = ldcache.host_memo_stats()
    assert (hits1 - hits0, misses1 - misses0) == (0, len(extra)) and entries >= len(extra)
    # the second plan reads no driver file: every one is a hit; both equal glibc's cache
    second = ldcache.plan(host_tree, [LIBDIR], extra, links="ldconfig", generator=generator)
    hits2, misses2, _ = ldcache.host_memo_stats()
    assert (hits2 - hits1, misses2 - misses1) == (len(extra), 0)
    assert first.mode == second.mode == "incremental"
    assert first.cache == second.cache == expected


def rebuild_with_soname(path, soname):
    """Rewrite PATH in place (same inode) as a library with SONAME."""
    fresh = build_library(path + ".new", soname)
    with open(fresh, "rb") as src, open(path, "r+b") as out:
        out.truncate(0)
        out.write(src.read())
    os.unlink(fresh)


@pytest.mark.parametrize("how", ["rewritten-in-place", "replaced-by-rename"])
def test_a_changed_driver_file_is_read_again(host_tree, workdir, scratch, memo, how):
    made = fake_driver(os.path.join(scratch, "driver"), names=("nvidia-ml", "cuda"))
    extra = {f"{LIBDIR}/{os.path.basename(p)}": p for p in made.values()}
    ldcache.plan_cache(host_tree, [LIBDIR], extra)           # remembered
    target = made["libcuda.so.1"]
    time.sleep(0.01)                                         # a ctime the kernel can tell apart
    if how == "rewritten-in-place":
        inode = os.stat(target).st_ino
        rebuild_with_soname(target, "libcuda-new.so.7")
        assert os.stat(target).st_ino == inode
    else:
        build_library(target + ".tmp", "libcuda-new.so.7")
        os.rename(target + ".tmp", target)
    _, misses_before, _ = ldcache.host_memo_stats()
    cache = ldcache.read_cache(ldcache.plan_cache(host_tree, [LIBDIR], extra))
    _, misses_after, _ = ldcache.host_memo_stats()
    assert misses_after - misses_before == 1                 # just the changed file
    assert cache.lookup("libcuda-new.so.7") and not cache.lookup("libcuda.so.1")
    mounted = mounted_copy(host_tree, scratch, extra, "mounted")
    assert_equivalent(host_tree, [LIBDIR], workdir, extra=extra, oracle_root=mounted)


def test_off_by_default_and_off_forgets(scratch):
    assert ldcache.remember_host_files(False) is False       # nothing turned it on in this process
    made = fake_driver(os.path.join(scratch, "driver"), names=("cuda",))
    hits, misses, entries = ldcache.host_memo_stats()
    ldcache.plan_cache(scratch, [LIBDIR], {f"{LIBDIR}/libcuda.so.1": made["libcuda.so.1"]})
    assert ldcache.host_memo_stats() == (hits, misses, 0)
    ldcache.remember_host_files(True)
    ldcache.plan_cache(scratch, [LIBDIR], {f"{LIBDIR}/libcuda.so.1": made["libcuda.so.1"]})
    assert ldcache.host_memo_stats()[2] == 1
    ldcache.remember_host_files(False)
    assert ldcache.host_memo_stats()[2] == 0


def test_unreadable_or_missing_host_file_is_never_remembered(host_tree, scratch, memo):
    missing = os.path.join(scratch, "gone.so.1")
    extra = {f"{LIBDIR}/libgone.so.1": missing}
    _, _, entries = ldcache.host_memo_stats()
    plan = ldcache.plan(host_tree, [LIBDIR], extra)
    assert any(path.endswith("libgone.so.1") for path, _ in plan.skipped)
    assert ldcache.host_memo_stats()[2] == entries
