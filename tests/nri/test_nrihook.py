"""`cdi-shim-nshook nri` (csrc/hooks/nrihook.c), the NRI adjustment's native hook, run as runc runs
a createContainer hook (the state on stdin): links and modes in C, the linker cache written by the
plugin's process through the rootfs descriptor the hook sends (shim/nri/hookserver.py); with the
plugin away, by the --fallback program; refused requests answered with a reason."""
import os
import socket
import stat
import subprocess

import pytest

from tests.conftest import tool
from tests.nri.test_hook import bundle

LINK = "libz.so.1.2.13::/usr/lib/x86_64-linux-gnu/libz.so"
FOLDER = "/usr/lib/x86_64-linux-gnu"


def nshook(args, state):
    return subprocess.run([tool("cdi-shim-nshook"), "nri", *args], input=state, capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin"})


def cache_listing(rootfs):
    return subprocess.run([tool("cdi-shim"), "ldcache", "list", "--root", str(rootfs)], capture_output=True,
                          text=True, check=True).stdout


def test_links_modes_in_c_and_the_cache_by_the_plugin(tmp_path, server):
    served, logged = server
    rootfs, state = bundle(tmp_path)
    done = nshook(["--socket", served.path, "--fallback", "/nonexistent/cdi-shim-hook", "--link", LINK,
                   "--chmod", "755:/dev/dri", "--chmod", "644:/no/such/path", "--folder", FOLDER], state)
    assert done.returncode == 0, done.stderr
    assert os.readlink(rootfs / "usr/lib/x86_64-linux-gnu/libz.so") == "libz.so.1.2.13"
    assert stat.S_IMODE(os.stat(rootfs / "dev/dri").st_mode) == 0o755
    assert f"{FOLDER}/libz.so.1" in cache_listing(rootfs)
    assert served.served == 1 and logged == [f"hook: the linker cache of {rootfs} written ({FOLDER})"]
    assert stat.S_IMODE(os.stat(served.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(served.path)).st_mode) == 0o700


def test_without_the_plugin_the_fallback_program_writes_the_cache(tmp_path):
    rootfs, state = bundle(tmp_path)
    done = nshook(["--socket", str(tmp_path / "nobody.sock"), "--fallback", tool("cdi-shim-hook"), "--link", LINK,
                   "--folder", FOLDER], state)
    assert done.returncode == 0, done.stderr
    assert f"{FOLDER}/libz.so.1" in cache_listing(rootfs)
    assert os.readlink(rootfs / "usr/lib/x86_64-linux-gnu/libz.so") == "libz.so.1.2.13"


def test_without_the_plugin_nor_a_fallback_it_fails_saying_why(tmp_path):
    _, state = bundle(tmp_path)
    done = nshook(["--socket", str(tmp_path / "nobody.sock"), "--folder", FOLDER], state)
    assert done.returncode == 1
    assert done.stderr.startswith("Error: nri: the NRI plugin is not at ") and "no --fallback" in done.stderr


def test_no_folders_no_plugin_needed(tmp_path):
    rootfs, state = bundle(tmp_path)
    done = nshook(["--link", LINK], state)
    assert done.returncode == 0, done.stderr
    assert os.readlink(rootfs / "usr/lib/x86_64-linux-gnu/libz.so") == "libz.so.1.2.13"


def test_a_link_out_of_the_root_stays_inside(tmp_path, server):
    rootfs, state = bundle(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(str(outside), rootfs / "usr/lib/escape")
    done = nshook(["--socket", server[0].path, "--link", "x::/usr/lib/escape/y"], state)
    assert not os.path.lexists(outside / "y")
    assert done.returncode == 0 or done.stderr.startswith("Error: ")


def test_bad_calls_fail_with_a_reason(tmp_path):
    _, state = bundle(tmp_path)
    assert nshook(["--folder"], state).returncode == 2
    assert nshook(["--socket", "relative.sock", "--folder", FOLDER], state).returncode == 2
    done = nshook(["--chmod", "755"], state)
    assert done.returncode == 1 and "expected MODE:PATH" in done.stderr
    done = nshook(["--link", LINK], "not json")
    assert done.returncode == 1 and done.stderr.startswith("Error: nri: ")


def test_the_server_refuses_malformed_requests(tmp_path, server):
    served, _ = server
    root = os.open(str(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert "malformed" in served.answer(b"rm -rf\0/x\0", [root])
        assert "malformed" in served.answer(b"update-ldcache\0relative\0", [root])
        assert "malformed" in served.answer(b"update-ldcache\0/x\0", [])
        with open(tmp_path / "f", "w"):
            pass
        file_fd = os.open(str(tmp_path / "f"), os.O_RDONLY)
        try:
            assert "not a folder" in served.answer(b"update-ldcache\0/x\0", [file_fd])
        finally:
            os.close(file_fd)
    finally:
        os.close(root)
    # a connection that sends no descriptor gets the reason, not a hang
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(30)
        sock.connect(served.path)
        sock.sendall(b"update-ldcache\0/x\0")
        sock.shutdown(socket.SHUT_WR)
        assert b"malformed" in sock.recv(4096)


FILES_SPEC = """cdiVersion: "0.6.0"
kind: nvidia.com/gpu
containerEdits:
  hooks:
    - {hookName: createContainer, path: /usr/bin/h, args: [nvidia-cdi-hook, update-ldcache, --folder, /usr/lib]}
    - {hookName: createContainer, path: /usr/bin/h, args: [nvidia-cdi-hook, disable-device-node-modification]}
    - {hookName: createContainer, path: /usr/bin/h, args: [nvidia-cdi-hook, update-application-profile]}
devices:
  - name: "0"
    containerEdits:
      deviceNodes: [{path: /dev/nvidia0, hostPath: /dev/null}]
"""


@pytest.mark.parametrize("params", ["ModifyDeviceFiles: 1\n", "ModifyDeviceFiles: 0\n", None])
def test_profile_and_params_hooks_done_by_the_plugin(tmp_path, cache_dir, monkeypatch, params):
    """update-application-profile: the plugin's profile file (by content) bound read-only;
    disable-device-node-modification: the plugin's params copy passed as --params to the one
    native hook, or nothing when the host's params need no change (or are absent)."""
    from shim.config import Config
    from shim.linker.toolkit_hooks import PROFILE_PATH, application_profile
    from shim.nri.messages import nri
    from shim.nri.nativehook import ToolkitFiles
    from shim.nri.policy import Policy
    from tests.conftest import write_spec

    host_params = tmp_path / "params"
    if params is not None:
        host_params.write_text("Foo: 1\n" + params)
    monkeypatch.setenv("CDI_SHIM_NVIDIA_PARAMS", str(host_params))
    write_spec(str(tmp_path / "cdi"), "gpu.yaml", FILES_SPEC)
    files = ToolkitFiles(str(tmp_path / "files"))
    policy = Policy(Config(spec_dirs=(str(tmp_path / "cdi"),)), ("ml",), "/x/cdi-shim-nshook", lambda *a: None,
                    hook_options=("--socket", "/run/h.sock"), files=files)
    pod = nri.PodSandbox(name="p", namespace="ml", annotations={"cdi.k8s.io/g": "nvidia.com/gpu=0"})
    adjust = policy.create_container(pod, nri.Container(name="c"))
    (hook,) = adjust.hooks.create_container
    args = list(hook.args)
    if params == "ModifyDeviceFiles: 1\n":
        assert args[:6] == ["cdi-shim-nshook", "nri", "--socket", "/run/h.sock", "--params", args[5]]
        with open(args[5]) as stream:
            assert stream.read() == "Foo: 1\nModifyDeviceFiles: 0\n"
    else:
        assert "--params" not in args
    assert args[-2:] == ["--folder", "/usr/lib"]
    (mount,) = [m for m in adjust.mounts if m.destination == PROFILE_PATH]
    assert "ro" in mount.options
    with open(mount.source, "rb") as stream:
        assert stream.read() == application_profile({"linux": {"devices": [
            {"path": "/dev/nvidia0", "type": "c", "major": 1, "minor": 3}]}})
    assert stat.S_IMODE(os.stat(mount.source).st_mode) == 0o444
    again = policy.create_container(pod, nri.Container(name="c"))   # the same bytes, the same file
    assert [m.source for m in again.mounts if m.destination == PROFILE_PATH] == [mount.source]


def test_params_bound_over_the_rootfs_params(tmp_path):
    """`--params FILE`: FILE bound read-only over the rootfs's /proc/driver/nvidia/params, in a
    mount namespace of its own here (unshare), as runc's would be."""
    import shutil

    rootfs, state = bundle(tmp_path)
    (rootfs / "proc" / "driver" / "nvidia").mkdir(parents=True)
    (rootfs / "proc" / "driver" / "nvidia" / "params").write_text("ModifyDeviceFiles: 1\n")
    source = tmp_path / "copy"
    source.write_text("ModifyDeviceFiles: 0\n")
    unshare = shutil.which("unshare")
    script = (f'{tool("cdi-shim-nshook")} nri --params {source} && cat {rootfs}/proc/driver/nvidia/params && '
              f'! touch {rootfs}/proc/driver/nvidia/params 2>/dev/null')
    done = subprocess.run([unshare, "--mount", "--propagation", "private", "sh", "-c", script], input=state,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ModifyDeviceFiles: 0\n"
    assert (rootfs / "proc" / "driver" / "nvidia" / "params").read_text() == "ModifyDeviceFiles: 1\n"


def test_an_update_ldcache_without_a_folder_still_writes_the_cache(tmp_path, server):
    """The toolkit's update-ldcache with no --folder runs ldconfig all the same (the cache, its
    zz-nvcr drop-in): the policy passes it as `--folder ""`, the plugin writes both (seen by
    the hook differential: benchmarks/hook_differential.py seed 1 case 24)."""
    from shim.nri.nativehook import native_hooks

    hook = {"path": "/usr/bin/nvidia-cdi-hook", "args": ["nvidia-cdi-hook", "update-ldcache"]}
    (ours,) = native_hooks({"createContainer": [hook]}, "/x/cdi-shim-nshook")["createContainer"]
    assert ours["args"] == ["cdi-shim-nshook", "nri", "--folder", ""]
    served, logged = server
    rootfs, state = bundle(tmp_path)
    (rootfs / "etc" / "ld.so.conf").write_text(f"{FOLDER}\n")
    done = nshook(["--socket", served.path, "--folder", ""], state)
    assert done.returncode == 0, done.stderr
    assert f"{FOLDER}/libz.so.1" in cache_listing(rootfs)
    assert [name for name in os.listdir(rootfs / "etc" / "ld.so.conf.d") if name.startswith("zz-nvcr")]
    assert logged == [f"hook: the linker cache of {rootfs} written (no folder)"]


@pytest.mark.parametrize("how", ["plugin", "fallback"])
def test_soname_links_beside_the_mounted_libraries(tmp_path, server, how):
    """As the hook's ldconfig (and the runtime, links.soname_links_to_make): the soname link
    beside a library file mounted into the folder (a bind mount, in a mount namespace of its
    own here as runc's), the cache naming it; create-symlinks' dev link to that soname link
    dangled during ldconfig's scan and is not listed. The mounts are read from the hook's
    mount namespace (its mountinfo), by the plugin or by the fallback program in it."""
    import shutil

    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or not unshare:
        pytest.skip("needs root and unshare (a bind mount in a private namespace)")
    rootfs, state = bundle(tmp_path)
    folder = rootfs / FOLDER.lstrip("/")
    driver = tmp_path / "driver"
    driver.mkdir()
    shutil.copy(folder / "libz.so.1.2.13", driver / "libz.so.1.2.13")   # (soname libz.so.1: the "driver's")
    os.unlink(folder / "libz.so.1.2.13")
    (folder / "libz.so.1.2.13").touch()                                 # runc's mount point
    (rootfs / "etc" / "ld.so.conf").write_text(f"{FOLDER}\n")
    if how == "plugin":
        hook = f"{tool('cdi-shim-nshook')} nri --socket {server[0].path} --link libz.so.1::{FOLDER}/libz.so"
    else:
        hook = f"{tool('cdi-shim-nshook')} nri --link libz.so.1::{FOLDER}/libz.so && {tool('cdi-shim-hook')} nri " \
               f"--rootfs {rootfs}"
    script = f"mount --bind {driver}/libz.so.1.2.13 {folder}/libz.so.1.2.13 && {hook} --folder {FOLDER}"
    done = subprocess.run([unshare, "-m", "--propagation", "private", "sh", "-c", script], input=state,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert os.readlink(folder / "libz.so.1") == "libz.so.1.2.13"
    listing = cache_listing(rootfs)
    assert f"libz.so.1 (libc6,x86-64) => {FOLDER}/libz.so.1\n" in listing, listing
    assert f"=> {FOLDER}/libz.so\n" not in listing, listing
