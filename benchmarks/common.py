"""Pieces the benchmark scripts share. The ~540-library image is built as the ldcache tests
build theirs (tests/linker/roots.py)."""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "linker"))
from roots import HOST_LIBDIR, host_image, link_host_libraries  # noqa: E402,F401


def timed(argv, env=None):
    """Wall time of one process, in ms (output discarded; a failure raises)."""
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return (time.perf_counter() - start) * 1000


def start_resident(socket_path, env):
    """`cdi-shim runtime serve` on SOCKET_PATH (from this venv); returns the Popen once listening."""
    cli = os.path.join(os.path.dirname(sys.executable), "cdi-shim")
    server = subprocess.Popen([cli, "runtime", "serve", "--socket", socket_path], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not os.path.exists(socket_path):
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise RuntimeError("cdi-shim runtime serve did not start")
        time.sleep(0.01)
    return server
