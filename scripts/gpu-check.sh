#!/usr/bin/env bash
# cdi-shim on a machine with a real NVIDIA GPU (not CI; as root, after scripts/setup.sh):
#   1. `cdi-shim cdi generate` against the installed driver (NVML), into a private spec dir;
#   2. `cdi-shim cdi validate` of it (stale-spec check included);
#   3. the devices and the files it names (device nodes, libraries, binaries, firmware, sockets);
#   4. one container through cdi-shim-runtime (real runc; a busybox rootfs plus the host's glibc
#      that nvidia-smi needs) with nvidia.com/gpu=0, running `nvidia-smi -L`.
# Exits 1, saying so, where there is no NVIDIA driver (no NVML) or no GPU.
#
#   sudo scripts/gpu-check.sh               # GPU 0
#   sudo DEVICE=all scripts/gpu-check.sh    # another device name of the spec
# DRIVER_ROOT / DEV_ROOT: a driver container's root (passed to --driver-root / --dev-root).
# PROC_ROOT: where /proc is (the tests' fake one: its devices file gives nvidia-uvm's major).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
bin=$repo/.venv/bin
device=${DEVICE:-0}
driver_root=${DRIVER_ROOT:-/}
dev_root=${DEV_ROOT:-$driver_root}
proc_root=${PROC_ROOT:-/proc}

say() { printf '== %s\n' "$*"; }
die() { printf 'gpu-check: FAILED: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (device nodes, runc)"
for tool in "$bin/cdi-shim" "$bin/cdi-shim-runtime"; do
    [ -x "$tool" ] || die "$tool is missing: run scripts/setup.sh first"
done
runc=$(command -v runc) || die "runc not found: apt-get install runc"
. scripts/apt.sh             # the container's rootfs: not a node's need, so not setup.sh's
apt_install "the check's container rootfs" busybox-static
busybox=$("$bin/python" -c 'from cdi_shim_lab.hosttools import static_busybox as s; print(s() or "")')
[ -n "$busybox" ] || die "no statically linked busybox: apt-get install busybox-static"

say "NVML and the kernel module"
if ! "$bin/cdi-shim" ldcache list --root "$driver_root" 2>/dev/null | grep -q 'libnvidia-ml\.so\.1'; then
    die "no NVML: libnvidia-ml.so.1 is not in the linker cache of $driver_root. This machine has no NVIDIA driver (or no GPU); this check needs a real NVIDIA GPU and its driver, it cannot run here."
fi
if [ -r /proc/driver/nvidia/version ]; then
    head -n 1 /proc/driver/nvidia/version
else
    echo "(no /proc/driver/nvidia/version: is the nvidia module loaded? the stale-spec check reports nothing without it)"
fi
[ -e "$dev_root/dev/nvidiactl" ] || die "no $dev_root/dev/nvidiactl: the NVIDIA kernel module is not loaded (modprobe nvidia; nvidia-smi)"

work=$(mktemp -d /tmp/cdi-shim-gpu-check.XXXXXX)
id=gpu-check-$$
cleanup() {
    "$runc" --root "$work/runc" delete --force "$id" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT
spec=$work/cdi/nvidia.yaml

say "cdi generate"
"$bin/cdi-shim" cdi generate --driver-root "$driver_root" --dev-root "$dev_root" --proc-root "$proc_root" \
    --output "$spec" --timings \
    || die "cdi generate failed (above): NVML or the driver's files are not usable; nvidia-smi on the host says more"

say "cdi validate"
"$bin/cdi-shim" cdi validate --spec-dir "$work/cdi" "$spec" || die "the generated spec does not validate"

say "devices and files"
"$bin/cdi-shim" cdi list --spec-dir "$work/cdi"
"$bin/python" - "$spec" <<'EOF'
import os, sys
import yaml
from shim.driver_version import host_driver_version, recorded_driver_version

doc = yaml.safe_load(open(sys.argv[1]))
edits = doc.get("containerEdits") or {}
nodes = {n["path"] for d in doc["devices"] for n in d["containerEdits"].get("deviceNodes", [])}
nodes |= {n["path"] for n in edits.get("deviceNodes", [])}
kinds = {}
for m in edits.get("mounts", []):
    path = m["containerPath"]
    kind = ("libraries" if ".so" in os.path.basename(path) else "firmware" if "/firmware/" in path
            else "sockets" if "socket" in path else "binaries" if "/bin/" in path else "config files")
    kinds[kind] = kinds.get(kind, 0) + 1
missing = [m["hostPath"] for m in edits.get("mounts", []) if not os.path.exists(m["hostPath"])]
print(f"cdiVersion {doc['cdiVersion']}, kind {doc['kind']}, {len(doc['devices'])} devices, "
      f"{len(nodes)} device nodes, hooks: {', '.join(h['args'][1] for h in edits.get('hooks', []))}")
print("mounts: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) + f" ({len(missing)} sources missing)")
gids = sorted({g for d in doc["devices"] for g in d["containerEdits"].get("additionalGids", [])})
links = {a for d in doc["devices"] for h in d["containerEdits"].get("hooks", [])
         for a in h["args"] if "::/dev/dri/by-path/" in a}
print(f"DRM nodes: {', '.join(sorted(n for n in nodes if n.startswith('/dev/dri/'))) or 'none'}; "
      f"by-path links: {len(links)}; additionalGids: {gids or 'none'}")
print(f"driver: the spec records {recorded_driver_version(doc)}, the loaded module is {host_driver_version() or 'unknown'}")
sys.exit(1 if missing else 0)
EOF

say "a container with nvidia.com/gpu=$device: nvidia-smi -L"
bundle=$work/bundle
rootfs=$bundle/rootfs
mkdir -p "$rootfs"/{bin,dev,proc,sys,etc,tmp,lib64,lib/x86_64-linux-gnu} "$work/runc"
cp "$busybox" "$rootfs/bin/busybox"
for applet in sh ls cat; do ln -s busybox "$rootfs/bin/$applet"; done
# nvidia-smi is the driver's (mounted by the spec) and needs glibc: the host's, copied.
smi=$driver_root/usr/bin/nvidia-smi
if [ -x "$smi" ] && ldd "$smi" >/dev/null 2>&1; then
    ldd "$smi" | awk '/=> \// { print $3 } /^\t\/.*ld-linux/ { print $1 }' | grep -v nvidia | while read -r lib; do
        case $lib in
            */ld-linux*) cp -L "$lib" "$rootfs/lib64/$(basename "$lib")" ;;
            *) cp -L "$lib" "$rootfs/lib/x86_64-linux-gnu/$(basename "$lib")" ;;
        esac
    done
fi
echo /lib/x86_64-linux-gnu > "$rootfs/etc/ld.so.conf"
ldconfig -r "$rootfs"
(cd "$bundle" && "$runc" spec)
"$bin/python" - "$bundle/config.json" <<'EOF'
import json, sys
path = sys.argv[1]
config = json.load(open(path))
config["process"]["terminal"] = False
config["process"]["args"] = ["nvidia-smi", "-L"]
config["process"]["env"] = ["PATH=/usr/bin:/bin:/usr/sbin:/sbin"]
config["root"]["readonly"] = False
json.dump(config, open(path, "w"), indent=2)
EOF
cat > "$work/config.toml" <<EOF
runtime = "$runc"
spec-dirs = ["$work/cdi"]
resident-socket = "$work/no-resident.sock"
EOF
out=$work/out.txt
if ! CDI_SHIM_CONFIG=$work/config.toml "$bin/cdi-shim-runtime" --root "$work/runc" --device "nvidia.com/gpu=$device" \
        run --bundle "$bundle" "$id" >"$out" 2>&1; then
    cat "$out"
    die "the container did not run nvidia-smi -L (above)"
fi
cat "$out"
grep -q '^GPU [0-9]' "$out" || die "nvidia-smi -L in the container listed no GPU"
say "gpu-check: OK"
