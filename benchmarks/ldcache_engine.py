"""The native ld.so.cache engine against glibc's ldconfig, on a ~540-library root.

The root is the generated library tree of the ldcache tests (tests/linker/libtree.py: 480
gcc-built library files with their soname and dev links in the multiarch directory, its
glibc-hwcaps subdirectories, a private and a 32-bit directory; 545 cache entries, as many as
the host multiarch directory these figures were first taken on had) with its own cache made
by ldconfig, plus a fake driver directory of gcc-built libraries (versioned files, SONAME
links) to add as a folder.

Measured alternately in one run (A B C D, then the same in a shuffled order, ...), so drift on a shared machine hits all
sides alike; we report each side's median and the median of the paired ratios against
`ldconfig -r` doing the same job (the toolkit's drop-in naming the folder, the update-ldcache
hook's run of ldconfig: it rescans every directory, writes, fsyncs), in two forms:

  ldconfig        `ldconfig -r ROOT` run again and again on the same root: its aux cache
                  (/var/cache/ldconfig/aux-cache, keyed by inode, ctime, size and device)
                  hits for every file, so it only stats them: ldconfig's best case
  ldconfig -i     the same ignoring the aux cache: what the hook pays in a new container,
                  whose files have other inodes, devices and ctimes than when the image's
                  aux cache was written, so every entry misses and every file is read

  incremental         plan() in-process from the image's cache + a scan of the 30-library
                      folder, the cache written to a new file on tmpfs (what the runtime
                      pays: it writes into the bundle directory, under /run on a node)
  incremental_disk    the same written to a new file on this machine's disk (ext4): a new
                      inode there costs 0.2-0.9 ms by itself on these VMs
  incremental_extras  the same with the 30 driver files on the host, to be bind-mounted
                      into the image's library directory (as nvidia-ctk's specs do);
                      against ldconfig -r on a copy with the files in place
  incremental_resident  incremental as a resident worker runs it for an image it has seen
                      before: library files remembered by stat identity
                      (ldcache.remember_files; an image's layer files keep their inode and
                      ctime in every container), so each plan stats them instead of reading
                      them -- the counterpart of ldconfig's aux cache hits
  extras_resident     incremental_extras the same way (the host's driver files remembered)
  plan_only           incremental without writing the file
  full                mode="full": every configured directory scanned, written to tmpfs
  full_resident       full with the files remembered, as incremental_resident
  cli                 `cdi-shim ldcache update --root R --folder F --output FILE`, a process
  bare                the engine as a process without click (python -c "...update(...)")
  hook                `cdi-shim-hook update-ldcache --folder F` as runc runs a createContainer
                      hook (state on stdin), writing into a copy of the image: the toolkit's
                      hook does this job with ldconfig (`ldconfig -r` is its part of it)
  hook_cli            the same hook through `cdi-shim hook` (the console script and click)

    .venv/bin/python benchmarks/ldcache_engine.py [--runs 40] [--driver-libs 30] [--json] [--tmpfs DIR]
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from cdi.safeio import RACY_WINDOW_NS  # noqa: E402
from shim.ldconfig import ldcache  # noqa: E402

sys.path.insert(0, HERE)
from common import LIBDIR, library_image  # noqa: E402

BIN = os.path.dirname(sys.executable)
FOLDER = "/usr/local/nvidia/lib"
DRIVER_VERSION = "550.54.15"
LDCONFIG = shutil.which("ldconfig") or "/usr/sbin/ldconfig"


def make_root(base, driver_libs=30):
    """(image root, the same root with the toolkit's drop-ins for ldconfig, host driver dir)."""
    image = os.path.join(base, "image")
    manifest = library_image(image)
    subprocess.run([LDCONFIG, "-r", image], check=True)
    # The driver: versioned files with SONAME links, as a driver installation has them.
    _build_driver(os.path.join(image, FOLDER.lstrip("/")), driver_libs, links=True)
    # ldconfig's side: the same files, the toolkit's drop-ins in place.
    theirs = os.path.join(base, "toolkit")
    subprocess.run(["cp", "-al", image, theirs], check=True)
    conf_d = os.path.join(theirs, "etc/ld.so.conf.d")
    with open(os.path.join(conf_d, ldcache.DROPIN_FIRST), "w") as out:
        out.write(FOLDER + "\n")
    with open(os.path.join(conf_d, ldcache.DROPIN_LAST), "w") as out:
        out.write("/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n/lib\n/usr/lib\n")
    subprocess.run([LDCONFIG, "-r", theirs], check=True)
    entries = len(ldcache.read_root_cache(theirs).entries)
    assert entries == manifest["entries"] + driver_libs, (entries, manifest["entries"], driver_libs)
    return image, theirs, entries


def _build_driver(directory, count, links):
    os.makedirs(directory, exist_ok=True)
    src = os.path.join(directory, "lib.c")
    made = {}
    for i in range(count):
        with open(src, "w") as out:
            out.write(f"int cdi_shim_bench_{i}(void) {{ return {i}; }}\n")
        name = f"libnvidia-bench{i}.so.{DRIVER_VERSION}"
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", os.path.join(directory, name), src,
                        f"-Wl,-soname,libnvidia-bench{i}.so.1"], check=True)
        if links:
            os.symlink(name, os.path.join(directory, f"libnvidia-bench{i}.so.1"))
        made[name] = os.path.join(directory, name)
    os.unlink(src)
    return made


def host_driver(base, count=30):
    """{container path: host path}: driver files on the host, to be bind-mounted into the
    image's library directory (as `nvidia-ctk cdi generate` specs do)."""
    made = _build_driver(os.path.join(base, "host-driver"), count, links=False)
    return {f"{LIBDIR}/{name}": path for name, path in made.items()}


def measure(runs, driver_libs, tmpfs="/dev/shm"):
    base = tempfile.mkdtemp(prefix="cdi-shim-ldcache-bench.")
    outs = tempfile.mkdtemp(prefix="cdi-shim-ldcache-out.", dir=tmpfs)
    try:
        image, theirs, entries = make_root(base, driver_libs)
        extras = host_driver(base, driver_libs)
        # ldconfig's side of the extras case: the files where the mounts will put them.
        theirs_extras = os.path.join(base, "toolkit-extras")
        subprocess.run(["cp", "-al", image, theirs_extras], check=True)
        for container, host in extras.items():
            os.link(host, os.path.join(theirs_extras, container.lstrip("/")))
        with open(os.path.join(theirs_extras, "etc/ld.so.conf.d", ldcache.DROPIN_LAST), "w") as out:
            out.write("/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n/lib\n/usr/lib\n")
        subprocess.run([LDCONFIG, "-r", theirs_extras], check=True)

        check = ldcache.plan(image, [FOLDER], links="ldconfig")
        assert check.mode == "incremental", check.reason
        expected = ldcache.read_cache(os.path.join(theirs, "etc/ld.so.cache")).entries
        assert ldcache.read_cache(check.cache).entries == expected, "not the same cache as ldconfig"
        check = ldcache.plan(image, [LIBDIR], extras, links="ldconfig")
        assert check.mode == "incremental", check.reason
        expected = ldcache.read_cache(os.path.join(theirs_extras, "etc/ld.so.cache")).entries
        assert ldcache.read_cache(check.cache).entries == expected, "not the same cache as ldconfig"

        out = os.path.join(base, "out.cache")
        serial = [0]

        def fresh(directory=outs):
            # The runtime writes a new file in a new bundle directory each time.
            serial[0] += 1
            return os.path.join(directory, f"out-{serial[0]}.cache")

        def incremental():
            ldcache.write_cache(fresh(), ldcache.plan_cache(image, [FOLDER]))

        def incremental_disk():
            ldcache.write_cache(fresh(base), ldcache.plan_cache(image, [FOLDER]))

        def incremental_extras():
            ldcache.write_cache(fresh(), ldcache.plan_cache(image, [LIBDIR], extras))

        def resident(fn):
            def run():
                ldcache.remember_files(True)
                try:
                    fn()
                finally:
                    ldcache.remember_files(False, forget=False)  # the other cases read
            return run

        def plan_only():
            ldcache.plan_cache(image, [FOLDER])

        def full():
            ldcache.write_cache(fresh(), ldcache.plan_cache(image, [FOLDER], mode="full"))

        cli = [os.path.join(BIN, "cdi-shim"), "ldcache", "update", "--root", image, "--folder",
               FOLDER, "--output", out]
        # The OCI hook as runc runs it under a spec that names it, on its own copy of the
        # image whose cache is put back before each run (untimed): every container is new.
        hook_root = os.path.join(base, "hook-root")
        subprocess.run(["cp", "-al", image, hook_root], check=True)
        bundle = os.path.join(base, "hook-bundle")
        os.makedirs(bundle)
        with open(os.path.join(bundle, "config.json"), "w") as config:
            json.dump({"ociVersion": "1.0.2", "root": {"path": hook_root}}, config)
        state = json.dumps({"ociVersion": "1.0.2", "id": "bench", "status": "creating", "pid": 1,
                            "bundle": bundle}).encode()
        image_cache = os.path.join(image, "etc/ld.so.cache")
        hook_cache = os.path.join(hook_root, "etc/ld.so.cache")

        def restore_hook_root():
            os.unlink(hook_cache)
            os.link(image_cache, hook_cache)

        def hook(*command):
            return lambda: subprocess.run([*command, "update-ldcache", "--folder", FOLDER], input=state,
                                          check=True)
        bare = [sys.executable, "-c",
                "import sys; from shim.ldconfig import ldcache; "
                "ldcache.update(sys.argv[1], [sys.argv[2]], output=sys.argv[3])",
                image, FOLDER, out]
        sides = {
            "ldconfig": lambda: subprocess.run([LDCONFIG, "-r", theirs], check=True),
            "ldconfig_i": lambda: subprocess.run([LDCONFIG, "-i", "-r", theirs], check=True),
            "ldconfig_extras": lambda: subprocess.run([LDCONFIG, "-r", theirs_extras], check=True),
            "ldconfig_i_extras": lambda: subprocess.run([LDCONFIG, "-i", "-r", theirs_extras], check=True),
            "incremental": incremental,
            "incremental_disk": incremental_disk,
            "incremental_extras": incremental_extras,
            "incremental_resident": resident(incremental),
            "extras_resident": resident(incremental_extras),
            "plan_only": plan_only,
            "full": full,
            "full_resident": resident(full),
            "cli": lambda: subprocess.run(cli, check=True, stdout=subprocess.DEVNULL),
            "bare": lambda: subprocess.run(bare, check=True),
            "hook": hook(os.path.join(BIN, "cdi-shim-hook")),
            "hook_cli": hook(os.path.join(BIN, "cdi-shim"), "hook"),
        }
        before = {"hook": restore_hook_root, "hook_cli": restore_hook_root}
        # The memo keeps only files older than the settle window (ldcache.remember_files);
        # an image's are hours old on a node, ours were just made (and linked: a new ctime).
        time.sleep(RACY_WINDOW_NS / 1e9 + 0.1)
        for name, fn in sides.items():     # warm the page cache, the imports and the memo
            if name in before:
                before[name]()
            fn()
        times = {name: [] for name in sides}
        order = list(sides)
        shuffler = random.Random(5)
        for _ in range(runs):
            # A new order each round: whatever follows a process (cold CPU caches) is not
            # always the same case.
            shuffler.shuffle(order)
            for name in order:
                fn = sides[name]
                if name in before:
                    before[name]()
                start = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - start) * 1000)
        med = statistics.median
        result = {"root_entries": entries, "driver_libs": driver_libs, "runs": runs, "tmpfs": tmpfs,
                  "ldconfig_ms": round(med(times["ldconfig"]), 3),
                  "ldconfig_i_ms": round(med(times["ldconfig_i"]), 3), "cases": []}
        for name in ("incremental", "incremental_resident", "incremental_disk", "incremental_extras",
                     "extras_resident", "plan_only", "full", "full_resident", "cli", "bare", "hook",
                     "hook_cli"):
            suffix = "_extras" if name in ("incremental_extras", "extras_resident") else ""
            case = {"case": name, "ms": round(med(times[name]), 3)}
            for against in ("ldconfig", "ldconfig_i"):
                theirs_times = times[against + suffix]
                case[f"{against}_ms"] = round(med(theirs_times), 3)
                case[f"speedup_vs_{against}"] = round(med(b / o for b, o in zip(theirs_times, times[name])), 2)
            result["cases"].append(case)
        return result
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(outs, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--driver-libs", type=int, default=30)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--tmpfs", default="/dev/shm", help="a tmpfs directory for our output files")
    args = parser.parse_args()
    result = measure(args.runs, args.driver_libs, args.tmpfs)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"root: {result['root_entries']} cache entries, driver folder: {result['driver_libs']} "
          f"libraries, {result['runs']} paired runs; ldconfig -r: {result['ldconfig_ms']} ms, "
          f"ldconfig -i -r: {result['ldconfig_i_ms']} ms (medians)")
    print(f"  {'case':<21} {'ours ms':>8}   {'ldconfig/ours':>13}   {'ldconfig -i/ours':>16}   (medians of pairs)")
    for case in result["cases"]:
        print(f"  {case['case']:<21} {case['ms']:>8.3f}   {case['speedup_vs_ldconfig']:>12.2f}x"
              f"   {case['speedup_vs_ldconfig_i']:>15.2f}x")


if __name__ == "__main__":
    main()
