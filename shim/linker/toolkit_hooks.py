"""The native work of the toolkit's other createContainer hooks (nvidia-cdi-hook 1.20).

prepare_linker (container.py) does update-ldcache and create-symlinks; this module does the
rest of what `nvidia-ctk cdi generate` puts in a spec, from the hooks' documented behaviour:

- enable-cuda-compat [--host-driver-version=V] [--host-cuda-version=C]: decided as the hook
  decides (cudacompat.py: the compat library's fwd_compatibility note, else driver majors);
  when it would write /etc/ld.so.conf.d/00-compat-*.conf naming /usr/local/cuda/compat and an
  update-ldcache hook runs after it, that folder goes to the cache planner as that drop-in
  (ldconf.LdConfig's DROPIN_COMPAT).
- disable-device-node-modification: the host's /proc/driver/nvidia/params with
  "ModifyDeviceFiles: 1" changed to 0 (nothing when the host has no such file, or it says 0
  already, or says neither). The copy is written into the bundle. runc refuses any mount under
  /proc from config.json ("cannot be mounted because it is inside /proc"), so the bind mount
  itself is done by our own hook program, `cdi-shim-nshook bind-params --rootfs DIR --source
  FILE` (C: csrc/hooks/nshook.c), in the container's mount namespace (as the toolkit's hook
  does): that program is ours, installed with the runtime, so a spec's missing
  nvidia-cdi-hook does not matter.
  CDI_SHIM_NVIDIA_PARAMS names another host file instead of /proc/driver/nvidia/params: for
  tests only (hosts without an NVIDIA driver).
- update-application-profile: for the /dev/nvidiaN character devices the container gets
  (config.json's linux.devices: what runc will create in its /dev), the file
  /etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf restricting
  EGLVisibleDGPUDevices to them (mask of the minors 0..63), mode 0444. Written into the bundle
  and bind-mounted read-only there (runc makes the mount point inside the root), so nothing is
  written into the image.
- chmod --mode M --path P...: a path runc creates as a device node (linux.devices) gets its
  fileMode; a path of the image is changed in place, resolved inside the rootfs; a missing path
  is skipped (as the hook does); EPERM is ignored (as the hook does). A path under a mount (the
  toolkit's `chmod --mode 755 --path /dev/dri`, in the /dev runc makes) can only be changed
  after runc's mounts: those paths go to our hook program, `cdi-shim-nshook chmod` (C),
  which does the same there; the directory runc makes (0755) for device nodes under it needs no
  hook for mode 755. Unlike the hook (a Go FileMode quirk), the sticky, setuid and setgid bits
  of --mode are kept.

Each function returns what to do, or raises HookFailure naming the hook and the reason. A hook
whose options are not all understood is left alone by the caller (KNOWN_OPTIONS).
"""
import os
import posixpath
import stat

PARAMS_PATH = "/proc/driver/nvidia/params"
PARAMS_ENV = "CDI_SHIM_NVIDIA_PARAMS"   # testing only: the host file read instead of PARAMS_PATH
PARAMS_FILE = "cdi-shim.nvidia-params"
COMPAT_FOLDER = "/usr/local/cuda/compat"
PROFILE_PATH = "/etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf"
PROFILE_FILE = "cdi-shim.application-profile.conf"
MAX_PARAMS = 1 << 20

KNOWN_OPTIONS = {
    "update-ldcache": {"folder", "ldconfig-path"},
    "create-symlinks": {"link"},
    "enable-cuda-compat": {"host-driver-version", "host-cuda-version"},
    "disable-device-node-modification": set(),
    "update-application-profile": set(),
    "chmod": {"mode", "path"},
}


class HookFailure(Exception):
    """A hook we do the work of could not be done: the create fails with this reason."""

    def __init__(self, command, reason):
        super().__init__(f"the spec's {command} hook cannot be done: {reason}")


def understood(call):
    """True when we know CALL's subcommand and every option it gives."""
    known = KNOWN_OPTIONS.get(call.command)
    return known is not None and set(call.options) <= known


def _root(rootfs):
    from ..ldconfig.engine import LdcacheError, Root

    try:
        return Root(rootfs)
    except LdcacheError as err:
        raise OSError(str(err)) from None


def cuda_compat_folder(rootfs, call):
    """The folder enable-cuda-compat's drop-in would name, or None (the hook does nothing):
    decided as the hook decides (cudacompat.py)."""
    host = (call.options.get("host-driver-version") or [""])[-1]
    cuda = (call.options.get("host-cuda-version") or [""])[-1]
    if not host and not cuda:
        return None     # (cudacompat.go: neither a host driver nor a host CUDA version: a no-op)
    try:
        with _root(rootfs) as root:
            if root.stat(COMPAT_FOLDER) is None:
                return None
            listing = root.listdir(COMPAT_FOLDER) or ()
            # libcuda.so.*.*, regular files only (no `re` on the create path: importing it costs more than the step)
            libs = [name for name, kind in listing if name.startswith("libcuda.so.")
                    and "." in name[len("libcuda.so."):] and _regular(root, f"{COMPAT_FOLDER}/{name}", kind)]
            if len(libs) != 1:
                return None  # none, or several (the hook warns and does nothing)
            fd = root.open(f"{COMPAT_FOLDER}/{libs[0]}", os.O_RDONLY | os.O_CLOEXEC)
            if fd < 0:
                raise OSError(root.errno, os.strerror(root.errno), libs[0])
            try:
                from . import cudacompat    # (json: only for an image with compat libraries)

                used = cudacompat.use_compat(libs[0], fd, host, cuda)
            finally:
                os.close(fd)
            # the hook's drop-in names the folder its libcuda was found in, links resolved
            # (/usr/local/cuda -> cuda-12.4: /usr/local/cuda-12.4/compat)
            folder = root.resolved(COMPAT_FOLDER) if used else None
    except OSError as err:
        raise HookFailure("enable-cuda-compat", f"cannot read {COMPAT_FOLDER} in {rootfs}: {err}") from None
    return folder


def _regular(root, path, kind):
    """A directory entry of type KIND (d_type) is a regular file (lstat when the type is unknown)."""
    if kind == 8:       # DT_REG
        return True
    if kind != 0:       # DT_UNKNOWN
        return False
    found = root.stat(path, follow=False)
    return found is not None and stat.S_ISREG(found[0])


def params_contents():
    """The modified params file's bytes, or None when nothing is to be done."""
    return modified_params(params_file())


def params_file():
    """The host's params file's bytes (one read, as the hook reads it), or None when it is absent."""
    path = os.environ.get(PARAMS_ENV) or PARAMS_PATH
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise HookFailure("disable-device-node-modification", f"cannot read {path}: {err.strerror}") from None
    try:
        return os.read(fd, MAX_PARAMS)
    except OSError as err:
        raise HookFailure("disable-device-node-modification", f"cannot read {path}: {err.strerror}") from None
    finally:
        os.close(fd)


def modified_params(data):
    """The params file DATA (params_file) with ModifyDeviceFiles 0, or None when nothing is to be done."""
    if data is None:
        return None
    out, modified = [], False
    for line in data.decode("utf-8", "replace").splitlines():
        if line.startswith("ModifyDeviceFiles: "):
            if line == "ModifyDeviceFiles: 0":
                return None
            if line == "ModifyDeviceFiles: 1":
                line, modified = "ModifyDeviceFiles: 0", True
        out.append(line + "\n")
    return "".join(out).encode() if modified else None


def application_profile(config):
    """The application profile's bytes for the container's /dev/nvidiaN devices, or None."""
    mask = 0
    for device in ((config.get("linux") or {}).get("devices") or ()):
        if not isinstance(device, dict) or device.get("type") != "c":
            continue
        path = device.get("path")
        minor = device.get("minor")
        number = path[len("/dev/nvidia"):] if isinstance(path, str) and path.startswith("/dev/nvidia") else ""
        if number.isascii() and number.isdigit() and isinstance(minor, int) and 0 <= minor < 64:
            mask |= 1 << minor
    if not mask:
        return None
    return ('{"profiles":[{"name":"_container_","settings":["EGLVisibleDGPUDevices",0x%x]}],'
            '"rules":[{"pattern":[],"profile":"_container_"}]}' % mask).encode()


def chmod(config, rootfs, call, places):
    """Do chmod --mode M --path P...; returns (the config with device fileModes set, the mode's
    text and the paths under a mount, left for a hook after runc's mounts). PLACES: where the
    mounts land (links.MountPlaces)."""
    modes = call.options.get("mode") or [""]
    try:
        mode = int(modes[-1].strip(), 8)
    except ValueError:
        raise HookFailure("chmod", f"--mode {modes[-1]!r} is not an octal mode") from None
    if mode & ~0o7777:
        raise HookFailure("chmod", f"--mode {modes[-1]!r} is not a file mode")
    paths = call.options.get("path") or []
    devices = (config.get("linux") or {}).get("devices") or []
    by_path = {posixpath.normpath(d["path"]): i for i, d in enumerate(devices)
               if isinstance(d, dict) and isinstance(d.get("path"), str) and d["path"].startswith("/")}
    from .._native import ffi, lib

    new_devices = None
    rootfd = None
    later = []
    try:
        for path in paths:
            if not path.strip():
                raise HookFailure("chmod", "an empty --path")
            norm = posixpath.normpath("/" + path.lstrip("/"))
            if norm in by_path:
                new_devices = new_devices or [dict(d) if isinstance(d, dict) else d for d in devices]
                new_devices[by_path[norm]]["fileMode"] = mode
                continue
            if places.at_a_mount(norm) or places.under_a_mount(norm):
                if norm.startswith("/dev/") and mode == 0o755 and any(
                        p.startswith(norm + "/") for p in by_path if isinstance(p, str)):
                    continue  # a directory runc makes (0755) for the device nodes under it
                later.append(norm)
                continue
            if rootfd is None:
                rootfd = os.open(rootfs, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            fd = lib.cds_inroot_open(rootfd, os.fsencode(norm), os.O_PATH)
            if fd < 0:
                if ffi.errno == 2:
                    continue  # missing: the hook skips it too
                raise HookFailure("chmod", f"cannot open {norm} in {rootfs}: {os.strerror(ffi.errno)}")
            try:
                current = os.fstat(fd).st_mode
                if stat.S_IMODE(current) == mode or stat.S_ISLNK(current):
                    continue
                try:
                    os.chmod(f"/proc/self/fd/{fd}", mode)
                except PermissionError:
                    pass  # as the hook does
                except OSError as err:
                    raise HookFailure("chmod", f"cannot change the mode of {norm} in {rootfs}: "
                                      f"{err.strerror}") from None
            finally:
                os.close(fd)
    finally:
        if rootfd is not None:
            os.close(rootfd)
    if new_devices is not None:
        config = dict(config, linux=dict(config["linux"], devices=new_devices))
    return config, "%o" % mode, later
