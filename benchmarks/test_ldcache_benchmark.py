"""pytest-benchmark view of the ld.so.cache engine against `ldconfig -r`, on the ~540-library
root of ldcache_engine.py (which pairs the runs and gives the ratios in one table): the
generated library tree of the ldcache tests (tests/linker/libtree.py, 480 library files,
545 cache entries) plus the 30-library driver folder.

  engine_incremental         plan from the image's cache + the 30-library driver folder,
                             written to a new file (what the runtime pays on create)
  engine_incremental_extras  the same with the 30 driver files still on the host, to be
                             bind-mounted into the image's own library directory (the
                             toolkit's specs do that)
  engine_incremental_resident  engine_incremental as a resident worker runs it for an image
                             seen before: the library files remembered by stat identity
                             (ldcache.remember_files: a layer's files keep their inode and ctime
                             in every container of the image), stat'ed instead of read -- the
                             counterpart of ldconfig's aux cache hits
  engine_extras_resident     engine_incremental_extras the same way (the host's driver files
                             remembered)
  engine_full                every configured directory scanned
  engine_full_resident       engine_full with the files remembered
  ldconfig_process           `ldconfig -r` on the same root with the toolkit's drop-ins (its aux
                             cache hits on every rerun: ldconfig's best case)
  ldconfig_process_fresh     `ldconfig -i -r`: ignoring the aux cache, as in a new container
                             (other inodes, devices and ctimes than the image's aux cache has)

Our cache files go to tmpfs (/dev/shm), as the runtime's go to the bundle directory under
/run on a node.

    .venv/bin/python -m pytest benchmarks/test_ldcache_benchmark.py --benchmark-enable -p no:cacheprovider
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ldcache_engine as bench  # noqa: E402
from common import library_tree  # noqa: E402
from cdi.safeio import RACY_WINDOW_NS  # noqa: E402
from shim.ldconfig import ldcache  # noqa: E402


# About a second of samples per case, as ldconfig's 100 rounds take: a machine's slow
# phase of a few hundred milliseconds then moves no median by itself.
INCREMENTAL_ROUNDS = 3000
FULL_ROUNDS = 600


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    base = str(tmp_path_factory.mktemp("ldcache-bench"))
    image, theirs, entries = bench.make_root(base)
    assert entries == library_tree()[1]["entries"] + 30
    extras = bench.host_driver(base)
    out_dir = tempfile.mkdtemp(prefix="cdi-shim-ldcache-out.", dir="/dev/shm")
    # The memo keeps only files older than the settle window; these were just made.
    time.sleep(RACY_WINDOW_NS / 1e9 + 0.1)
    yield image, theirs, extras, os.path.join(out_dir, "out.cache")
    shutil.rmtree(out_dir, ignore_errors=True)


def _fresh(out):
    def setup():
        if os.path.exists(out):
            os.unlink(out)
    return setup


def test_engine_incremental(benchmark, roots):
    image, _, _, out = roots
    assert ldcache.plan(image, [bench.FOLDER]).mode == "incremental"
    benchmark.pedantic(lambda: ldcache.write_cache(out, ldcache.plan_cache(image, [bench.FOLDER])),
                       setup=_fresh(out), rounds=INCREMENTAL_ROUNDS, warmup_rounds=20)


def test_engine_incremental_extras(benchmark, roots):
    image, _, extras, out = roots
    folders = [bench.LIBDIR]
    assert ldcache.plan(image, folders, extras).mode == "incremental"
    benchmark.pedantic(lambda: ldcache.write_cache(out, ldcache.plan_cache(image, folders, extras)),
                       setup=_fresh(out), rounds=INCREMENTAL_ROUNDS, warmup_rounds=20)


@pytest.fixture
def resident():
    """The file memo on, as in the runtime's resident workers; off and empty afterwards."""
    previous = ldcache.remember_files(True, forget=True)
    yield
    ldcache.remember_files(previous, forget=True)


def test_engine_incremental_resident(benchmark, roots, resident):
    image, _, _, out = roots
    ldcache.plan_cache(image, [bench.FOLDER])     # remembered (also with --benchmark-disable: one round)
    benchmark.pedantic(lambda: ldcache.write_cache(out, ldcache.plan_cache(image, [bench.FOLDER])),
                       setup=_fresh(out), rounds=INCREMENTAL_ROUNDS, warmup_rounds=20)
    assert ldcache.memo_stats()[0] > 0


def test_engine_extras_resident(benchmark, roots, resident):
    image, _, extras, out = roots
    folders = [bench.LIBDIR]
    benchmark.pedantic(lambda: ldcache.write_cache(out, ldcache.plan_cache(image, folders, extras)),
                       setup=_fresh(out), rounds=INCREMENTAL_ROUNDS, warmup_rounds=20)


def test_engine_full(benchmark, roots):
    image, _, _, out = roots
    benchmark.pedantic(
        lambda: ldcache.write_cache(out, ldcache.plan_cache(image, [bench.FOLDER], mode="full")),
        setup=_fresh(out), rounds=FULL_ROUNDS, warmup_rounds=10)


def test_engine_full_resident(benchmark, roots, resident):
    image, _, _, out = roots
    benchmark.pedantic(
        lambda: ldcache.write_cache(out, ldcache.plan_cache(image, [bench.FOLDER], mode="full")),
        setup=_fresh(out), rounds=FULL_ROUNDS, warmup_rounds=10)


def test_ldconfig_process(benchmark, roots):
    _, theirs, _, _ = roots
    benchmark.pedantic(lambda: subprocess.run([bench.LDCONFIG, "-r", theirs], check=True),
                       rounds=100, warmup_rounds=5)


def test_ldconfig_process_fresh(benchmark, roots):
    _, theirs, _, _ = roots
    benchmark.pedantic(lambda: subprocess.run([bench.LDCONFIG, "-i", "-r", theirs], check=True),
                       rounds=100, warmup_rounds=5)
