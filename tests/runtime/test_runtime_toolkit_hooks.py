"""The runtime does the work of every hook of a toolkit-generated spec (issue 11, runtime part).

containerd ≥ 1.7 (enable_cdi) and podman resolve CDI devices themselves and write the spec's
edits into config.json before the runtime runs: no request is left, but the spec's six
createContainer hooks of /usr/bin/nvidia-cdi-hook are. That program does not exist on this
host, so runc alone fails such a container (the control below); through cdi-shim-runtime each
hook's work is done before runc and the hook dropped. `cdi-shim cdi inject` pre-injects, as
containerd would.

What each hook does is checked against its documented behaviour (nvidia-container-toolkit,
cmd/nvidia-cdi-hook): update-ldcache and enable-cuda-compat against glibc's ldconfig given the
hooks' drop-ins (00-compat-*.conf, 00-nvcr/zz-nvcr), create-symlinks by the links, the
application profile and the params file by their bytes, chmod by the modes.
"""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import runtime_helpers as rh
from tests.helpers import native_programs

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "linker"))

RESIDENT_TOO = True

VERSION = rh.DRIVER_VERSION
COMPAT_VERSION = "560.28.03"
LIBDIR = "/usr/lib/x86_64-linux-gnu"
COMPAT = "/usr/local/cuda/compat"
HOOK = "/usr/bin/nvidia-cdi-hook"
PROFILE = "/etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf"
PROGRAM = r"""
#include <dlfcn.h>
#include <stdio.h>
int cdi_shim_fake(void);
int main(void) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    int (*major)(void) = cuda ? (int (*)(void))dlsym(cuda, "fake_cuda_major") : 0;
    printf("linked=%d cuda=%d\n", cdi_shim_fake(), major ? major() : -1);
    return 0;
}
"""
PARAMS = "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\nDeviceFileUID: 0\nDeviceFileMode: 438\n"


def _image(bundle, driver, tmp_path, compat=True):
    """The bundle's busybox rootfs made a small glibc image with its own ld.so.cache and, with
    COMPAT, CUDA forward-compatibility libraries for a newer driver (560) in /usr/local/cuda/compat."""
    rootfs = bundle.rootfs
    rh.glibc_image(rootfs, PROGRAM, str(driver / f"libnvidia-ml.so.{VERSION}"), str(tmp_path), ["-ldl"])
    if compat:
        os.makedirs(rootfs + COMPAT)
        rh.library(rootfs + f"{COMPAT}/libcuda.so.{COMPAT_VERSION}", "libcuda.so.1",
                 "int fake_cuda_major(void) { return 560; }\n")
        os.symlink(f"libcuda.so.{COMPAT_VERSION}", rootfs + f"{COMPAT}/libcuda.so.1")
    os.makedirs(rootfs + "/opt/data", mode=0o755)
    subprocess.run([rh.need("ldconfig", "libc-bin"), "-r", rootfs], check=True, timeout=60)
    return rootfs


def _hook(*args):
    return (f"    - hookName: createContainer\n      path: {HOOK}\n"
            f"      args: [nvidia-cdi-hook, {', '.join(repr(a) for a in args)}]\n"
            "      env: [NVIDIA_CTK_DEBUG=false]\n")


def toolkit_spec(world, driver, extra_hooks=""):
    """What `nvidia-ctk cdi generate` (1.20) writes, in shape: the six hooks, the driver files."""
    assert not os.path.exists(HOOK), "this test needs a host without the toolkit's hook"
    mounts = "".join(
        f"    - hostPath: {driver}/{name}\n      containerPath: {LIBDIR}/{name}\n"
        "      options: [ro, nosuid, nodev, rbind, rprivate]\n"
        for name in (f"libnvidia-ml.so.{VERSION}", f"libcuda.so.{VERSION}"))
    return (
        'cdiVersion: "0.5.0"\nkind: nvidia.com/gpu\n'
        'devices:\n  - name: "0"\n    containerEdits:\n'
        f"      deviceNodes: [{{path: /dev/nvidia0, hostPath: {world.node(0)}}}]\n"
        "containerEdits:\n"
        f"  env: [NVIDIA_CTK_LIBCUDA_DIR={LIBDIR}, NVIDIA_VISIBLE_DEVICES=void]\n"
        "  deviceNodes:\n    - {path: /dev/nvidiactl, hostPath: /dev/null}\n"
        "  hooks:\n"
        + _hook("create-symlinks", "--link", f"libcuda.so.1::{LIBDIR}/libcuda.so")
        + _hook("create-symlinks", "--link", f"libnvidia-ml.so.{VERSION}::{LIBDIR}/libnvidia-ml.so")
        + _hook("enable-cuda-compat", f"--host-driver-version={VERSION}")
        + _hook("update-ldcache", "--folder", LIBDIR, "--folder", f"{LIBDIR}/vdpau")
        + _hook("disable-device-node-modification")
        + _hook("update-application-profile")
        + extra_hooks
        + "  mounts:\n" + mounts
    )


def preinject(world, bundle, annotated=False):
    """Pre-inject nvidia.com/gpu=0 as containerd's own CDI would: no request left (but for an
    annotation the test put there, ANNOTATED)."""
    edited = subprocess.run([os.path.join(rh.VENV_BIN, "cdi-shim"), "cdi", "inject", "--device", "nvidia.com/gpu=0",
                             bundle.config_path], env=world.env(), capture_output=True, text=True, check=True).stdout
    config = json.loads(edited)
    assert annotated or not any(a.startswith("cdi.k8s.io/") for a in config.get("annotations") or {})
    with open(bundle.config_path, "w") as out:
        json.dump(config, out)
    return config


SCRIPT = ("/prog; echo profile=$(cat " + PROFILE + " 2>&1); "
          "echo params=$(grep ModifyDeviceFiles /proc/driver/nvidia/params 2>&1); "
          "echo dev=$(stat -c %a /dev/nvidia0); echo data=$(stat -c %a /opt/data)")


def _absent_params(tmp_path):
    return {"CDI_SHIM_NVIDIA_PARAMS": str(tmp_path / "no-such-params")}


def _resolution(listing_bytes, root):
    """[(soname, flags, the file it loads, resolved inside ROOT)] of an `ldconfig -p` listing."""
    out = []
    for line in listing_bytes.decode().splitlines()[1:]:
        if line.startswith("Cache generated by"):
            continue
        match = re.match(r"\s*(\S+) \(([^)]*)\) => (\S+)", line)
        assert match, line
        name, flags, path = match.groups()
        real = os.path.realpath(root + path)
        out.append((name, flags, os.path.relpath(real, root)))
    return out


def test_toolkit_spec_preinjected_runs_without_the_toolkit(world, driver, tmp_path):
    world.write_spec("nvidia-gpu.yaml", toolkit_spec(
        world, driver, _hook("chmod", "--mode", "640", "--path", "/dev/nvidia0")
        + _hook("chmod", "--mode", "700", "--path", "/opt/data")))
    bundle = world.bundle(args=["sh", "-c", SCRIPT])
    rootfs = _image(bundle, driver, tmp_path)
    image_cache = open(rootfs + "/etc/ld.so.cache", "rb").read()
    preinject(world, bundle)
    before = bundle.read_bytes()

    result = world.shim("run", "--bundle", bundle.path, bundle.id, env=world.env(**_absent_params(tmp_path)))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # the program links against the spec's libnvidia-ml.so.1; libcuda.so.1 is the image's
    # compat library (560, newer than the host's 550): the compat folder comes first
    assert lines[0] == "linked=42 cuda=560", result.stdout
    assert lines[1] == 'profile={"profiles":[{"name":"_container_","settings":["EGLVisibleDGPUDevices",0x1]}],' \
                       '"rules":[{"pattern":[],"profile":"_container_"}]}'
    assert lines[2].startswith("params=") and "ModifyDeviceFiles" not in lines[2]  # no params on this host
    assert lines[3] == "dev=640"
    assert lines[4] == "data=700"

    config = bundle.config()
    assert not config.get("hooks", {}).get("createContainer"), config.get("hooks")
    assert os.readlink(rootfs + f"{LIBDIR}/libcuda.so") == "libcuda.so.1"
    assert os.readlink(rootfs + f"{LIBDIR}/libnvidia-ml.so") == f"libnvidia-ml.so.{VERSION}"
    # the cache and the hooks' drop-ins written in the root, as the hooks leave them (ldconfig.go:
    # 00-nvcr-*.conf the folders not yet configured, zz-nvcr-*.conf the system directories of a
    # container not Debian-like; cudacompat.go: 00-compat-*.conf the compat folder; each 0644)
    assert open(rootfs + "/etc/ld.so.cache", "rb").read() != image_cache
    dropins = {n.split("-")[0] + "-" + n.split("-")[1]: (open(rootfs + "/etc/ld.so.conf.d/" + n).read(),
                                                         os.stat(rootfs + "/etc/ld.so.conf.d/" + n).st_mode)
               for n in os.listdir(rootfs + "/etc/ld.so.conf.d")
               if n.startswith(("00-compat-", "00-nvcr-", "zz-nvcr-"))}
    assert dropins == {"00-compat": (COMPAT + "\n", 0o100644), "00-nvcr": (f"{LIBDIR}/vdpau\n", 0o100644),
                       "zz-nvcr": ("/lib\n/usr/lib\n/lib64\n/usr/lib64\n/libx32\n/usr/libx32\n", 0o100644)}
    assert not [n for n in os.listdir(bundle.path) if n.startswith("cdi-shim.ld")]
    # the profile is mounted, never written into the image (runc makes an empty mount point)
    assert os.path.getsize(rootfs + PROFILE) == 0
    assert not os.path.exists(os.path.join(bundle.path, "cdi-shim.nvidia-params"))

    # update-ldcache + enable-cuda-compat: the cache resolves every soname to the file glibc's
    # ldconfig resolves it to, given the hooks' drop-ins, in the same order.
    import ldcache_helpers as lh

    oracle_root = str(tmp_path / "oracle-root")
    shutil.copytree(rootfs, oracle_root, symlinks=True)
    for name in (f"libnvidia-ml.so.{VERSION}", f"libcuda.so.{VERSION}"):
        shutil.copy2(driver / name, oracle_root + f"{LIBDIR}/{name}")
    with open(oracle_root + "/etc/ld.so.conf.d/00-compat-2921417741.conf", "w") as out:
        out.write(COMPAT + "\n")  # what enable-cuda-compat writes
    # the soname links the hook's ldconfig makes (it runs without -X), so that both listings resolve
    subprocess.run([lh.LDCONFIG, "-N", "-r", oracle_root], check=True, timeout=60)
    expected = lh.toolkit_ldconfig(oracle_root, [LIBDIR, f"{LIBDIR}/vdpau"])
    ours = open(rootfs + "/etc/ld.so.cache", "rb").read()
    # (A development link such as libcuda.so -> libcuda.so.1 is listed by ldconfig only once it
    # has made the soname link libcuda.so.1; we make no soname links: the cache names the
    # file itself. The loader looks sonames up, never those names.)
    def sonames(cache):
        return [entry for entry in _resolution(lh.listing(cache), oracle_root) if not entry[0].endswith(".so")]

    assert sonames(ours) == sonames(expected)
    assert ("libcuda.so.1", "libc6,x86-64", f"usr/local/cuda/compat/libcuda.so.{COMPAT_VERSION}") \
        in sonames(ours)

    # The control: the same pre-injected config under plain runc fails on the missing hook.
    with open(bundle.config_path, "wb") as out:
        out.write(before)
    control = world.runc_cmd("run", "--bundle", bundle.path, bundle.id + "-runc")
    assert control.returncode != 0
    assert "nvidia-cdi-hook" in control.stderr + control.stdout


@pytest.mark.parametrize("host_major", ["560", "570"])
def test_compat_libraries_for_an_older_or_same_driver_are_left_out(world, driver, tmp_path, host_major):
    world.write_spec("nvidia-gpu.yaml", toolkit_spec(world, driver).replace(
        f"--host-driver-version={VERSION}", f"--host-driver-version={host_major}.10"))
    bundle = world.bundle(args=["/prog"])
    _image(bundle, driver, tmp_path)
    preinject(world, bundle)
    result = world.shim("run", "--bundle", bundle.path, bundle.id, env=world.env(**_absent_params(tmp_path)))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "linked=42 cuda=550\n"  # the host's driver, as the hook leaves it


def test_params_file_modified_and_our_hook_binds_it(world, driver, tmp_path):
    """The host's params (a test file here) with ModifyDeviceFiles: 0 is written into the
    bundle; runc refuses config.json mounts under /proc, so the spec's hook becomes ours
    (cdi-shim-nshook bind-params, present with the runtime), which binds it in the container's
    mount namespace as the toolkit's does. This host has no /proc/driver/nvidia, so inside a
    real container that bind has no file to cover: the create fails, naming our hook and why
    (the toolkit's hook, present, would fail the same way); the bind itself is checked below,
    in a private mount namespace, on an image whose own file stands for the driver's."""
    params = tmp_path / "params"
    params.write_text(PARAMS)
    world.write_spec("nvidia-gpu.yaml", toolkit_spec(world, driver))
    bundle = world.bundle(args=["/prog"])
    _image(bundle, driver, tmp_path)
    preinject(world, bundle)
    result = world.shim("create", "--bundle", bundle.path, bundle.id, env=world.env(CDI_SHIM_NVIDIA_PARAMS=str(params)))
    assert result.returncode != 0
    assert "bind-params" in result.stderr and "/proc/driver/nvidia/params" in result.stderr, result.stderr
    assert "no such file" in result.stderr.lower(), result.stderr
    written = os.path.join(bundle.path, "cdi-shim.nvidia-params")
    assert open(written).read() == PARAMS.replace("ModifyDeviceFiles: 1", "ModifyDeviceFiles: 0")
    assert os.stat(written).st_mode & 0o777 == 0o444
    # one hook of ours: the library mounts' binds (shim/linker/filebinds.py), the params bind folded in
    hooks = bundle.config()["hooks"]["createContainer"]
    assert len(hooks) == 1 and hooks[0]["args"][:4] == ["cdi-shim-nshook", "binds", "--rootfs", bundle.rootfs]
    assert hooks[0]["args"][-2:] == ["--params", written] and hooks[0]["args"].count("--bind") == 3
    assert hooks[0]["path"] == os.path.join(rh.VENV_BIN, "cdi-shim-nshook")

    # The hook, as runc runs it (state on stdin), in a private mount namespace.
    rootfs = bundle.rootfs
    os.makedirs(rootfs + "/proc/driver/nvidia", exist_ok=True)
    with open(rootfs + "/proc/driver/nvidia/params", "w") as out:
        out.write("the image's\n")
    state = json.dumps({"ociVersion": "1.0.2", "id": bundle.id, "status": "creating", "pid": 1, "bundle": bundle.path})
    target = rootfs + "/proc/driver/nvidia/params"
    script = (f"{hooks[0]['path']} {' '.join(hooks[0]['args'][1:])} < {tmp_path}/state.json || exit 9; "
              f"cat {target}; echo x > {target} 2>/dev/null && echo writable; true")
    (tmp_path / "state.json").write_text(state)
    run = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                         capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    assert run.stdout == PARAMS.replace("ModifyDeviceFiles: 1", "ModifyDeviceFiles: 0")
    assert open(target).read() == "the image's\n"  # only bound over, in that namespace
    # the same bind alone (a spec's hook kept as bind-params where no library mount moves)
    script = script.replace(" ".join(hooks[0]["args"][1:]), f"bind-params --rootfs {rootfs} --source {written}")
    run = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                         capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    assert run.stdout == PARAMS.replace("ModifyDeviceFiles: 1", "ModifyDeviceFiles: 0"), run.stderr


def _bind_params(rootfs, source, state):
    """Our params hook as runc runs it (state on stdin), in a private mount namespace; then
    what the namespace's host file and the image's params read."""
    hook = os.path.join(rh.VENV_BIN, "cdi-shim-nshook")
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                           f'{hook} bind-params --rootfs {rootfs} --source {source} < {state}; echo "rc=$?"'],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("kind", ["link out of the root", "fifo", "directory", "missing"])
def test_params_bind_refuses_anything_but_the_image_s_own_file(world, tmp_path, kind):
    """The image's /proc/driver/nvidia/params a link to a host file, a FIFO (never opened for
    reading: no hang), a directory, or absent: our hook binds nothing and says why."""
    host_file = tmp_path / "host-secret"
    host_file.write_text("host\n")
    source = tmp_path / "source"
    source.write_text("ModifyDeviceFiles: 0\n")
    bundle = world.bundle(args=["true"])
    target = bundle.rootfs + "/proc/driver/nvidia/params"
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if kind == "link out of the root":
        os.symlink(str(host_file), target)
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "directory":
        os.mkdir(target)
    (tmp_path / "state.json").write_text(json.dumps({"bundle": bundle.path, "id": bundle.id}))
    run = _bind_params(bundle.rootfs, source, tmp_path / "state.json")
    assert run.stdout.strip() == "rc=1", (run.stdout, run.stderr)
    assert "Error: bind-params:" in run.stderr and "/proc/driver/nvidia/params" in run.stderr, run.stderr
    assert host_file.read_text() == "host\n"


def test_nshook_usage():
    hook = os.path.join(rh.VENV_BIN, "cdi-shim-nshook")
    for args in ([], ["bind-params"], ["bind-params", "--source", "relative", "--rootfs", "/"],
                 ["bind-params", "--rootfs", "/"], ["symlinks", "--rootfs", "/"],
                 ["symlinks", "--rootfs", "x", "--link", "a::/b"],
                 ["symlinks", "--rootfs", "/", "--source", "/x"], ["other", "--rootfs", "/"]):
        run = subprocess.run([hook, *args], capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL)
        assert run.returncode == 2 and "usage: cdi-shim-nshook bind-params [--rootfs DIR] --source FILE" in run.stderr


def test_nshook_is_a_static_program(world, tmp_path):
    """It runs for every container start on a GPU node: a static binary, no interpreter."""
    hook = os.path.join(rh.VENV_BIN, "cdi-shim-nshook")
    with open(hook, "rb") as stream:
        assert stream.read(4) == b"\x7fELF"
    dynamic = subprocess.run([rh.need("readelf", "binutils"), "-d", hook], capture_output=True, text=True).stdout
    assert "NEEDED" not in dynamic, dynamic


def _nshook_links(rootfs, *links):
    hook = os.path.join(rh.VENV_BIN, "cdi-shim-nshook")
    args = [a for link in links for a in ("--link", link)]
    return subprocess.run([hook, "symlinks", "--rootfs", rootfs, *args], capture_output=True, text=True,
                          timeout=30, input='{"ociVersion": "1.0.2"}')


def test_nshook_symlinks_made_inside_the_root(tmp_path):
    """Parents made as needed; what is at the link path replaced, as the toolkit's
    create-symlinks does (an identical link left, a directory refused); a link in the image's
    path followed inside the root only; a ".." in the link path refused."""
    rootfs, host = tmp_path / "rootfs", tmp_path / "host"
    (rootfs / "dev").mkdir(parents=True)
    host.mkdir()
    os.symlink("/dev", rootfs / "devlink")          # absolute: means the root's /dev
    os.symlink(str(host), rootfs / "dev" / "out")   # to the host: must resolve inside the root
    os.symlink("keep", rootfs / "dev" / "kept")
    run = _nshook_links(str(rootfs), "../card1::/dev/dri/by-path/pci-0000:3b:00.0-card",
                        "new::/dev/kept", "x::/devlink/via-link")
    assert run.returncode == 0, run.stderr
    assert os.readlink(rootfs / "dev/dri/by-path/pci-0000:3b:00.0-card") == "../card1"
    assert os.readlink(rootfs / "dev/kept") == "new"
    same = os.lstat(rootfs / "dev/kept").st_ino
    (rootfs / "dev" / "file").write_text("x")
    (rootfs / "dev" / "dir").mkdir()
    run = _nshook_links(str(rootfs), "new::/dev/kept", "f::/dev/file")
    assert run.returncode == 0, run.stderr
    assert os.lstat(rootfs / "dev/kept").st_ino == same and os.readlink(rootfs / "dev/file") == "f"
    run = _nshook_links(str(rootfs), "d::/dev/dir")
    assert run.returncode == 1 and "Is a directory" in run.stderr, run.stderr
    assert (rootfs / "dev" / "dir").is_dir()
    assert os.readlink(rootfs / "dev/via-link") == "x"
    # /dev/out leads to the host's directory: resolved inside the root, where it names nothing
    run = _nshook_links(str(rootfs), "y::/dev/out/escape")
    assert run.returncode == 1 and "cannot open the directory of /dev/out/escape" in run.stderr, run.stderr
    assert os.listdir(host) == []
    for bad in ("z::/dev/../etc/x", "z::relative", "::/dev/x", "z::/dev/"):
        run = _nshook_links(str(rootfs), bad)
        assert run.returncode == 1 and "Error: symlinks: malformed" in run.stderr, (bad, run.stderr)


def _state_bundle(tmp_path, config_text, rootfs="rootfs"):
    bundle = tmp_path / "bundle"
    (bundle / rootfs).mkdir(parents=True, exist_ok=True)
    (bundle / "config.json").write_text(config_text)
    return bundle


@pytest.mark.parametrize("config, state_bundle", [
    ('{"ociVersion": "1.0.2", "root": {"path": "rootfs", "readonly": true}}', None),
    # root.path absolute, after nested values of every kind; a repeated key: the last counts
    ('{"process": {"args": ["sh", "-c", "x"], "env": [], "user": {"uid": 0}}, "n": [-0, 1.5e-3, true, null, {}, []],'
     ' "root": {"path": "/elsewhere"}, "root": {"path": "@ROOTFS@"}}', None),
    # the state's bundle written with JSON escapes (\u0062 is "b", \/ is "/")
    ('{"root": {"path": "rootfs"}}', "@TMP@\\/\\u0062undle"),
])
def test_nshook_takes_the_rootfs_from_the_oci_state(tmp_path, config, state_bundle):
    """Without --rootfs (a generated spec's hook, as podman or plain runc run it): the state on
    stdin names the bundle, its config.json root.path (relative to the bundle, or absolute)."""
    rootfs = tmp_path / "bundle" / "rootfs"
    bundle = _state_bundle(tmp_path, config.replace("@ROOTFS@", str(rootfs)))
    name = (state_bundle or "").replace("@TMP@", str(tmp_path)) or str(bundle)
    state = '{"ociVersion": "1.0.2", "id": "x", "status": "creating", "pid": 1, "bundle": "%s"}' % name
    hook = os.path.join(rh.VENV_BIN, "cdi-shim-nshook")
    run = subprocess.run([hook, "symlinks", "--link", "../card1::/dev/dri/by-path/pci-0000:3b:00.0-card"],
                         input=state, capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    assert os.readlink(rootfs / "dev/dri/by-path/pci-0000:3b:00.0-card") == "../card1"


@pytest.mark.parametrize("state, config, says", [
    ("", '{"root": {"path": "rootfs"}}', "names no absolute bundle"),
    ('{"bundle": "relative"}', '{"root": {"path": "rootfs"}}', "names no absolute bundle"),
    ('{"bundle": "@B@"} trailing', '{"root": {"path": "rootfs"}}', "names no absolute bundle"),
    ('{"bundle": "@B@", "x": 01}', '{"root": {"path": "rootfs"}}', "names no absolute bundle"),
    ('{"bundle": "@B\\u0000@"}', '{"root": {"path": "rootfs"}}', "names no absolute bundle"),
    ('{"bundle": "@B@"}', '{"root": {"path": 7}}', "has no root.path"),
    ('{"bundle": "@B@"}', '{"root": {"path": "rootfs"}', "has no root.path"),
    ('{"bundle": "@B@"}', '{"root": "rootfs"}', "has no root.path"),
    ('{"bundle": "@B@/missing"}', '{}', "cannot open"),
])
def test_nshook_refuses_a_state_it_cannot_read(tmp_path, state, config, says):
    bundle = _state_bundle(tmp_path, config)
    hook = os.path.join(rh.VENV_BIN, "cdi-shim-nshook")
    run = subprocess.run([hook, "symlinks", "--link", "x::/dev/y"], input=state.replace("@B@", str(bundle)),
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 1 and "Error: symlinks:" in run.stderr and says in run.stderr, run.stderr


@pytest.mark.parametrize("text", ["ModifyDeviceFiles: 0\n", "NoSuchLine: 1\n"])
def test_params_already_safe_need_nothing(world, driver, tmp_path, text):
    params = tmp_path / "params"
    params.write_text(text)
    world.write_spec("nvidia-gpu.yaml", toolkit_spec(world, driver))
    bundle = world.bundle(args=["/prog"])
    _image(bundle, driver, tmp_path, compat=False)
    preinject(world, bundle)
    result = world.shim("run", "--bundle", bundle.path, bundle.id, env=world.env(CDI_SHIM_NVIDIA_PARAMS=str(params)))
    assert result.returncode == 0, result.stderr
    assert not bundle.config().get("hooks", {}).get("createContainer")


def test_unknown_hook_options_stay_and_run(world, driver, tmp_path):
    """A known hook with an option we do not understand runs as written (debug log line)."""
    world.write_config(log_level="debug")
    world.write_spec("nvidia-gpu.yaml", toolkit_spec(world, driver).replace(
        "[nvidia-cdi-hook, 'update-application-profile']",
        "[nvidia-cdi-hook, 'update-application-profile', '--container-spec', '/x']"))
    bundle = world.bundle(args=["/prog"])
    _image(bundle, driver, tmp_path)
    preinject(world, bundle)
    log = os.path.join(bundle.path, "log.json")
    result = world.shim("--log", log, "--log-format", "json", "create", "--bundle", bundle.path, bundle.id,
                        env=world.env(**_absent_params(tmp_path)))
    assert result.returncode != 0  # runc runs it: the program is missing on this host
    hooks = json.loads(open(bundle.config_path).read())["hooks"]["createContainer"]
    assert [h["args"][1] for h in hooks] == ["update-application-profile"]
    messages = [m for _, m in rh.read_log(log, "json")]
    assert any("hook left to run as written" in m and "--container-spec" in m for m in messages)


def test_drm_by_path_links_of_a_toolkit_spec_without_the_toolkit(world, driver, tmp_path):
    """The toolkit's per-GPU hook for /dev/dri/by-path links (nvidia-ctk cdi generate 1.20,
    dgpu/by-path-hooks.go): the links lie under /dev, which runc mounts after we run, so they
    cannot be made in the rootfs beforehand; our own C program (cdi-shim-nshook symlinks) makes
    them in the container's mount namespace in its place (the toolkit's program is missing on
    this host; it would not matter if it were there). The three library binds stay with runc:
    the links alone do not make our hook run (a create with --pid-file makes them without it:
    test_links_after_create.py). The library links of the other create-symlinks hook are still
    made natively."""
    bus = "0000:3b:00.0"
    links = ["--link", f"../card1::/dev/dri/by-path/pci-{bus}-card",
             "--link", f"../renderD128::/dev/dri/by-path/pci-{bus}-render"]
    world.write_spec("nvidia-gpu.yaml", toolkit_spec(world, driver, _hook("create-symlinks", *links)))
    bundle = world.bundle(args=["sh", "-c", "for l in /dev/dri/by-path/*; do echo $l $(readlink $l); done"])
    _image(bundle, driver, tmp_path)
    preinject(world, bundle)
    result = world.shim("run", "--bundle", bundle.path, bundle.id, env=world.env(**_absent_params(tmp_path)))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"/dev/dri/by-path/pci-{bus}-card ../card1",
                                          f"/dev/dri/by-path/pci-{bus}-render ../renderD128"]
    # one hook of ours, the links alone; the library binds are runc's (shim/linker/filebinds.py)
    hooks = bundle.config()["hooks"]["createContainer"]
    assert len(hooks) == 1 and hooks[0]["path"] == os.path.join(rh.VENV_BIN, "cdi-shim-nshook"), hooks
    assert hooks[0]["args"] == ["cdi-shim-nshook", "symlinks", "--rootfs", bundle.rootfs, *links]
    assert [m for m in bundle.config()["mounts"] if m["destination"].startswith(LIBDIR + "/lib")]
    assert os.readlink(bundle.rootfs + f"{LIBDIR}/libcuda.so") == "libcuda.so.1"   # made natively


# ---- hostile images ----------------------------------------------------------------

def test_hostile_links_out_of_the_root(world, driver, tmp_path):
    """Every path the hooks touch is a link to the host: nothing outside the root changes,
    nothing of the host is read as the image's."""
    host = tmp_path / "host"
    (host / "compat").mkdir(parents=True)
    rh.library(host / "compat" / "libcuda.so.999.1", "libcuda.so.1", "int fake_cuda_major(void) { return 999; }\n")
    (host / "nvidia").mkdir()
    (host / "data").mkdir(mode=0o755)
    os.chmod(host / "data", 0o755)
    world.write_spec("nvidia-gpu.yaml", toolkit_spec(
        world, driver, _hook("chmod", "--mode", "700", "--path", "/opt/data")))
    bundle = world.bundle(args=["sh", "-c", "/prog; cat " + PROFILE])
    rootfs = _image(bundle, driver, tmp_path, compat=False)
    os.makedirs(rootfs + "/usr/local/cuda")
    os.symlink(str(host / "compat"), rootfs + COMPAT)
    os.symlink(str(host / "nvidia"), rootfs + "/etc/nvidia")
    os.rmdir(rootfs + "/opt/data")
    os.symlink(str(host / "data"), rootfs + "/opt/data")
    preinject(world, bundle)
    result = world.shim("run", "--bundle", bundle.path, bundle.id, env=world.env(**_absent_params(tmp_path)))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "linked=42 cuda=550"  # the host's compat dir is not the image's
    assert "EGLVisibleDGPUDevices" in result.stdout
    assert os.listdir(host / "nvidia") == []
    assert os.stat(host / "data").st_mode & 0o777 == 0o755


def test_hostile_fifos(world, driver, tmp_path):
    """FIFOs where the hooks look (a compat library, a chmod path): nothing blocks."""
    world.write_spec("nvidia-gpu.yaml", toolkit_spec(
        world, driver, _hook("chmod", "--mode", "600", "--path", "/opt/fifo")))
    bundle = world.bundle(args=["sh", "-c", "/prog; stat -c %a /opt/fifo"])
    rootfs = _image(bundle, driver, tmp_path, compat=False)
    os.makedirs(rootfs + COMPAT)
    os.mkfifo(rootfs + f"{COMPAT}/libcuda.so.{COMPAT_VERSION}")
    os.mkfifo(rootfs + "/opt/fifo", 0o644)
    preinject(world, bundle)
    result = world.shim("run", "--bundle", bundle.path, bundle.id, env=world.env(**_absent_params(tmp_path)),
                        timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["linked=42 cuda=550", "600"]


def test_hostile_read_only_rootfs_fails_clearly(world, driver, tmp_path):
    """A chmod the rootfs cannot take (a read-only filesystem) fails the create, naming the hook."""
    world.write_spec("nvidia-gpu.yaml", toolkit_spec(
        world, driver, _hook("chmod", "--mode", "700", "--path", "/opt/data")))
    bundle = world.bundle(args=["/prog"])
    rootfs = _image(bundle, driver, tmp_path)
    for name in ("libcuda.so", "libnvidia-ml.so"):  # the links exist: only the chmod is left to do
        os.symlink("x", rootfs + f"{LIBDIR}/{name}")
    preinject(world, bundle)
    before = bundle.read_bytes()
    subprocess.run(["mount", "--bind", rootfs, rootfs], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", rootfs], check=True)
        result = world.shim("create", "--bundle", bundle.path, bundle.id, env=world.env(**_absent_params(tmp_path)))
    finally:
        subprocess.run(["umount", rootfs], check=True)
    assert result.returncode != 0
    assert "chmod hook" in result.stderr and "Read-only file system" in result.stderr, result.stderr
    assert bundle.read_bytes() == before


# ---- the front end's scan -------------------------------------------------------------

@pytest.mark.parametrize("program, arg0, python", [
    ("nvidia-cdi-hook", "nvidia-cdi-hook", True),
    ("nvidia-ctk", "x", True),                     # the path's last component
    ("wrapper", "cdi-shim-hook", True),            # args[0]
    ("cdi-shim", "cdi-shim", True),
    ("nvidia-cdi-hook-wrapper", "my-nvidia-ctk", False),
    ("wrapper", "nvidia-cdi-hooks", False),
])
def test_front_end_sends_configs_with_hook_programs_to_python(world, tmp_path, program, arg0, python):
    """No request in config.json: a hook of one of our programs sends it to the Python half
    (which leaves a hook it does not know, here a `noop` subcommand, to run); any other
    config goes straight to runc (no Python: no phase lines in the debug log)."""
    world.write_config(log_level="debug")
    script = tmp_path / "bin" / program
    script.parent.mkdir()
    script.write_text("#!/bin/sh\ncat > /dev/null\nexit 0\n")
    script.chmod(0o755)

    def edit(config):
        config["hooks"] = {"createContainer": [{"path": str(script), "args": [arg0, "noop"],
                                                "env": ["PATH=/bin", "X=nvidia-cdi-hook"]}]}

    bundle = world.bundle(args=["true"], edit=edit)
    log = os.path.join(bundle.path, "log.json")
    result = world.shim("--log", log, "--log-format", "json", "run", "--bundle", bundle.path, bundle.id)
    assert result.returncode == 0, result.stderr
    messages = [m for _, m in rh.read_log(log, "json")] if os.path.exists(log) else []
    assert any("phase=total" in m for m in messages) == python, messages
    if python:
        assert any("hook left to run as written" in m for m in messages)
    assert bundle.unchanged()


def test_device_injected_by_containerd_and_named_by_annotation_is_injected_once(world, driver, tmp_path):
    extra = ("    - hookName: createContainer\n      path: /bin/true\n"
             "      args: [true, spec-hook]\n      env: [PATH=/bin]\n")
    world.write_spec("nvidia-gpu.yaml", toolkit_spec(world, driver, extra))
    bundle = world.bundle(args=["/prog"], annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=0"})
    _image(bundle, driver, tmp_path)
    preinject(world, bundle, annotated=True)
    result = world.shim("run", "--bundle", bundle.path, bundle.id, env=world.env(**_absent_params(tmp_path)))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "linked=42 cuda=560\n"
    config = bundle.config()
    assert [h["args"] for h in config["hooks"]["createContainer"]] == [["true", "spec-hook"]]
    paths = [d["path"] for d in config["linux"]["devices"]]
    assert sorted(paths) == sorted(set(paths)) and "/dev/nvidia0" in paths
    rules = [json.dumps(r, sort_keys=True) for r in config["linux"]["resources"]["devices"]]
    assert len(rules) == len(set(rules)), rules
    destinations = [m["destination"] for m in config["mounts"]]
    assert len(destinations) == len(set(destinations))
    env = [e.partition("=")[0] for e in config["process"]["env"]]
    assert len(env) == len(set(env))


def test_links_to_nothing_yet_are_made_after_planning_so_the_image_cache_serves(world, driver, tmp_path):
    """create-symlinks' links whose target is neither in the image nor mounted (libcuda.so ->
    libcuda.so.1, a soname link nobody makes) are made after the cache is planned: the library
    directory is then unchanged while planning, and the image's cache serves it (incremental)."""
    world.write_config(log_level="debug")
    world.write_spec("nvidia-gpu.yaml", toolkit_spec(world, driver).replace(
        f"libnvidia-ml.so.{VERSION}::{LIBDIR}/libnvidia-ml.so", f"libnvidia-ml.so.1::{LIBDIR}/libnvidia-ml.so"))
    bundle = world.bundle(args=["/prog"])
    rootfs = _image(bundle, driver, tmp_path, compat=False)
    old = os.stat(rootfs + LIBDIR).st_mtime_ns - 10**9
    os.utime(rootfs + LIBDIR, ns=(old, old))  # older than the image's cache, as in a real image
    preinject(world, bundle)
    log = os.path.join(bundle.path, "log.json")
    result = world.shim("--log", log, "--log-format", "json", "run", "--bundle", bundle.path, bundle.id,
                        env=world.env(**_absent_params(tmp_path)))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "linked=42 cuda=550\n"
    messages = [m for _, m in rh.read_log(log, "json")]
    # LIBDIR taken from the image's cache: one directory the image's cache does not stand for is
    # scanned, not LIBDIR too (2 when the links are made before planning)
    assert any("linker cache:" in m and "(incremental, 1 directories scanned" in m for m in messages), messages
    assert os.readlink(rootfs + f"{LIBDIR}/libcuda.so") == "libcuda.so.1"
    assert os.readlink(rootfs + f"{LIBDIR}/libnvidia-ml.so") == "libnvidia-ml.so.1"
    assert not bundle.config().get("hooks", {}).get("createContainer")


def sanitized_nshook(directory):
    """cdi-shim-nshook built with gcc's address and undefined-behaviour sanitizers, in DIRECTORY."""
    gcc = rh.need("gcc", "gcc")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    binary = os.path.join(str(directory), "nshook-asan")
    sources, _ = native_programs().PROGRAMS["cdi-shim-nshook"]
    build = subprocess.run([gcc, "-std=gnu11", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
                            "-o", binary, *(os.path.join(repo, source) for source in sources)],
                           capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr + "\n(gcc's sanitizer runtimes: apt-get install libasan8 libubsan1)"
    return binary


def test_nshook_state_reader_under_asan_and_ubsan(tmp_path):
    """The OCI state and config.json reader of cdi-shim-nshook, built with gcc's sanitizers, on
    good and malformed documents: deep nesting, long strings, bad escapes and surrogates, cut
    documents. Each run ends with 0 or 1 and no sanitizer report."""
    binary = sanitized_nshook(tmp_path)
    bundle = _state_bundle(tmp_path, '{"root": {"path": "rootfs"}}')
    good = '{"bundle": "%s"}' % bundle
    cases = [
        (good, '{"root": {"path": "rootfs"}}', 0),
        (good, '{"a": ' + "[" * 100000 + "]" * 100000 + ', "root": {"path": "rootfs"}}', 1),   # past the depth bound
        (good, '{"a": ' + "[" * 400 + "1" + "]" * 400 + ', "root": {"path": "rootfs"}}', 0),
        (good, '{"a": "' + "x" * 300000 + '", "root": {"path": "rootfs"}}', 0),
        (good, '{"root": {"path": "root\\ud83d\\ude00fs"}}', 1),          # a real pair: a path that is not there
        (good, '{"root": {"path": "\\ud83d"}}', 1),                        # a lone high surrogate
        (good, '{"root": {"path": "\\ude00x"}}', 1),                       # a lone low surrogate
        (good, '{"root": {"path": "\\u12"}}', 1),
        (good, '{"r\\u006fot": {"p\\u0061th": "ro\\u006ftfs"}}', 0),       # escaped keys, decoded
        (good, '{"x": "\\u0000", "root": {"path": "rootfs"}}', 1),          # a NUL anywhere
        (good, '{"root": {"path": "rootfs\\', 1),
        (good, '{"root": {"path": "rootfs"}, "n": -', 1),
        (good, '{"root": {"path": "rootfs"}, "n": 1e}', 1),
        (good, '{"root": {"path": "rootfs"}, "t": tru}', 1),
        ('{"bundle": "' + "/x" * 3000 + '"}', "{}", 1),                     # longer than a path
        ('{"bundle": "\\u0000"}', "{}", 1),
        ("\x00\x01\x02", "{}", 1),
    ]
    for state, config, expected in cases:
        (bundle / "config.json").write_text(config)
        run = subprocess.run([str(binary), "symlinks", "--link", "x::/dev/y"], input=state, capture_output=True,
                             text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "ASAN_OPTIONS": "detect_leaks=1"})
        assert "Sanitizer" not in run.stderr and "runtime error" not in run.stderr, (config[:80], run.stderr[-2000:])
        assert run.returncode == expected, (state[:80], config[:80], run.stderr)
