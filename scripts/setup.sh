#!/usr/bin/env bash
# One-time set-up on a fresh Debian machine (as root): system packages, a venv, the package.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(runc containerd busybox-static podman gcc libc6-dev libasan8 libubsan1 debootstrap clang libclang-rt-14-dev systemd
          python3 python3-venv python3-dev)
missing=()
for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Never the pyenv shim: resolve the real interpreter so timings and the venv are honest.
python=$(python3 -c 'import sys; print(sys.executable)')
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
.venv/bin/pip install -q --disable-pip-version-check --config-settings editable_mode=compat -e '.[test]'
# Byte-compile now, so the first container create does not pay for compiling.
.venv/bin/python -m compileall -q cdi shim >/dev/null
