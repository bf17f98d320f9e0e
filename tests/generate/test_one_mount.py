"""`cdi generate --layout one-mount` (docs/one-mount.md): the driver's libraries and tools in one
host directory, bound at /usr/local/nvidia/lib64 and /usr/local/nvidia/bin, with an
update-ldcache hook for the folder. Real runc through cdi-shim-runtime, the real loader, a
glibc image without LD_LIBRARY_PATH, the fake driver (gcc-built libraries, the fake NVML)."""
import os
import subprocess
import sys

import pytest
import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runtime"))
import runtime_helpers as rh  # noqa: E402

import fakedriver  # noqa: E402
from shim.driver_version import recorded_driver_version  # noqa: E402
from fakedriver import LIBDIR, VERSION, FakeDriver, Runner  # noqa: E402
from shim.generate import hostdir  # noqa: E402

LIB = "/usr/local/nvidia/lib64"
BIN = "/usr/local/nvidia/bin"
NEW_VERSION = "580.82.07"
# The driver's files the one-mount layout moves into lib64's subfolders (hostdir.SEARCH).
MOVED = {"/etc/vulkan/icd.d/nvidia_icd.json", "/etc/vulkan/implicit_layer.d/nvidia_layers.json",
         "/usr/share/glvnd/egl_vendor.d/10_nvidia.json", "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
         "/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json"}

# Linked to libnvidia-ml.so.1 by SONAME (the loader resolves it at start), dlopens libcuda.so.1
# and libcuda.so (the dev link), and says where each came from.
PROGRAM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
int nvmlInit_v2(void);
int nvmlSystemGetDriverVersion(char *version, unsigned int length);
static const char *from(void *symbol) {
    Dl_info info;
    return symbol && dladdr(symbol, &info) && info.dli_fname ? info.dli_fname : "-";
}
int main(void) {
    char version[96] = "";
    int init = nvmlInit_v2();
    nvmlSystemGetDriverVersion(version, sizeof version);
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    int (*f)(void) = cuda ? (int (*)(void))dlsym(cuda, "fake_driver_symbol") : 0;
    void *dev = dlopen("libcuda.so", RTLD_NOW);
    printf("nvml=%d version=%s cuda=%d from=%s dev=%s\n", init, version, f ? f() : -1, from((void *)f),
           dev ? "yes" : dlerror());
    return 0;
}
"""
SCRIPT = ("/prog; echo '== ldd'; /lib64/ld-linux-x86-64.so.2 --list /prog; "
          f"echo '== bin'; {BIN}/nvidia-smi; echo '== lib'; ls {LIB}; echo '== end'")


def _generate(run, world, driver_dir, *extra):
    own = os.path.join(world.spec_dir, "nvidia-gpu.yaml")   # the world's own nvidia.com/gpu spec
    if os.path.exists(own):
        os.unlink(own)
    return run.generate("--layout", "one-mount", "--driver-dir", driver_dir,
                        "--output", os.path.join(world.spec_dir, "nvidia.yaml"), *extra, output=False)


def _image(world, run, tmp_path, args=("sh", "-c", SCRIPT), edit=None, tag="c"):
    bundle = world.bundle(args=args, env=["FAKE_NVML_CONFIG=/fake-nvml.conf"], edit=edit, tag=tag)
    work = tmp_path / f"build-{bundle.id}"
    work.mkdir()
    rh.glibc_image(bundle.rootfs, PROGRAM, run.driver.nvml, str(work), ["-ldl"])
    with open(run.config) as src, open(os.path.join(bundle.rootfs, "fake-nvml.conf"), "w") as out:
        out.write(src.read())
    return bundle


def _ldconfig(rootfs):
    subprocess.run([rh.need("ldconfig", "libc-bin"), "-r", rootfs], check=True, timeout=60)


def _run(world, bundle, uuid):
    done = world.shim("--device", f"nvidia.com/gpu={uuid}", "run", "--bundle", bundle.path, bundle.id)
    assert done.returncode == 0, done.stderr
    assert "update-ldcache" not in bundle.read_bytes().decode()     # the cache made natively, the hook dropped
    return done.stdout + ("== stderr\n" + done.stderr if done.stderr else "")


def _sections(text):
    out, current = {"prog": []}, "prog"
    for line in text.splitlines():
        if line.startswith("== "):
            current = line[3:]
            out[current] = []
        else:
            out[current].append(line)
    return out


@pytest.fixture
def world(tmp_path):
    made = rh.World(tmp_path / "world")
    yield made
    made.cleanup()


def test_the_spec_binds_one_folder_and_keeps_the_rest(driver, run, tmp_path):
    """The spec: two directory binds where the library and binary binds were, an update-ldcache
    hook for the folder (and VDPAU's), the device nodes, ICD and config files, firmware and IPC
    sockets as before; the host directory holds hard links to the driver's files (same
    filesystem), the SONAME and dev links, and is root's, 0755."""
    base = str(tmp_path / "driver-dirs")
    out = str(tmp_path / "spec.yaml")
    run.generate("--layout", "one-mount", "--driver-dir", base, "--output", out, output=False)
    with open(out) as stream:
        spec = yaml.safe_load(stream)
    files = run.generate("--output", str(tmp_path / "files.yaml"), output=False)
    assert files.returncode == 0
    with open(tmp_path / "files.yaml") as stream:
        default = yaml.safe_load(stream)
    (name,) = os.listdir(base)
    assert name.startswith(VERSION + "-")
    host = os.path.join(base, name)
    mounts = {m["containerPath"]: m for m in spec["containerEdits"]["mounts"]}
    assert mounts[LIB]["hostPath"] == host + "/lib64"
    assert mounts[BIN]["hostPath"] == host + "/bin"
    assert not [p for p in mounts if p.startswith(LIBDIR + "/lib") or p.startswith("/usr/bin/")], sorted(mounts)
    kept = {m["containerPath"] for m in default["containerEdits"]["mounts"]
            if not m["containerPath"].startswith((LIBDIR + "/", "/usr/bin/")) and m["containerPath"] not in MOVED}
    assert kept <= set(mounts), kept - set(mounts)          # OpenCL, nvoptix, Xorg, firmware, IPC: as before
    assert not MOVED & set(mounts) and not [p for p in mounts if p.startswith(LIBDIR)], sorted(mounts)
    assert spec["devices"] == default["devices"]
    hooks = spec["containerEdits"]["hooks"]
    ldcache = [h for h in hooks if "update-ldcache" in h["args"]]
    assert ldcache[0]["args"][-2:] == ["--folder", LIB] and ldcache[0]["args"].count("--folder") == 1
    links = [h for h in hooks if "create-symlinks" in h["args"]]
    left = [a for h in links for a in h["args"] if "::" in a]
    assert not [a for a in left if a.partition("::")[2].startswith(LIBDIR + "/")], left   # none in its folders
    env = spec["containerEdits"]["env"]
    assert f"NVIDIA_CTK_LIBCUDA_DIR={LIB}" in env
    assert f"GBM_BACKENDS_PATH={LIB}/gbm:{LIBDIR}/gbm:/usr/lib64/gbm:/usr/lib/gbm" in env, env
    assert f"XDG_CONFIG_DIRS={LIB}/xdg:/etc/xdg" in env, env
    assert os.readlink(host + "/lib64/gbm/nvidia-drm_gbm.so") == "../libnvidia-allocator.so.1"
    assert os.readlink(host + "/lib64/vdpau/libvdpau_nvidia.so.1") == f"libvdpau_nvidia.so.{VERSION}"
    assert os.path.isfile(host + "/lib64/xdg/vulkan/icd.d/nvidia_icd.json")
    assert hostdir.problems(host) == []
    assert recorded_driver_version(spec) == VERSION      # (stale-spec checks read it from the directory's name)
    lib = os.listdir(host + "/lib64")
    for want in (f"libcuda.so.{VERSION}", "libcuda.so.1", "libcuda.so", "libnvidia-ml.so.1", "libGLX_indirect.so.0"):
        assert want in lib, lib
    assert os.readlink(host + "/lib64/libcuda.so") == "libcuda.so.1"
    assert os.stat(host + f"/lib64/libcuda.so.{VERSION}").st_ino == os.stat(
        driver.libdir + f"/libcuda.so.{VERSION}").st_ino                # a hard link, not a copy
    assert sorted(os.listdir(host + "/bin")) == sorted(fakedriver.BINARIES)
    for path in (base, host, host + "/lib64", host + "/bin"):
        info = os.stat(path)
        assert (info.st_uid, info.st_mode & 0o7777) == (0, 0o755), path
    again = run.generate("--layout", "one-mount", "--driver-dir", base, "--output", out, output=False)
    assert again.returncode == 0 and os.listdir(base) == [name]          # the same driver: the same directory


def test_dry_run_makes_nothing(run, tmp_path):
    base = str(tmp_path / "driver-dirs")
    done = run.generate("--layout", "one-mount", "--driver-dir", base, "--dry-run", output=False)
    assert f"{base}/{VERSION}-" in done.stdout
    assert not os.path.exists(base)


def test_a_copy_where_hard_links_cannot_be_made(run, tmp_path):
    """A base on another filesystem than the driver (/dev/shm, a tmpfs): copies, root's, 0755 when
    the source is executable (gcc makes libraries so), else 0644."""
    base = os.path.join("/dev/shm", f"cdi-shim-test-{os.getpid()}")
    try:
        run.generate("--layout", "one-mount", "--driver-dir", base, "--output", str(tmp_path / "s.yaml"), output=False)
        (name,) = os.listdir(base)
        lib = os.path.join(base, name, "lib64", f"libcuda.so.{VERSION}")
        info = os.stat(lib)
        source = os.stat(run.driver.libdir + f"/libcuda.so.{VERSION}")
        assert info.st_ino != source.st_ino and info.st_nlink == 1
        assert (info.st_uid, info.st_mode & 0o777) == (0, 0o755 if source.st_mode & 0o111 else 0o644)
        with open(lib, "rb") as a, open(run.driver.libdir + f"/libcuda.so.{VERSION}", "rb") as b:
            assert a.read() == b.read()
        assert os.stat(os.path.join(base, name, "bin", "nvidia-smi")).st_mode & 0o777 == 0o755
    finally:
        import shutil
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.runtime_e2e
@pytest.mark.parametrize("readonly", [False, True], ids=["rw-rootfs", "ro-rootfs"])
def test_a_program_finds_the_driver_through_the_cache(driver, run, world, tmp_path, readonly):
    """No LD_LIBRARY_PATH in the image: the loader resolves libnvidia-ml.so.1 (DT_NEEDED) and
    dlopen resolves libcuda.so.1 and libcuda.so through the cache, at the folder; the tools run
    from /usr/local/nvidia/bin. A read-only rootfs too."""
    _generate(run, world, str(tmp_path / "driver-dirs"))

    def ro(config):
        config["root"]["readonly"] = readonly

    bundle = _image(world, run, tmp_path, edit=ro)
    _ldconfig(bundle.rootfs)
    report = _sections(_run(world, bundle, driver.uuids(2)[0]))
    assert report["prog"] == [f"nvml=0 version={VERSION} cuda=42 from={LIB}/libcuda.so.1 dev=yes"], report
    assert f"libnvidia-ml.so.1 => {LIB}/libnvidia-ml.so.1" in " ".join(report["ldd"]), report["ldd"]
    assert report["bin"] == [f"nvidia-smi {VERSION}"]
    assert "end" in report


@pytest.mark.runtime_e2e
def test_an_image_with_its_own_usr_local_nvidia_is_shadowed(driver, run, world, tmp_path):
    """The rule: the binds shadow the image's /usr/local/nvidia/lib64 and bin (GKE's convention
    owns them); the image's stale libcuda.so.1 there is neither seen nor in the cache, and the
    rest of its /usr/local/nvidia stays."""
    _generate(run, world, str(tmp_path / "driver-dirs"))
    bundle = _image(world, run, tmp_path, args=("sh", "-c", SCRIPT + "; cat /usr/local/nvidia/NOTICE"))
    rootfs = bundle.rootfs
    os.makedirs(rootfs + LIB)
    os.makedirs(rootfs + BIN)
    _stale_library(rootfs + LIB + "/libcuda.so.1", tmp_path)
    with open(rootfs + BIN + "/nvidia-smi", "w") as out:
        out.write("#!/bin/sh\necho stale\n")
    os.chmod(rootfs + BIN + "/nvidia-smi", 0o755)
    with open(rootfs + "/usr/local/nvidia/NOTICE", "w") as out:
        out.write("the image's own\n")
    with open(rootfs + "/etc/ld.so.conf.d/nvidia.conf", "w") as out:
        out.write(LIB + "\n")
    _ldconfig(rootfs)
    report = _sections(_run(world, bundle, driver.uuids(2)[0]))
    assert report["prog"] == [f"nvml=0 version={VERSION} cuda=42 from={LIB}/libcuda.so.1 dev=yes"], report
    assert report["bin"] == [f"nvidia-smi {VERSION}"]
    assert report["end"] == ["the image's own"]


@pytest.mark.runtime_e2e
def test_an_image_link_at_the_folder_leads_inside_the_container(driver, run, world, tmp_path):
    """The image has /usr/local/nvidia/lib64 as a link to /opt/gpu-libs (absolute, as a hostile
    image would): runc resolves the mount point inside the rootfs, so the bind lands on the
    container's /opt/gpu-libs (never a host path), and the program still finds the driver
    through the cache at the folder."""
    _generate(run, world, str(tmp_path / "driver-dirs"))
    bundle = _image(world, run, tmp_path, args=("sh", "-c", SCRIPT + "; ls /opt/gpu-libs | grep -c libcuda"))
    os.makedirs(bundle.rootfs + "/opt/gpu-libs")
    os.makedirs(bundle.rootfs + "/usr/local/nvidia")
    os.symlink("/opt/gpu-libs", bundle.rootfs + LIB)
    _ldconfig(bundle.rootfs)
    report = _sections(_run(world, bundle, driver.uuids(2)[0]))
    assert report["prog"] == [f"nvml=0 version={VERSION} cuda=42 from={LIB}/libcuda.so.1 dev=yes"], report
    assert int(report["end"][0]) >= 3, report["end"]                 # the bind is at the link's target, inside
    assert os.listdir(bundle.rootfs + "/opt/gpu-libs") == []           # (the image's own folder, untouched)


def _stale_library(path, tmp_path):
    src = tmp_path / "stale.c"
    src.write_text("int fake_driver_symbol(void) { return 7; }\n")
    rh.gcc("-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", path, str(src))


@pytest.mark.runtime_e2e
def test_a_driver_upgrade_under_a_running_container(tmp_path):
    """A container running with driver A; the driver is upgraded to B (A's files removed, as a
    package manager does) and the spec regenerated: a new host directory, the old one kept
    while the container binds it. The running container then loads its libraries (A's,
    through its bind); a new container gets B's; once the old container is gone the next
    generation removes A's directory."""
    fake = FakeDriver(tmp_path / "fake", gpus=2)
    world = rh.World(tmp_path / "world")
    try:
        (tmp_path / "runner").mkdir()
        run = Runner(fake, tmp_path / "runner")
        base = str(tmp_path / "driver-dirs")
        _generate(run, world, base)
        (old,) = os.listdir(base)
        waiting = ("while [ ! -e /go ]; do sleep 0.05; done; " + SCRIPT)
        first = _image(world, run, tmp_path, args=("sh", "-c", waiting), tag="old")
        _ldconfig(first.rootfs)
        out_path = tmp_path / "first.out"
        with open(out_path, "wb") as out:
            done = world.shim("--device", f"nvidia.com/gpu={fake.uuids(2)[0]}", "create", "--bundle", first.path,
                              first.id, stdout=out, stderr=None, capture_output=False)
        assert done.returncode == 0
        assert "update-ldcache" not in first.read_bytes().decode()
        assert world.shim("start", first.id).returncode == 0

        fake.upgrade(NEW_VERSION)
        run.gpus(2)
        _generate(run, world, base)
        names = sorted(os.listdir(base))
        new = next(n for n in names if n.startswith(NEW_VERSION + "-"))
        assert old in names, names                                    # bound by the running container
        assert not os.path.exists(fake.libdir + f"/libcuda.so.{VERSION}")

        second = _image(world, run, tmp_path, tag="new")
        _ldconfig(second.rootfs)
        report = _sections(_run(world, second, fake.uuids(2)[0]))
        assert report["prog"] == [f"nvml=0 version={NEW_VERSION} cuda=42 from={LIB}/libcuda.so.1 dev=yes"], report
        assert f"libcuda.so.{NEW_VERSION}" in report["lib"]

        open(os.path.join(first.rootfs, "go"), "w").close()
        world.wait_stopped(first.id)
        report = _sections(out_path.read_text())
        assert report["prog"][0].endswith(f"cuda=42 from={LIB}/libcuda.so.1 dev=yes"), report
        assert f"libcuda.so.{VERSION}" in report["lib"] and f"libcuda.so.{NEW_VERSION}" not in report["lib"]
        assert report["bin"] == [f"nvidia-smi {VERSION}"]
        assert world.shim("delete", first.id).returncode == 0

        _generate(run, world, base)
        assert os.listdir(base) == [new]                              # the old one collected
    finally:
        world.cleanup()
        fake.close()


def test_watch_keeps_the_host_directory(run, tmp_path):
    """`generate --watch --once --layout one-mount`: the spec written, its host directory made,
    a leftover of an older driver that no spec names and nothing binds removed; a second
    attempt finds the spec current and changes nothing."""
    base = tmp_path / "driver-dirs"
    (base / "535.54.03-0123456789ab" / "lib64").mkdir(parents=True)
    argv = ("--watch", "--once", "--layout", "one-mount", "--driver-dir", str(base))
    done = run.generate(*argv)
    assert "removed unused host directories 535.54.03-0123456789ab" in done.stderr, done.stderr
    (name,) = os.listdir(base)
    with open(run.output) as stream:
        assert f"{base}/{name}/lib64" in stream.read()
    again = run.generate(*argv)
    assert "wrote" not in again.stderr and os.listdir(base) == [name], again.stderr


def test_the_layout_choices_are_hostdir_s():
    """`cdi generate --layout` and `install --node --layout` offer hostdir.LAYOUTS, default first."""
    from shim.cli.install import install
    from shim.cli.specs import generate
    from shim.generate import hostdir

    for command in (generate, install):
        (option,) = [p for p in command.params if p.name == "layout"]
        assert tuple(option.type.choices) == hostdir.LAYOUTS and option.default == hostdir.LAYOUTS[0]


# For each variable the spec sets, the file its loader looks for in the folders it names
# (the first folder that has it): what each loader (Vulkan, glvnd, NVIDIA's EGL, Mesa's GBM,
# libvdpau) opens there, read in the container from the container's environment.
LOOKUPS = (
    ("XDG_CONFIG_DIRS", "vulkan/icd.d/nvidia_icd.json"),
    ("XDG_CONFIG_DIRS", "vulkan/implicit_layer.d/nvidia_layers.json"),
    ("__EGL_VENDOR_LIBRARY_DIRS", "10_nvidia.json"),
    ("__EGL_EXTERNAL_PLATFORM_CONFIG_DIRS", "15_nvidia_gbm.json"),
    ("GBM_BACKENDS_PATH", "nvidia-drm_gbm.so"),
    ("VDPAU_DRIVER_PATH", "libvdpau_nvidia.so.1"),
)
FIND = ("for pair in " + " ".join(f"{v}:{f}" for v, f in LOOKUPS) + "; do "
        "var=${pair%%:*}; file=${pair#*:}; eval dirs=\\$$var; found=-; "
        "for d in $(echo $dirs | tr : ' '); do if [ -e $d/$file ]; then found=$d/$file; break; fi; done; "
        "echo \"$var $found\"; done; "
        "/lib64/ld-linux-x86-64.so.2 --list /usr/local/nvidia/lib64/gbm/nvidia-drm_gbm.so >/dev/null && echo gbm-loads")


@pytest.mark.runtime_e2e
def test_each_moved_file_is_where_its_loader_looks(driver, run, world, tmp_path):
    """In the container (real runc, the spec's env): each variable's first folder that has the
    loader's file is in /usr/local/nvidia/lib64; the GBM backend link resolves to a loadable
    library; the image's own Mesa GBM backend folder is still in the list; the program still
    finds the driver through the cache."""
    _generate(run, world, str(tmp_path / "driver-dirs"))
    bundle = _image(world, run, tmp_path, args=("sh", "-c", "/prog; echo '== find'; " + FIND))
    _ldconfig(bundle.rootfs)
    report = _sections(_run(world, bundle, driver.uuids(2)[0]))
    assert report["prog"] == [f"nvml=0 version={VERSION} cuda=42 from={LIB}/libcuda.so.1 dev=yes"], report
    found = dict(line.split(" ", 1) for line in report["find"][:-1])
    assert found == {
        "XDG_CONFIG_DIRS": f"{LIB}/xdg/vulkan/implicit_layer.d/nvidia_layers.json",
        "__EGL_VENDOR_LIBRARY_DIRS": f"{LIB}/glvnd/egl_vendor.d/10_nvidia.json",
        "__EGL_EXTERNAL_PLATFORM_CONFIG_DIRS": f"{LIB}/egl/egl_external_platform.d/15_nvidia_gbm.json",
        "GBM_BACKENDS_PATH": f"{LIB}/gbm/nvidia-drm_gbm.so",
        "VDPAU_DRIVER_PATH": f"{LIB}/vdpau/libvdpau_nvidia.so.1",
    }, report["find"]
    assert f"XDG_CONFIG_DIRS {LIB}/xdg/vulkan/icd.d/nvidia_icd.json" in report["find"], report["find"]
    assert report["find"][-1] == "gbm-loads", report
