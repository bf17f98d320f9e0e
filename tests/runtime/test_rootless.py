"""A rootless engine runs the runtime in a user namespace, where runc binds the host's node at
the container's path instead of making one: a device whose hostPath differs from its path
cannot be given there. The runtime says so (shim/runtime/rootless.py) instead of runc's opaque
"error creating device nodes". The e2e runs the real runtime in a user namespace made by
unshare(1) (root mapped to root: the files stay readable), as rootless podman runs it."""
import subprocess

import runtime_helpers as rh

from shim.runtime.rootless import devices_unbindable, in_user_namespace


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
        ("/dev/nvidia-none-here", "no such file or directory")]
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
    assert "/dev/nvidia0: no such file or directory" in out.stderr and "run the engine as root" in out.stderr
    assert bundle.read_bytes() == before     # nothing written
    state = subprocess.run([world.runc, "--root", world.runc_root, "state", bundle.id],
                           capture_output=True, text=True)
    assert state.returncode != 0             # runc never ran
