"""The driver's files in the driver root, and the device nodes under the dev root.

Both roots are untrusted (docs/security.md): every path inside them is resolved inside them
(shim/inroot.py over shim.linker's in-root opens: a link in a driver container's root never
leads to the host's files). Paths come back as pairs: the host path (the root's file, links
resolved: what the spec hands runc) and the container path (where the toolkit puts it: the same
path relative to the driver root). IPC sockets and folders that are links are refused; device
nodes must be character devices of their driver's major (DevRoot).

Libraries, as the toolkit 1.20 finds them (pkg/nvcdi/driver-nvml.go, internal/lookup/root):
the driver root's own ld.so.cache names libnvidia-ml.so.1 (what NVML is loaded from); once
NVML has said the driver version, the cache's entries of this machine's type that resolve
to a file named lib*.so.<version> give the driver's library directories; every
lib*.so.<version> in those directories and in their vdpau/ subdirectories is mounted (plus
the legacy libnvidia-nvvm70.so.*). A library a driver of this version ships and that is not
there is a warning naming it (EXPECTED_LIBRARIES). Graphics files (Xorg modules, ICD and
configuration files) and the GPUs' DRM nodes are graphics.py's.
"""
import fnmatch
import os
import platform
import posixpath
import stat

from . import GenerateError
from .graphics import by_path_links, discover_graphics, drm_nodes, pci_bus_id
from .nvml import LIBRARY as NVML_LIBRARY
from ..inroot import Tree, TreeError

MOUNT_OPTIONS = ["ro", "nosuid", "nodev", "rbind", "rprivate"]
IPC_MOUNT_OPTIONS = ["nosuid", "nodev", "rbind", "rprivate", "noexec"]

# (name without ".so.<version>", first driver branch shipping it, what it is). Libraries a
# full Linux driver installs with the version suffix; one missing is worth a warning. Others
# found with the suffix are mounted too, silently (the toolkit mounts every lib*.so.<version>).
EXPECTED_LIBRARIES = (
    ("libnvidia-ml", 0, "management library (NVML)"),
    ("libcuda", 0, "CUDA driver library"),
    ("libnvidia-ptxjitcompiler", 0, "PTX JIT compiler (used by libcuda)"),
    ("libnvidia-cfg", 0, "GPU configuration"),
    ("libnvidia-opencl", 0, "OpenCL ICD"),
    ("libnvidia-allocator", 460, "allocator runtime"),
    ("libnvidia-nvvm", 520, "NVVM compiler"),
    ("libcudadebugger", 525, "CUDA debugger"),
    ("libnvidia-gpucomp", 535, "shader compiler"),
    ("libnvcuvid", 0, "video decoder"),
    ("libnvidia-encode", 0, "video encoder"),
    ("libnvidia-opticalflow", 0, "optical flow"),
    ("libvdpau_nvidia", 0, "VDPAU ICD"),
    ("libnvidia-eglcore", 0, "EGL core"),
    ("libnvidia-glcore", 0, "OpenGL core"),
    ("libnvidia-tls", 0, "thread-local storage (OpenGL)"),
    ("libnvidia-glsi", 0, "OpenGL system interaction"),
    ("libnvidia-fbc", 0, "frame buffer capture"),
    ("libnvidia-rtcore", 0, "OptiX ray tracing core"),
    ("libnvoptix", 0, "OptiX"),
    ("libGLX_nvidia", 0, "OpenGL/GLX ICD"),
    ("libEGL_nvidia", 0, "EGL ICD"),
    ("libGLESv2_nvidia", 0, "OpenGL ES 2 ICD"),
    ("libGLESv1_CM_nvidia", 0, "OpenGL ES 1 ICD"),
    ("libnvidia-glvkspirv", 0, "SPIR-V for Vulkan"),
)

# The toolkit's binaries: (name, expected). The IMEX ones come only with the IMEX package.
BINARIES = (
    ("nvidia-smi", True),
    ("nvidia-debugdump", True),
    ("nvidia-persistenced", True),
    ("nvidia-cuda-mps-control", True),
    ("nvidia-cuda-mps-server", True),
    ("nvidia-imex", False),
    ("nvidia-imex-ctl", False),
)
BIN_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")

FIRMWARE_DIRS = ("/lib/firmware/updates/{release}", "/lib/firmware/updates", "/lib/firmware/{release}",
                 "/lib/firmware")
FIRST_GSP_BRANCH = 510

IPC_SOCKETS = ("/nvidia-persistenced/socket", "/nvidia-fabricmanager/socket")
IPC_SOCKET_DIRS = ("/run", "/var/run")
MPS_DIR = "/tmp/nvidia-mps"

CONTROL_NODES = (("/dev/nvidiactl", True), ("/dev/nvidia-uvm", False), ("/dev/nvidia-uvm-tools", False),
                 ("/dev/nvidia-modeset", False))

# ld.so.cache flags of this machine's libraries (libc6 type | the machine's required bits).
_NATIVE_FLAGS = {"x86_64": 0x0303, "aarch64": 0x0a03}


def branch(version):
    """The driver branch (major number) of VERSION, 0 when it does not start with one."""
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else 0


class Library:
    __slots__ = ("host", "path", "soname")

    def __init__(self, host, path, soname):
        self.host = host        # the file in the driver root (host path)
        self.path = path        # where it goes in the container
        self.soname = soname    # its DT_SONAME, "" when none


class DriverFiles:
    """What discover_files() found."""

    def __init__(self):
        self.libraries = []     # [Library], in mount order
        self.lib_dirs = []      # container paths of the driver's library directories
        self.binaries = []      # [(host, path)]
        self.firmware = []      # [(host, path)]
        self.ipc = []           # [(host, path)]
        self.configs = []       # [(host, path)]: configuration and ICD files (graphics.py)
        self.graphics = []      # [(host, path)]: EGL platform libraries, Xorg modules (graphics.py)
        self.links = []         # ["TARGET::LINK"] for create-symlinks
        self.warnings = []


class DriverRoot(Tree):
    """The driver root, opened once; paths inside it are resolved inside it (shim.inroot:
    host(), resolve(), lookup(), listdir(), and the warnings of what they refused)."""

    def __init__(self, root, machine=None):
        try:
            super().__init__(root, "driver root")
        except TreeError as err:
            raise GenerateError(str(err)) from None
        self.machine = machine or platform.machine()
        self._cache = None

    def soname(self, path):
        """DT_SONAME of the library at container path PATH ("" if none), or None when it is
        not a library of this machine."""
        from .._native import ffi, lib
        from ..ldconfig.engine import MACHINES

        target = MACHINES.get(self.machine)
        fd = self.tree.open(path, os.O_RDONLY | os.O_CLOEXEC)
        if fd < 0:
            return None
        try:
            info = ffi.new("struct cds_elf_info *")
            status = lib.cds_elf_read_fd(fd, 2**64 - 1, target[0] if target else lib.CDS_TARGET_X86_64, info)
        finally:
            os.close(fd)
        if status != lib.CDS_ELF_LIBRARY:
            return None
        return ffi.string(info.soname, info.soname_len).decode(errors="replace") if info.has_soname else ""

    # -- the cache ---------------------------------------------------------------------

    def cache_entries(self):
        """[(soname, path)] of the root's ld.so.cache, this machine's libraries only."""
        if self._cache is None:
            from ..ldconfig.ldcache import LdcacheError, read_root_cache

            try:
                cache = read_root_cache(self.path)
            except LdcacheError as err:
                raise GenerateError(self._missing_driver(f"its /etc/ld.so.cache cannot be read ({err})")) from None
            native = _NATIVE_FLAGS.get(self.machine)
            self._cache = [(e.soname, e.path) for e in cache.entries
                           if native is None or (e.flags & 0xffff) == native]
        return self._cache

    def _missing_driver(self, why):
        where = "" if self.path == "/" else f" --root {self.path}"
        return (f"no NVIDIA user-space driver in the driver root {self.path}: {why}. "
                f"Check that the driver is installed there (`cdi-shim ldcache list{where} | grep {NVML_LIBRARY}` "
                f"lists it) and that its ld.so.cache is current (`ldconfig{' -r ' + self.path if where else ''}`); "
                "--driver-root names another root (a driver container's, e.g. /run/nvidia/driver)")

    def nvml_library(self):
        """Host path of the root's libnvidia-ml.so.1 as its ld.so.cache names it."""
        for soname, path in self.cache_entries():
            if soname == NVML_LIBRARY:
                resolved = self.resolve(path, stat.S_IFREG)
                if resolved is not None:
                    return self.host(resolved)
        raise GenerateError(self._missing_driver(f"its ld.so.cache lists no {NVML_LIBRARY} (of this machine, "
                                                 f"{self.machine}, present in the root)"))


def discover_files(root, version):
    """DriverFiles of driver VERSION in ROOT (a DriverRoot)."""
    found = DriverFiles()
    _libraries(root, version, found)
    _binaries(root, found)
    _firmware(root, version, found)
    _ipc(root, found)
    discover_graphics(root, version, found)
    found.warnings += root.warnings
    return found


def _libraries(root, version, found):
    suffix = ".so." + version
    dirs = []
    for _soname, path in root.cache_entries():
        resolved = root.resolve(path, stat.S_IFREG)
        if resolved and posixpath.basename(resolved).startswith("lib") and resolved.endswith(suffix):
            directory = posixpath.dirname(resolved)
            if directory not in dirs:
                dirs.append(directory)
    if not dirs:
        raise GenerateError(root._missing_driver(f"its ld.so.cache names no library of driver {version} "
                                                 f"(lib*{suffix}), the version NVML reports"))
    found.lib_dirs = dirs
    seen = set()
    for directory in dirs + [d + "/vdpau" for d in dirs]:
        for name, _kind in sorted(root.listdir(directory)):
            if not (fnmatch.fnmatchcase(name, "*" + suffix) or fnmatch.fnmatchcase(name, "libnvidia-nvvm70.so.*")):
                continue
            resolved = root.resolve(f"{directory}/{name}", stat.S_IFREG)
            if resolved is None or resolved in seen:
                continue
            soname = root.soname(resolved)
            if soname is None:
                continue  # not a library of this machine
            seen.add(resolved)
            found.libraries.append(Library(root.host(resolved), f"{directory}/{name}", soname))
    names = {posixpath.basename(lib.path) for lib in found.libraries}
    for stem, first, what in EXPECTED_LIBRARIES:
        if branch(version) >= first and stem + suffix not in names:
            found.warnings.append(f"{stem}{suffix} ({what}) is not in the driver's library directories "
                                  f"({', '.join(dirs)}) of {root.path}: containers will not get it")
    found.links = _links(root, found.libraries, version)


def _links(root, libraries, version):
    """create-symlinks arguments, as the toolkit makes them (internal/discover/symlinks.go)."""
    links = []

    def add(link):
        if link not in links:
            links.append(link)

    suffix = ".so." + version
    for lib in libraries:
        directory, name = posixpath.split(lib.path)
        if name == "libcuda" + suffix:            # applications dlopen libcuda.so
            add(f"libcuda.so.1::{directory}/libcuda.so")
        elif name == "libGLX_nvidia" + suffix:    # GLVND's indirect GLX
            add(f"{name}::{directory}/libGLX_indirect.so.0")
        elif name == "libnvidia-opticalflow" + suffix:
            add(f"libnvidia-opticalflow.so.1::{directory}/libnvidia-opticalflow.so")
        if not name.endswith(suffix):
            continue
        # DIR/SONAME -> the file, and DIR/lib.so -> SONAME, where the driver root has them.
        if lib.soname and lib.soname != name and root.tree.stat(f"{directory}/{lib.soname}", follow=False):
            add(f"{name}::{directory}/{lib.soname}")
        target = lib.soname or name
        dev = target[:target.index(".so") + 3] if ".so" in target else target
        if dev != target and root.tree.stat(f"{directory}/{dev}", follow=False):
            add(f"{target}::{directory}/{dev}")
    return links


def _binaries(root, found):
    for name, expected in BINARIES:
        for directory in BIN_DIRS:
            path = f"{directory}/{name}"
            resolved = root.resolve(path, stat.S_IFREG)
            if resolved is not None:
                found.binaries.append((root.host(resolved), path))
                break
        else:
            if expected:
                found.warnings.append(f"{name} is not in {', '.join(BIN_DIRS)} of {root.path}: "
                                      "containers will not get it")


def _firmware(root, version, found):
    release = platform.release()
    dirs = []
    try:
        with open("/sys/module/firmware_class/parameters/path") as stream:
            custom = stream.read().strip()
        if custom:
            dirs.append(custom)
    except OSError:
        pass
    dirs += [d.format(release=release) for d in FIRMWARE_DIRS]
    for directory in dirs:
        folder = f"{directory.rstrip('/')}/nvidia/{version}"
        names = sorted(name for name, _ in root.listdir(folder) if fnmatch.fnmatchcase(name, "gsp*.bin"))
        for name in names:
            resolved = root.resolve(f"{folder}/{name}", stat.S_IFREG)
            if resolved is not None:
                found.firmware.append((root.host(resolved), f"{folder}/{name}"))
        if found.firmware:
            return
    if branch(version) >= FIRST_GSP_BRANCH:
        found.warnings.append(f"no GSP firmware of driver {version} (nvidia/{version}/gsp*.bin under "
                              f"{', '.join(dirs)}) in {root.path}: containers will not get it")


def _ipc(root, found):
    # Mounted read-write: the resolved socket or folder only, never one that is itself a link
    # (a planted link would hand containers the host's / or containerd's socket).
    for socket in IPC_SOCKETS:
        for directory in IPC_SOCKET_DIRS:
            path = directory + socket
            resolved = root.resolve(path, stat.S_IFSOCK, leaf_link=False)
            if resolved is not None:
                found.ipc.append((root.host(resolved), path))
                break
    resolved = root.resolve(MPS_DIR, stat.S_IFDIR, leaf_link=False)
    if resolved is not None:
        found.ipc.append((root.host(resolved), MPS_DIR))


# -- device nodes -------------------------------------------------------------------------

NVIDIA_MAJOR = 195       # /dev/nvidiaN, /dev/nvidiactl, /dev/nvidia-modeset: the driver's fixed major
DRM_MAJOR = 226          # /dev/dri/*
# Nodes whose major the kernel gives out at module load: the driver name in /proc/devices.
PROC_MAJORS = (("/dev/nvidia-uvm", "nvidia-uvm"), ("/dev/nvidia-caps/", "nvidia-caps"))


class Node:
    """A device node found under the dev root: its container PATH, its HOST path (resolved
    inside the dev root) and its owner group and mode (for gid and additionalGids)."""

    __slots__ = ("path", "host", "gid", "mode")

    def __init__(self, path, host, gid, mode):
        self.path, self.host, self.gid, self.mode = path, host, gid, mode

    def group_only(self):
        """A process needs the node's group to use it: not both world-readable and -writable,
        and the group is not root's (the toolkit's edits/device.go)."""
        return self.gid != 0 and (self.mode & 0o006) != 0o006


class DevRoot(Tree):
    """The dev root, opened once: each device node resolved inside it and checked against the
    major number it must have (a planted /dev/nvidia0 that is /dev/mem, or a link to a disk's
    node, would be allowed by the container's device cgroup)."""

    def __init__(self, root, proc="/proc"):
        try:
            super().__init__(root, "dev root")
        except TreeError as err:
            raise GenerateError(str(err)) from None
        self.proc = proc
        self._majors = None

    def proc_majors(self):
        """{driver name: major} of the character devices in PROC/devices ({} when unreadable)."""
        if self._majors is None:
            from cdi.safeio import UnsafeFile, read_regular_file

            self._majors = {}
            try:
                text = read_regular_file(f"{self.proc}/devices", 1 << 20)[0].decode("utf-8", "replace")
            except (OSError, UnsafeFile):
                return self._majors
            section = None
            for line in text.splitlines():
                if line.endswith(":"):
                    section = line
                    continue
                parts = line.split()
                if section == "Character devices:" and len(parts) == 2 and parts[0].isdigit():
                    self._majors.setdefault(parts[1], int(parts[0]))
        return self._majors

    def expected_major(self, path):
        """(major, where it comes from) that the node at PATH must have; major None when unknown."""
        if path.startswith("/dev/dri/"):
            return DRM_MAJOR, "DRM"
        for prefix, name in PROC_MAJORS:
            if path == prefix or path.startswith(prefix + "-") or prefix.endswith("/") and path.startswith(prefix):
                return self.proc_majors().get(name), f"{name} in {self.proc}/devices"
        return NVIDIA_MAJOR, "NVIDIA"

    def char_device(self, path):
        """The Node at PATH (a character device of the right major, resolved inside the dev
        root), or None: missing, or refused with a warning naming it."""
        found = self.lookup(path)
        if found is None:
            return None
        resolved, info = found
        host = self.host(resolved)
        if not stat.S_ISCHR(info.st_mode):
            if resolved != path:
                self.warn(f"{self.host(path)} leads to {host}, which is not a character device: left out")
            return None
        major, where = self.expected_major(path)
        got = os.major(info.st_rdev)
        if major is None:
            self.warn(f"{host} ({path}): {where} has no major number for it (the module is not loaded?), so the "
                      f"node ({got}:{os.minor(info.st_rdev)}) cannot be checked: left out")
            return None
        if got != major:
            self.warn(f"{host} ({path}) is the character device {got}:{os.minor(info.st_rdev)}, not one of major "
                      f"{major} ({where}): left out")
            return None
        return Node(path, host, info.st_gid, info.st_mode)


def control_nodes(dev_root, warnings):
    """[Node] of the control device nodes present; /dev/nvidiactl is required."""
    nodes = []
    for path, required in CONTROL_NODES:
        node = dev_root.char_device(path)
        if node is not None:
            nodes.append(node)
        elif required:
            raise GenerateError(_missing_node(dev_root, path, "the NVIDIA control device"))
    return nodes


def gpu_nodes(dev_root, gpu, sysfs="/sys"):
    """([Node], [create-symlinks link]) of GPU: its /dev/nvidiaN (required) and its DRM nodes
    (graphics.py), and the /dev/dri/by-path links to those."""
    path = f"/dev/nvidia{gpu.minor}"
    node = dev_root.char_device(path)
    if node is None:
        raise GenerateError(_missing_node(dev_root, path, f"GPU {gpu.index} ({gpu.uuid}, minor number {gpu.minor})"))
    bus_id = pci_bus_id(gpu.bus_id)
    if bus_id is None:
        return [node], []
    drm = drm_nodes(dev_root, bus_id, sysfs)
    return [node] + drm, by_path_links(dev_root, bus_id, drm)


def mig_caps(proc="/proc"):
    """{capability: minor} of the kernel's MIG capabilities (gpu0/gi1/access, gpu0/gi1/ci0/access,
    config, monitor), from PROC/driver/nvidia-caps/mig-minors; None when the file is absent."""
    try:
        with open(f"{proc}/driver/nvidia-caps/mig-minors") as stream:
            text = stream.read()
    except FileNotFoundError:
        return None
    caps = {}
    for line in text.splitlines():
        parts = line.split(" ")
        if len(parts) == 2 and parts[1].isdigit():
            caps[parts[0]] = int(parts[1])
    return caps


def mig_nodes(dev_root, gpu, mig, caps, proc="/proc"):
    """[Node] of a MIG device: its GPU's /dev/nvidiaN and the device nodes of its
    GPU-instance and compute-instance capabilities (/dev/nvidia-caps/nvidia-capM)."""
    what = f"GPU {gpu.index} ({gpu.uuid}) MIG device {mig.index} ({mig.uuid})"
    if caps is None:
        raise GenerateError(f"{what}: {proc}/driver/nvidia-caps/mig-minors is missing, so its capability device "
                            "nodes are unknown: is the NVIDIA driver loaded with MIG support (lsmod | grep nvidia)?")
    path = f"/dev/nvidia{gpu.minor}"
    node = dev_root.char_device(path)
    if node is None:
        raise GenerateError(_missing_node(dev_root, path, f"GPU {gpu.index} ({gpu.uuid}, minor number {gpu.minor})"))
    nodes = [node]
    for cap in (f"gpu{gpu.minor}/gi{mig.gi}/access", f"gpu{gpu.minor}/gi{mig.gi}/ci{mig.ci}/access"):
        if cap not in caps:
            raise GenerateError(f"{what}: no capability {cap} in {proc}/driver/nvidia-caps/mig-minors")
        path = f"/dev/nvidia-caps/nvidia-cap{caps[cap]}"
        node = dev_root.char_device(path)
        if node is None:
            raise GenerateError(_missing_node(dev_root, path, f"{what}, capability {cap}").replace(
                "Run `nvidia-smi` once, or `nvidia-modprobe -c N` / `nvidia-ctk system create-device-nodes`",
                f"Run `nvidia-modprobe -f /proc/driver/nvidia/capabilities/{cap.replace('/', '/mig/', 1)}`"))
        nodes.append(node)
    return nodes


def _missing_node(dev_root, path, what):
    where = "" if dev_root.path == "/" else f" under the dev root {dev_root.path}"
    refused = next((w for w in dev_root.warnings if w.startswith(dev_root.host(path) + " ")
                    or f"({path})" in w), None)
    if refused:
        return f"{path}{where} ({what}): {refused}"
    return (f"{path}{where} ({what}) is missing or not a character device: the driver has not made its device "
            "nodes yet. Run `nvidia-smi` once, or `nvidia-modprobe -c N` / `nvidia-ctk system create-device-nodes`, "
            "then generate again")
