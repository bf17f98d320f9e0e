"""The kernel and user-space driver layers: nvidia.ko, /dev/nvidia*, libcuda and libnvidia-ml, nvidia-smi."""
import os
import re
import stat

from .base import DRIVER_LIBRARIES, FAIL, _MODULE_VERSION, NVIDIA_MAJOR, _SO_VERSION, WARN, Check, _ok




def check_kernel_module(ctx):
    text = ctx.node.read_text("/proc/modules")
    if text is None:
        return Check("kernel", "module", FAIL, "/proc/modules cannot be read",
                     "run doctor on the node itself (or give --root a tree with proc/modules)")
    modules = {line.split()[0] for line in text.splitlines() if line.split()}
    if "nvidia" not in modules:
        return Check("kernel", "module", FAIL, "nvidia is not in /proc/modules: the kernel driver is not loaded",
                     "load it: `modprobe nvidia` (see `dmesg | grep -i nvrm` if that fails; after a kernel "
                     "upgrade, rebuild it: `dkms autoinstall`)")
    extra = sorted(m for m in modules if m.startswith("nvidia_"))
    return _ok("kernel", "module", "nvidia loaded" + (f" (with {', '.join(extra)})" if extra else ""))


def _device_problem(node, path, major):
    info = node.stat(path)
    if info is None:
        return "missing"
    if not stat.S_ISCHR(info.st_mode):
        return "not a character device"
    if major is not None and os.major(info.st_rdev) != major:
        return f"major {os.major(info.st_rdev)}, not {major}"
    return None


def check_kernel_devices(ctx):
    node = ctx.node
    names = node.listdir("/dev") or []
    gpus = sorted((n for n in names if re.fullmatch(r"nvidia\d+", n)), key=lambda n: int(n[6:]))
    problems, seen = [], []
    for path, major in [("/dev/nvidiactl", NVIDIA_MAJOR)] + [(f"/dev/{g}", NVIDIA_MAJOR) for g in gpus] \
            + [("/dev/nvidia-uvm", None)]:
        problem = _device_problem(node, path, major)
        if problem:
            problems.append(f"{path} {problem}")
            if problem == "missing":
                ctx.missing_devices.add(path)
        else:
            seen.append(path)
    if not gpus:
        problems.append("no /dev/nvidia[0-9]* node")
        ctx.missing_devices.add("/dev/nvidia0")
    if problems:
        return Check("kernel", "devices", FAIL, "; ".join(problems),
                     "create the nodes: `nvidia-modprobe -c 0 -u` (or `nvidia-smi` once as root); a node whose "
                     f"major is not {NVIDIA_MAJOR} was not made by the NVIDIA driver: remove it and recreate it")
    return _ok("kernel", "devices", ", ".join(seen))


# --- user space -----------------------------------------------------------------------------------

def _version_of(name):
    match = _SO_VERSION.search(name)
    return match.group(1) if match else None


def check_libraries(ctx):
    from ...ldconfig.ldcache import LdcacheError, read_root_cache

    node = ctx.node
    try:
        cache = read_root_cache(node.root)
    except (LdcacheError, OSError) as err:
        return Check("userspace", "libraries", FAIL, f"cannot read /etc/ld.so.cache: {err}",
                     "run `ldconfig` (as root) to rebuild it")
    missing, seen = [], []
    for soname in DRIVER_LIBRARIES:
        paths = [e.path for e in cache.entries if e.soname == soname]
        if not paths:
            missing.append(soname)
            continue
        versions = set()
        for path in paths:
            if not node.exists(path):
                missing.append(f"{soname} ({path} in the cache does not exist)")
                continue
            version = _version_of(os.path.basename(node.host(path)))
            if version:
                versions.add(version)
        ctx.library_versions[soname] = versions
        seen.append(f"{soname} -> {paths[0]}" + (f" ({', '.join(sorted(versions))})" if versions else ""))
    if missing:
        return Check("userspace", "libraries", FAIL, f"not in /etc/ld.so.cache: {', '.join(missing)}",
                     "install the driver's user-space libraries (e.g. the libcuda1/libnvidia-ml1 or "
                     "nvidia-driver packages of the driver's version); if they are installed in a directory "
                     "ldconfig does not scan, add it to /etc/ld.so.conf.d/ and run `ldconfig`")
    return _ok("userspace", "libraries", "; ".join(seen))


def check_versions(ctx):
    text = ctx.node.read_text("/proc/driver/nvidia/version")
    if text is not None:
        match = _MODULE_VERSION.search(text)
        ctx.kernel_version = match.group(1) if match else None
    sources = {}
    for soname in DRIVER_LIBRARIES:
        for version in ctx.library_versions.get(soname, ()):
            sources.setdefault(version, []).append(soname)
    if ctx.kernel_version:
        sources.setdefault(ctx.kernel_version, []).append("/proc/driver/nvidia/version")
    saw = "; ".join(f"{v}: {', '.join(names)}" for v, names in sorted(sources.items()))
    if len(sources) > 1:
        return Check("userspace", "versions", FAIL, f"driver versions disagree: {saw}",
                     "install the user-space libraries of the loaded module's version (or reboot after a driver "
                     "upgrade so the new module loads); then `cdi-shim cdi generate`")
    if text is None:
        return Check("userspace", "versions", WARN,
                     f"/proc/driver/nvidia/version is missing (module not loaded?); libraries: {saw or 'none'}",
                     "load the module: `modprobe nvidia`")
    if not ctx.kernel_version:
        return Check("userspace", "versions", WARN, "cannot read a version in /proc/driver/nvidia/version", "")
    return _ok("userspace", "versions", f"{ctx.kernel_version} everywhere ({saw})")


def check_nvidia_smi(ctx):
    found = ctx.node.which_all("nvidia-smi")
    if not found:
        return Check("userspace", "nvidia-smi", FAIL,
                     f"nvidia-smi is not on PATH ({':'.join(ctx.node.path_dirs)})",
                     "install the driver's utilities (nvidia-smi, e.g. the nvidia-smi or nvidia-utils package); "
                     "`cdi-shim cdi generate` mounts it into containers")
    return _ok("userspace", "nvidia-smi", found[0][0])
