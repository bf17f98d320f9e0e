"""Pieces the benchmark scripts share."""
import os
import subprocess
import sys
import time

HOST_LIBDIR = "/usr/lib/x86_64-linux-gnu"


def timed(argv, env=None):
    """Wall time of one process, in ms (output discarded; a failure raises)."""
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return (time.perf_counter() - start) * 1000


def link_host_libraries(libdir, source=HOST_LIBDIR):
    """Fill LIBDIR with this host's shared libraries: hard links for files, copies of links.

    A ~540-library image without copying any data. Returns the number of names made.
    """
    os.makedirs(libdir, exist_ok=True)
    count = 0
    for name in os.listdir(source):
        src = os.path.join(source, name)
        if ".so" not in name:
            continue
        if os.path.islink(src):
            os.symlink(os.readlink(src), os.path.join(libdir, name))
        elif os.path.isfile(src):
            os.link(src, os.path.join(libdir, name))
        else:
            continue
        count += 1
    return count


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
