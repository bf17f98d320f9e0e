"""The container sees what nvidia-cdi-hook gives it on the image layouts people run (issue 42).

Each layout is a real image shape: the plain busybox root of the other tests; Debian 12 and 13
from debootstrap (merged /usr: /lib -> usr/lib, Debian's own ld.so.conf.d listing
/lib/x86_64-linux-gnu before /usr/lib/x86_64-linux-gnu); the same merged shape made by hand (no
debootstrap needed to see the folder-spelling rule); an RPM layout (/usr/lib64, /lib64 ->
usr/lib64, a relative `include ld.so.conf.d/*.conf`); a CUDA image (/usr/local/cuda ->
cuda-12.4 with its compat folder, a 000_cuda.conf drop-in, a libcuda.so stub) on Debian 12.

The spec is the toolkit's shape: the driver files mounted into the layout's library folder,
create-symlinks dev links, update-ldcache. The expected container is the real hook's: its
update-ldcache runs glibc's ldconfig in the container's root after the mounts and the
create-symlinks links, without -N or -X (ldconfig_helpers.toolkit_ldconfig, in place, is that
ldconfig run the hook's way on a copy of the image). Facts of that ldconfig on these layouts,
checked here as written: it makes libX.so.1 -> libX.so.<v> beside the mounted file, in the
folder the mount names; its cache names the folder by the spelling ld.so.conf reaches first
(/lib/x86_64-linux-gnu on Debian, through the /lib link; /lib64 on the RPM layout, through the
hook's zz-nvcr drop-in's /lib64 before /usr/lib64); so `ld.so --list` resolves to that
soname path, and the dev link libcuda.so -> libcuda.so.1 opens.

A probe in the container (the host's static busybox and ldconfig, copied in) prints the links
of the library folder, `ldconfig -p` of the container's cache, `ld.so --list` of a program
linked against libnvidia-ml.so.1, and whether the dev links open.
"""
import json
import os
import shutil
import stat
import subprocess
import sys

import pytest

import runtime_helpers as rh
from test_runtime_toolkit_hooks import PROGRAM, VERSION, _absent_params, preinject

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "linker"))
import ldcache_helpers as lh  # noqa: E402
import roots  # noqa: E402

RESIDENT_TOO = True
HOOK = "/usr/bin/nvidia-cdi-hook"
MULTIARCH = "/usr/lib/x86_64-linux-gnu"
DEBIAN_DROPIN = "/usr/local/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n"
CUDA = "/usr/local/cuda-12.4"
COMPAT_VERSION = "560.28.03"

# layout -> (the spec's library folder, the folder as the hook's ldconfig's cache names it)
LAYOUTS = {
    "busybox": (MULTIARCH, MULTIARCH),
    "merged-usr": (MULTIARCH, "/lib/x86_64-linux-gnu"),
    "debian12": (MULTIARCH, "/lib/x86_64-linux-gnu"),
    "debian13": (MULTIARCH, "/lib/x86_64-linux-gnu"),
    "rpm": ("/usr/lib64", "/lib64"),
    "cuda": (MULTIARCH, "/lib/x86_64-linux-gnu"),
}


@pytest.fixture(scope="module")
def debian_trees(tmp_path_factory):
    """{suite: an unpacked debootstrap minbase root}, made once for the module (copied per test)."""
    trees = {}
    base = tmp_path_factory.mktemp("debian")

    def tree(suite):
        if suite not in trees:
            if shutil.which("debootstrap") is None:
                pytest.fail("debootstrap not found: apt-get install debootstrap (scripts/setup-tests.sh)")
            trees[suite] = roots.extract(roots.debootstrap_tarball(suite), str(base / suite))
        return trees[suite]

    return tree


def _write(path, text, mode=0o644):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as out:
        out.write(text)
    os.chmod(path, mode)


def _host_glibc(rootfs, libdir, loader_dir):
    for name in ("libc.so.6", "libm.so.6"):
        shutil.copy2(os.path.realpath(f"/lib/x86_64-linux-gnu/{name}"), rootfs + f"{libdir}/{name}")
    shutil.copy2(os.path.realpath("/lib64/ld-linux-x86-64.so.2"), rootfs + f"{loader_dir}/ld-linux-x86-64.so.2")


def _merged_usr(rootfs, libdir):
    """/bin, /lib, /lib64 as links into /usr (busybox's /bin moved there), as Debian 12 lays it out."""
    for sub in ("usr/bin", "usr/lib", "usr/lib64", libdir.lstrip("/")):
        os.makedirs(os.path.join(rootfs, sub), exist_ok=True)
    for name in os.listdir(rootfs + "/bin"):
        os.rename(os.path.join(rootfs, "bin", name), os.path.join(rootfs, "usr/bin", name))
    os.rmdir(rootfs + "/bin")
    for name in ("bin", "lib", "lib64"):
        os.symlink(f"usr/{name}", os.path.join(rootfs, name))


def merge_usr(rootfs):
    """A glibc image (test_runtime_toolkit_hooks._image) made merged /usr as Debian 12's: its /bin,
    /lib, /lib64 moved into /usr and linked there, Debian's multiarch drop-in; its cache made again."""
    for top in ("bin", "lib", "lib64"):
        os.makedirs(f"{rootfs}/usr/{top}", exist_ok=True)
        if os.path.isdir(f"{rootfs}/{top}") and not os.path.islink(f"{rootfs}/{top}"):
            for name in os.listdir(f"{rootfs}/{top}"):
                os.rename(f"{rootfs}/{top}/{name}", f"{rootfs}/usr/{top}/{name}")
            os.rmdir(f"{rootfs}/{top}")
        os.symlink(f"usr/{top}", f"{rootfs}/{top}")
    _write(rootfs + "/etc/ld.so.conf.d/x86_64-linux-gnu.conf", "# Multiarch support\n" + DEBIAN_DROPIN)
    _write(rootfs + "/etc/debian_version", "12.12\n")
    subprocess.run([lh.LDCONFIG, "-r", rootfs], check=True, timeout=60, capture_output=True)


def make_layout(layout, rootfs, debian_trees):
    """ROOTFS (World.bundle's busybox root) made the LAYOUT's image, with the host's static
    busybox and ldconfig in /probe for the probe."""
    busybox = os.path.join(rootfs, "bin", "busybox")
    shutil.copy2(os.path.realpath(busybox), os.path.join(os.path.dirname(rootfs), "busybox"))
    if layout in ("debian12", "debian13", "cuda"):
        shutil.rmtree(rootfs)
        roots.copy_tree(debian_trees(roots.NEXT_SUITE if layout == "debian13" else roots.SUITE), rootfs)
    elif layout == "busybox":
        os.makedirs(rootfs + MULTIARCH)
        os.makedirs(rootfs + "/lib64")
        _host_glibc(rootfs, MULTIARCH, "/lib64")
        _write(rootfs + "/etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n")
        _write(rootfs + "/etc/ld.so.conf.d/x86_64-linux-gnu.conf", MULTIARCH + "\n")
    elif layout == "merged-usr":
        _merged_usr(rootfs, MULTIARCH)
        _host_glibc(rootfs, MULTIARCH, "/usr/lib64")
        _write(rootfs + "/etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n\n")
        _write(rootfs + "/etc/ld.so.conf.d/x86_64-linux-gnu.conf", "# Multiarch support\n" + DEBIAN_DROPIN)
        _write(rootfs + "/etc/ld.so.conf.d/libc.conf", "# libc default configuration\n/usr/local/lib\n")
        _write(rootfs + "/etc/debian_version", "12.12\n")
    elif layout == "rpm":
        _merged_usr(rootfs, "/usr/lib64")
        _host_glibc(rootfs, "/usr/lib64", "/usr/lib64")
        os.makedirs(rootfs + "/usr/lib64/pgsql")
        _write(rootfs + "/etc/ld.so.conf", "include ld.so.conf.d/*.conf\n")
        _write(rootfs + "/etc/ld.so.conf.d/pgsql-x86_64.conf", "/usr/lib64/pgsql\n")
        _write(rootfs + "/etc/redhat-release", "Rocky Linux release 9.5 (Blue Onyx)\n")
    if layout == "cuda":
        # NVIDIA's CUDA images: the toolkit under /usr/local/cuda-X.Y, reached through links,
        # its lib64 in a drop-in, a libcuda.so stub for linking, the forward-compat libcuda
        for sub in ("targets/x86_64-linux/lib/stubs", "compat"):
            os.makedirs(rootfs + f"{CUDA}/{sub}")
        os.symlink("targets/x86_64-linux/lib", rootfs + f"{CUDA}/lib64")
        os.symlink("cuda-12.4", rootfs + "/usr/local/cuda")
        os.symlink("cuda-12.4", rootfs + "/usr/local/cuda-12")
        rh.library(rootfs + f"{CUDA}/targets/x86_64-linux/lib/stubs/libcuda.so", "libcuda.so.1",
                   "int fake_cuda_major(void) { return -2; }\n")
        rh.library(rootfs + f"{CUDA}/targets/x86_64-linux/lib/libcudart.so.12.4.127", "libcudart.so.12",
                   "int cudart(void) { return 12; }\n")
        os.symlink("libcudart.so.12.4.127", rootfs + f"{CUDA}/targets/x86_64-linux/lib/libcudart.so.12")
        rh.library(rootfs + f"{CUDA}/compat/libcuda.so.{COMPAT_VERSION}", "libcuda.so.1",
                   "int fake_cuda_major(void) { return 560; }\n")
        os.symlink(f"libcuda.so.{COMPAT_VERSION}", rootfs + f"{CUDA}/compat/libcuda.so.1")
        _write(rootfs + "/etc/ld.so.conf.d/000_cuda.conf", "/usr/local/cuda/targets/x86_64-linux/lib\n")
        _write(rootfs + "/etc/ld.so.conf.d/988_cuda-12.conf", "/usr/local/cuda-12/targets/x86_64-linux/lib\n")
        _write(rootfs + "/etc/ld.so.conf.d/nvidia.conf", "/usr/local/nvidia/lib\n/usr/local/nvidia/lib64\n")
    os.makedirs(rootfs + "/probe")
    shutil.copy2(os.path.join(os.path.dirname(rootfs), "busybox"), rootfs + "/probe/busybox")
    shutil.copy2(lh.LDCONFIG, rootfs + "/probe/ldconfig")
    subprocess.run([lh.LDCONFIG, "-r", rootfs], check=True, timeout=60, capture_output=True)


def _hook(*args):
    return (f"    - hookName: createContainer\n      path: {HOOK}\n"
            f"      args: [nvidia-cdi-hook, {', '.join(repr(a) for a in args)}]\n")


def spec(world, driver, libdir, compat=False, dev_links=True):
    """The toolkit's shape for a driver mounted into LIBDIR (COMPAT: its enable-cuda-compat too;
    DEV_LINKS: its create-symlinks of the libcuda.so and libnvidia-ml.so dev links)."""
    mounts = "".join(f"    - hostPath: {driver}/{name}\n      containerPath: {libdir}/{name}\n"
                     "      options: [ro, nosuid, nodev, rbind, rprivate]\n"
                     for name in (f"libnvidia-ml.so.{VERSION}", f"libcuda.so.{VERSION}"))
    return ('cdiVersion: "0.5.0"\nkind: nvidia.com/gpu\n'
            'devices:\n  - name: "0"\n    containerEdits:\n'
            f"      deviceNodes: [{{path: /dev/nvidia0, hostPath: {world.node(0)}}}]\n"
            "containerEdits:\n  hooks:\n"
            + (_hook("create-symlinks", "--link", f"libcuda.so.1::{libdir}/libcuda.so")
               + _hook("create-symlinks", "--link", f"libnvidia-ml.so.{VERSION}::{libdir}/libnvidia-ml.so")
               if dev_links else "")
            + (_hook("enable-cuda-compat", f"--host-driver-version={VERSION}") if compat else "")
            + _hook("update-ldcache", "--folder", libdir)
            + "  mounts:\n" + mounts)


def folder_spec(world, hook, folder, destination, options):
    """A spec of one hook and one folder bound whole at DESTINATION."""
    return ('cdiVersion: "0.5.0"\nkind: nvidia.com/gpu\n'
            'devices:\n  - name: "0"\n    containerEdits:\n'
            f"      deviceNodes: [{{path: /dev/nvidia0, hostPath: {world.node(0)}}}]\n"
            "containerEdits:\n  hooks:\n" + hook
            + f"  mounts:\n    - {{hostPath: {folder}, containerPath: {destination}, options: {options}}}\n")


def probe(libdir):
    b = "/probe/busybox"
    return (f"/prog; for f in {libdir}/*; do [ -L \"$f\" ] && echo \"link ${{f##*/}} $({b} readlink \"$f\")\"; done; "
            f"/probe/ldconfig -p | {b} sed 's/^/cache /'; "
            f"/lib64/ld-linux-x86-64.so.2 --list /prog | {b} grep -E 'libnvidia-ml|libcuda' | {b} sed 's/^/list /'; "
            f"{b} cat {libdir}/libcuda.so > /dev/null && echo opens libcuda.so; "
            f"{b} cat {libdir}/libnvidia-ml.so > /dev/null && echo opens libnvidia-ml.so")


def _run(world, bundle, tmp_path, how):
    """The device asked for HOW (pre-injected or by annotation), BUNDLE run: its output."""
    if how == "preinjected":
        preinject(world, bundle)
    else:
        config = bundle.config()
        config.setdefault("annotations", {})["cdi.k8s.io/test"] = "nvidia.com/gpu=0"
        with open(bundle.config_path, "w") as out:
            json.dump(config, out)
    result = world.shim("run", "--bundle", bundle.path, bundle.id, env=world.env(**_absent_params(tmp_path)))
    assert result.returncode == 0, result.stderr
    return result.stdout


def _seen(output, kind):
    return [line[len(kind) + 1:] for line in output.splitlines() if line.startswith(kind + " ")]


def hook_oracle(rootfs, oracle, driver, libdir, compat_folder=None, dev_links=True):
    """The image after the real hook's work, in ORACLE: runc's mounts (the files copied), the
    create-symlinks links (DEV_LINKS), then update-ldcache's ldconfig in place. Returns the
    cache's bytes."""
    roots.copy_tree(rootfs, oracle)
    os.makedirs(oracle + libdir, 0o755, exist_ok=True)      # (runc's, for the mounts, where the image has none)
    for name in (f"libnvidia-ml.so.{VERSION}", f"libcuda.so.{VERSION}"):
        shutil.copy2(os.path.join(driver, name), oracle + f"{libdir}/{name}")
    if dev_links:
        os.symlink("libcuda.so.1", oracle + f"{libdir}/libcuda.so")
        os.symlink(f"libnvidia-ml.so.{VERSION}", oracle + f"{libdir}/libnvidia-ml.so")
    return lh.toolkit_ldconfig(oracle, [libdir], compat=[compat_folder] if compat_folder else [], in_place=True)


def _links(directory):
    return sorted(f"{name} {os.readlink(os.path.join(directory, name))}" for name in os.listdir(directory)
                  if os.path.islink(os.path.join(directory, name)))


def _entries(listing_lines):
    return sorted(line.strip() for line in listing_lines if "=>" in line)


@pytest.mark.parametrize("how", ["preinjected", "annotation"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_the_container_sees_what_the_hook_gives_it(world, driver, tmp_path, debian_trees, layout, how):
    libdir, cached_as = LAYOUTS[layout]
    compat = layout == "cuda"
    world.write_spec("nvidia-gpu.yaml", spec(world, driver, libdir, compat))
    bundle = world.bundle(args=["/probe/busybox", "sh", "-c", probe(libdir)])
    rootfs = bundle.rootfs
    make_layout(layout, rootfs, debian_trees)
    _program(rootfs, driver, tmp_path)
    oracle = str(tmp_path / "oracle")
    expected_cache = hook_oracle(rootfs, oracle, driver, libdir, f"{CUDA}/compat" if compat else None)
    out = _run(world, bundle, tmp_path, how)
    # (the forward-compat libcuda of the CUDA image is newer than the 550 driver: it loads)
    assert out.splitlines()[0] == f"linked=42 cuda={560 if compat else 550}", out

    # the soname links, beside the mounted files, as the hook's ldconfig makes them (facts)
    links = sorted(_seen(out, "link"))
    assert f"libnvidia-ml.so.1 libnvidia-ml.so.{VERSION}" in links, out
    assert f"libcuda.so.1 libcuda.so.{VERSION}" in links, out
    assert links == _links(oracle + libdir), out

    # the cache, as `ldconfig -p` lists it in the container, entry for entry the hook's
    ours = _entries(_seen(out, "cache"))
    assert f"libnvidia-ml.so.1 (libc6,x86-64) => {cached_as}/libnvidia-ml.so.1" in ours, out
    assert ours == _entries(lh.listing(expected_cache).decode().splitlines()), out

    # the loader resolves the soname path the cache names; the dev links open
    listed = " ".join(_seen(out, "list"))
    assert f"libnvidia-ml.so.1 => {cached_as}/libnvidia-ml.so.1" in listed, out
    assert "opens libcuda.so" in out and "opens libnvidia-ml.so" in out, out


@pytest.mark.parametrize("how", ["preinjected", "annotation"])
def test_a_library_folder_the_image_lacks(world, driver, tmp_path, debian_trees, how):
    """The spec mounts the driver into a folder the image does not have, and no create-symlinks
    link makes it first: runc makes it for the mounts, and the hook's ldconfig makes the soname
    links there and names them in the cache (checked against nvidia-cdi-hook v1.20.0, 2026-12-07:
    before, ours named the versioned files and made no link, so libcuda.so.1 was not there)."""
    libdir = "/opt/nvidia/lib"
    world.write_spec("nvidia-gpu.yaml", spec(world, driver, libdir, dev_links=False))
    bundle = world.bundle(args=["/probe/busybox", "sh", "-c", probe(libdir) + " 2>/dev/null; true"])  # (no dev links)
    make_layout("busybox", bundle.rootfs, debian_trees)
    assert not os.path.exists(bundle.rootfs + "/opt")
    _program(bundle.rootfs, driver, tmp_path)
    oracle = str(tmp_path / "oracle")
    expected_cache = hook_oracle(bundle.rootfs, oracle, driver, libdir, dev_links=False)
    out = _run(world, bundle, tmp_path, how)
    assert out.splitlines()[0] == "linked=42 cuda=550", out
    links = sorted(_seen(out, "link"))
    assert f"libcuda.so.1 libcuda.so.{VERSION}" in links and links == _links(oracle + libdir), out
    ours = _entries(_seen(out, "cache"))
    assert f"libcuda.so.1 (libc6,x86-64) => {libdir}/libcuda.so.1" in ours, out
    assert ours == _entries(lh.listing(expected_cache).decode().splitlines()), out
    assert stat.S_IMODE(os.stat(bundle.rootfs + libdir).st_mode) == 0o755


def _program(rootfs, driver, tmp_path):
    """/prog: linked against libnvidia-ml.so.1, dlopens libcuda.so.1 (PROGRAM)."""
    source = tmp_path / "prog.c"
    source.write_text(PROGRAM)
    link_dir = tmp_path / "link"
    link_dir.mkdir(exist_ok=True)
    if not os.path.lexists(link_dir / "libnvidia-ml.so"):
        os.symlink(driver / f"libnvidia-ml.so.{VERSION}", link_dir / "libnvidia-ml.so")
    rh.gcc("-o", rootfs + "/prog", str(source), f"-L{link_dir}", "-lnvidia-ml", "-ldl")


# ---- one folder, two spellings: compared by place, as the hook (running after runc's mounts,
# inside the container's root) meets them -------------------------------------------------

@pytest.mark.parametrize("how", ["preinjected", "annotation"])
def test_a_folder_mounted_under_one_spelling_and_configured_under_another(world, driver, tmp_path, debian_trees,
                                                                           how):
    """A driver folder bound whole at /usr/lib/x86_64-linux-gnu/nvidia, update-ldcache's
    --folder spelling it /lib/x86_64-linux-gnu/nvidia (merged /usr): the hook's ldconfig scans
    the mounted folder (runc bound it there, the /lib link leads to it), so its libraries are in
    the cache under the drop-in's spelling."""
    folder = tmp_path / "host-folder"
    folder.mkdir()
    shutil.copy2(driver / f"libnvidia-ml.so.{VERSION}", folder)
    world.write_spec("nvidia-gpu.yaml", folder_spec(world, _hook("update-ldcache", "--folder",
                                                                 "/lib/x86_64-linux-gnu/nvidia"),
                                                    folder, f"{MULTIARCH}/nvidia", "[ro, rbind]"))
    bundle = world.bundle(args=["/probe/busybox", "sh", "-c", "/probe/ldconfig -p | /probe/busybox grep nvidia"])
    make_layout("merged-usr", bundle.rootfs, debian_trees)
    oracle = str(tmp_path / "oracle")
    roots.copy_tree(bundle.rootfs, oracle)
    os.makedirs(oracle + f"{MULTIARCH}/nvidia")
    # (bound read-only, as runc binds it: the hook's ldconfig cannot add a soname link there)
    subprocess.run(["mount", "--bind", str(folder), oracle + f"{MULTIARCH}/nvidia"], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", oracle + f"{MULTIARCH}/nvidia"], check=True)
        expected = lh.toolkit_ldconfig(oracle, ["/lib/x86_64-linux-gnu/nvidia"], in_place=True)
    finally:
        subprocess.run(["umount", oracle + f"{MULTIARCH}/nvidia"], check=True)
    out = _run(world, bundle, tmp_path, how)
    # the folder by the drop-in's spelling, as the hook's; the file named where the hook's
    # ldconfig names a soname link it could not make in the read-only mount (docs/hooks.md:
    # soname links in a mounted folder)
    theirs = [e for e in _entries(lh.listing(expected).decode().splitlines()) if "nvidia" in e]
    assert theirs == ["libnvidia-ml.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/nvidia/libnvidia-ml.so.1"]
    assert _entries(out.splitlines()) == [
        f"libnvidia-ml.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/nvidia/libnvidia-ml.so.{VERSION}"], out


@pytest.mark.parametrize("how", ["preinjected", "annotation"])
def test_a_dev_link_to_a_mounted_library_by_another_spelling(world, driver, tmp_path, debian_trees, how):
    """create-symlinks libcuda.so -> /lib/x86_64-linux-gnu/libcuda.so.<v>, the library mounted at
    /usr/lib/x86_64-linux-gnu/libcuda.so.<v>: under the hook the link resolves when its ldconfig
    scans (runc mounted the file first), so the cache lists libcuda.so; it is made before the
    cache is planned here too, not left for after as a link that leads nowhere."""
    world.write_spec("nvidia-gpu.yaml", spec(world, driver, MULTIARCH).replace(
        f"libcuda.so.1::{MULTIARCH}/libcuda.so", f"/lib/x86_64-linux-gnu/libcuda.so.{VERSION}::{MULTIARCH}/libcuda.so"))
    bundle = world.bundle(args=["/probe/busybox", "sh", "-c", probe(MULTIARCH)])
    make_layout("merged-usr", bundle.rootfs, debian_trees)
    _program(bundle.rootfs, driver, tmp_path)
    oracle = str(tmp_path / "oracle")
    roots.copy_tree(bundle.rootfs, oracle)
    for name in (f"libnvidia-ml.so.{VERSION}", f"libcuda.so.{VERSION}"):
        shutil.copy2(driver / name, oracle + f"{MULTIARCH}/{name}")
    os.symlink(f"/lib/x86_64-linux-gnu/libcuda.so.{VERSION}", oracle + f"{MULTIARCH}/libcuda.so")
    os.symlink(f"libnvidia-ml.so.{VERSION}", oracle + f"{MULTIARCH}/libnvidia-ml.so")
    expected = lh.toolkit_ldconfig(oracle, [MULTIARCH], in_place=True)
    out = _run(world, bundle, tmp_path, how)
    ours = _entries(_seen(out, "cache"))
    assert "libcuda.so (libc6,x86-64) => /lib/x86_64-linux-gnu/libcuda.so" in ours, out
    assert ours == _entries(lh.listing(expected).decode().splitlines()), out


@pytest.mark.parametrize("how", ["preinjected", "annotation"])
def test_chmod_of_a_mounted_folder_by_another_spelling(world, driver, tmp_path, debian_trees, how):
    """chmod --mode 711 --path /lib/firmware/nvidia, the folder bound at /usr/lib/firmware/nvidia:
    the hook changes the mounted folder (it runs after runc's mounts), so the container sees
    0711 there, not the image's folder changed under the mount."""
    folder = tmp_path / "firmware"
    folder.mkdir(mode=0o755)
    os.chmod(folder, 0o755)
    world.write_spec("nvidia-gpu.yaml", folder_spec(world, _hook("chmod", "--mode", "711", "--path",
                                                                 "/lib/firmware/nvidia"),
                                                    folder, "/usr/lib/firmware/nvidia", "[rbind]"))
    bundle = world.bundle(args=["/probe/busybox", "stat", "-c", "%a", "/lib/firmware/nvidia"])
    make_layout("merged-usr", bundle.rootfs, debian_trees)
    os.makedirs(bundle.rootfs + "/usr/lib/firmware/nvidia", mode=0o755)
    os.chmod(bundle.rootfs + "/usr/lib/firmware/nvidia", 0o755)
    out = _run(world, bundle, tmp_path, how)
    assert out.strip() == "711", out


@pytest.mark.own_resident
def test_the_merged_usr_shape_is_replayed_by_the_front_end(world, driver, tmp_path):
    """On merged /usr the step makes the soname links beside the mounted files: each way -- the
    worker, the front end's replay, the worker's memo, Python alone -- gives the same container
    (config.json, bundle files, links, linker files), the links there and the cache naming the
    folder as /lib/x86_64-linux-gnu; the second create is the front end's."""
    from test_front_end_replay import Image, each_way

    made = Image(world, driver, tmp_path)
    try:
        merge_usr(made.layer)
        seen = []

        def check(how, bundle):
            links = _links(bundle.rootfs + MULTIARCH)
            cache = lh.listing(open(bundle.rootfs + "/etc/ld.so.cache", "rb").read()).decode()
            seen.append(links)
            assert f"libnvidia-ml.so.1 libnvidia-ml.so.{VERSION}" in links, (how, links)
            assert "=> /lib/x86_64-linux-gnu/libnvidia-ml.so.1\n" in cache, (how, cache)
            return True

        results = each_way(world, made, check)
        assert all(later == results[0] for later in results[1:])
        assert all(links == seen[0] for links in seen[1:]), seen
    finally:
        made.close()
