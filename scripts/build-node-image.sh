#!/usr/bin/env bash
# Builds the node image, deploy/Containerfile, with Debian's podman, from parts this machine
# reaches: two Debian bases made by debootstrap from Debian's archive and imported (minbase, and
# minbase with python3 and patchelf for the build stage), the cdi-shim wheel (the sdist, then the
# wheel built from it), its dependencies and pip from the package index. The build itself runs
# without network.
#
#   scripts/build-node-image.sh [--release-tag TAG] [--python-standalone TARBALL] [--tag IMAGE] [--wheel WHEEL]
#
# --wheel: the cdi-shim wheel already built from this tree (scripts/release.sh's), used instead
# of building it again.
# --python-standalone: a python-build-standalone "install_only" tarball (downloaded elsewhere) as
# the tree's Python instead of Debian's python3.11: see docs/install.md. --release-tag: a suffix of
# the release name (<version>-<tag>), for a second release of the same version (the tests).
# The image is tagged by the hash of its inputs (the tracked source files, the Python, the tag)
# and not built again while that image exists; the last line printed is the image's name.
# As root. Bases and wheels are cached in $CDI_SHIM_TEST_CACHE/node-image (/var/cache/cdi-shim-tests).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
. scripts/apt.sh

release_tag="" standalone="" tag="" wheel=""
while (($#)); do
    case $1 in
        --release-tag) release_tag=${2:?--release-tag needs a value}; shift 2 ;;
        --python-standalone) standalone=${2:?--python-standalone needs a file}; shift 2 ;;
        --tag) tag=${2:?--tag needs a value}; shift 2 ;;
        --wheel) wheel=${2:?--wheel needs a file}; shift 2 ;;
        -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) fail "unknown argument $1 (see --help)" ;;
    esac
done
[ "$(id -u)" = 0 ] || fail "must run as root (podman's storage, debootstrap)"
command -v podman >/dev/null || fail "podman not found: apt-get install podman"
command -v debootstrap >/dev/null || fail "debootstrap not found: apt-get install debootstrap"
[ -x .venv/bin/python ] || fail "no .venv: run scripts/setup.sh first (it builds the wheel with .venv's Python)"
if [ -n "$standalone" ]; then
    [ -f "$standalone" ] || fail "--python-standalone $standalone: no such file (a python-build-standalone install_only tarball)"
    case $standalone in *install_only*.tar.gz) ;; *) fail "--python-standalone $standalone: not an install_only .tar.gz" ;; esac
fi
version=$(.venv/bin/python -c 'import re; print(re.search(r"__version__ = \"(.+)\"", open("cdi/__init__.py").read()).group(1))')
release=$version${release_tag:+-$release_tag}
cache=${CDI_SHIM_TEST_CACHE:-/var/cache/cdi-shim-tests}/node-image
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9                                  # one builder at a time

inputs=$( { git ls-files -z -- cdi shim csrc deploy setup.py pyproject.toml MANIFEST.in README.md |
            xargs -0 sha256sum; echo "python=${standalone:+$(sha256sum < "$standalone")} release=$release"; } |
          sha256sum | cut -c1-16)
image=${tag:-localhost/cdi-shim-node:$release-$inputs}
if podman image exists "$image"; then
    step "$image exists (same inputs): not rebuilt"
    echo "$image"
    exit 0
fi

# ---- the bases: debootstrap, then podman import ---------------------------------------------
mirror=$(CDI_SHIM_TEST_CACHE=${cache%/node-image} .venv/bin/python -c 'import sys; sys.path.insert(0, "tests/linker"); import roots; print(roots.MIRROR)')
base() {   # base NAME TAR [PACKAGE,...]: the image localhost/cdi-shim-base:NAME
    local name=$1 tar=$2 include=${3:-}
    podman image exists "localhost/cdi-shim-base:$name" && return 0
    if [ ! -e "$tar" ]; then
        local work
        work=$(mktemp -d /var/tmp/cdi-shim-base.XXXXXX)
        step "debootstrap --variant=minbase ${include:+--include=$include }bookworm $mirror"
        debootstrap --variant=minbase ${include:+--include="$include"} bookworm "$work" "$mirror" >/dev/null ||
            { rm -rf "$work"; fail "debootstrap of bookworm from $mirror failed"; }
        rm -rf "$work/var/cache/apt/archives" "$work/var/lib/apt/lists"
        tar -C "$work" --numeric-owner -cf "$tar.tmp" . && mv "$tar.tmp" "$tar"
        rm -rf "$work"
    fi
    step "podman import $tar localhost/cdi-shim-base:$name"
    podman import -q "$tar" "localhost/cdi-shim-base:$name" >/dev/null
}
# the minbase root is the tests' (tests/linker/roots.py), made by the same recipe when missing
base bookworm-minbase "${cache%/node-image}/debootstrap-bookworm-minbase.tar"
base bookworm-python "$cache/base-bookworm-python.tar" python3,patchelf

# ---- the context: the wheels, the tree's build script and the installer -----------------------
context=$(mktemp -d /var/tmp/cdi-shim-image.XXXXXX)
trap 'rm -rf "$context"' EXIT
mkdir -p "$context/deploy" "$context/wheels"
cp deploy/build-tree.sh deploy/node-install.sh "$context/deploy/"
if [ -n "$wheel" ]; then
    [ -f "$wheel" ] || fail "--wheel $wheel: no such file"
    step "the wheel: $wheel (built already)"
    mkdir -p "$context/dist" && cp "$wheel" "$context/dist/"
else
    step "the wheel: python -m build (the sdist, then the wheel from it)"
    .venv/bin/python -m pip install -q --disable-pip-version-check build
    (cd "$context" && "$repo/.venv/bin/python" -m build -q --outdir "$context/dist" "$repo" >/dev/null) ||
        fail "python -m build failed (run it by hand for the whole output)"
fi
step "the wheels of its dependencies, and pip's"
.venv/bin/python -m pip wheel -q --disable-pip-version-check --wheel-dir "$context/wheels" "$context"/dist/*.whl
.venv/bin/python -m pip download -q --disable-pip-version-check --no-deps --only-binary :all: -d "$context/wheels" pip
python_arg=debian
if [ -n "$standalone" ]; then
    cp "$standalone" "$context/"
    python_arg=$(basename "$standalone")
fi
step "podman build $image (Python: $python_arg, release $release)"
podman build -q --network=none -f deploy/Containerfile --build-arg PYTHON="$python_arg" \
    --build-arg VERSION="$version" --build-arg RELEASE="$release" -t "$image" "$context" >/dev/null ||
    fail "podman build failed (see above)"
step "built $image: $(podman image inspect --format '{{.Size}}' "$image" | awk '{printf "%.1f MB", $1 / 1e6}')"
echo "$image"
