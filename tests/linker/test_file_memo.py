"""The memo of library files read before (shim.ldconfig.ldcache.remember_files), which the runtime's
resident workers turn on: a plan with it equals glibc's ldconfig exactly as one without it,
later plans stat the files instead of reading them -- the host's driver files, and an
image's own files in every container of that image (a new overlay mount, so a new device
number, over the same layer files) -- and any change to a file (rewritten in place,
replaced by rename, a new SONAME) is seen."""
import contextlib
import os
import subprocess
import time

import pytest

import ldcache_helpers
from ldcache_helpers import build_library, fake_driver, generator_of, roots, toolkit_ldconfig
from shim.ldconfig import ldcache
from tests.helpers import file_memo
from test_equivalence import assert_equivalent

LIBDIR = "/usr/lib/x86_64-linux-gnu"


@pytest.fixture
def memo():
    """The memo on and empty, keeping files however new (the settle rule has its own test)."""
    with file_memo(True, forget=True):
        yield


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
    hits0, misses0, _ = ldcache.memo_stats()
    first = ldcache.plan(host_tree, [LIBDIR], extra, links="ldconfig", generator=generator)
    hits1, misses1, entries = ldcache.memo_stats()
    read = len(extra) + 1        # the driver files, and the listing of the directory they go to
    assert (hits1 - hits0, misses1 - misses0) == (0, read) and entries >= read
    # the second plan reads no driver file: every one is a hit; both equal glibc's cache
    second = ldcache.plan(host_tree, [LIBDIR], extra, links="ldconfig", generator=generator)
    hits2, misses2, _ = ldcache.memo_stats()
    assert (hits2 - hits1, misses2 - misses1) == (read, 0)
    assert first.mode == second.mode == "incremental"
    assert first.cache == second.cache == expected


def rebuild_with_soname(path, soname, build_dir=None):
    """Rewrite PATH in place (same inode) as a library with SONAME (built in BUILD_DIR, by
    default next to it)."""
    fresh = build_library(os.path.join(build_dir or os.path.dirname(path),
                                       os.path.basename(path) + ".new"), soname)
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
    _, misses_before, _ = ldcache.memo_stats()
    cache = ldcache.read_cache(ldcache.plan_cache(host_tree, [LIBDIR], extra))
    _, misses_after, _ = ldcache.memo_stats()
    assert misses_after - misses_before == 1                 # just the changed file
    assert cache.lookup("libcuda-new.so.7") and not cache.lookup("libcuda.so.1")
    mounted = mounted_copy(host_tree, scratch, extra, "mounted")
    assert_equivalent(host_tree, [LIBDIR], workdir, extra=extra, oracle_root=mounted)


def test_off_by_default_and_off_forgets(scratch):
    assert ldcache.remember_files(False) is False            # nothing turned it on in this process
    made = fake_driver(os.path.join(scratch, "driver"), names=("cuda",))
    hits, misses, entries = ldcache.memo_stats()
    ldcache.plan_cache(scratch, [LIBDIR], {f"{LIBDIR}/libcuda.so.1": made["libcuda.so.1"]})
    assert ldcache.memo_stats() == (hits, misses, 0)
    with file_memo(True):
        ldcache.plan_cache(scratch, [LIBDIR], {f"{LIBDIR}/libcuda.so.1": made["libcuda.so.1"]})
        assert ldcache.memo_stats()[2] == 1
    assert ldcache.memo_stats()[2] == 0


def test_unreadable_or_missing_host_file_is_never_remembered(host_tree, scratch, memo):
    missing = os.path.join(scratch, "gone.so.1")
    extra = {f"{LIBDIR}/libgone.so.1": missing}
    _, _, entries = ldcache.memo_stats()
    plan = ldcache.plan(host_tree, [LIBDIR], extra)
    assert any(path.endswith("libgone.so.1") for path, _ in plan.skipped)
    assert ldcache.memo_stats()[2] == entries + 1            # the directory's listing only


def test_a_file_changed_within_the_settle_time_is_not_kept(scratch):
    """A file whose ctime is under SETTLE seconds old may still change within one tick of
    the kernel's clock, unseen by its stat: it is read every time until it settles."""
    made = fake_driver(os.path.join(scratch, "driver"), names=("cuda",))
    extra = {f"{LIBDIR}/libcuda.so.1": made["libcuda.so.1"]}
    with file_memo(True, forget=True, settle=5):
        ldcache.plan_cache(scratch, [LIBDIR], extra)
        ldcache.plan_cache(scratch, [LIBDIR], extra)
        hits, misses, entries = ldcache.memo_stats()
        assert entries == 0
        with file_memo(True, forget=False):
            ldcache.plan_cache(scratch, [LIBDIR], extra)
            ldcache.plan_cache(scratch, [LIBDIR], extra)
            assert ldcache.memo_stats() == (hits + 1, misses + 1, 1)


# ---- the image's own files -----------------------------------------------------------

@contextlib.contextmanager
def overlay_mounts(lower, scratch, count):
    """COUNT overlay mounts over LOWER: containers of one image (new device numbers, the
    layer files' inodes and ctimes)."""
    mounts = []
    try:
        for n in range(count):
            upper, work, merged = (os.path.join(scratch, f"c{n}", d) for d in ("upper", "work", "rootfs"))
            for d in (upper, work, merged):
                os.makedirs(d)
            subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                            f"lowerdir={lower},upperdir={upper},workdir={work}", merged],
                           check=True, capture_output=True)
            mounts.append(merged)
        assert len({os.stat(m).st_dev for m in mounts}) == count
        yield mounts
    finally:
        for merged in mounts:
            subprocess.run(["umount", merged], check=False)


@pytest.fixture
def two_containers(host_tree, scratch):
    """Two containers of an image: the host tree with a fake driver folder."""
    lower = roots.copy_tree(host_tree, os.path.join(scratch, "layer"))
    fake_driver(os.path.join(lower, "usr/local/nvidia/lib"), links=True)
    with overlay_mounts(lower, scratch, 2) as mounts:
        yield lower, mounts


def test_image_files_are_remembered_across_containers(two_containers, host_tree_manifest, workdir, memo):
    lower, (first, second) = two_containers
    folders = ["/usr/local/nvidia/lib"]
    expected = toolkit_ldconfig(lower, folders, workdir)
    generator = generator_of(expected)
    hits0, misses0, _ = ldcache.memo_stats()
    one = ldcache.plan(first, folders, links="ldconfig", generator=generator, mode="full")
    hits1, misses1, entries = ldcache.memo_stats()
    # every library file of the tree and of the driver folder read (and remembered) once
    driver = os.path.join(lower, folders[0].lstrip("/"))
    files = host_tree_manifest["files"] + sum(not os.path.islink(os.path.join(driver, n))
                                              for n in os.listdir(driver))
    assert hits1 == hits0 and misses1 - misses0 >= files and entries >= misses1 - misses0
    # the other container reads no library file: every one is a hit
    two = ldcache.plan(second, folders, links="ldconfig", generator=generator, mode="full")
    hits2, misses2, _ = ldcache.memo_stats()
    assert (hits2 - hits1, misses2 - misses1) == (misses1 - misses0, 0)
    assert one.cache == two.cache == expected
    # and the incremental plan, which reads only the driver folder
    inc = ldcache.plan(second, folders, links="ldconfig", generator=generator)
    assert inc.mode == "incremental" and inc.cache == expected
    assert ldcache.memo_stats()[1] == misses2


@pytest.mark.parametrize("how", ["rewritten-in-the-container", "replaced-in-the-container",
                                 "rewritten-in-the-layer"])
def test_a_changed_image_file_is_read_again(two_containers, workdir, scratch, memo, how):
    lower, (first, second) = two_containers
    folders = ["/usr/local/nvidia/lib"]
    ldcache.plan_cache(first, folders)                       # remembered
    time.sleep(0.01)                                         # a ctime the kernel can tell apart
    libdir = os.path.join(second, "usr/local/nvidia/lib")
    target = os.path.join(libdir, "libcuda.so.550.54.15")
    if how == "rewritten-in-the-container":                  # a copy-up
        rebuild_with_soname(target, "libcuda-new.so.7")
    elif how == "replaced-in-the-container":
        build_library(target + ".tmp", "libcuda-new.so.7")
        os.rename(target + ".tmp", target)
    else:                                                    # same inode, same directory
        rebuild_with_soname(os.path.join(lower, "usr/local/nvidia/lib/libcuda.so.550.54.15"),
                            "libcuda-new.so.7", build_dir=scratch)
    _, misses_before, _ = ldcache.memo_stats()
    cache = ldcache.read_cache(ldcache.plan_cache(second, folders))
    # just the changed file; and its directory's listing where the container changed it
    # (a copy-up in the container's own layer: a new identity for the directory)
    changed = 1 if how == "rewritten-in-the-layer" else 2
    assert ldcache.memo_stats()[1] - misses_before == changed
    assert cache.lookup("libcuda-new.so.7")


def plan_without_memo(root, folders, extra=None):
    previous = ldcache.remember_files(False, forget=False)
    try:
        return ldcache.plan_cache(root, folders, extra)
    finally:
        ldcache.remember_files(previous, forget=False)


@pytest.mark.parametrize("change", ["library-added", "link-retargeted"])
def test_a_changed_directory_is_listed_again(two_containers, memo, change):
    """Listings are remembered by the directory's identity: an entry added, removed or
    replaced changes it, and the plan then equals the one made without the memo."""
    _, (first, second) = two_containers
    folders = ["/usr/local/nvidia/lib"]
    before = ldcache.plan_cache(first, folders)
    assert ldcache.plan_cache(second, folders) == before     # listed from the memo
    time.sleep(0.01)
    libdir = os.path.join(second, "usr/local/nvidia/lib")
    if change == "library-added":
        build_library(os.path.join(libdir, "libnvidia-new.so.550.54.15"), "libnvidia-new.so.1")
        os.symlink("libnvidia-new.so.550.54.15", os.path.join(libdir, "libnvidia-new.so.1"))
        gained, lost = "libnvidia-new.so.1", None
    else:
        # libcuda.so.1 now names NVML's file: ldconfig takes it as a file of its own (its
        # soname is not the link's name), so libcuda.so.1 no longer resolves to libcuda
        os.unlink(os.path.join(libdir, "libcuda.so.1"))
        os.symlink("libnvidia-ml.so.550.54.15", os.path.join(libdir, "libcuda.so.1"))
        gained, lost = None, "/usr/local/nvidia/lib/libcuda.so.1"
    _, misses_before, _ = ldcache.memo_stats()
    after = ldcache.plan_cache(second, folders)
    assert ldcache.memo_stats()[1] > misses_before           # the directory listed again
    assert after == plan_without_memo(second, folders) != before
    paths = {e.path for e in ldcache.read_cache(after).entries}
    names = {e.soname for e in ldcache.read_cache(after).entries}
    assert gained is None or gained in names
    assert lost is None or lost not in paths


@pytest.mark.parametrize("image_has", ["a-soname-link-to-a-mount", "a-file-a-mount-hides"])
def test_extras_use_the_remembered_listing(host_tree, workdir, scratch, memo, image_has):
    """Driver files mounted into the image's own library directory, which the image's cache
    covers: the plan looks up the names they hide and their soname links in the directory's
    listing (read once, then remembered) instead of a stat and a readlink each. glibc's
    cache of the mounted tree, in two containers of the image."""
    lower = roots.copy_tree(host_tree, os.path.join(scratch, "layer"))
    libdir = os.path.join(lower, LIBDIR.lstrip("/"))
    if image_has == "a-soname-link-to-a-mount":       # the cache then names the link
        os.symlink("libcuda.so.550.54.15", os.path.join(libdir, "libcuda.so.1"))
    else:                                             # which ldconfig keeps: read them all
        build_library(os.path.join(libdir, "libnvidia-ml.so.550.54.15"), "libnvidia-image.so.3")
    subprocess.run([ldcache_helpers.LDCONFIG, "-X", "-r", lower], check=True, timeout=60)
    made = fake_driver(os.path.join(scratch, "driver"), names=("cuda", "nvidia-ml", "nvidia-ptxjitcompiler"))
    extra = {f"{LIBDIR}/{os.path.basename(p)}": p for p in made.values()}
    expected = toolkit_ldconfig(mounted_copy(lower, scratch, extra, "mounted"), [LIBDIR], workdir)
    generator = generator_of(expected)
    with overlay_mounts(lower, scratch, 2) as containers:
        for root in containers:
            plan = ldcache.plan(root, [LIBDIR], extra, links="ldconfig", generator=generator)
            assert plan.cache == expected
            # as the runtime plans (names the files, or the soname links that exist)
            existing = ldcache.plan_cache(root, [LIBDIR], extra)
            assert existing == plan_without_memo(root, [LIBDIR], extra)
            names = {e.soname: os.path.basename(e.path) for e in ldcache.read_cache(existing).entries}
            assert names["libcuda.so.1"] == ("libcuda.so.1" if image_has == "a-soname-link-to-a-mount"
                                             else "libcuda.so.550.54.15")
    assert ldcache.memo_stats()[0] > 0


def test_a_remembered_listing_is_equal_to_glibc(host_tree, workdir, scratch, memo):
    """The memo on from the first plan to the third (listings and files remembered, then
    used for the extras' lookups): glibc's cache each time."""
    made = fake_driver(os.path.join(scratch, "driver"))
    extra = {f"{LIBDIR}/{os.path.basename(p)}": p for p in made.values()}
    expected = toolkit_ldconfig(mounted_copy(host_tree, scratch, extra, "mounted"), [LIBDIR], workdir)
    generator = generator_of(expected)
    for mode in ("full", "auto", "auto"):
        plan = ldcache.plan(host_tree, [LIBDIR], extra, links="ldconfig", generator=generator,
                            mode=mode)
        assert plan.cache == expected
