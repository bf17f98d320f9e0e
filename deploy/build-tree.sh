#!/bin/sh
# The node's cdi-shim tree, built inside deploy/Containerfile's first stage:
#   build-tree.sh TREE WHEELS PYTHON
# TREE gets a Python of its own and cdi-shim installed into it from the wheels in WHEELS (the
# cdi-shim wheel, its dependencies, pip's own wheel): bin/ (python3, cdi-shim, cdi-shim-runtime,
# cdi-shim-hook, cdi-shim-nshook) and lib/python3.X/site-packages. The programs find that Python
# relative to themselves, so the tree works wherever it is copied (/opt/cdi-shim/releases/R).
# PYTHON is "debian" (this stage's Debian python3.11, copied with the two libraries it links
# besides glibc, its RUNPATH set to the tree's lib/; the host needs glibc >= 2.36) or the file
# name of a python-build-standalone "install_only" tarball in /context (no need of the host's
# libraries but glibc >= 2.17).
set -eu
tree=$1 wheels=$2 python=$3

mkdir -p "$tree/bin" "$tree/lib"
if [ "$python" = debian ]; then
    multiarch=$(python3.11 -c 'import sysconfig; print(sysconfig.get_config_var("MULTIARCH"))')
    cp -a /usr/bin/python3.11 "$tree/bin/python3.11"
    cp -a /usr/lib/python3.11 "$tree/lib/python3.11"
    rm -f "$tree/lib/python3.11/EXTERNALLY-MANAGED"      # the tree's own Python, not the system's
    for lib in libexpat.so.1 libz.so.1; do
        cp -L "/usr/lib/$multiarch/$lib" "$tree/lib/$lib"
    done
    patchelf --set-rpath '$ORIGIN/../lib' "$tree/bin/python3.11"
    ln -s python3.11 "$tree/bin/python3"
else
    [ -f "/context/$python" ] || { echo "build-tree.sh: /context/$python: no such python-build-standalone tarball" >&2; exit 1; }
    mkdir /tmp/standalone
    tar -C /tmp/standalone -xzf "/context/$python"
    cp -a /tmp/standalone/python/. "$tree/"
    rm -rf /tmp/standalone
fi
pip=$(ls "$wheels"/pip-*.whl | head -n 1)
"$tree/bin/python3" -I "$pip/pip" install --no-index --find-links "$wheels" --prefix "$tree" \
    --no-warn-script-location --disable-pip-version-check -q cdi-shim
rm -rf "$tree/bin/pip"* "$tree/lib/python3."*/site-packages/pip "$tree/lib/python3."*/site-packages/pip-*.dist-info
"$tree/bin/cdi-shim" --version
