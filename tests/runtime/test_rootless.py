"""A rootless engine runs the runtime in a user namespace, where runc binds the host's node at
the container's path instead of making one: a device whose hostPath differs from its path
cannot be given there. The runtime says so (shim/runtime/rootless.py) instead of runc's opaque
"error creating device nodes". The e2e runs the real runtime in a user namespace made by
unshare(1) (root mapped to root: the files stay readable), as rootless podman runs it."""
import json
import re
import subprocess

import runtime_helpers as rh

from shim.runtime.rootless import devices_unbindable, in_user_namespace
from shim.runtime.runlog import engine_prefix

# podman's reading of a runtime's failure (libpod/oci_util.go, getOCIRuntimeError, podman 4.3 to 5.x):
# the text decides the error, and so `podman run`'s exit status
PODMAN_CLASSES = (
    ("permission denied (exit 126)", r"(?i).*permission denied.*|.*operation not permitted.*"),
    ("OCI runtime not found (exit 127)", r"(?i).*executable file not found in.*|.*no such file or directory.*"
                                         r"|.*open executable.*"),
    ("security attribute", r"`/proc/[a-z0-9-].+/attr.*`"),
)


def podman_reading(name, message):
    """(class, text) as podman reports MESSAGE of runtime NAME: the first class whose pattern
    matches, else a plain OCI runtime error; podman writes the runtime's name before the message."""
    for label, pattern in PODMAN_CLASSES:
        if re.search(pattern, message):
            return label, f"{name}: {message.strip()}"
    return "OCI runtime error", f"{name}: {message.strip()}"


def test_user_namespace_told_by_the_uid_map(tmp_path):
    uid_map = tmp_path / "uid_map"
    uid_map.write_text("         0          0 4294967295\n")
    assert not in_user_namespace(str(uid_map))
    for text in ("         0       1000          1\n", "0 0 1\n", "0 1000 1\n1 100000 65536\n"):
        uid_map.write_text(text)
        assert in_user_namespace(str(uid_map)), text
    assert not in_user_namespace(str(tmp_path / "missing"))


def test_devices_bindable_only_at_the_same_path_and_number():
    null = {"path": "/dev/null", "type": "c", "major": 1, "minor": 3}
    assert devices_unbindable({"linux": {"devices": [null]}}) == []
    assert devices_unbindable({"linux": {"devices": [dict(null, path="/dev/nvidia-none-here")]}}) == [
        ("/dev/nvidia-none-here", "not on this host")]
    [(path, why)] = devices_unbindable({"linux": {"devices": [dict(null, minor=5)]}})
    assert path == "/dev/null" and "is 1:3, not the device's 1:5" in why
    assert devices_unbindable({}) == [] and devices_unbindable({"linux": {"devices": None}}) == []


def test_rootless_runtime_names_the_devices_and_the_fix(world):
    """nvidia.com/gpu=0 of the world's spec: hostPath in the test's dev folder, path /dev/nvidia0."""
    bundle = world.bundle(annotations={"cdi.k8s.io/test": "nvidia.com/gpu=0"})
    before = bundle.read_bytes()
    unshare = rh.need("unshare", "util-linux")
    out = subprocess.run([unshare, "--user", "--map-root-user", "--", world.runtime, "--root", world.runc_root,
                          "create", "--bundle", bundle.path, bundle.id],
                         capture_output=True, text=True, env=world.env(), timeout=rh.CMD_TIMEOUT)
    assert out.returncode != 0
    assert "running rootless (in a user namespace)" in out.stderr, out.stderr
    assert "/dev/nvidia0: not on this host" in out.stderr and "run the engine as root" in out.stderr
    assert out.stderr.startswith("cdi-shim: container ")   # run by hand: we say who speaks
    assert bundle.read_bytes() == before     # nothing written
    state = subprocess.run([world.runc, "--root", world.runc_root, "state", bundle.id],
                           capture_output=True, text=True)
    assert state.returncode != 0             # runc never ran


# conmon's part: it runs the runtime as its child and hands the runtime's stderr to podman
CONMON = """#!/bin/sh
"$@"
status=$?
exit $status
"""


def test_rootless_refusal_as_podman_reads_it(world, tmp_path):
    """Issue 46, item 5: under a parent named conmon (podman's and CRI-O's monitor) in a user
    namespace, as rootless podman runs it, the refusal (stderr and runc's --log) carries no errno
    text podman misreads (it read "no such file or directory" as a missing runtime: exit 127) and
    no "cdi-shim: " of its own, since podman writes the runtime's name before it."""
    bundle = world.bundle(annotations={"cdi.k8s.io/test": "nvidia.com/gpu=0"})
    conmon = tmp_path / "conmon"
    conmon.write_text(CONMON)
    conmon.chmod(0o755)
    log = tmp_path / "runc.log"
    unshare = rh.need("unshare", "util-linux")
    out = subprocess.run([str(conmon), unshare, "--user", "--map-root-user", "--", world.runtime, "--root",
                          world.runc_root, "--log", str(log), "--log-format", "json", "create", "--bundle",
                          bundle.path, bundle.id], capture_output=True, text=True, env=world.env(),
                         timeout=rh.CMD_TIMEOUT)
    assert out.returncode != 0
    [entry] = [json.loads(line) for line in log.read_text().splitlines()]
    assert entry["level"] == "error"
    for message in (out.stderr, entry["msg"]):
        assert message.startswith(f"container {bundle.id}: running rootless (in a user namespace)"), message
        assert "/dev/nvidia0: not on this host" in message
        label, shown = podman_reading("cdi-shim", message)
        assert label == "OCI runtime error", (label, message)
        assert not shown.startswith("cdi-shim: cdi-shim:"), shown


def test_the_prefix_is_left_to_conmon_only(tmp_path):
    proc = tmp_path / "proc"
    for pid, comm in ((7, "conmon"), (8, "containerd-shim"), (9, "podman")):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "comm").write_text(comm + "\n")
    assert engine_prefix(7, str(proc)) == ""
    assert engine_prefix(8, str(proc)) == engine_prefix(9, str(proc)) == engine_prefix(10, str(proc)) == "cdi-shim: "
