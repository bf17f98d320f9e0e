#!/usr/bin/env bash
# Demo: a busybox container gets a (fake) GPU through CDI: a char device with NVIDIA's major
# number, an env variable and a bind-mounted "driver" file, injected by cdi-shim and run by runc.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/apt.sh
# CDI_SHIM_BIN: the bin/ folder of another install (the installed-package tests' venvs)
bin=${CDI_SHIM_BIN:-.venv/bin}
[ -x "$bin/cdi-shim" ] || fail "no $bin/cdi-shim: run scripts/setup.sh first"
# The container's root is one static busybox: the demo's only need beyond scripts/setup.sh.
apt_install "the demo container's rootfs" busybox-static
work=$(mktemp -d /tmp/cdi-shim-demo.XXXXXX)
id=cdi-shim-demo-$$
trap 'runc delete -f "$id" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

mkdir -p "$work/bundle/rootfs/bin" "$work/specs" "$work/dev"
cp /bin/busybox "$work/bundle/rootfs/bin/busybox"
for tool in sh ls cat env; do ln -s busybox "$work/bundle/rootfs/bin/$tool"; done
mknod "$work/dev/nvidia0" c 195 0          # a fake GPU: NVIDIA's major number, no driver behind it
echo "fake driver 999.99" > "$work/driver-version"

cat > "$work/specs/nvidia.yaml" <<SPEC
cdiVersion: "0.5.0"
kind: nvidia.com/gpu
containerEdits:
  env: [NVIDIA_DEMO=1]
devices:
  - name: "0"
    containerEdits:
      deviceNodes:
        - {path: /dev/nvidia0, hostPath: $work/dev/nvidia0}
      mounts:
        - {hostPath: $work/driver-version, containerPath: /driver/version, options: [ro, bind]}
SPEC

printf 'spec-dirs = ["%s"]\n' "$work/specs" > "$work/config.toml"
(cd "$work/bundle" && runc spec)
python3 - "$work/bundle/config.json" <<'PY'
import json, sys
path = sys.argv[1]
config = json.load(open(path))
config["process"]["terminal"] = False
config["process"]["args"] = ["sh", "-c", "ls -l /dev/nvidia0; env | grep NVIDIA; cat /driver/version"]
json.dump(config, open(path, "w"))
PY
cp "$work/bundle/config.json" "$work/config.json.orig"
echo "== cdi-shim cdi list"
CDI_SHIM_CONFIG="$work/config.toml" "$bin"/cdi-shim cdi list
echo "== cdi-shim-runtime --device nvidia.com/gpu=0 run (injects, then execs runc)"
CDI_SHIM_CONFIG="$work/config.toml" "$bin"/cdi-shim-runtime --device nvidia.com/gpu=0 \
    run --bundle "$work/bundle" "$id"

echo "== the same through the resident process (cdi-shim runtime serve): no interpreter start"
cp "$work/config.json.orig" "$work/bundle/config.json"     # the bundle as containerd would give it
printf 'spec-dirs = ["%s"]\nresident-socket = "%s"\nlog-file = "%s"\nlog-level = "debug"\n' \
    "$work/specs" "$work/run/runtime.sock" "$work/shim.log" > "$work/config.toml"
CDI_SHIM_CONFIG="$work/config.toml" "$bin"/cdi-shim runtime serve --socket "$work/run/runtime.sock" &
server=$!
trap 'kill $server 2>/dev/null; runc delete -f "$id" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
for _ in $(seq 300); do [ -S "$work/run/runtime.sock" ] && break; sleep 0.02; done
CDI_SHIM_CONFIG="$work/config.toml" "$bin"/cdi-shim-runtime --device nvidia.com/gpu=0 \
    run --bundle "$work/bundle" "$id"
grep -o 'phase=total[^"]*' "$work/shim.log"
