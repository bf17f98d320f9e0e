#!/usr/bin/env bash
# A new user's machine: the README's two commands, as written, in a fresh Debian 12 root
# (debootstrap --variant=minbase bookworm plus git and python3) that is made the root of its
# own mount namespace with pivot_root (runc needs a real mount at /; a chroot is not enough).
# Fails, saying why, when the root cannot be made or entered, or when either command fails.
#
# As root. The root's base is built once and cached in $CDI_SHIM_TEST_CACHE
# (/var/cache/cdi-shim-tests), the way the tests cache theirs; CDI_SHIM_FRESH_REBUILD=1 builds
# it again. Every run starts from a new copy of it. KEEP=1 keeps the copy for a look after.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
. scripts/apt.sh

cache=${CDI_SHIM_TEST_CACHE:-/var/cache/cdi-shim-tests}
test_tar=$cache/debootstrap-bookworm-minbase.tar           # tests/linker/roots.py's, same recipe
base_tar=$cache/fresh-bookworm-minbase-git-python3.tar     # that plus git and python3
guest_repo=/root/cdi-shim

[ "$(id -u)" = 0 ] || fail "must run as root (it makes mount namespaces and a Debian root)"
unshare --mount --propagation private true 2>/dev/null ||
    fail "cannot make a mount namespace (unshare --mount: needs CAP_SYS_ADMIN); no fresh check here"

apt_install "the fresh check's tools" debootstrap git python3

# ---- the Debian mirror: this machine's own apt sources, as the tests take it ----------------
debian_mirror() {
    if [ -n "${CDI_SHIM_DEBIAN_MIRROR:-}" ]; then echo "$CDI_SHIM_DEBIAN_MIRROR"; return; fi
    python3 - <<'PY'
import glob, re, sys
for path in ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.list")):
    try:
        lines = open(path).read().splitlines()
    except OSError:
        continue
    for line in lines:
        fields = re.sub(r"\[[^]]*\]", "", line.split("#")[0]).split()
        if len(fields) >= 3 and fields[0] == "deb" and fields[2] == "bookworm":
            sys.exit(print(fields[1]))
for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
    for stanza in re.split(r"\n\s*\n", open(path).read()):
        fields = {}
        for line in stanza.splitlines():
            if not line.startswith(("#", " ", "\t")) and ":" in line:
                key, value = line.split(":", 1)
                fields[key.strip().lower()] = value.split()
        if ("deb" in fields.get("types", []) and "bookworm" in fields.get("suites", [])
                and fields.get("enabled", ["yes"])[0] != "no" and fields.get("uris")):
            sys.exit(print(fields["uris"][0]))
sys.exit("no 'deb ... bookworm' source in /etc/apt/sources.list(.d): set CDI_SHIM_DEBIAN_MIRROR")
PY
}
mirror=$(debian_mirror) || fail "no Debian mirror"
export CDI_SHIM_DEBIAN_MIRROR=$mirror

# ---- entering a root: its own mount and PID namespaces, pivot_root -------------------------
# Environment passed in: what a root login has, plus this machine's proxy and pip settings.
guest_env=(HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
           LANG=C.UTF-8 TERM="${TERM:-dumb}" CDI_SHIM_DEBIAN_MIRROR="$mirror")
while IFS= read -r name; do
    guest_env+=("$name=${!name}")
done < <(compgen -e | grep -E '^(PIP_[A-Z_]+|(http|https|ftp|no|all)_proxy|(HTTP|HTTPS|FTP|NO|ALL)_PROXY)$' || true)

# Read-only binds, pairs of host path and guest path: local directories and files the pip
# configuration names (find-links, file:// indexes, certificates, constraints), so pip inside
# reaches the same index the same way; and the tests' debootstrap tarball (see below).
binds=()
pip_paths() {
    { cat /etc/pip.conf /etc/xdg/pip/pip.conf "$HOME/.config/pip/pip.conf" "$HOME/.pip/pip.conf" 2>/dev/null
      compgen -e | grep '^PIP_' | while IFS= read -r name; do echo "${!name}"; done; } |
        grep -oE '(file://)?/[^[:space:]"'\'']+' | sed 's|^file://||' | sort -u
}
while IFS= read -r path; do
    case $path in /etc/*|"$HOME"/.config/*|"$HOME"/.pip/*) continue ;; esac   # copied below
    [ "${path##*/}" = simple ] && path=${path%/simple}     # a file:// index links to ../../files
    [ -e "$path" ] && binds+=("$path" "$path")
done < <(pip_paths)

enter() {   # enter ROOT COMMAND...: COMMAND run by bash as root, ROOT being /
    local root=$1; shift
    unshare --mount --pid --fork --propagation private -- /bin/bash -c '
        set -euo pipefail
        root=$1; nbinds=$2; shift 2
        binds=("${@:1:nbinds}"); shift "$nbinds"
        mount --bind "$root" "$root"                 # pivot_root wants a mount point
        mount -t proc proc "$root/proc"              # of this PID namespace
        mount --rbind /sys "$root/sys"               # with the cgroup mounts as they are here
        mount --rbind /dev "$root/dev"               # with /dev/pts, /dev/shm
        mount -t tmpfs -o mode=755,nosuid,nodev tmpfs "$root/run"
        # /tmp stays a directory of the root, on disk, as on a Debian 12 install.
        while ((${#binds[@]})); do
            src=${binds[0]} dst=$root${binds[1]}
            binds=("${binds[@]:2}")
            if [ -d "$src" ]; then mkdir -p "$dst"; else mkdir -p "$(dirname "$dst")"; touch "$dst"; fi
            mount --bind "$src" "$dst"
            mount -o remount,bind,ro "$dst"
        done
        cd "$root"
        mkdir -p .old-root
        pivot_root . .old-root
        cd /
        umount -l /.old-root
        rmdir /.old-root
        exec env -i "$@"
    ' enter "$root" "${#binds[@]}" "${binds[@]}" "${guest_env[@]}" /bin/bash -c "$init" init "$@"
}
# PID 1 of the namespace: runs the command as its child and reaps every orphan meanwhile (bash's
# wait reaps any child), as init does on a real machine. The command itself must not be PID 1:
# bash -c execs its last command, and pytest as PID 1 leaves killed containers' processes
# unreaped (runc then never sees them stop), and its pid (1) names the tests' containers.
init='/bin/bash -c "$1" & wait $!'


enter_check() {   # enter_check ROOT: fail, saying so, if ROOT cannot be entered as the mount namespace's /
    enter "$1" 'awk "\$5 == \"/\"" /proc/self/mountinfo | grep -q . && [ -e /proc/self/exe ] && [ -c /dev/null ]' ||
        fail "cannot make $1 the root of a mount namespace with pivot_root (proc, sys, dev mounted): see the error above"
}

# The machine's apt sources and configuration, CA certificates and pip configuration, so apt
# and pip inside go through the same mirror, proxy and index as here.
copy_host_config() {
    local root=$1 dir
    rm -rf "$root/etc/apt/sources.list" "$root/etc/apt/sources.list.d"
    for dir in sources.list sources.list.d apt.conf.d preferences.d auth.conf.d trusted.gpg trusted.gpg.d keyrings; do
        [ -e "/etc/apt/$dir" ] && cp -a "/etc/apt/$dir" "$root/etc/apt/"
    done
    # Keyrings a source names (Signed-By) that the root does not have.
    { cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null || true; } |
        { grep -oE '(Signed-By:|signed-by=)[[:space:]]*/[^] ]+' || true; } |
        sed -E 's/^(Signed-By:|signed-by=)[[:space:]]*//' | sort -u | while IFS= read -r key; do
            if [ -e "$key" ] && [ ! -e "$root$key" ]; then mkdir -p "$(dirname "$root$key")"; cp -a "$key" "$root$key"; fi
        done
    mkdir -p "$root/etc/ssl" "$root/usr/local/share"
    [ -d /etc/ssl/certs ] && cp -a /etc/ssl/certs "$root/etc/ssl/"
    [ -d /usr/local/share/ca-certificates ] && cp -a /usr/local/share/ca-certificates "$root/usr/local/share/"
    [ -e /etc/pip.conf ] && cp -a /etc/pip.conf "$root/etc/"
    [ -d /etc/xdg/pip ] && { mkdir -p "$root/etc/xdg"; cp -a /etc/xdg/pip "$root/etc/xdg/"; }
    [ -d "$HOME/.config/pip" ] && { mkdir -p "$root/root/.config"; cp -a "$HOME/.config/pip" "$root/root/.config/"; }
    [ -d "$HOME/.pip" ] && cp -a "$HOME/.pip" "$root/root/"
    cp -L /etc/resolv.conf "$root/etc/resolv.conf"
    return 0
}

# ---- the base: debootstrap minbase (the tests' tarball), then git and python3 --------------
mkdir -p "$cache"
exec 9>"$cache/.fresh-check.lock"
flock 9                      # one builder at a time; the other waits and then finds the cache
if [ ! -e "$test_tar" ]; then
    step "debootstrap --variant=minbase bookworm $mirror -> $test_tar"
    CDI_SHIM_TEST_CACHE=$cache python3 -c 'import sys; sys.path.insert(0, "tests/linker"); import roots; roots.debootstrap_tarball()' ||
        fail "debootstrap of bookworm from $mirror"
fi
if [ ! -e "$base_tar" ] || [ -n "${CDI_SHIM_FRESH_REBUILD:-}" ]; then
    work=$(mktemp -d /var/tmp/cdi-shim-fresh-base.XXXXXX)
    trap 'rm -rf "$work"' EXIT
    step "base root: $test_tar plus git, python3 (apt-get inside the root)"
    tar -C "$work" --numeric-owner -xf "$test_tar"
    copy_host_config "$work"
    enter_check "$work"
    enter "$work" 'export DEBIAN_FRONTEND=noninteractive
        { apt-get update && apt-get install -y --no-install-recommends git python3; } >/apt.log 2>&1 ||
            { tail -n 40 /apt.log | sed "s/^/    /"; exit 1; }
        apt-get clean; rm -rf /var/lib/apt/lists/* /apt.log' ||
        fail "apt-get install git python3 in the base root (the tail of its output above)"
    # Certificates and pip configuration are not cached with it: every run copies this machine's
    # (and its apt configuration) in afresh.
    rm -rf "$work/etc/ssl/certs" "$work/etc/pip.conf" "$work/etc/xdg/pip" "$work/root/.config/pip" "$work/root/.pip"
    tar -C "$work" --numeric-owner -cf "$base_tar.tmp" .
    mv "$base_tar.tmp" "$base_tar"
    rm -rf "$work"
    trap - EXIT
fi
exec 9>&-

# ---- this run's root --------------------------------------------------------------------------
root=$(mktemp -d /var/tmp/cdi-shim-fresh.XXXXXX)
[ -n "${KEEP:-}" ] || trap 'rm -rf --one-file-system "$root"' EXIT
step "fresh root $root from $base_tar"
tar -C "$root" --numeric-owner -xf "$base_tar"
copy_host_config "$root"
enter_check "$root"
# The checkout, as a user gets it (git clone), with this working tree's uncommitted changes.
step "the checkout: git clone into $guest_repo, plus uncommitted changes"
git clone -q --no-hardlinks "$repo" "$root$guest_repo"
git -C "$root$guest_repo" checkout -q --detach "$(git rev-parse HEAD)"
git ls-files -z -m -o --exclude-standard | tar --null -T - -cf - | tar -C "$root$guest_repo" -xf -
git ls-files -z -d | (cd "$root$guest_repo" && xargs -0 -r rm -f --)
# The tests build a debootstrap tarball into their cache on first use (a minute or two, the
# network). The very same recipe's output is bound read-only here: it is only a cache of
# debootstrap's output, and everything the test command installs and builds is still done
# in the fresh root (including debootstrap itself, by scripts/setup-tests.sh).
binds+=("$test_tar" /var/cache/cdi-shim-tests/debootstrap-bookworm-minbase.tar)

# ---- the README's two commands, as written ------------------------------------------------
mapfile -t commands < <(awk '/^```sh/{n++; next} /^```/{if (n == 1) exit} n == 1' README.md |
                        sed -E 's/[[:space:]]+#[[:space:]].*$//; /^[[:space:]]*$/d')
((${#commands[@]} == 2)) || fail "README's first sh block has ${#commands[@]} commands, not the two expected"
status=0
for command in "${commands[@]}"; do
    step "in the fresh root, $guest_repo: $command"
    start=$SECONDS
    if enter "$root" "cd $guest_repo && $command"; then
        step "passed in $((SECONDS - start)) s: $command"
    else
        rc=$?
        printf '%s: FAILED (exit %s) in %s s in the fresh root: %s\n' "${0##*/}" "$rc" "$((SECONDS - start))" "$command" >&2
        status=1
    fi
done
((status == 0)) || fail "a README command failed on a fresh machine (see above)"
step "passed: the README's commands on a fresh Debian 12 root"
