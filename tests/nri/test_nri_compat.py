"""enable-cuda-compat under NRI, with no toolkit process: the policy folds the spec's
enable-cuda-compat into the one native hook (`--cuda-compat DRIVER:CUDA`, in the spec's hook
order among the folders); the hook hands the rootfs to the plugin's hook server, which decides
the compat folder with the runtime's own code (toolkit_hooks.cuda_compat_folder: the folder's
links resolved inside the root, as the real hook names it) and puts its drop-in first in the
cache it writes (shim/nri/cache.py). The decision's rules are the runtime's, checked against the
real hook in tests/runtime/test_hook_fidelity.py; here: the wiring, end to end."""
import os
import subprocess

import pytest

from tests.conftest import tool
from tests.nri.test_hook import bundle
from tests.nri.test_nrihook import nshook

FOLDER = "/usr/lib/x86_64-linux-gnu"
DRIVER = "550.54.15"
COMPAT_LIB = "libcuda.so.570.86.10"
RESOLVED = "/usr/local/cuda-12.8/compat"        # /usr/local/cuda -> cuda-12.8 in the image
DROPIN = "etc/ld.so.conf.d/00-compat-cdi-shim.conf"


def _library(path, marker):
    from tests.helpers import need

    source = f"{path}.c"
    with open(source, "w") as out:
        out.write(f"int fake_cuda_major(void) {{ return {marker}; }}\n")
    subprocess.run([need("gcc", "gcc"), "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(path), source],
                   check=True, capture_output=True, timeout=120)
    os.unlink(source)


def compat_root(tmp_path):
    """The hook test's root with the driver's libcuda in FOLDER (as the spec's mount puts it)
    and an image's CUDA compat libcuda 570 under /usr/local/cuda-12.8, reached by a link."""
    rootfs, state = bundle(tmp_path)
    _library(rootfs / FOLDER.lstrip("/") / f"libcuda.so.{DRIVER}", 550)
    os.symlink(f"libcuda.so.{DRIVER}", rootfs / FOLDER.lstrip("/") / "libcuda.so.1")
    compat = rootfs / RESOLVED.lstrip("/")
    compat.mkdir(parents=True)
    _library(compat / COMPAT_LIB, 570)
    os.symlink(COMPAT_LIB, compat / "libcuda.so.1")
    os.symlink("cuda-12.8", rootfs / "usr/local/cuda")
    (rootfs / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    return rootfs, state


def first_libcuda(rootfs):
    """The libcuda.so.1 the loader takes from the root's cache: its first entry of that name."""
    from shim.ldconfig.ldcache import read_root_cache

    return next(entry.path for entry in read_root_cache(str(rootfs)).entries if entry.soname == "libcuda.so.1")


@pytest.mark.parametrize("host, chosen", [(DRIVER, True), ("580.65.06", False)], ids=["newer", "older"])
def test_the_compat_libcuda_first_when_newer(tmp_path, server, host, chosen):
    served, logged = server
    rootfs, state = compat_root(tmp_path)
    done = nshook(["--socket", served.path, "--cuda-compat", f"{host}:", "--folder", FOLDER], state)
    assert done.returncode == 0, done.stderr
    if chosen:
        assert first_libcuda(rootfs) == f"{RESOLVED}/libcuda.so.1"
        assert (rootfs / DROPIN).read_text() == f"{RESOLVED}\n"
        assert logged == [f"hook: the linker cache of {rootfs} written ({FOLDER}); enable-cuda-compat: "
                          f"{RESOLVED} first"]
    else:
        assert first_libcuda(rootfs) == f"{FOLDER}/libcuda.so.1"
        assert not (rootfs / DROPIN).exists()
        assert logged == [f"hook: the linker cache of {rootfs} written ({FOLDER})"]


def test_after_every_update_ldcache_only_its_drop_in(tmp_path, server):
    """The hooks run in order: a compat call after the cache's only writes its drop-in (a later
    ldconfig in the container reads it), the cache keeps the driver's libcuda."""
    served, logged = server
    rootfs, state = compat_root(tmp_path)
    done = nshook(["--socket", served.path, "--folder", FOLDER, "--cuda-compat", f"{DRIVER}:"], state)
    assert done.returncode == 0, done.stderr
    assert first_libcuda(rootfs) == f"{FOLDER}/libcuda.so.1"
    assert (rootfs / DROPIN).read_text() == f"{RESOLVED}\n"
    assert logged[-1] == f"hook: enable-cuda-compat's drop-in of {rootfs} written ({RESOLVED})"


def test_without_the_plugin_the_fallback_does_the_same(tmp_path):
    rootfs, state = compat_root(tmp_path)
    done = nshook(["--socket", str(tmp_path / "nobody.sock"), "--fallback", tool("cdi-shim-hook"),
                   "--cuda-compat", f"{DRIVER}:", "--folder", FOLDER], state)
    assert done.returncode == 0, done.stderr
    assert first_libcuda(rootfs) == f"{RESOLVED}/libcuda.so.1"
    assert (rootfs / DROPIN).read_text() == f"{RESOLVED}\n"


def test_malformed_compat_refused(tmp_path, server):
    _, state = bundle(tmp_path)
    assert nshook(["--cuda-compat", "550"], state).returncode == 2
    done = subprocess.run([tool("cdi-shim-hook"), "nri", "--cuda-compat", "550"], input=state, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "DRIVER:CUDA" in done.stderr


HOOK = "    - {hookName: createContainer, path: /usr/bin/nvidia-cdi-hook, args: [nvidia-cdi-hook, %s]}\n"
SPEC = ('cdiVersion: "0.6.0"\nkind: nvidia.com/gpu\ncontainerEdits:\n  hooks:\n'
        + "".join(HOOK % args for args in ('create-symlinks, --link, "a::/b"',
                                           "enable-cuda-compat, --host-driver-version=550.54.15",
                                           "update-ldcache, --folder, /usr/lib",
                                           "enable-cuda-compat, --host-cuda-version=12.4",
                                           "enable-cuda-compat, --odd=1"))
        + """devices:
  - name: "0"
    containerEdits:
      deviceNodes: [{path: /dev/nvidia0, hostPath: /dev/null}]
""")


def test_the_policy_folds_enable_cuda_compat_into_the_one_hook(tmp_path):
    """No nvidia-cdi-hook process left for the toolkit's enable-cuda-compat: its versions go to
    the native hook in the spec's order among the folders; a call with an option we do not know
    stays the spec's."""
    from shim.config import Config
    from shim.nri.messages import nri
    from shim.nri.policy import Policy
    from tests.conftest import write_spec

    write_spec(str(tmp_path / "cdi"), "gpu.yaml", SPEC)
    policy = Policy(Config(spec_dirs=(str(tmp_path / "cdi"),)), ("ml",), "/x/cdi-shim-nshook", lambda *a: None,
                    hook_options=("--socket", "/run/h.sock"))
    pod = nri.PodSandbox(name="p", namespace="ml", annotations={"cdi.k8s.io/g": "nvidia.com/gpu=0"})
    ours, kept = policy.create_container(pod, nri.Container(name="c")).hooks.create_container
    assert list(ours.args) == ["cdi-shim-nshook", "nri", "--socket", "/run/h.sock", "--link", "a::/b",
                               "--cuda-compat", "550.54.15:", "--folder", "/usr/lib", "--cuda-compat", ":12.4"]
    assert list(kept.args) == ["nvidia-cdi-hook", "enable-cuda-compat", "--odd=1"]
