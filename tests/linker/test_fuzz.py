"""Fuzzing the cache reader (with a writer round trip) and the ELF reader: libFuzzer harnesses
built with clang, AddressSanitizer and UBSan, run for a bounded time on the checked-in seed
corpus. The total of executions is printed and written to the report file.

    CDI_SHIM_FUZZ_SECONDS   seconds per harness (default 30: a minute for both)
    CDI_SHIM_FUZZ_REPORT    where the JSON report goes (default: the test cache directory)
"""
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CSRC = os.path.join(REPO, "csrc", "engine")
CACHE_DIR = os.environ.get("CDI_SHIM_TEST_CACHE", "/var/cache/cdi-shim-tests")
SECONDS = int(os.environ.get("CDI_SHIM_FUZZ_SECONDS", "30"))
REPORT = os.environ.get("CDI_SHIM_FUZZ_REPORT", os.path.join(CACHE_DIR, "fuzz-report.json"))
HARNESSES = {
    "ldcache": ("fuzz_ldcache.c", ["ldcache.c", "ldcache_write.c", "ldcache_strtab.c", "elf.c", "inroot.c"],
                "cache"),
    "elf": ("fuzz_elf.c", ["elf.c"], "elf"),
}
_totals = {}


def _build(name):
    clang = shutil.which("clang")
    if clang is None:
        pytest.fail("clang not found: apt-get install clang libclang-rt-14-dev")
    harness, sources, _ = HARNESSES[name]
    files = [os.path.join(HERE, "fuzz", harness)] + [os.path.join(CSRC, s) for s in sources]
    digest = hashlib.sha256()
    for path in files + sorted(glob.glob(os.path.join(CSRC, "*.h"))):
        with open(path, "rb") as f:
            digest.update(f.read())
    out_dir = os.path.join(CACHE_DIR, "fuzz-build")
    os.makedirs(out_dir, exist_ok=True)
    binary = os.path.join(out_dir, f"fuzz_{name}-{digest.hexdigest()[:16]}")
    if not os.path.exists(binary):
        proc = subprocess.run([clang, "-g", "-O1", "-std=gnu11", "-fno-omit-frame-pointer",
                               "-fsanitize=fuzzer,address,undefined",
                               "-fno-sanitize-recover=undefined", "-I", CSRC, "-o", binary + ".tmp",
                               *files, "-lpthread"], capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.fail(f"cannot build the {name} fuzzer (apt-get install clang libclang-rt-14-dev):\n"
                        + proc.stderr[-3000:])
        os.rename(binary + ".tmp", binary)
    return binary


@pytest.mark.parametrize("name", sorted(HARNESSES))
def test_fuzz(name, tmp_path):
    binary = _build(name)
    seeds = os.path.join(HERE, "fuzz", "corpus", HARNESSES[name][2])
    corpus = tmp_path / "corpus"
    shutil.copytree(seeds, corpus)
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    start = time.monotonic()
    proc = subprocess.run([binary, str(corpus), f"-max_total_time={SECONDS}", "-max_len=65536",
                           "-rss_limit_mb=1024", "-timeout=10", "-print_final_stats=1",
                           f"-artifact_prefix={artifacts}/"],
                          capture_output=True, text=True, timeout=SECONDS + 120)
    took = time.monotonic() - start
    crashes = sorted(os.listdir(artifacts))
    assert proc.returncode == 0 and not crashes, (
        f"{name}: fuzzer found {crashes} (in {artifacts}):\n{proc.stderr[-4000:]}")
    runs = re.search(r"stat::number_of_executed_units:\s*(\d+)", proc.stderr)
    assert runs, proc.stderr[-2000:]
    executions = int(runs.group(1))
    _totals[name] = {"executions": executions, "seconds": round(took, 1),
                     "corpus_files": len(os.listdir(corpus))}
    report = {"harnesses": _totals, "total_executions": sum(v["executions"] for v in _totals.values()),
              "seconds_per_harness": SECONDS}
    os.makedirs(os.path.dirname(REPORT), exist_ok=True)
    with open(REPORT, "w") as out:
        json.dump(report, out, indent=2)
    print(f"\nfuzz {name}: {executions} executions in {took:.0f}s; report: {REPORT}")
    assert executions > 1000
