"""A plain-folder root run again and again (issue 47: `cdi-shim-runtime --device … run` on one
bundle): the root holds what our own earlier step left -- its cache, which already lists the
mounted libraries, the soname links it made to them, runc's empty mount points and the links
create-symlinks made -- and the library folder is as large as an image's. The next plan takes
that cache for the folder (the extras' own entries left out and made again), scans nothing and
stays within the plan's path bound, so the step is kept; its cache is glibc's for the root with
the driver mounted. Anything it cannot tell for sure has the folder scanned again."""
import os
import shutil
import time

import pytest

from ldcache_helpers import fake_driver, generator_of, toolkit_ldconfig
from shim.ldconfig import ldcache
from shim.linker import stepmemo
from shim.linker.toolkit_hooks import PARAMS_ENV
from test_step_memo import LIBDIR, PARAMS, step as one_step
from tests.helpers import file_memo


@pytest.fixture
def reused(host_tree, scratch, monkeypatch):
    """(root, driver, step): a real copy of the library image, a fake driver, and a function
    that runs one step of config_for's spec (create-symlinks' libcuda.so, update-ldcache) in
    that root as the resident worker does (step memo on: mount points made, writes noted)."""
    root = os.path.join(scratch, "root")
    shutil.copytree(host_tree, root, symlinks=True)
    made = fake_driver(os.path.join(scratch, "driver"), names=("cuda", "nvidia-ml"))
    with open(os.path.join(scratch, "params"), "w") as out:
        out.write(PARAMS)
    monkeypatch.setenv(PARAMS_ENV, os.path.join(scratch, "params"))
    runs = []

    def step():
        bundle = os.path.join(scratch, f"bundle-{len(runs)}")
        log = one_step({"driver": made}, root, bundle, memo)[3]     # (the C replay of its recipe, or the step)
        runs.append(log)
        time.sleep(0.02)    # (the next run comes later: the clock's tick passed)
        return log

    os.makedirs(os.path.join(scratch, "run"), mode=0o700)
    memo = stepmemo.StepMemo(os.path.join(scratch, "run", "steps"))
    with file_memo(False), ldcache.PlanMemo().using():
        yield root, made, step


def _extra(made):
    """The driver's mounts as the step gives them to the plan on a reused root (its soname
    links are there already)."""
    return {f"{LIBDIR}/{os.path.basename(path)}": path for path in made.values()}


def _oracle(root, made, scratch):
    """glibc's cache for ROOT with the driver mounted: a copy with each mounted file in place of
    its mount point."""
    mounted = os.path.join(scratch, f"mounted-{time.monotonic_ns()}")
    shutil.copytree(root, mounted, symlinks=True)
    for container_path, source in _extra(made).items():
        dest = os.path.join(mounted, container_path.lstrip("/"))
        if os.path.lexists(dest):
            os.unlink(dest)
        shutil.copy(source, dest)
    return toolkit_ldconfig(mounted, [LIBDIR], scratch)


def _plan(root, made, expected):
    return ldcache.plan(root, [LIBDIR], _extra(made), generator=generator_of(expected))


def test_a_root_our_step_left_is_not_rescanned(reused, scratch):
    root, made, step = reused
    for _ in range(3):
        step()
    assert os.path.islink(os.path.join(root, LIBDIR.lstrip("/"), "libcuda.so.1"))
    assert os.path.getsize(os.path.join(root, LIBDIR.lstrip("/"), "libcuda.so.550.54.15")) == 0
    expected = _oracle(root, made, scratch)
    plan = _plan(root, made, expected)
    assert (plan.mode, plan.scanned) == ("incremental", 0), plan.reason
    assert plan.looked is not None     # (within the path bound: the step can be kept)
    assert plan.cache == expected
    entries = ldcache.read_cache(plan.cache)
    assert len(entries.entries) == len(ldcache.read_cache(expected).entries)
    assert entries.lookup("libcuda.so.1") == ["/lib/x86_64-linux-gnu/libcuda.so.1"]
    assert entries.lookup("libcuda.so") == ["/lib/x86_64-linux-gnu/libcuda.so"]
    # the same plan the full scan gives, run after run: no entry gained
    assert plan.cache == ldcache.plan(root, [LIBDIR], _extra(made), mode="full",
                                      generator=generator_of(expected)).cache
    # and the steps that gave it: kept from the third run on, and replayed
    assert step().replayed()


def test_the_folder_changed_in_the_tick_the_cache_was_written_in(reused, scratch):
    """Our step writes the cache, then makes create-symlinks' deferred libcuda.so: within one
    tick of the clock the folder is no newer than the cache, yet that link is not in it."""
    root, made, step = reused
    step()
    folder = os.path.join(root, LIBDIR.lstrip("/"))
    cache = os.path.join(root, "etc/ld.so.cache")

    def same_tick():
        ns = os.stat(cache).st_mtime_ns
        os.utime(folder, ns=(ns, ns))

    same_tick()
    expected = _oracle(root, made, scratch)
    plan = _plan(root, made, expected)
    assert plan.scanned > 0
    assert plan.cache == expected
    assert ldcache.read_cache(plan.cache).lookup("libcuda.so") == ["/lib/x86_64-linux-gnu/libcuda.so"]
    step()
    step()
    same_tick()     # (every link of the folder to the driver in the cache: taken)
    plan = _plan(root, made, expected)
    assert (plan.scanned, plan.cache) == (0, expected)


@pytest.mark.parametrize("change", ["mount point with bytes", "soname link elsewhere"])
def test_what_it_cannot_tell_has_the_folder_scanned_again(reused, scratch, change):
    root, made, step = reused
    for _ in range(3):
        step()
    folder = os.path.join(root, LIBDIR.lstrip("/"))
    if change == "mount point with bytes":
        with open(os.path.join(folder, "libcuda.so.550.54.15"), "w") as out:
            out.write("not empty")
    else:
        os.unlink(os.path.join(folder, "libcuda.so.1"))
        os.symlink("libz.so.1", os.path.join(folder, "libcuda.so.1"))
    cache = os.path.join(root, "etc/ld.so.cache")
    later = os.stat(folder).st_mtime_ns + 10_000_000
    os.utime(cache, ns=(later, later))     # (the folder older than the cache all the same)
    expected = _oracle(root, made, scratch)
    plan = _plan(root, made, expected)
    assert plan.scanned > 0
    if change == "mount point with bytes":
        assert plan.cache == expected
    # (a soname link that leads elsewhere is the step's to make again, and then an extra:
    # links.soname_links_to_make; planned without it, the folder is read as it is)
