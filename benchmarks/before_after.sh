#!/usr/bin/env bash
# The create paths of two builds, alternated in one session (as root):
#   bash benchmarks/before_after.sh BEFORE_CHECKOUT [AFTER_CHECKOUT (default: this one)] [ROUNDS (2)]
# Each checkout must have its own .venv (scripts/setup.sh there). Per round and build:
# runtime_overhead.py's device cases (annotation; interpreter per create and resident) and
# run_with_libraries.py --preinjected (a config containerd's own CDI injected, front-end replay),
# each printed as its ratio to runc in the same run.
set -euo pipefail
before=$(cd "$1" && pwd)
after=$(cd "${2:-$(dirname "$0")/..}" && pwd)
rounds=${3:-2}
for round in $(seq "$rounds"); do
    for side in before after; do
        dir=$before; [ "$side" = after ] && dir=$after
        cd "$dir"
        echo "=== round $round $side ($dir): runtime_overhead.py --runs 30"
        .venv/bin/python benchmarks/runtime_overhead.py --runs 30 2>/dev/null | python3 -c '
import json, sys
for r in json.load(sys.stdin):
    if "device" in r["case"]:
        print("  %s: %sx (%s ms, runc %s ms)" % (r["case"], r["median_paired_ratio"], r["shim_ms"], r["runc_ms"]))'
        echo "=== round $round $side ($dir): run_with_libraries.py --preinjected --runs 20"
        .venv/bin/python benchmarks/run_with_libraries.py --preinjected --runs 20 --dir /dev/shm 2>/dev/null | python3 -c '
import json, sys
d = json.load(sys.stdin)
d = d[-1] if isinstance(d, list) else d
print("  pre-injected: %sx, before runc %s ms" % (d["median_paired_ratio"], d["of_which_before_runc_ms"]))'
    done
done
