"""The whole C engine under AddressSanitizer and UBSan: the extension built with gcc's
sanitizers, then this directory's tests (glibc equivalence, hostile images, the file memo
with its listings and threads, the real loader) run against it in a child pytest.

The fuzzers (test_fuzz.py) cover the two readers with random input; this covers what they
do not reach -- the directory scan, the memo, the builder -- on real trees.
"""
import os
import re
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
LINK = "-fsanitize=address,undefined"
COMPILE = LINK + " -g -fno-sanitize-recover=undefined -fno-omit-frame-pointer"


def _runtime_library(gcc, name):
    path = subprocess.run([gcc, f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(path) or not os.path.exists(path):
        pytest.fail(f"gcc has no {name}: apt-get install libasan8 libubsan1")
    return path


def test_engine_tests_pass_under_asan_and_ubsan(tmp_path):
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.fail("gcc not found: apt-get install gcc")
    copy = tmp_path / "tree"
    for part in ("cdi", "shim", "csrc"):
        shutil.copytree(os.path.join(REPO, part), copy / part,
                        ignore=shutil.ignore_patterns("*.so", "*.o", "__pycache__"))
    shutil.copytree(HERE, copy / "tests" / "linker",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(REPO, "pyproject.toml"), copy)
    build = subprocess.run(
        [sys.executable, "-c", "import sys; sys.path.insert(0, 'csrc/engine'); import build_native; "
                               "build_native.ffibuilder.compile(tmpdir='.')"],
        cwd=copy, capture_output=True, text=True,
        env=dict(os.environ, CC=gcc, CFLAGS=COMPILE, LDFLAGS=LINK))
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-3000:]
    built = [name for name in os.listdir(copy / "shim") if name.startswith("_native") and name.endswith(".so")]
    assert built, "the sanitized extension was not built"

    preload = ":".join(_runtime_library(gcc, name) for name in ("libasan.so", "libubsan.so"))
    reports = tmp_path / "sanitizer"          # the child pytest captures stderr: reports go to files
    env = dict(os.environ, PYTHONPATH=str(copy), LD_PRELOAD=preload,
               ASAN_OPTIONS=f"detect_leaks=0:abort_on_error=1:log_path={reports}",
               UBSAN_OPTIONS=f"print_stacktrace=1:log_path={reports}")
    check = subprocess.run([sys.executable, "-c", "import shim._native as n; print(n.__file__)"],
                           cwd=copy, env=env, capture_output=True, text=True)
    assert check.stdout.strip().startswith(str(copy)), check.stdout + check.stderr
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/linker",
         "--ignore", "tests/linker/test_sanitized.py", "--ignore", "tests/linker/test_fuzz.py"],
        cwd=copy, env=env, capture_output=True, text=True, timeout=900)
    found = sorted(p for p in tmp_path.iterdir() if p.name.startswith("sanitizer."))
    sanitizer = "".join(p.read_text(errors="replace")[:6000] for p in found)
    report = sanitizer + "\n...\n" + tests.stdout[-3000:] + tests.stderr[-3000:]
    assert not found, report
    assert tests.returncode == 0, report
    passed = re.search(r"(\d+) passed", tests.stdout)
    assert passed and int(passed.group(1)) >= 150, report
