"""What the toolkit 1.20 adds for graphics: Xorg modules, EGL platform libraries, ICD and
configuration files, and each GPU's DRM device nodes with their /dev/dri/by-path links.

As `nvidia-ctk cdi generate` 1.20 finds them (internal/discover/graphics.go,
internal/lookup/root, internal/platform-support/dgpu, internal/edits/device.go):

- EGL platform libraries (libnvidia-egl-gbm.so.X.Y.Z, ...; they do not carry the driver
  version) in the standard library directories, else through the root's ld.so.cache,
  mounted where they resolve to;
- the Xorg modules nvidia_drv.so and libglxserver_nvidia.so.<version>: the first of each in
  the Xorg module directories (the driver's library directories' nvidia/xorg and
  xorg/modules/..., then /usr/lib/xorg, /usr/lib64/xorg, /usr/X11R6/...), mounted at their
  own paths, with the link libglxserver_nvidia.so -> libglxserver_nvidia.so.<version>;
- links for libnvidia-allocator (gbm/nvidia-drm_gbm.so -> ../libnvidia-allocator.so.1) and
  libnvidia-vulkan-producer (the .so link) when the driver has them;
- configuration files (EGL vendor and platform JSON, OptiX's nvoptix.bin, Xorg
  configuration, the OpenCL vendor file) in /etc and the XDG data directories
  ($XDG_DATA_DIRS, default /usr/local/share and /usr/share), every one found mounted at its
  own path;
- the Vulkan ICD and layer files: the first found in those directories or in the driver
  root itself (a GKE driver root has vulkan/icd.d/ at its top), always mounted under
  /etc/vulkan/... in the container;
- a GPU's DRM nodes: each entry of /sys/bus/pci/devices/<bus id>/drm (card1, renderD128;
  controlD64 on old kernels) as /dev/dri/<name> when that is a character device under the
  dev root; the links
  /dev/dri/by-path/pci-<bus id>-card and -render, with the dev root's own targets, when they
  lead to those nodes (a create-symlinks hook of the device);
- a node whose group is not root's: that gid on the node; one neither world-readable nor
  world-writable also puts the group in the device's additionalGids (cdiVersion 0.7.0), so
  that the process's supplementary group is the node's group in the container too (spec.py);
- each DRM node resolved inside the dev root and checked for DRM's major (226) like every
  other node (discover.DevRoot).

The toolkit's main branch (after 1.20) adds the xcb and xlib EGL platform files and
libraries; we mount them too when the driver ships them (580 and later).
"""
import fnmatch
import os
import posixpath
import stat

# Configuration files: every one found (in config_dirs()) mounted at its own path.
CONFIG_DIRS = ("/etc", "/usr/local/share", "/usr/share")   # /etc, then $XDG_DATA_DIRS or its default
CONFIG_FILES = (
    "glvnd/egl_vendor.d/10_nvidia.json",
    "egl/egl_external_platform.d/15_nvidia_gbm.json",
    "egl/egl_external_platform.d/10_nvidia_wayland.json",
    "egl/egl_external_platform.d/09_nvidia_wayland2.json",
    "egl/egl_external_platform.d/20_nvidia_xcb.json",     # toolkit main, after 1.20
    "egl/egl_external_platform.d/20_nvidia_xlib.json",    # toolkit main, after 1.20
    "nvidia/nvoptix.bin",
    "X11/xorg.conf.d/10-nvidia.conf",
    "X11/xorg.conf.d/nvidia-drm-outputclass.conf",
    "OpenCL/vendors/nvidia.icd",
)
# Vulkan files: the first found in config_dirs() or at the driver root's top, mounted at /etc/NAME.
VULKAN_FILES = (
    "vulkan/icd.d/nvidia_icd.json",
    "vulkan/icd.d/nvidia_layers.json",
    "vulkan/implicit_layer.d/nvidia_layers.json",
)
VULKAN_MACHINE_FILE = "vulkan/icd.d/nvidia_icd.{machine}.json"   # some RPM packages' name
VULKAN_CONTAINER_DIR = "/etc"

# EGL platform libraries (versioned on their own, not with the driver).
EGL_PLATFORM_LIBRARIES = (
    "libnvidia-egl-gbm.so.*.*",
    "libnvidia-egl-wayland.so.*.*",
    "libnvidia-egl-wayland2.so.*.*",
    "libnvidia-egl-xcb.so.*.*",       # toolkit main, after 1.20
    "libnvidia-egl-xlib.so.*.*",      # toolkit main, after 1.20
)
# Where the toolkit looks for libraries before the ld.so.cache (pkg/lookup/library.go).
LIBRARY_DIRS = (
    "/", "/usr/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/nvidia/current", "/usr/lib/aarch64-linux-gnu/nvidia/current",
    "/lib64", "/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu",
    "/lib/x86_64-linux-gnu/nvidia/current", "/lib/aarch64-linux-gnu/nvidia/current",
)

XORG_MODULES = ("nvidia_drv.so", "libglxserver_nvidia.so.{version}")
XORG_ROOTS = ("/usr/lib/xorg", "/usr/lib64/xorg", "/usr/X11R6/lib", "/usr/X11R6/lib64")
XORG_SUBDIRS = ("modules/drivers", "modules/extensions", "modules/updates/drivers", "modules/updates/extensions")

DRM_DIR = "/dev/dri"
BY_PATH_KINDS = ("card", "render")


def config_dirs(environ=os.environ):
    """Where configuration files are looked for in the driver root: /etc, then the
    directories of XDG_DATA_DIRS when it is set and not empty (as the toolkit reads it from
    its own environment), else its default /usr/local/share and /usr/share."""
    xdg = [d.rstrip("/") or "/" for d in environ.get("XDG_DATA_DIRS", "").split(":") if d.startswith("/")]
    return tuple(dict.fromkeys(["/etc"] + (xdg or list(CONFIG_DIRS[1:]))))


def xorg_search_paths(lib_dirs):
    """The Xorg module directories, in the toolkit's order, for the driver's LIB_DIRS."""
    paths = []
    for lib_dir in lib_dirs:
        paths.append(f"{lib_dir}/nvidia/xorg")
        paths += [f"{lib_dir}/xorg/{sub}" for sub in XORG_SUBDIRS]
    for root in XORG_ROOTS:
        paths += [f"{root}/{sub}" for sub in XORG_SUBDIRS]
    return paths


def discover_graphics(root, version, found):
    """Add the graphics mounts and links of driver VERSION in ROOT (a DriverRoot) to FOUND
    (discover.DriverFiles, whose libraries and lib_dirs are already known)."""
    seen = set()

    def mount(host_path, path, into):
        if host_path not in seen:
            seen.add(host_path)
            into.append((root.host(host_path), path))

    for pattern in EGL_PLATFORM_LIBRARIES:
        for resolved in _platform_libraries(root, pattern):
            mount(resolved, resolved, found.graphics)
    links = []
    for name in XORG_MODULES:
        name = name.format(version=version)
        for directory in xorg_search_paths(found.lib_dirs):
            path = f"{directory}/{name}"
            resolved = root.resolve(path, stat.S_IFREG)
            if resolved is not None:
                mount(resolved, path, found.graphics)
                if name.startswith("libglxserver_nvidia.so."):
                    links.append(f"{name}::{directory}/libglxserver_nvidia.so")
                break
    for lib in found.libraries:
        directory, name = posixpath.split(lib.path)
        if name == f"libnvidia-allocator.so.{version}":
            links.append(f"../libnvidia-allocator.so.1::{directory}/gbm/nvidia-drm_gbm.so")
        elif name == f"libnvidia-vulkan-producer.so.{version}":
            links.append(f"{name}::{directory}/libnvidia-vulkan-producer.so")
    found.links = links + [link for link in found.links if link not in links]

    dirs = config_dirs()
    for name in CONFIG_FILES:
        for directory in dirs:
            path = posixpath.join(directory, name)
            resolved = root.resolve(path, stat.S_IFREG)
            if resolved is not None:
                mount(resolved, path, found.configs)
    vulkan = list(VULKAN_FILES)
    if root.machine in ("x86_64", "aarch64"):
        vulkan.append(VULKAN_MACHINE_FILE.format(machine=root.machine))
    for name in vulkan:
        for directory in dirs + ("",):
            resolved = root.resolve(posixpath.join(directory or "/", name), stat.S_IFREG)
            if resolved is not None:
                mount(resolved, f"{VULKAN_CONTAINER_DIR}/{name}", found.configs)
                break


def _platform_libraries(root, pattern):
    """Container paths (links resolved) of the libraries named PATTERN: those in the standard
    library directories, else those the root's ld.so.cache names."""
    found = []
    for directory in LIBRARY_DIRS:
        for name, _kind in sorted(root.listdir(directory)):
            if fnmatch.fnmatchcase(name, pattern):
                resolved = root.resolve(posixpath.join(directory, name), stat.S_IFREG)
                if resolved is not None and resolved not in found:
                    found.append(resolved)
    if found:
        return found
    for _soname, path in root.cache_entries():
        resolved = root.resolve(path, stat.S_IFREG)
        if resolved is not None and fnmatch.fnmatchcase(posixpath.basename(resolved), pattern) \
                and resolved not in found:
            found.append(resolved)
    return found


# -- DRM ----------------------------------------------------------------------------------

def pci_bus_id(nvml_bus_id):
    """NVML's bus id ("00000000:3B:00.0") in the kernel's form ("0000:3b:00.0"), as go-nvlib
    gives it to the toolkit; None when it is not one."""
    domain, sep, rest = nvml_bus_id.lower().partition(":")
    if not sep or not rest or not all(c in "0123456789abcdef" for c in domain):
        return None
    if len(domain) == 8 and domain.startswith("0000"):
        domain = domain[4:]
    return f"{domain}:{rest}"


def drm_nodes(dev_root, bus_id, sysfs="/sys"):
    """[Node] of the DRM nodes of the PCI device BUS_ID (kernel form): the names in its sysfs
    drm directory that are DRM character devices in DEV_ROOT's /dev/dri (a discover.DevRoot)."""
    try:
        names = os.listdir(f"{sysfs}/bus/pci/devices/{bus_id}/drm")
    except OSError:
        return []
    nodes = []
    for name in sorted(names):
        if "/" in name or name in (".", ".."):
            continue
        node = dev_root.char_device(f"{DRM_DIR}/{name}")
        if node is not None:
            nodes.append(node)
    return nodes


def by_path_links(dev_root, bus_id, nodes):
    """create-symlinks arguments for /dev/dri/by-path/pci-BUS_ID-{card,render}: the dev
    root's link text, when the link leads (inside the dev root) to one of NODES."""
    hosts = {node.host for node in nodes}
    links = []
    for kind in BY_PATH_KINDS:
        path = f"{DRM_DIR}/by-path/pci-{bus_id}-{kind}"
        target = dev_root.readlink(path)
        if target is None:
            continue
        resolved = dev_root.resolve(path)
        if resolved is not None and dev_root.host(resolved) in hosts:
            links.append(f"{target}::{path}")
    return links
