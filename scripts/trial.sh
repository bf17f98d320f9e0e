#!/usr/bin/env bash
# Try cdi-shim without a GPU (docs/trial.md): a fake driver, its CDI spec, and pods on a private
# containerd 2.x that get nvidia.com/gpu=0 through cdi-shim. As root, from a checkout:
#   bash scripts/trial.sh /tmp/cdi-shim-trial [--driver-only] [--nri] [--gpus N] [--containerd 2.1|1.7]
# --nri: `cdi-shim nri` on containerd's NRI socket, the pods on the stock runc handler (docs/nri.md);
# the trial prints, for each pod, its handler, its devices and its start-up.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/apt.sh
[ -x .venv/bin/cdi-shim ] || bash scripts/setup.sh
apt_install "the trial's image, fake driver and containerd download" busybox-static gcc util-linux apt
if ! .venv/bin/python -c 'import grpc' 2>/dev/null; then
    step "pip install grpcio (the pods' CRI client)"
    .venv/bin/pip install -q --disable-pip-version-check grpcio
fi
exec .venv/bin/python scripts/trial.py "$@"
