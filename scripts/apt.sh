# Sourced by the set-up scripts (as root): say each step on one line; install with apt only
# what is missing; on failure show the tail of apt's own output, which is otherwise kept quiet.

step() { printf '%s: [%ss] %s\n' "${0##*/}" "$SECONDS" "$*"; }

fail() { printf '%s: FAILED: %s\n' "${0##*/}" "$*" >&2; exit 1; }

_apt_updated=
_apt_run() {   # _apt_run WHAT COMMAND...: COMMAND's output to a log, its tail shown if it fails
    local what=$1 log rc=0; shift
    log=$(mktemp /tmp/cdi-shim-apt.XXXXXX.log)
    "$@" >"$log" 2>&1 || rc=$?
    if ((rc != 0)); then
        printf '%s: FAILED: %s (exit %s). Last 40 lines of its output (all of it in %s):\n' \
            "${0##*/}" "$what" "$rc" "$log" >&2
        tail -n 40 "$log" | sed 's/^/    /' >&2
        exit 1
    fi
    rm -f "$log"
}

apt_install() {   # apt_install WHY PACKAGE...: install those PACKAGEs not installed yet
    local why=$1 pkg missing=(); shift
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    if ((${#missing[@]} == 0)); then
        step "$why: installed already ($*)"
        return
    fi
    [ "$(id -u)" = 0 ] || fail "installing ${missing[*]} needs root: run this script as root"
    export DEBIAN_FRONTEND=noninteractive
    if [ -z "$_apt_updated" ]; then
        step "apt-get update"
        _apt_run "apt-get update" apt-get update
        _apt_updated=1
    fi
    step "$why: apt-get install ${missing[*]}"
    _apt_run "apt-get install ${missing[*]}" apt-get install -y --no-install-recommends "${missing[@]}"
}
