"""The labs' images and fake driver: busybox-static as an OCI image, the ldcache tests' library
tree as a layer, fake device nodes, gcc-built libraries, and a stand-in for the toolkit's hook
program with the six hooks it is run for."""
import hashlib
import io
import json
import os
import platform
import shutil
import stat
import subprocess
import sys
import tarfile

from . import releases
from .hosttools import CMD_TIMEOUT, LabError

# --- the image ----------------------------------------------------------------------------------

def _oci_arch():
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le",
            "s390x": "s390x", "riscv64": "riscv64"}.get(machine, machine)


def _layer(busybox):
    """An uncompressed layer tar: busybox with its applets as links, a passwd, the usual dirs."""
    applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True).stdout.split()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def add_dir(name):
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(info)

        def add_file(name, data, mode=0o644):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))

        for directory in ("bin", "dev", "etc", "proc", "sys", "tmp", "usr", "usr/lib", "var", "root"):
            add_dir(directory)
        with open(busybox, "rb") as stream:
            add_file("bin/busybox", stream.read(), 0o755)
        for applet in sorted(set(applets) - {"busybox"}):
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, "busybox", 0o777, 0
            tar.addfile(info)
        add_file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
        add_file("etc/group", b"root:x:0:\n")
    return buffer.getvalue()


def build_oci_archive(path, busybox, images):
    """Write an OCI image layout tarball holding `images` ({reference: (entrypoint, cmd)} or
    (entrypoint, cmd, extra layers)): the busybox layer, then the image's extra layers (uncompressed tars)."""
    layer = _layer(busybox)
    layer_digest = "sha256:" + hashlib.sha256(layer).hexdigest()
    blobs = {layer_digest: layer}
    manifests = []
    for reference, (entrypoint, cmd, *more) in images.items():
        layers = [(layer_digest, len(layer))]
        for extra in (more[0] if more else ()):
            digest = "sha256:" + hashlib.sha256(extra).hexdigest()
            blobs[digest] = extra
            layers.append((digest, len(extra)))
        config = json.dumps({
            "architecture": _oci_arch(), "os": "linux",
            "config": {"Env": ["PATH=/bin"], "Entrypoint": entrypoint, "Cmd": cmd, "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [digest for digest, _ in layers]},
        }, sort_keys=True).encode()
        config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
        blobs[config_digest] = config
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest,
                       "size": len(config)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": digest, "size": size}
                       for digest, size in layers],
        }, sort_keys=True).encode()
        manifest_digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
        blobs[manifest_digest] = manifest
        manifests.append({
            "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest,
            "size": len(manifest), "platform": {"architecture": _oci_arch(), "os": "linux"},
            "annotations": {"io.containerd.image.name": reference,
                            "org.opencontainers.image.ref.name": reference.rsplit(":", 1)[-1]},
        })
    index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                        "manifests": manifests}, sort_keys=True).encode()
    with tarfile.open(path, "w") as tar:
        def add(name, data):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))

        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", index)
        for digest, data in blobs.items():
            add("blobs/sha256/" + digest.split(":", 1)[1], data)
    return path


def library_layer(work, ldconfig):
    """An uncompressed layer tar of the generated library tree of the ldcache tests
    (tests/linker/libtree.py, cached as a tarball under CDI_SHIM_TEST_CACHE: 480 gcc-built library
    files, 417 links, its own /etc/ld.so.conf(.d)) with the image's own ld.so.cache, made by the
    host's `ldconfig -r`, as an image ships one."""
    linker_tests = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "linker")
    if not os.path.exists(os.path.join(linker_tests, "libtree.py")):
        raise LabError(f"the library tree needs the cdi-shim checkout's {linker_tests}/libtree.py")
    sys.path.insert(0, linker_tests)
    try:
        import libtree
    finally:
        sys.path.remove(linker_tests)
    tarball, _ = libtree.tarball(releases.CACHE_DIR)
    root = os.path.join(work, "libtree-root")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    subprocess.run(["tar", "-C", root, "--numeric-owner", "-xf", tarball], check=True, timeout=CMD_TIMEOUT)
    subprocess.run([ldconfig, "-r", root], check=True, capture_output=True, timeout=CMD_TIMEOUT)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(os.listdir(root)):
            tar.add(os.path.join(root, name), arcname=name)
    shutil.rmtree(root, ignore_errors=True)
    return buffer.getvalue()


# --- fake devices and libraries ----------------------------------------------------------------

def make_char_device(path, major, minor):
    if not os.path.exists(path):
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    return path


def build_fake_libraries(directory, count, gcc):
    """`count` shared libraries with real SONAMEs (libfakedrv<N>.so.1 -> .so.1.0.0), built by gcc."""
    os.makedirs(directory, exist_ok=True)
    source = os.path.join(directory, "fake.c")
    with open(source, "w") as stream:
        stream.write("int fake_driver_entry(void) { return 42; }\n")
    paths = []
    for index in range(count):
        soname = f"libfakedrv{index}.so.1"
        target = os.path.join(directory, soname + ".0.0")
        if not os.path.exists(target):
            subprocess.run([gcc, "-shared", "-fPIC", "-O1", f"-Wl,-soname,{soname}", "-o", target, source],
                           check=True, capture_output=True, timeout=CMD_TIMEOUT)
        paths.append(target)
    return paths


DRIVER_FOLDER = "/usr/lib/x86_64-linux-gnu"
DRIVER_VERSION = "550.54.15"

# A hook program doing what nvidia-cdi-hook does for the subcommands of a generated spec
# (NVIDIA Container Toolkit 1.17+),
# run by runc as a createContainer hook: it reads the
# OCI state on stdin, finds the rootfs from the bundle's config.json and works on it (runc runs
# createContainer hooks in the container's mount namespace before pivot_root, so the rootfs
# holds the spec's bind mounts). It appends "<subcommand> <rootfs>" to LOG first: the evidence
# that it ran as a process.
#   update-ldcache: an /etc/ld.so.conf if missing, an ld.so.conf.d drop-in naming the --folder
#     directories, then the host's `ldconfig -r <rootfs>` (a full rescan of the image's library
#     directories, as the toolkit's `ldconfig -f /etc/ld.so.conf -C /etc/ld.so.cache` in the
#     pivot_rooted root; without its re-exec into new namespaces, so if anything cheaper);
#   create-symlinks: each --link TARGET::LINK inside the rootfs (kept when there);
#   update-application-profile: the EGLVisibleDGPUDevices profile for the config's /dev/nvidiaN;
#   enable-cuda-compat: nothing unless the image has /usr/local/cuda/compat (this one has not);
#   disable-device-node-modification: nothing unless the host has /proc/driver/nvidia/params.
HOOK_SCRIPT = r"""#!/bin/sh
set -eu
PATH=/usr/sbin:/usr/bin:/sbin:/bin
state=$(cat)
bundle=$(printf '%s' "$state" | sed -n 's/.*"bundle":"\([^"]*\)".*/\1/p')
[ -n "$bundle" ] || { echo "$0: no bundle in the OCI state" >&2; exit 1; }
root=$(sed -n 's/.*"root":{"path":"\([^"]*\)".*/\1/p' "$bundle/config.json")
case $root in /*) ;; *) root=$bundle/$root ;; esac
[ -n "$root" ] && [ "$root" != / ] || { echo "$0: no rootfs" >&2; exit 1; }
command=$1
shift
echo "$command $root" >> @LOG@
case $command in
update-ldcache)
    folders=
    while [ $# -gt 0 ]; do
        case $1 in
            --folder) folders="$folders$2
"; shift 2 ;;
            --folder=*) folders="$folders${1#--folder=}
"; shift ;;
            *) shift ;;
        esac
    done
    mkdir -p "$root/etc/ld.so.conf.d"
    [ -e "$root/etc/ld.so.conf" ] || echo 'include /etc/ld.so.conf.d/*.conf' > "$root/etc/ld.so.conf"
    printf '%s' "$folders" > "$root/etc/ld.so.conf.d/00-nvcr-$$.conf"
    @LDCONFIG@ -r "$root" 2>/dev/null
    ;;
create-symlinks)
    while [ $# -gt 0 ]; do
        case $1 in
            --link) spec=$2; shift 2 ;;
            --link=*) spec=${1#--link=}; shift ;;
            *) shift; continue ;;
        esac
        target=${spec%%::*}
        link=${spec#*::}
        mkdir -p "$root$(dirname "$link")"
        [ -e "$root$link" ] || [ -L "$root$link" ] || ln -s "$target" "$root$link"
    done
    ;;
update-application-profile)
    mask=0
    for n in $(sed -n 's/"path":"\/dev\/nvidia\([0-9][0-9]*\)"/\n\1\n/gp' "$bundle/config.json" | grep -x '[0-9]*'); do
        mask=$((mask | (1 << n)))
    done
    if [ "$mask" -ne 0 ]; then
        mkdir -p "$root/etc/nvidia/nvidia-application-profiles-rc.d"
        profile='{"profiles":[{"name":"_container_","settings":["EGLVisibleDGPUDevices",0x%x]}],'
        profile=$profile'"rules":[{"pattern":[],"profile":"_container_"}]}'
        printf "$profile" "$mask" > "$root/etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf"
    fi
    ;;
enable-cuda-compat)
    [ ! -d "$root/usr/local/cuda/compat" ] || { echo "$0: a compat folder: not done here" >&2; exit 1; }
    ;;
disable-device-node-modification)
    [ ! -e /proc/driver/nvidia/params ] || { echo "$0: /proc/driver/nvidia/params: not done here" >&2; exit 1; }
    ;;
*)
    echo "$0: unknown subcommand $command" >&2; exit 1 ;;
esac
"""


def build_driver_libraries(directory, count, gcc, version=DRIVER_VERSION):
    """`count` gcc-built driver libraries as a driver ships them: versioned file names
    (libnvidia-bench<N>.so.<version>), SONAME libnvidia-bench<N>.so.1."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for index in range(count):
        path = os.path.join(directory, f"libnvidia-bench{index}.so.{version}")
        if not os.path.exists(path):
            source = os.path.join(directory, f"lib{index}.c")
            with open(source, "w") as stream:
                stream.write(f"int cdi_shim_bench_{index}(void) {{ return {index}; }}\n")
            subprocess.run([gcc, "-shared", "-fPIC", "-o", path, source, f"-Wl,-soname,libnvidia-bench{index}.so.1"],
                           check=True, capture_output=True, timeout=CMD_TIMEOUT)
            os.unlink(source)
        paths.append(path)
    return paths


def toolkit_hooks(program, folder=DRIVER_FOLDER, version=DRIVER_VERSION):
    """The six createContainer hooks of a spec written by `nvidia-ctk cdi generate` (1.20), with
    PROGRAM as the hook program (path; args[0] its basename)."""
    name = os.path.basename(program)

    def hook(*args):
        return (f"    - hookName: createContainer\n      path: {program}\n"
                f"      args: [{name}, {', '.join(args)}]\n      env: [NVIDIA_CTK_DEBUG=false]\n")
    return (hook("create-symlinks", "--link", f"'libnvidia-bench0.so.1::{folder}/libnvidia-bench0.so'")
            + hook("create-symlinks", "--link", f"'libnvidia-bench1.so.1::{folder}/libnvidia-bench1.so'")
            + hook("enable-cuda-compat", f"--host-driver-version={version}")
            + hook("update-ldcache", "--folder", folder, "--folder", f"{folder}/vdpau")
            + hook("disable-device-node-modification")
            + hook("update-application-profile"))


