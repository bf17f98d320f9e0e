#!/usr/bin/env bash
# What a node that runs cdi-shim needs (as root, on Debian 12): runc, a C compiler for the
# native parts, Python with venv; then .venv with the package in it (builds the C parts).
# The tests' own tools come from scripts/setup-tests.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/apt.sh

apt_install "runtime, compiler, Python" runc gcc libc6-dev python3 python3-venv python3-dev

# Never the pyenv shim: resolve the real interpreter so timings and the venv are honest.
python=$(python3 -c 'import sys; print(sys.executable)')
if [ ! -x .venv/bin/python ]; then
    step "python -m venv .venv ($python)"
    "$python" -m venv .venv
fi
step "pip install -e . (builds the C parts)"
.venv/bin/pip install -q --disable-pip-version-check --config-settings editable_mode=compat -e .
# Byte-compile now, so the first container create does not pay for compiling.
step "byte-compile cdi, shim"
.venv/bin/python -m compileall -q cdi shim >/dev/null
step "done"
