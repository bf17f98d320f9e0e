"""The memo of whole plans (shim.ldconfig.ldcache.PlanMemo), which the runtime's resident
workers hold (ldcache.Memos): a container of an image planned before with the same driver files gets a copy
of that plan once every path the plan looked at -- in its own root, and the host files it added
-- has the same identity; any change to one of them (a configuration file, a directory's
entries, the image's cache, a driver file, a path that was missing) makes a new plan, equal to
the one made without the memo. Two containers are two overlay mounts of one layer, as
containerd makes them (new device numbers, the layer files' inodes and ctimes)."""
import errno
import os
import shutil
import subprocess
import time

import pytest

import ldcache_helpers
from ldcache_helpers import build_library, fake_driver, roots
from shim.ldconfig import ldcache
from tests.helpers import file_memo
from test_file_memo import overlay_mounts, rebuild_with_soname

LIBDIR = "/usr/lib/x86_64-linux-gnu"


@pytest.fixture
def plans():
    """The plan memo on and empty, the file memo off (so each plan's reads are its own), and
    files trusted however new (the settle rule has its own test)."""
    with file_memo(False), ldcache.PlanMemo().using():
        yield


@pytest.fixture
def image(host_tree, scratch):
    """An image layer (the library tree, with its own cache) and driver files for it."""
    lower = roots.copy_tree(host_tree, os.path.join(scratch, "layer"))
    made = fake_driver(os.path.join(scratch, "driver"), names=("cuda", "nvidia-ml"))
    extra = {f"{LIBDIR}/{os.path.basename(p)}": p for p in made.values()}
    return lower, extra


def fresh_plan(root, extra, folders=(LIBDIR,)):
    """The plan made without the memo (the answer a remembered one must equal)."""
    with ldcache.PlanMemo.using(None):
        return ldcache.plan(root, list(folders), extra)


def test_a_second_container_of_an_image_gets_the_first_ones_plan(image, scratch, plans):
    lower, extra = image
    with overlay_mounts(lower, scratch, 3) as (first, second, third):
        one = ldcache.plan(first, [LIBDIR], extra)
        assert one.mode == "incremental" and not one.scanned and not one.remembered
        two = ldcache.plan(second, [LIBDIR], extra)
        assert two.remembered and two.cache == one.cache == fresh_plan(second, extra).cache
        assert (two.entries, two.dirs, two.warnings) == (one.entries, one.dirs, one.warnings)
        two.warnings.append("changed by the caller")            # a copy: the kept plan is untouched
        assert ldcache.plan(third, [LIBDIR], extra).warnings == one.warnings


def _add_conf_file(root):
    with open(os.path.join(root, "etc/ld.so.conf.d/zz-new.conf"), "w") as out:
        out.write("/opt/new/lib\n")
    os.makedirs(os.path.join(root, "opt/new/lib"))
    build_library(os.path.join(root, "opt/new/lib/libnew.so.1"), "libnew.so.1")


def _add_library(root):
    build_library(os.path.join(root, LIBDIR.lstrip("/"), "libadded.so.3"), "libadded.so.3")


def _replace_cache(root):
    # the same bytes in a new file (a new inode): nothing to tell it apart but its identity
    path = os.path.join(root, "etc/ld.so.cache")
    shutil.copyfile(path, path + ".new")
    os.rename(path + ".new", path)


def _make_musl(root):
    # a path the plan found missing appears (an image turned musl)
    os.makedirs(os.path.join(root, "lib"), exist_ok=True)
    with open(os.path.join(root, "lib/ld-musl-x86_64.so.1"), "w") as out:
        out.write("")


def _rewrite_conf(root):
    os.makedirs(os.path.join(root, "opt/other"))
    build_library(os.path.join(root, "opt/other/libother.so.2"), "libother.so.2")
    with open(os.path.join(root, "etc/ld.so.conf"), "a") as out:     # in place
        out.write("/opt/other\n")


# change -> whether the plan's answer changes with it
CHANGES = {"a-configuration-file-added": (_add_conf_file, True), "a-library-added": (_add_library, True),
           "the-image-cache-replaced": (_replace_cache, False), "a-missing-path-appears": (_make_musl, True),
           "ld.so.conf-rewritten": (_rewrite_conf, True)}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_changed_container_is_planned_again(image, scratch, plans, change):
    lower, extra = image
    with overlay_mounts(lower, scratch, 2) as (first, second):
        before = ldcache.plan(first, [LIBDIR], extra)
        time.sleep(0.01)                                   # a ctime the kernel can tell apart
        make, differs = CHANGES[change]
        make(second)
        after = ldcache.plan(second, [LIBDIR], extra)
        assert not after.remembered
        expected = fresh_plan(second, extra)
        assert (after.cache, after.musl) == (expected.cache, expected.musl)
        assert ((after.cache, after.musl) != (before.cache, before.musl)) == differs


@pytest.mark.parametrize("how", ["rewritten-in-place", "replaced-by-rename"])
def test_a_changed_driver_file_is_planned_again(image, scratch, plans, how):
    lower, extra = image
    target = extra[f"{LIBDIR}/libcuda.so.550.54.15"]
    with overlay_mounts(lower, scratch, 2) as (first, second):
        before = ldcache.plan(first, [LIBDIR], extra)
        time.sleep(0.01)
        fresh = build_library(target + ".new", "libcuda-new.so.7")
        if how == "rewritten-in-place":
            with open(fresh, "rb") as src, open(target, "r+b") as out:
                out.truncate(0)
                out.write(src.read())
            os.unlink(fresh)
        else:
            os.rename(fresh, target)
        after = ldcache.plan(second, [LIBDIR], extra)
        assert not after.remembered and after.cache == fresh_plan(second, extra).cache != before.cache
        assert ldcache.read_cache(after.cache).lookup("libcuda-new.so.7")


def test_other_arguments_never_share_a_plan(image, scratch, plans):
    lower, extra = image
    with overlay_mounts(lower, scratch, 2) as (first, second):
        ldcache.plan(first, [LIBDIR], extra)
        fewer = dict(list(extra.items())[:1])
        for other in (ldcache.plan(second, [LIBDIR], fewer), ldcache.plan(second, [LIBDIR, "/opt"], extra),
                      ldcache.plan(second, [LIBDIR], extra, links="ldconfig")):
            assert not other.remembered


def test_the_files_a_scan_read_are_part_of_the_plans_identity(scratch, plans):
    """Without the image's cache every directory is read: the plan is kept with the files it
    read, and a library rewritten in place in the image's layer (same inode, its directory
    unchanged) makes a new plan."""
    lower = os.path.join(scratch, "layer")
    os.makedirs(os.path.join(lower, "etc"))
    os.makedirs(os.path.join(lower, "opt/lib"))
    with open(os.path.join(lower, "etc/ld.so.conf"), "w") as out:
        out.write("/opt/lib\n")
    library = build_library(os.path.join(lower, "opt/lib/libone.so.1"), "libone.so.1")
    with overlay_mounts(lower, scratch, 2) as (first, second):
        one = ldcache.plan(first, [])
        assert one.mode == "full" and one.scanned and ldcache.read_cache(one.cache).lookup("libone.so.1")
        assert ldcache.plan(second, []).remembered
        time.sleep(0.01)
        inode = os.stat(library).st_ino
        rebuild_with_soname(library, "libtwo.so.1", build_dir=scratch)
        assert os.stat(library).st_ino == inode
        after = ldcache.plan(second, [])
        assert not after.remembered and after.cache == fresh_plan(second, None, folders=[]).cache
        assert ldcache.read_cache(after.cache).lookup("libtwo.so.1")


def test_a_debian_image_whose_cache_leaves_a_directory_out(scratch, plans):
    """Debian's ldconfig lists nothing of /lib64, whose one entry is the loader (here a link to
    a library of the multiarch directory), so every plan of such an image scans /lib64 again:
    the plan is kept all the same, with the file it read."""
    lower = os.path.join(scratch, "layer")
    for directory in ("etc/ld.so.conf.d", LIBDIR.lstrip("/"), "lib64"):
        os.makedirs(os.path.join(lower, directory))
    with open(os.path.join(lower, "etc/ld.so.conf"), "w") as out:
        out.write("include /etc/ld.so.conf.d/*.conf\n")
    with open(os.path.join(lower, "etc/ld.so.conf.d/x86_64-linux-gnu.conf"), "w") as out:
        out.write(LIBDIR + "\n")
    build_library(os.path.join(lower, LIBDIR.lstrip("/"), "libone.so.1"), "libone.so.1")
    os.symlink(f"{LIBDIR}/libone.so.1", os.path.join(lower, "lib64/ld-linux-x86-64.so.2"))
    subprocess.run([ldcache_helpers.LDCONFIG, "-X", "-r", lower], check=True, timeout=60)
    made = fake_driver(os.path.join(scratch, "driver"), names=("cuda",))
    extra = {f"{LIBDIR}/{os.path.basename(p)}": p for p in made.values()}
    with overlay_mounts(lower, scratch, 2) as (first, second):
        one = ldcache.plan(first, [LIBDIR], extra)
        assert one.mode == "incremental" and one.scanned == 1 and "/lib64" in one.dirs, (one.mode, one.dirs)
        two = ldcache.plan(second, [LIBDIR], extra)
        assert two.remembered and two.cache == one.cache == fresh_plan(second, extra).cache


def test_files_changed_within_the_settle_time_are_not_trusted(image, scratch):
    lower, extra = image
    with ldcache.PlanMemo().using(), overlay_mounts(lower, scratch, 2) as (first, second):
        with file_memo(False, settle=5):      # every file here is younger
            ldcache.plan(first, [LIBDIR], extra)
            assert not ldcache.plan(second, [LIBDIR], extra).remembered
        with file_memo(False):
            ldcache.plan(first, [LIBDIR], extra)
            assert ldcache.plan(second, [LIBDIR], extra).remembered


def test_none_in_use_by_default_and_each_memo_its_own(image, scratch):
    """Plans are kept only in the memo a holder puts in use, for that block: two memos share
    nothing, and none is in use after."""
    lower, extra = image
    with file_memo(False), overlay_mounts(lower, scratch, 2) as (first, second):
        ldcache.plan(first, [LIBDIR], extra)
        assert not ldcache.plan(second, [LIBDIR], extra).remembered      # nothing put one in use
        one, other = ldcache.PlanMemo(), ldcache.PlanMemo()
        with one.using():
            ldcache.plan(first, [LIBDIR], extra)
            assert ldcache.plan(second, [LIBDIR], extra).remembered
            with other.using():
                assert not ldcache.plan(second, [LIBDIR], extra).remembered   # nothing of one's
                assert ldcache.plan(second, [LIBDIR], extra).remembered       # its own
            assert ldcache.plan(second, [LIBDIR], extra).remembered           # one's again
        assert not ldcache.plan(second, [LIBDIR], extra).remembered
        assert len(one.kept) == len(other.kept) == 1


def test_a_memo_in_use_is_that_threads_alone(image, scratch):
    """The memo in use is the using() block's, in its own thread only (the NRI hook server
    answers in threads): another thread's plans keep nothing in it and recall nothing of it."""
    import threading

    lower, extra = image
    with file_memo(False), overlay_mounts(lower, scratch, 2) as (first, second):
        memo, seen = ldcache.PlanMemo(), []
        with memo.using():
            ldcache.plan(first, [LIBDIR], extra)
            worker = threading.Thread(target=lambda: seen.append(ldcache.plan(second, [LIBDIR], extra).remembered))
            worker.start()
            worker.join()
            assert seen == [False]                                       # not the other thread's
            assert ldcache.plan(second, [LIBDIR], extra).remembered      # this one's
        assert len(memo.kept) == 1


def test_memos_hold_the_file_memo_and_plans_from_open_to_close(image, scratch):
    """ldcache.Memos (a resident worker's, the NRI hook server's): the file memo on while it is
    open (turned off by the one that turned it on); its plans consulted within using(); closed
    (its holder gone), both are forgotten."""
    lower, extra = image
    with file_memo(False), overlay_mounts(lower, scratch, 2) as (first, second):
        memos = ldcache.Memos()
        with memos:
            assert ldcache.remember_files(True, forget=False)            # on
            with ldcache.Memos() as other:                               # (found it on: leaves it on)
                assert other.plans is not memos.plans
            assert ldcache.remember_files(True, forget=False)
            with memos.using():
                ldcache.plan(first, [LIBDIR], extra)
                assert ldcache.plan(second, [LIBDIR], extra).remembered
            assert not ldcache.plan(second, [LIBDIR], extra).remembered  # outside using()
            plans = memos.plans
        assert memos.plans is None and len(plans.kept) == 1
        assert not ldcache.remember_files(False, forget=False)           # off once closed
        assert ldcache.memo_stats()[2] == 0                              # and forgotten
        with memos.using():
            assert not ldcache.plan(second, [LIBDIR], extra).remembered  # closed: none in use


def test_a_resident_worker_holds_memos_of_its_own():
    """Each worker of the resident server opens memos of its own (after the fork: none are
    shared), put in use for each create it serves (resident.handle)."""
    from shim.runtime import resident

    with file_memo(False):
        workers = [resident._Worker(None), resident._Worker(None)]
        try:
            assert all(worker.memos.plans is not None for worker in workers)
            assert workers[0].memos.plans is not workers[1].memos.plans
            assert ldcache.remember_files(True, forget=False)
        finally:
            for worker in workers:
                worker.memos.close()
                os.close(worker.messages)
        assert not ldcache.remember_files(False, forget=False)


def test_the_same_tree_planned_again_outside_overlayfs(image, scratch, plans):
    """A root that is not an overlay keeps the device in every identity: a copy of the tree
    (other inodes) is planned afresh, the tree itself is not."""
    lower, extra = image
    copy = os.path.join(scratch, "copy")
    shutil.copytree(lower, copy, symlinks=True)
    ldcache.plan(lower, [LIBDIR], extra)
    assert ldcache.plan(lower, [LIBDIR], extra).remembered
    assert not ldcache.plan(copy, [LIBDIR], extra).remembered


# ---- the identities (csrc/engine/filememo.c) --------------------------------------------

def _identify(root, paths, count=None):
    from shim._native import ffi, lib
    count = paths.count(b"\0") if count is None else count
    out = ffi.new("struct cds_identity[]", max(count, 1))
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    try:
        rc = lib.cds_memo_identify(fd, paths, len(paths), count, lib.cds_memo_clock_ns(), out)
        same = lib.cds_memo_same(fd, paths, len(paths), count, out)
        return rc, ffi.errno, same, [(out[i].err, out[i].ino) for i in range(count)]
    finally:
        os.close(fd)


def test_identities_in_the_tree_never_leave_it(scratch):
    """A hostile image's links lead back into its own root: the host's /etc/passwd is never
    what an in-tree path's identity is taken of."""
    root = os.path.join(scratch, "root")
    os.makedirs(os.path.join(root, "etc"))
    os.symlink("/etc/passwd", os.path.join(root, "absolute"))
    os.symlink("../../../../../../etc/passwd", os.path.join(root, "climbing"))
    rc, _, same, found = _identify(root, b"f/absolute\0f/climbing\0n/absolute\0h/etc/passwd\0")
    assert rc >= 0 and same == 1
    assert found[0][0] == found[1][0] == errno.ENOENT          # no /etc/passwd in the root
    assert found[2][0] == 0 and found[2][1] == os.lstat(os.path.join(root, "absolute")).st_ino
    assert found[3] == (0, os.stat("/etc/passwd").st_ino)     # 'h': a host path, as given


@pytest.mark.parametrize("paths,count", [(b"x/etc\0", 1), (b"f/etc", 1), (b"f/etc\0", 2), (b"", 1)],
                         ids=["unknown-kind", "no-terminator", "fewer-entries-than-counted", "empty"])
def test_malformed_identity_lists_are_refused(scratch, paths, count):
    rc, err, same, _ = _identify(scratch, paths, count)
    assert (rc, err, same) == (-1, errno.EINVAL, -1)


def test_a_plan_of_many_files_is_made_again(host_tree, scratch, plans):
    """Checking ~900 files costs more than planning them again with the file memo: a full
    plan of the library tree is not kept."""
    lower = roots.copy_tree(host_tree, os.path.join(scratch, "layer"))
    os.unlink(os.path.join(lower, "etc/ld.so.cache"))
    with overlay_mounts(lower, scratch, 2) as (first, second):
        assert ldcache.plan(first, [LIBDIR]).mode == "full"
        assert not ldcache.plan(second, [LIBDIR]).remembered


def test_a_mounted_folder_is_remembered_until_its_host_folder_changes(image, scratch, plans):
    """A folder bound whole (the one-mount layout): the second container's plan is the first
    one's while the same host folder is bound there and it and its files are unchanged; another
    host folder there (a driver upgrade's), a library added to the host folder, or one
    rewritten there, makes a new plan."""
    lower, _ = image
    folder = "/usr/local/nvidia/lib64"
    host = os.path.join(scratch, "host-lib64")
    os.makedirs(host)
    fake_driver(host, names=("cuda", "nvidia-ml"), links=True)
    mounts = [(folder, host)]
    other = shutil.copytree(host, os.path.join(scratch, "host-lib64-other"), symlinks=True)
    with overlay_mounts(lower, scratch, 5) as (first, second, third, fourth, fifth):
        one = ldcache.plan(first, [folder], mounts=mounts)
        assert not one.remembered and one.covered == [folder]
        # a pod's own mounts (its /etc/hosts) do not matter; another host folder at the folder does
        two = ldcache.plan(second, [folder], mounts=mounts + [("/etc/hosts", os.path.join(scratch, "pod-hosts"))])
        assert two.remembered and two.cache == one.cache
        assert not ldcache.plan(fifth, [folder], mounts=[(folder, other)]).remembered
        build_library(os.path.join(host, "libnvidia-extra.so.1"), "libnvidia-extra.so.1", "int x(void) { return 1; }\n")
        three = ldcache.plan(third, [folder], mounts=mounts)
        assert not three.remembered
        assert ldcache.read_cache(three.cache).lookup("libnvidia-extra.so.1") == [f"{folder}/libnvidia-extra.so.1"]
        rebuild_with_soname(os.path.join(host, "libnvidia-extra.so.1"), "libnvidia-other.so.1")
        four = ldcache.plan(fourth, [folder], mounts=mounts)
        assert not four.remembered
        assert ldcache.read_cache(four.cache).lookup("libnvidia-other.so.1") == [f"{folder}/libnvidia-extra.so.1"]
        with ldcache.PlanMemo.using(None):
            assert four.cache == ldcache.plan(fourth, [folder], mounts=mounts).cache


def test_the_nri_hook_server_holds_its_memos_from_start_to_close(tmp_path):
    from shim.nri.hookserver import HookServer

    with file_memo(False):
        server = HookServer(str(tmp_path / "hook" / "h.sock"), lambda level, text: None, remember=True).start()
        try:
            assert server.memos.plans is not None and ldcache.remember_files(True, forget=False)
        finally:
            server.close()
        assert server.memos.plans is None and not ldcache.remember_files(False, forget=False)
