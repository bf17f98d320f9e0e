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
#
# What every container start runs as root comes from the host's /opt/cdi-shim, so nobody but
# root may be able to change it: HOST_OPT, releases/ and every folder above HOST_OPT (on the
# path as written and on the path its links lead to) must be owned by root and not writable by
# group or others (one above HOST_OPT may be when sticky, like /tmp: others cannot rename root's
# entries there), or nothing is installed. The copy is owned by root and writable by root only
# (no set-user-ID or set-group-ID bit either), whatever owners and modes the image's tree had.
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
# check_folder DIR ABOVE: DIR (a link: the link itself) owned by root and, unless a link, not
# writable by group or others; ABOVE=above (a folder above HOST_OPT) lets a sticky one be.
check_folder() {
    info=$(stat -c '%u %a %A' "$1") || fail "cannot inspect $1"
    owner=${info%% *} mode=${info#* } perms=${info##* }
    mode=${mode%% *}
    [ "$owner" = 0 ] || fail "$1 is owned by uid $owner, not root: chown root:root $1 (or remove it), then rerun"
    case $perms in l*) return 0 ;; ?????w???? | ????????w?) ;; *) return 0 ;; esac
    case $2$perms in above?????????[tT]) return 0 ;; esac
    fail "$1 has mode $mode, writable by group or others: chmod go-w $1, then rerun"
}
# check_chain PATH: each folder from / down to PATH (absolute), PATH itself strictly.
check_chain() {
    rest=${1#/} sofar=
    check_folder / above
    while [ -n "$rest" ]; do
        part=${rest%%/*}
        case $rest in */*) rest=${rest#*/} ;; *) rest= ;; esac
        [ -n "$part" ] && [ "$part" != . ] || continue
        sofar=$sofar/$part
        case $rest in "" | *[!/]*) ;; *) rest= ;; esac   # only slashes left: the end
        if [ -n "$rest" ]; then check_folder "$sofar" above; else check_folder "$sofar" last; fi
    done
}
case $HOST_OPT in /*) ;; *) HOST_OPT=$PWD/$HOST_OPT ;; esac
check_chain "$HOST_OPT"
real_opt=$(readlink -f "$HOST_OPT") || fail "cannot resolve $HOST_OPT"
[ "$real_opt" = "$HOST_OPT" ] || check_chain "$real_opt"
check_folder "$HOST_OPT/releases" last
[ -w "$HOST_OPT/releases" ] || fail "$HOST_OPT/releases is not writable (mount the host's /opt/cdi-shim read-write)"
exec 9>"$HOST_OPT/.install.lock"
flock -w "$LOCK_WAIT" 9 || fail "another installer holds $HOST_OPT/.install.lock for over $LOCK_WAIT s: not installing"

if [ ! -e "$HOST_OPT/releases/$RELEASE/RELEASE" ]; then
    incoming=$(mktemp -d "$HOST_OPT/releases/.incoming.XXXXXX")
    trap 'rm -rf "$incoming"' EXIT
    cp -a "$TREE/." "$incoming/" || fail "copying release $RELEASE to $incoming failed"
    # root's, writable by root only, whatever the image's tree had (links keep their targets)
    chown -R -h 0:0 "$incoming" && chmod -R go-w,ug-s "$incoming" \
        || fail "cannot make the copy in $incoming root's own"
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
    $NSENTER systemctl try-restart cdi-shim-resident.service cdi-shim-generate.service || true
fi
