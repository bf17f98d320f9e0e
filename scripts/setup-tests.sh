#!/usr/bin/env bash
# What the tests need on top of scripts/setup.sh (as root, on Debian 12): the real parts they
# drive (containerd, podman, busybox-static for container roots, debootstrap for an image;
# patchelf runs forky's podman 5.8 with its own glibc),
# clang with the sanitizer runtimes for the fuzzing and sanitized engine tests, clang-format for
# the C style check (tests/test_lint.py), systemd (its
# systemd-analyze verifies the contrib units; a minbase root lacks it); the Python test
# dependencies (pyproject's `test` extra) in .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/apt.sh

[ -x .venv/bin/python ] || fail "no .venv: run scripts/setup.sh first"
apt_install "test tools" containerd busybox-static podman patchelf debootstrap \
    clang libclang-rt-14-dev libasan8 libubsan1 clang-format-14 systemd

mapfile -t requirements < <(.venv/bin/python -c '
import tomllib
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["optional-dependencies"]["test"]))')
step "pip install ${requirements[*]}"
.venv/bin/pip install -q --disable-pip-version-check "${requirements[@]}"
step "done"
