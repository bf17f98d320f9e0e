#!/usr/bin/env bash
# The release artefacts, into dist/<version>/ (or OUT): the sdist, the wheel built from it, the
# node tree tarball (the node image's /opt/cdi-shim/current, as deploy/node-install.sh copies it to
# a node: untar it as /opt/cdi-shim/releases/<version> and point `current` at it), and
# SHA256SUMS of the three. As root (the node image is built with podman).
#   scripts/release.sh [OUT] [build-node-image.sh options, e.g. --python-standalone TARBALL]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/apt.sh
[ -x .venv/bin/python ] || fail "no .venv: run scripts/setup.sh first"
version=$(.venv/bin/python -c 'import re; print(re.search(r"__version__ = \"(.+)\"", open("cdi/__init__.py").read()).group(1))')
out=${1:-dist/$version}
[ $# -gt 0 ] && shift
grep -q "^## $version\b" CHANGELOG.md || fail "CHANGELOG.md has no '## $version' section: write it first"
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -f "$out"/cdi_shim-"$version"* "$out/cdi-shim-node-$version.tar.gz" "$out/SHA256SUMS"

step "the sdist, then the wheel from it"
.venv/bin/python -m pip install -q --disable-pip-version-check build
(cd /tmp && "$OLDPWD/.venv/bin/python" -m build -q --outdir "$out" "$OLDPWD" >/dev/null) || fail "python -m build failed"
step "the node image (scripts/build-node-image.sh, from that wheel: its steps below)"
wheel=$(ls "$out"/cdi_shim-"$version"-*.whl)
image=$(bash scripts/build-node-image.sh --wheel "$wheel" "$@" | tee /dev/stderr | tail -n 1)
step "the node tree tarball from $image"
container=$(podman create -q "$image")
trap 'podman rm -f "$container" >/dev/null 2>&1 || true' EXIT
podman cp "$container:/opt/cdi-shim/current" - | gzip -n > "$out/cdi-shim-node-$version.tar.gz"
(cd "$out" && sha256sum "cdi_shim-$version.tar.gz" cdi_shim-"$version"-*.whl "cdi-shim-node-$version.tar.gz" > SHA256SUMS)
step "done: $out"
ls -l "$out"
