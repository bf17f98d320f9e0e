#!/bin/sh
# The image's entry point for a node install (deploy/kubernetes/daemonset.yaml, and the node
# bootstrap with --copy-only).
#
# 1. Copies this image's cdi-shim tree (/opt/cdi-shim/current: its own Python, the package, the
#    native programs, which find that Python relative to themselves) to the host's /opt/cdi-shim
#    as releases/<release>, once per release, and points the host's /opt/cdi-shim/current at it
#    (a link replaced by rename: a runtime exec'd meanwhile runs the old release or the new one,
#    and a process keeps the release it started from).
# 2. Unless --copy-only: runs `cdi-shim install --node $CDI_SHIM_INSTALL_ARGS` in the host's
#    namespaces (nsenter -t 1; the pod has hostPID), where the host's systemctl and containerd
#    do the work; restarts the resident process when the release changed.
#
# Two installers at once (a restarted pod, the bootstrap unit): the second waits for the first
# (flock on /opt/cdi-shim/.install.lock, at most CDI_SHIM_LOCK_WAIT seconds, then refuses). Each
# copy goes to a private temporary folder, is flushed to disk, then renamed into place.
set -eu

HOST_OPT=${HOST_OPT:-/host/opt/cdi-shim}        # the host's /opt/cdi-shim, as mounted here
INSTALL_ARGS=${CDI_SHIM_INSTALL_ARGS:---drop-in --restart}
NSENTER=${NSENTER-nsenter --target 1 --mount --uts --ipc --net --pid --}
TREE=${CDI_SHIM_TREE:-/opt/cdi-shim/current}     # the tree in this image
LOCK_WAIT=${CDI_SHIM_LOCK_WAIT:-300}
say() { echo "cdi-shim: $*" >&2; }
fail() { say "$*"; exit 1; }

[ -r "$TREE/RELEASE" ] || fail "$TREE/RELEASE: missing (not a cdi-shim node image?)"
RELEASE=$(cat "$TREE/RELEASE")
case $RELEASE in ""|*/*|.*) fail "$TREE/RELEASE: bad release name '$RELEASE'" ;; esac
copy_only=false
[ "${1:-}" = "--copy-only" ] && copy_only=true

mkdir -p "$HOST_OPT/releases" || fail "cannot make $HOST_OPT/releases (is the host's /opt/cdi-shim mounted read-write?)"
# What every container start runs as root comes from here: nobody but root may be able to swap it.
for dir in "$HOST_OPT" "$HOST_OPT/releases"; do
    owner=$(stat -c %u "$dir") mode=$(stat -c %a "$dir")
    [ "$owner" = 0 ] || fail "$dir is owned by uid $owner, not root: chown root:root $dir (or remove it), then rerun"
    case $mode in *[2367]? | *[2367]) fail "$dir has mode $mode, writable by group or others: chmod go-w $dir, then rerun" ;; esac
done
[ -w "$HOST_OPT/releases" ] || fail "$HOST_OPT/releases is not writable (mount the host's /opt/cdi-shim read-write)"
exec 9>"$HOST_OPT/.install.lock"
flock -w "$LOCK_WAIT" 9 || fail "another installer holds $HOST_OPT/.install.lock for over $LOCK_WAIT s: not installing"

if [ ! -e "$HOST_OPT/releases/$RELEASE/RELEASE" ]; then
    incoming=$(mktemp -d "$HOST_OPT/releases/.incoming.XXXXXX")
    trap 'rm -rf "$incoming"' EXIT
    cp -a "$TREE/." "$incoming/" || fail "copying release $RELEASE to $incoming failed"
    sync "$incoming"/bin/* "$incoming/RELEASE" && sync -f "$incoming"
    rm -rf "$HOST_OPT/releases/$RELEASE"             # a folder left without RELEASE: an old broken copy
    mv -T "$incoming" "$HOST_OPT/releases/$RELEASE"
    trap - EXIT
    say "copied release $RELEASE to the host's /opt/cdi-shim/releases/$RELEASE"
fi
previous=$(readlink "$HOST_OPT/current" 2>/dev/null || true)
switched=false
if [ "$previous" != "releases/$RELEASE" ]; then
    ln -sfn "releases/$RELEASE" "$HOST_OPT/.current.new"
    mv -T "$HOST_OPT/.current.new" "$HOST_OPT/current"
    sync -f "$HOST_OPT"
    switched=true
    say "/opt/cdi-shim/current -> releases/$RELEASE (was: ${previous:-none})"
fi
# keep the current release and the one before it (a process may still run from it)
for old in "$HOST_OPT"/releases/*; do
    name=releases/$(basename "$old")
    [ "$name" = "releases/$RELEASE" ] || [ "$name" = "$previous" ] || rm -rf "$old"
done
$copy_only && exit 0

# shellcheck disable=SC2086 # the arguments are words
$NSENTER /opt/cdi-shim/current/bin/cdi-shim install --node $INSTALL_ARGS
if $switched && [ -n "$NSENTER" ]; then
    $NSENTER systemctl try-restart cdi-shim-resident.service || true
fi
