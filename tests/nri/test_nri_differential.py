"""The NRI path against the real nvidia-cdi-hook, through the runtime's differential
(benchmarks/hook_differential.py --way nri --way nri-kept): the plugin's adjustment applied as
containerd applies it, runc on an overlay of the image, the native hook and the plugin's hook
server doing the work, compared with runc + nvidia-cdi-hook v1.20.0 under the same rules. A few
cases, each a defect the first run found (the full run: benchmarks/RESULTS.md, 2026-12-07):

- seed 1 case 1 (busybox): the soname link ldconfig makes beside a mounted library
  (libnvidia-ptxjitcompiler.so.1) and the cache naming it;
- seed 1 case 24 (debian13): an update-ldcache hook with no --folder (the cache rebuilt all the
  same, the zz-nvcr drop-in, the soname links) and create-symlinks' libcuda.so -> libcuda.so.1,
  which dangles during ldconfig's scan and is not listed;
- seed 1 cases 0, 2, 3 (busybox): compat folders, include-less ld.so.conf, no update-ldcache.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIFFERENTIAL = os.path.join(REPO, "benchmarks", "hook_differential.py")
CASES = (0, 1, 2, 3, 24)


def _needs():
    if os.geteuid() != 0:
        return "needs root (runc, overlay mounts)"
    for program in ("runc", "unshare", "gcc"):
        if not shutil.which(program, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin"):
            return f"needs {program}"
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    try:
        from toolkit import PROGRAMS, cache_dir
    finally:
        sys.path.pop(0)
    if not all(os.access(os.path.join(cache_dir(), "bin", name), os.X_OK) for name in PROGRAMS):
        return "needs the real nvidia-cdi-hook (.venv/bin/python benchmarks/toolkit.py builds it)"
    if not os.path.exists("/var/cache/cdi-shim-tests/debootstrap-trixie-minbase.tar"):
        return "needs the trixie debootstrap tarball (tests/linker/roots.py makes it)"
    return None


def test_the_nri_path_is_the_real_hook_s_container(tmp_path):
    why = _needs()
    if why:
        pytest.skip(why)
    records = tmp_path / "cases.json"
    only = [arg for case in CASES for arg in ("--only", str(case))]
    done = subprocess.run([sys.executable, DIFFERENTIAL, "--cases", "25", "--seed", "1", *only, "--way", "nri",
                           "--way", "nri-kept", "--json", str(records)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    outcomes = {record["case"]["number"]: record["outcome"] for record in json.loads(records.read_text())}
    assert sorted(outcomes) == list(CASES)
    for number, outcome in outcomes.items():
        assert set(outcome) == {"nri", "nri-kept"}
        for way, (kind, reasons) in outcome.items():
            assert kind != "left", (number, way, reasons, done.stdout)
            # the second container of the image gets the first one's answer, not a plan
            assert "(the answer not kept)" not in reasons, (number, way, done.stdout)
    assert outcomes[1]["nri"][0] == outcomes[24]["nri"][0] == "identical"
