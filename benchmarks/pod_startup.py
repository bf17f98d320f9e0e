"""Pod start-up benchmark through a real containerd: the cdi-shim handler against plain runc.

    sudo .venv/bin/python benchmarks/pod_startup.py -n 30 --plot pods.png

The same as `cdi-shim bench pods` (cdi_shim_lab/pods.py holds the harness; this file is its command
line for people who run benchmarks/). Needs root, containerd 1.6+ (ctr), runc, busybox-static,
gcc, and grpcio + grpcio-tools (`pip install -e '.[bench]'`); matplotlib only for --plot.
"""
import sys

from shim.cli.bench import pods

if __name__ == "__main__":
    sys.exit(pods.main(args=sys.argv[1:], prog_name="pod_startup.py"))
