#!/bin/sh
# The image's entry point for a node install (deploy/kubernetes/daemonset.yaml, and the node
# bootstrap with --copy-only).
#
# 1. Copies this image's cdi-shim tree (/opt/cdi-shim/current: its own Python, the package, the
#    static front end, all built for that very path) to the host's /opt/cdi-shim as
#    releases/<release>, once per release, and points the host's /opt/cdi-shim/current at it
#    (a symlink replaced by rename: a runtime exec'd meanwhile sees the old tree or the new one).
# 2. Unless --copy-only: runs `cdi-shim install --node $CDI_SHIM_INSTALL_ARGS` in the host's
#    namespaces (nsenter -t 1; the pod has hostPID), where the host's systemctl and containerd
#    do the work; restarts the resident process when the release changed.
set -eu

HOST_OPT=${HOST_OPT:-/host/opt/cdi-shim}        # the host's /opt/cdi-shim, as mounted here
INSTALL_ARGS=${CDI_SHIM_INSTALL_ARGS:---drop-in --restart}
NSENTER=${NSENTER:-nsenter --target 1 --mount --uts --ipc --net --pid --}
TREE=${CDI_SHIM_TREE:-/opt/cdi-shim/current}     # the tree in this image
RELEASE=$(cat "$TREE/RELEASE")
copy_only=false
[ "${1:-}" = "--copy-only" ] && copy_only=true

mkdir -p "$HOST_OPT/releases"
if [ ! -e "$HOST_OPT/releases/$RELEASE/RELEASE" ]; then
    rm -rf "$HOST_OPT/releases/.incoming-$RELEASE"
    cp -a "$TREE" "$HOST_OPT/releases/.incoming-$RELEASE"
    mv -T "$HOST_OPT/releases/.incoming-$RELEASE" "$HOST_OPT/releases/$RELEASE"
    echo "cdi-shim: copied release $RELEASE to the host's /opt/cdi-shim/releases/$RELEASE" >&2
fi
previous=$(readlink "$HOST_OPT/current" 2>/dev/null || true)
switched=false
if [ "$previous" != "releases/$RELEASE" ]; then
    ln -sfn "releases/$RELEASE" "$HOST_OPT/.current.new"
    mv -T "$HOST_OPT/.current.new" "$HOST_OPT/current"
    switched=true
    echo "cdi-shim: /opt/cdi-shim/current -> releases/$RELEASE (was: ${previous:-none})" >&2
fi
# keep the current release and the one before it (a process may still run from it)
for old in "$HOST_OPT"/releases/*; do
    name=releases/$(basename "$old")
    [ "$name" = "releases/$RELEASE" ] || [ "$name" = "$previous" ] || rm -rf "$old"
done
$copy_only && exit 0

# shellcheck disable=SC2086 # the arguments are words
$NSENTER /opt/cdi-shim/current/venv/bin/cdi-shim install --node $INSTALL_ARGS
if $switched; then
    $NSENTER systemctl try-restart cdi-shim-resident.service || true
fi
