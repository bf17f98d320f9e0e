"""The container sees what the toolkit's nvidia-cdi-hook would give it (issue 32).

Each test runs real runc on a small glibc image, through cdi-shim-runtime with the config
pre-injected (containerd's own CDI) or requested by annotation, and a probe inside the
container. The expected results are facts of nvidia-cdi-hook 1.20.0 (NVIDIA/nvidia-container-
toolkit v1.20.0, cmd/nvidia-cdi-hook/...), quoted where they come from; the real hook cannot
run in CI (its source is not reachable there), so the facts are written here.
"""
import json
import os
import subprocess
import sys

import pytest

import runtime_helpers as rh
from test_runtime_toolkit_hooks import (COMPAT, LIBDIR, VERSION, _absent_params, _hook, _image, preinject,
                                        toolkit_spec)

RESIDENT_TOO = True

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "linker"))


def _request(world, bundle, how):
    """nvidia.com/gpu=0 for BUNDLE: written into its config.json (pre-injected) or asked by annotation."""
    if how == "preinjected":
        preinject(world, bundle)
        return
    config = bundle.config()
    config.setdefault("annotations", {})["cdi.k8s.io/test"] = "nvidia.com/gpu=0"
    with open(bundle.config_path, "w") as out:
        json.dump(config, out)


def _listing(output, path):
    """The target of PATH in the probe's `ls -l` lines ('' when not a link, None when absent)."""
    for line in output.splitlines():
        parts = line.split()    # (busybox: mode, links, owner, group, size, month, day, time, name)
        if parts[8:9] == [path]:
            return parts[10] if parts[9:10] == ["->"] else ""
    return None


# ---- create-symlinks -----------------------------------------------------------------------
#
# create-symlinks.go, createLink: "If a file exists at the link path or the link points to a
# different target this file is removed before creating the link"; "If the specified link
# already exists and points to the same target, this operation is a no-op" (linkExists: lstat,
# readlink, the text compared). container-root_linux.go: symlinkat of "<name>-<uuid>" in the
# link's directory, then renameat over the name. The flag's text: "If the link exists in the
# container root, it is removed."

@pytest.mark.parametrize("how", ["preinjected", "annotation"])
def test_create_symlinks_replaces_what_is_at_the_link_path(world, driver, tmp_path, how):
    """The image's own libcuda.so.1 (a file, soname libcuda.so.1, an old driver: major 100), a
    libcuda.so link to another name and an identical libnvidia-ml.so link: the spec's links
    replace the first two (the cache follows: libcuda.so.1 loads the mounted 550 driver, as
    ldconfig after the hook finds it), and the identical one is left (same inode)."""
    world.write_spec("nvidia-gpu.yaml", toolkit_spec(
        world, driver, _hook("create-symlinks", "--link", f"libcuda.so.{VERSION}::{LIBDIR}/libcuda.so.1")))
    probe = f"/prog; ls -l {LIBDIR}/"
    bundle = world.bundle(args=["sh", "-c", probe])
    rootfs = bundle.rootfs
    rh.glibc_image(rootfs, __import__("test_runtime_toolkit_hooks").PROGRAM,
                   str(driver / f"libnvidia-ml.so.{VERSION}"), str(tmp_path), ["-ldl"])
    rh.library(rootfs + f"{LIBDIR}/libcuda.so.1", "libcuda.so.1", "int fake_cuda_major(void) { return 100; }\n")
    os.symlink("libcuda.so.0", rootfs + f"{LIBDIR}/libcuda.so")
    os.symlink(f"libnvidia-ml.so.{VERSION}", rootfs + f"{LIBDIR}/libnvidia-ml.so")
    subprocess.run([rh.need("ldconfig", "libc-bin"), "-r", rootfs], check=True, timeout=60)
    identical = os.lstat(rootfs + f"{LIBDIR}/libnvidia-ml.so").st_ino
    _request(world, bundle, how)

    result = world.shim("run", "--bundle", bundle.path, bundle.id, env=world.env(**_absent_params(tmp_path)))
    assert result.returncode == 0, result.stderr
    # the image's libcuda.so.1 is gone: the spec's link to the mounted 550 library took its place
    assert result.stdout.splitlines()[0] == "linked=42 cuda=550", result.stdout
    assert _listing(result.stdout, "libcuda.so.1") == f"libcuda.so.{VERSION}", result.stdout
    assert _listing(result.stdout, "libcuda.so") == "libcuda.so.1", result.stdout
    assert _listing(result.stdout, "libnvidia-ml.so") == f"libnvidia-ml.so.{VERSION}", result.stdout
    assert os.lstat(rootfs + f"{LIBDIR}/libnvidia-ml.so").st_ino == identical
    assert not [name for name in os.listdir(rootfs + LIBDIR) if "cdi-shim" in name]   # no temporary link left


@pytest.mark.parametrize("how", ["preinjected", "annotation"])
@pytest.mark.parametrize("image_link", [False, True], ids=["stub-alone", "stub-with-its-soname-link"])
def test_a_replaced_file_s_link_to_a_soname_link_dangles_during_the_scan(world, driver, tmp_path, how, image_link):
    """The image's own file at libcuda.so (a stub, soname libcuda.so.1); the spec's dev link
    libcuda.so -> libcuda.so.1 replaces it, but libcuda.so.1 is the soname link the hook's
    ldconfig makes only after its scan: the link dangles during the scan and the toolkit's cache
    lists no libcuda.so (observed with the real hook, benchmarks/hook_differential.py), while
    the stub's entry is gone. With the image's own soname link libcuda.so.1 -> libcuda.so (its
    ldconfig's, to the stub) the spec's link makes a loop during the scan: the same. In the
    container the link resolves."""
    import ldcache_helpers as lh

    world.write_spec("nvidia-gpu.yaml", toolkit_spec(world, driver))
    bundle = world.bundle(args=["sh", "-c", f"/prog; cat {LIBDIR}/libcuda.so > /dev/null && echo dev-link-opens"])
    rootfs = _image(bundle, driver, tmp_path, compat=False)
    rh.library(rootfs + f"{LIBDIR}/libcuda.so", "libcuda.so.1", "int fake_cuda_major(void) { return 100; }\n")
    subprocess.run([rh.need("ldconfig", "libc-bin"), "-r", rootfs], check=True, timeout=60)
    assert os.readlink(rootfs + f"{LIBDIR}/libcuda.so.1") == "libcuda.so"     # (ldconfig's, to the stub)
    if not image_link:
        os.unlink(rootfs + f"{LIBDIR}/libcuda.so.1")
    _request(world, bundle, how)

    result = world.shim("run", "--bundle", bundle.path, bundle.id, env=world.env(**_absent_params(tmp_path)))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "linked=42 cuda=550\ndev-link-opens\n", result.stdout
    assert os.readlink(rootfs + f"{LIBDIR}/libcuda.so") == "libcuda.so.1"
    assert os.readlink(rootfs + f"{LIBDIR}/libcuda.so.1") == f"libcuda.so.{VERSION}"
    listed = lh.listing(open(rootfs + "/etc/ld.so.cache", "rb").read()).decode()
    assert f"=> {LIBDIR}/libcuda.so.1" in listed and f"=> {LIBDIR}/libcuda.so\n" not in listed, listed


@pytest.mark.parametrize("how", ["preinjected", "annotation"])
def test_create_symlinks_onto_a_directory_fails_the_create(world, driver, tmp_path, how):
    """renameat of the hook's temporary link over a directory fails (EISDIR): the hook exits
    non-zero ("failed to create link [...]: failed to create symlink: ...: is a directory") and
    runc fails the create. Here the create fails before runc, naming the link; config.json is
    left as it was and no container exists."""
    world.write_spec("nvidia-gpu.yaml", toolkit_spec(world, driver))
    bundle = world.bundle(args=["/prog"])
    rootfs = _image(bundle, driver, tmp_path, compat=False)
    os.makedirs(rootfs + f"{LIBDIR}/libcuda.so/inside")
    _request(world, bundle, how)
    before = bundle.read_bytes()

    result = world.shim("create", "--bundle", bundle.path, bundle.id, env=world.env(**_absent_params(tmp_path)))
    assert result.returncode != 0
    assert "create-symlinks" in result.stderr and f"{LIBDIR}/libcuda.so" in result.stderr, result.stderr
    assert "is a directory" in result.stderr, result.stderr
    assert bundle.read_bytes() == before
    assert os.path.isdir(rootfs + f"{LIBDIR}/libcuda.so/inside")
    assert world.runc_cmd("state", bundle.id).returncode != 0


# ---- update-ldcache: ldconfig's soname links ------------------------------------------------
#
# update-ldcache.go (1.20.0) runs the host's ldconfig in the container's root after runc's
# mounts, as `ldconfig -f /etc/ld.so.conf -C /etc/ld.so.cache` -- without -N or -X, so glibc's
# search_dir makes each kept library's soname link (create_links: libX.so.1 -> libX.so.<v>)
# after reading the directory, and the cache names DIR/SONAME. The spec's create-symlinks hooks
# come before it: a link made then to a soname link not made yet dangles during the scan.

def _links_in(directory):
    return {name: os.readlink(os.path.join(directory, name)) for name in os.listdir(directory)
            if os.path.islink(os.path.join(directory, name))}


@pytest.mark.parametrize("how", ["preinjected", "annotation"])
def test_soname_links_and_cache_as_the_hook_s_ldconfig_makes_them(world, driver, tmp_path, how):
    """The toolkit's spec (two file-mounted libraries, its create-symlinks dev links, update-
    ldcache): the container has the links the hook's ldconfig gives the same image -- the soname
    links beside the mounted libraries, the dev link libcuda.so -> libcuda.so.1 no longer
    dangling -- and the cache lists what that ldconfig's lists, path for path."""
    import shutil

    import ldcache_helpers as lh

    world.write_spec("nvidia-gpu.yaml", toolkit_spec(world, driver))
    probe = f"/prog; ls -l {LIBDIR}/; cat {LIBDIR}/libcuda.so > /dev/null && echo dev-link-opens"
    bundle = world.bundle(args=["sh", "-c", probe])
    rootfs = _image(bundle, driver, tmp_path, compat=False)
    oracle = str(tmp_path / "oracle")
    shutil.copytree(rootfs, oracle, symlinks=True)
    _request(world, bundle, how)

    result = world.shim("run", "--bundle", bundle.path, bundle.id, env=world.env(**_absent_params(tmp_path)))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("linked=42 cuda=550\n") and "dev-link-opens" in result.stdout, result.stdout

    # the toolkit's way: the mounts, the create-symlinks links, then its ldconfig in place
    for name in (f"libnvidia-ml.so.{VERSION}", f"libcuda.so.{VERSION}"):
        shutil.copy2(driver / name, oracle + f"{LIBDIR}/{name}")
    os.symlink("libcuda.so.1", oracle + f"{LIBDIR}/libcuda.so")
    os.symlink(f"libnvidia-ml.so.{VERSION}", oracle + f"{LIBDIR}/libnvidia-ml.so")
    expected = lh.toolkit_ldconfig(oracle, [LIBDIR, f"{LIBDIR}/vdpau"], in_place=True)
    assert _links_in(oracle + LIBDIR) == {"libcuda.so": "libcuda.so.1", "libcuda.so.1": f"libcuda.so.{VERSION}",
                                          "libnvidia-ml.so": f"libnvidia-ml.so.{VERSION}",
                                          "libnvidia-ml.so.1": f"libnvidia-ml.so.{VERSION}"}   # (the facts)
    seen = {name: _listing(result.stdout, name) for name in os.listdir(oracle + LIBDIR)}
    assert {name: target for name, target in seen.items() if target} == _links_in(oracle + LIBDIR), result.stdout
    assert _links_in(rootfs + LIBDIR) == _links_in(oracle + LIBDIR)

    def entries(cache):
        return [line for line in lh.listing(cache).decode().splitlines()[1:] if "Cache generated" not in line]

    ours = open(rootfs + "/etc/ld.so.cache", "rb").read()      # (written where the hook's ldconfig writes it)
    assert entries(ours) == entries(expected)
    assert f"\tlibnvidia-ml.so.1 (libc6,x86-64) => {LIBDIR}/libnvidia-ml.so.1" in entries(ours)


def test_no_soname_links_without_update_ldcache(world, driver, tmp_path):
    """No update-ldcache hook: no ldconfig runs under the toolkit, so no link is made."""
    spec = toolkit_spec(world, driver).replace(
        _hook("update-ldcache", "--folder", LIBDIR, "--folder", f"{LIBDIR}/vdpau"), "")
    assert "update-ldcache" not in spec
    world.write_spec("nvidia-gpu.yaml", spec)
    bundle = world.bundle(args=["/prog"])
    rootfs = _image(bundle, driver, tmp_path, compat=False)
    preinject(world, bundle)
    result = world.shim("run", "--bundle", bundle.path, bundle.id, env=world.env(**_absent_params(tmp_path)))
    assert result.returncode == 0 and result.stdout == "linked=42 cuda=550\n", result.stderr
    assert not os.path.lexists(rootfs + f"{LIBDIR}/libnvidia-ml.so.1")
    assert not os.path.lexists(rootfs + f"{LIBDIR}/libcuda.so.1")


# ---- update-ldcache: a later ldconfig in the container ---------------------------------------
#
# ldconfig.go (internal/ldconfig, 1.20.0), UpdateLDCache, pivoted into the container's root:
# ensureLdsoconfFile creates /etc/ld.so.conf (O_CREATE|O_EXCL, 0644: "include
# /etc/ld.so.conf.d/*.conf") only where none is; createLdsoconfdFile writes the folders not yet
# configured to /etc/ld.so.conf.d/00-nvcr-*.conf and the container's system directories (not
# Debian-like: /lib /usr/lib /lib64 /usr/lib64 /libx32 /usr/libx32) to zz-nvcr-*.conf
# (os.CreateTemp, then Chmod 0644, MkdirAll 0755 of the folder); then `ldconfig -f
# /etc/ld.so.conf -C /etc/ld.so.cache` renames its new cache over /etc/ld.so.cache (mode 0644).
# All of it is left in the root, so an entrypoint's own `ldconfig` works and keeps the folders.
# (runc runs createContainer hooks before it remounts a read-only root: the hook writes the image
# there too, and a later ldconfig fails on the read-only /etc; ours works: docs/hooks.md.)

FOLDER = "/usr/local/nvidia/lib64"
SYSTEM_DIRS = "/lib\n/usr/lib\n/lib64\n/usr/lib64\n/libx32\n/usr/libx32\n"


def _later_ldconfig_spec(world, driver):
    mounts = "".join(f"    - hostPath: {driver}/{name}\n      containerPath: {FOLDER}/{name}\n"
                     "      options: [ro, nosuid, nodev, rbind, rprivate]\n"
                     for name in (f"libnvidia-ml.so.{VERSION}", f"libcuda.so.{VERSION}"))
    return ('cdiVersion: "0.5.0"\nkind: nvidia.com/gpu\n'
            'devices:\n  - name: "0"\n    containerEdits:\n'
            f"      deviceNodes: [{{path: /dev/nvidia0, hostPath: {world.node(0)}}}]\n"
            "containerEdits:\n  hooks:\n" + _hook("update-ldcache", "--folder", FOLDER) + "  mounts:\n" + mounts)


LATER = (f"/sbin/ldconfig; echo ldconfig=$?; /prog; /sbin/ldconfig -p | grep -c {FOLDER}/; "
         "cat /etc/ld.so.conf.d/00-nvcr-*.conf; ls /etc/ld.so.conf.d")


@pytest.mark.parametrize("readonly", [False, True], ids=["rw-rootfs", "readonly-rootfs"])
@pytest.mark.parametrize("how", ["preinjected", "annotation"])
def test_a_later_ldconfig_works_and_keeps_the_driver_folders(world, driver, tmp_path, how, readonly):
    """An entrypoint that runs ldconfig, then loads the driver libraries by soname. Read-write
    root: ldconfig exits 0, and its new cache still lists the mounted folder (the drop-in names
    it); the files are in the image as the hook leaves them. Read-only root: the image's /etc is
    left as it was; the container's /etc (a read-only overlay) shows the same files, and
    ldconfig fails on it, as after the toolkit's hook (issue 43: a read-only root stays so)."""
    import fnmatch

    world.write_spec("nvidia-gpu.yaml", _later_ldconfig_spec(world, driver))
    bundle = world.bundle(args=["sh", "-c", LATER], edit=lambda config: config["root"].update(readonly=readonly))
    rootfs = _image(bundle, driver, tmp_path, compat=False)
    os.makedirs(rootfs + FOLDER)
    os.makedirs(rootfs + "/sbin", exist_ok=True)
    import shutil

    shutil.copy2(rh.need("ldconfig", "libc-bin"), rootfs + "/sbin/ldconfig")     # (static)
    image_etc = _listed(rootfs + "/etc")
    _request(world, bundle, how)

    result = world.shim("run", "--bundle", bundle.path, bundle.id, env=world.env(**_absent_params(tmp_path)))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # both libraries cached (a read-only root: by the step's cache, ldconfig failing on /etc)
    assert lines[:3] == [f"ldconfig={int(readonly)}", "linked=42 cuda=550", "2"], result.stdout
    assert lines[3] == FOLDER, result.stdout
    dropins = lines[4:]
    assert [fnmatch.fnmatch(name, "00-nvcr-*.conf") for name in dropins].count(True) == 1, dropins
    assert [fnmatch.fnmatch(name, "zz-nvcr-*.conf") for name in dropins].count(True) == 1, dropins
    config = bundle.config()
    assert not any("update-ldcache" in json.dumps(h) for h in config.get("hooks", {}).get("createContainer", []))
    assert not [m for m in config["mounts"] if m["destination"] == "/etc/ld.so.cache"]
    # the soname links, as the hook's ldconfig makes them (in the image: FOLDER is the image's)
    assert _links_in(rootfs + FOLDER) == {"libnvidia-ml.so.1": f"libnvidia-ml.so.{VERSION}",
                                          "libcuda.so.1": f"libcuda.so.{VERSION}"}
    if readonly:
        assert _listed(rootfs + "/etc") == image_etc, "a read-only root's /etc was written"
        overlay = [m for m in config["mounts"] if m["destination"] == "/etc"]
        assert overlay and overlay[0]["type"] == "overlay", config["mounts"]
        assert overlay[0]["options"][0] == "ro" and len(overlay[0]["options"]) == 2, overlay
        etc = os.path.join(bundle.path, "cdi-shim.etc", "files")
    else:
        etc = rootfs + "/etc"
        assert not [m for m in config["mounts"] if m["destination"] == "/etc"]
    after = _listed(etc)
    first = [name for name in after if fnmatch.fnmatch(name, "ld.so.conf.d/00-nvcr-*.conf")]
    last = [name for name in after if fnmatch.fnmatch(name, "ld.so.conf.d/zz-nvcr-*.conf")]
    assert [after[n] for n in first] == [(f"{FOLDER}\n".encode(), 0o100644)]
    assert [after[n] for n in last] == [(SYSTEM_DIRS.encode(), 0o100644)]
    assert after["ld.so.cache"][1] == 0o100644
    assert f"{FOLDER}/libnvidia-ml.so.1".encode() in after["ld.so.cache"][0]   # (the step's, or ldconfig's)


def _listed(etc):
    """{name: (bytes, mode)} of the linker files under the folder ETC (a root's /etc, or an upper folder)."""
    names = ["ld.so.cache", "ld.so.conf"]
    if os.path.isdir(etc + "/ld.so.conf.d"):
        names += [f"ld.so.conf.d/{n}" for n in sorted(os.listdir(etc + "/ld.so.conf.d"))]
    return {name: (open(f"{etc}/{name}", "rb").read(), os.stat(f"{etc}/{name}").st_mode)
            for name in names if os.path.exists(f"{etc}/{name}")}


def test_ld_so_conf_made_where_the_image_has_none(world, driver, tmp_path):
    """ensureLdsoconfFile: an image without /etc/ld.so.conf gets the one-line file (0644), and
    an image's own one is left as it was (O_EXCL)."""
    world.write_spec("nvidia-gpu.yaml", _later_ldconfig_spec(world, driver))
    bundle = world.bundle(args=["/prog"])
    rootfs = _image(bundle, driver, tmp_path, compat=False)
    os.makedirs(rootfs + FOLDER)
    os.unlink(rootfs + "/etc/ld.so.conf")
    preinject(world, bundle)
    result = world.shim("run", "--bundle", bundle.path, bundle.id, env=world.env(**_absent_params(tmp_path)))
    assert result.returncode == 0 and result.stdout == "linked=42 cuda=550\n", result.stderr + result.stdout
    assert _listed(rootfs + "/etc")["ld.so.conf"] == (b"include /etc/ld.so.conf.d/*.conf\n", 0o100644)


# ---- chmod ---------------------------------------------------------------------------------
#
# chmod.go (1.20.0): a createContainer hook, so it runs after runc's mounts and device nodes;
# getPaths skips a path whose os.Stat fails ("Skipping path") and one already of the mode;
# os.Chmod follows links; "Ignoring permission error with chmod" (EPERM). Paths under /dev are
# runc's tmpfs by then: the create must not fail on them.

DRI_NODE = "    - {path: /dev/dri/card1, hostPath: /dev/null}\n"


@pytest.mark.parametrize("how", ["preinjected", "annotation"])
def test_chmod_under_dev_is_done_after_runc_s_mounts(world, driver, tmp_path, how):
    """`chmod --mode 711 --path /dev/dri --path /dev/missing` with a device node under /dev/dri:
    the directory runc made gets 0711, the missing path is skipped; `chmod --mode 755 --path
    /dev/dri` (what nvidia-ctk writes) leaves runc's 0755 directory as it is."""
    spec = toolkit_spec(world, driver, _hook("chmod", "--mode", "711", "--path", "/dev/dri", "--path", "/dev/missing")
                        + _hook("chmod", "--mode", "755", "--path", "/dev/dri/by-path"))
    spec = spec.replace("    - {path: /dev/nvidiactl, hostPath: /dev/null}\n",
                        "    - {path: /dev/nvidiactl, hostPath: /dev/null}\n" + DRI_NODE)
    world.write_spec("nvidia-gpu.yaml", spec)
    bundle = world.bundle(args=["sh", "-c", "stat -c '%a %n' /dev/dri /dev/dri/card1; test -e /dev/missing || echo no"])
    _image(bundle, driver, tmp_path, compat=False)
    _request(world, bundle, how)
    result = world.shim("run", "--bundle", bundle.path, bundle.id, env=world.env(**_absent_params(tmp_path)))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "711 /dev/dri", result.stdout
    assert lines[2] == "no", result.stdout


def test_chmod_755_of_runc_s_device_directory_needs_no_hook(world, driver, tmp_path):
    spec = toolkit_spec(world, driver, _hook("chmod", "--mode", "755", "--path", "/dev/dri"))
    world.write_spec("nvidia-gpu.yaml", spec.replace("    - {path: /dev/nvidiactl, hostPath: /dev/null}\n",
                                                     "    - {path: /dev/nvidiactl, hostPath: /dev/null}\n" + DRI_NODE))
    bundle = world.bundle(args=["stat", "-c", "%a", "/dev/dri"])
    _image(bundle, driver, tmp_path, compat=False)
    preinject(world, bundle)
    result = world.shim("run", "--bundle", bundle.path, bundle.id, env=world.env(**_absent_params(tmp_path)))
    assert result.returncode == 0 and result.stdout == "755\n", result.stderr
    assert not any("chmod" in json.dumps(h) for h in bundle.config().get("hooks", {}).get("createContainer", []))


def test_nshook_chmod_stays_in_the_root(tmp_path):
    """Our chmod hook resolves each path inside the rootfs: a link to a host directory names
    nothing there (skipped, the host's mode untouched); a bad mode or path is refused."""
    hook = os.path.join(rh.VENV_BIN, "cdi-shim-nshook")
    rootfs, host = tmp_path / "rootfs", tmp_path / "host"
    (rootfs / "dev" / "dri").mkdir(parents=True)
    host.mkdir(mode=0o755)
    os.chmod(host, 0o755)
    os.symlink(str(host), rootfs / "dev" / "out")
    os.symlink("/dev/dri", rootfs / "dev" / "in")

    def chmod(*args):
        return subprocess.run([hook, "chmod", "--rootfs", str(rootfs), *args], capture_output=True, text=True,
                              timeout=30, stdin=subprocess.DEVNULL)

    run = chmod("--mode", "700", "--path", "/dev/out", "--path", "/dev/in", "--path", "/dev/none")
    assert run.returncode == 0, run.stderr
    assert os.stat(host).st_mode & 0o7777 == 0o755
    assert os.stat(rootfs / "dev" / "dri").st_mode & 0o7777 == 0o700      # the link followed inside the root
    assert chmod("--mode", "1777", "--path", "/dev/dri").returncode == 0
    assert os.stat(rootfs / "dev" / "dri").st_mode & 0o7777 == 0o1777     # (kept: a documented difference)
    for args in (["--mode", "9", "--path", "/dev/dri"], ["--mode", "17777", "--path", "/dev/dri"],
                 ["--mode", "700", "--path", "relative"], ["--mode", "700", "--path", "/dev/../etc"]):
        run = chmod(*args)
        assert run.returncode == 1 and "Error: chmod:" in run.stderr, (args, run.stderr)


# ---- enable-cuda-compat ----------------------------------------------------------------------
#
# cudacompat.go (1.20.0), run: "If neither the host driver version nor the host cuda version is
# specified the hook is a no-op"; getContainerForwardCompatDir needs only the compat folder and
# exactly one regular file libcuda.so.*.* in it (no /etc/ld.so.cache, no /etc/ld.so.conf.d: its
# drop-in is made with MkdirAll). useCompatLibraries first reads the library's
# `.note.cuda.fwd_compatibility` (cuda-elf-header.go: owner "NVIDIA Corporation", a JSON
# description); with it, UseCompat: the host driver's major in "Driver" and the compat version
# newer (semver), or without a driver version to compare, "CUDA Version" newer than
# --host-cuda-version; without it: nothing when --host-cuda-version is given, else the majors.
# Its drop-in is read only by an update-ldcache hook run after it.
# Each expectation below was observed with the real hook (benchmarks/hook_differential.py).

COMPAT_MARK = 777       # what the compat libcuda's fake_cuda_major() says: "the compat library loaded"
NOTE_ASM = r"""
__asm__(".pushsection .note.cuda.fwd_compatibility,\"a\",@note\n"
        ".balign 4\n.long 19\n.long %(size)d\n.long 1\n.asciz \"NVIDIA Corporation\"\n.balign 4\n"
        ".asciz \"%(text)s\"\n.balign 4\n.popsection\n");
"""


def note_source(note):
    """C source giving a library the CUDA fwd_compatibility note NOTE (a dict, as NVIDIA's JSON)."""
    text = json.dumps(note)
    return NOTE_ASM % {"size": len(text) + 1, "text": text.replace('"', '\\\\\\"')}


def _note(drivers, cuda="12.4"):
    return {"Format": 1, "CUDA Version": cuda, "Driver": drivers, "Device": [7, 8, 9]}


COMPAT_CASES = {
    # name: (compat version, its note or None, the hook's options, the library loaded)
    "note lists the host major, a newer minor": ("550.90.07", _note([535, 550]), [f"--host-driver-version={VERSION}"],
                                                 COMPAT_MARK),
    "note lists the host major, an older minor": ("550.40.07", _note([535, 550]), [f"--host-driver-version={VERSION}"],
                                                  550),
    "note lacks the host major, a newer major": ("570.86.10", _note([535, 560]), [f"--host-driver-version={VERSION}"],
                                                 550),
    "no note, a newer major": ("570.86.10", None, [f"--host-driver-version={VERSION}"], COMPAT_MARK),
    "no note, a newer minor": ("550.90.07", None, [f"--host-driver-version={VERSION}"], 550),
    "note, a host CUDA version older than the note's": ("570.86.10", _note([535], "12.8"), ["--host-cuda-version=12.4"],
                                              COMPAT_MARK),
    "note, a host CUDA version newer than the note's": ("570.86.10", _note([535], "12.2"),
                                                        ["--host-cuda-version=12.4"], 550),
    "no note, a host CUDA version": ("570.86.10", None,
                                     [f"--host-driver-version={VERSION}", "--host-cuda-version=12.4"], 550),
    "note, a host driver that does not parse": ("570.86.10", _note([560], "12.8"),
                                                ["--host-driver-version=unknown", "--host-cuda-version=12.4"],
                                                COMPAT_MARK),
    "no host version": ("570.86.10", None, [], 550),
    "a host version that does not parse": ("570.86.10", None, ["--host-driver-version=unknown"], 550),
    "update-ldcache before it": ("570.86.10", None, [f"--host-driver-version={VERSION}"], 550),
    "no /etc/ld.so.cache, no /etc/ld.so.conf.d": ("570.86.10", _note([550]), [f"--host-driver-version={VERSION}"],
                                                  COMPAT_MARK),
    # (the hook's drop-in goes unread: ldconfig reads only ld.so.conf)
    "an image ld.so.conf without an include line": ("570.86.10", _note([550]), [f"--host-driver-version={VERSION}"],
                                                    550),
}


@pytest.mark.parametrize("case", list(COMPAT_CASES))
def test_enable_cuda_compat_decides_as_the_hook(world, driver, tmp_path, case):
    import shutil

    compat, note, options, expected = COMPAT_CASES[case]
    ours = "    - hookName: createContainer\n      path: /usr/bin/nvidia-cdi-hook\n" \
           f"      args: {json.dumps(['nvidia-cdi-hook', 'enable-cuda-compat', *options])}\n"
    spec = toolkit_spec(world, driver).replace(_hook("enable-cuda-compat", f"--host-driver-version={VERSION}"), "")
    if case == "update-ldcache before it":
        spec = spec.replace("  mounts:\n", ours + "  mounts:\n", 1)
    else:
        spec = spec.replace("    - hookName: createContainer\n", ours + "    - hookName: createContainer\n", 1)
    world.write_spec("nvidia-gpu.yaml", spec)
    bundle = world.bundle(args=["/prog"])
    rootfs = _image(bundle, driver, tmp_path, compat=False)
    os.makedirs(rootfs + COMPAT)
    rh.library(rootfs + f"{COMPAT}/libcuda.so.{compat}", "libcuda.so.1",
             f"int fake_cuda_major(void) {{ return {COMPAT_MARK}; }}\n" + (note_source(note) if note else ""))
    os.symlink(f"libcuda.so.{compat}", rootfs + f"{COMPAT}/libcuda.so.1")
    if case == "no /etc/ld.so.cache, no /etc/ld.so.conf.d":
        shutil.rmtree(rootfs + "/etc/ld.so.conf.d")
        os.unlink(rootfs + "/etc/ld.so.cache")
    if case == "an image ld.so.conf without an include line":
        with open(rootfs + "/etc/ld.so.conf", "w") as out:
            out.write(LIBDIR + "\n")
    preinject(world, bundle)
    result = world.shim("run", "--bundle", bundle.path, bundle.id, env=world.env(**_absent_params(tmp_path)))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"linked=42 cuda={expected}\n", (case, result.stdout)
    hooks = bundle.config().get("hooks", {}).get("createContainer", [])
    assert not any("enable-cuda-compat" in json.dumps(h) for h in hooks)


# cudacompat.go, run: once getContainerForwardCompatDir names the folder, createLdsoconfdFile
# writes it whatever hooks follow (MkdirAll /etc/ld.so.conf.d 0755, "00-compat-<uuid>.conf"
# holding "/usr/local/cuda/compat\n", Chmod 0644). Without an update-ldcache hook after it no
# ldconfig reads it: the driver's libcuda loads; a later ldconfig in the container puts the
# compat folder first. Observed with the real hook (hook_differential.py, seed 1 case 63: no
# update-ldcache, a read-only root, compat 570 over a 550 host).

ALONE = ("/prog; cat /etc/ld.so.conf.d/00-compat-*.conf; stat -c %a /etc/ld.so.conf.d/00-compat-*.conf; "
         "/sbin/ldconfig 2>/dev/null; echo ldconfig=$?; /prog")


@pytest.mark.parametrize("order", ["no update-ldcache", "update-ldcache before it"])
@pytest.mark.parametrize("readonly", [False, True], ids=["rw-rootfs", "readonly-rootfs"])
@pytest.mark.parametrize("how", ["preinjected", "annotation"])
def test_the_compat_drop_in_is_written_where_no_cache_reads_it(world, driver, tmp_path, how, readonly, order):
    import shutil

    ours = _hook("enable-cuda-compat", f"--host-driver-version={VERSION}")
    spec = toolkit_spec(world, driver).replace(ours, "")
    if order == "no update-ldcache":
        spec = spec.replace(_hook("update-ldcache", "--folder", LIBDIR, "--folder", f"{LIBDIR}/vdpau"), "")
    spec = spec.replace("  mounts:\n", ours + "  mounts:\n", 1)
    world.write_spec("nvidia-gpu.yaml", spec)
    bundle = world.bundle(args=["sh", "-c", ALONE], edit=lambda config: config["root"].update(readonly=readonly))
    rootfs = _image(bundle, driver, tmp_path, compat=False)
    os.makedirs(rootfs + COMPAT)
    rh.library(rootfs + f"{COMPAT}/libcuda.so.570.86.10", "libcuda.so.1",
             f"int fake_cuda_major(void) {{ return {COMPAT_MARK}; }}\n")
    os.symlink("libcuda.so.570.86.10", rootfs + f"{COMPAT}/libcuda.so.1")
    os.makedirs(rootfs + "/sbin", exist_ok=True)
    shutil.copy2(rh.need("ldconfig", "libc-bin"), rootfs + "/sbin/ldconfig")     # (static)
    image_etc = _listed(rootfs + "/etc")
    _request(world, bundle, how)

    result = world.shim("run", "--bundle", bundle.path, bundle.id, env=world.env(**_absent_params(tmp_path)))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # the driver's libcuda (no ldconfig after the hook), its drop-in there all the same
    assert lines[:3] == ["linked=42 cuda=550", COMPAT, "644"], result.stdout
    if order == "update-ldcache before it" and not readonly:
        # a later ldconfig reads the drop-in first: the compat libcuda
        assert lines[3:] == ["ldconfig=0", f"linked=42 cuda={COMPAT_MARK}"], result.stdout
    elif order == "update-ldcache before it":
        # a read-only root: ldconfig fails on /etc, as after the toolkit's hook (issue 43)
        assert lines[3:] == ["ldconfig=1", "linked=42 cuda=550"], result.stdout
    hooks = bundle.config().get("hooks", {}).get("createContainer", [])
    assert not any("enable-cuda-compat" in json.dumps(h) for h in hooks)
    if readonly:
        assert _listed(rootfs + "/etc") == image_etc, "a read-only root's /etc was written"


def test_update_ldcache_without_folders_adds_no_folder(world, driver, tmp_path):
    """ldconfig.go, UpdateLDCache: the 00-nvcr drop-in names the hook's --folder options not
    yet configured, none given: none written (createLdsoconfdFile returns for no folders), even
    where the mounted libraries' folder is configured nowhere; the zz-nvcr one is written.
    Observed with the real hook: hook_differential.py seed 1 case 30 (an image without
    /etc/ld.so.conf.d, a read-only root)."""
    spec = _later_ldconfig_spec(world, driver).replace(_hook("update-ldcache", "--folder", FOLDER),
                                                       _hook("update-ldcache"))
    world.write_spec("nvidia-gpu.yaml", spec)
    bundle = world.bundle(args=["sh", "-c", "ls /etc/ld.so.conf.d"],
                          edit=lambda config: config["root"].update(readonly=True))
    rootfs = _image(bundle, driver, tmp_path, compat=False)
    import shutil

    shutil.rmtree(rootfs + "/etc/ld.so.conf.d")
    os.makedirs(rootfs + FOLDER)
    preinject(world, bundle)
    result = world.shim("run", "--bundle", bundle.path, bundle.id, env=world.env(**_absent_params(tmp_path)))
    assert result.returncode == 0, result.stderr
    names = result.stdout.split()
    assert len(names) == 1 and names[0].startswith("zz-nvcr-"), result.stdout
    upper = os.path.join(bundle.path, "cdi-shim.etc", "files", "ld.so.conf.d")
    assert [open(os.path.join(upper, n)).read() for n in os.listdir(upper)] == [SYSTEM_DIRS]
