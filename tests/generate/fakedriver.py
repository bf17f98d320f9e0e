"""A fake NVIDIA driver for the tests of `cdi-shim cdi generate`, made of real parts.

* a driver root: the driver's libraries as gcc-built shared objects with the real SONAMEs
  and file names (lib*.so.<version>, the SONAME links, the .so links the driver makes),
  libnvidia-ml.so.<version> being the fake NVML of fake_nvml.c (read by the real pynvml),
  vdpau/libvdpau_nvidia.so.<version>, the binaries, the GSP firmware, the persistenced
  socket, the root's own ld.so.cache made by the real `ldconfig -r`, and the graphics files
  where the driver's .run installer puts them: the Xorg modules (gcc-built), the EGL platform
  libraries (versioned on their own), the ICD and configuration files (GRAPHICS_FILES);
* a dev root: /dev/nvidiaN, /dev/nvidiactl, /dev/nvidia-uvm, ... made with mknod (char 195,
  as NVIDIA's; the tests run as root), and each GPU's DRM nodes /dev/dri/card<N+1> and
  /dev/dri/renderD<128+N> (char 226) with the udev links /dev/dri/by-path/pci-<bus id>-card
  and -render;
* a sysfs root: /sys/bus/pci/devices/<bus id> (a link into /sys/devices, as the kernel's)
  with the GPU's drm/card* and drm/renderD* entries;
* the NVML description (fake-nvml.conf beside the library): the driver version and the GPUs.

Missing tools FAIL the test with the package to install (never skip).
"""
import os
import shutil
import socket
import subprocess

try:
    import pytest
except ImportError:         # scripts/trial.py builds the driver without the test tools
    pytest = None

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE_NVML_C = os.path.join(HERE, "fake_nvml.c")
VERSION = "580.65.06"
LIBDIR = "/usr/lib/x86_64-linux-gnu"

# (file stem, SONAME: "1" = stem.so.1, "v" = stem.so.<version>, or a literal; .so link made?)
LIBRARIES = (
    ("libcuda", "1", True),
    ("libcudadebugger", "1", False),
    ("libnvidia-ptxjitcompiler", "1", False),
    ("libnvidia-nvvm", "4", False),
    ("libnvidia-opencl", "1", False),
    ("libnvidia-allocator", "1", False),
    ("libnvidia-gpucomp", "v", False),
    ("libnvidia-cfg", "1", False),
    ("libnvidia-pkcs11", "v", False),
    ("libnvidia-pkcs11-openssl3", "v", False),
    ("libnvcuvid", "1", False),
    ("libnvidia-encode", "1", False),
    ("libnvidia-opticalflow", "1", False),
    ("libnvidia-eglcore", "v", False),
    ("libnvidia-glcore", "v", False),
    ("libnvidia-tls", "v", False),
    ("libnvidia-glsi", "v", False),
    ("libnvidia-fbc", "1", False),
    ("libnvidia-rtcore", "v", False),
    ("libnvoptix", "1", False),
    ("libGLX_nvidia", "0", False),
    ("libEGL_nvidia", "0", False),
    ("libGLESv2_nvidia", "2", False),
    ("libGLESv1_CM_nvidia", "1", False),
    ("libnvidia-glvkspirv", "v", False),
    ("libnvidia-ngx", "1", False),
    ("libnvidia-sandboxutils", "1", False),
)
# Graphics files: (path in the driver root, content); the Vulkan ICD under /usr/share, as the
# .run installer puts it (the toolkit mounts it at /etc/vulkan/... in the container).
GRAPHICS_FILES = (
    ("/usr/share/glvnd/egl_vendor.d/10_nvidia.json", '{"ICD": {"library_path": "libEGL_nvidia.so.0"}}\n'),
    ("/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
     '{"ICD": {"library_path": "libnvidia-egl-gbm.so.1"}}\n'),
    ("/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json",
     '{"ICD": {"library_path": "libnvidia-egl-wayland.so.1"}}\n'),
    ("/usr/share/vulkan/icd.d/nvidia_icd.json", '{"ICD": {"library_path": "libGLX_nvidia.so.0"}}\n'),
    ("/usr/share/vulkan/implicit_layer.d/nvidia_layers.json", '{"layer": {"name": "VK_LAYER_NV_optimus"}}\n'),
    ("/usr/share/nvidia/nvoptix.bin", "optix\n"),
    ("/usr/share/X11/xorg.conf.d/nvidia-drm-outputclass.conf", 'Section "OutputClass"\nEndSection\n'),
    ("/etc/OpenCL/vendors/nvidia.icd", "libnvidia-opencl.so.1\n"),
)
# EGL platform libraries: (file name, SONAME), in LIBDIR.
EGL_PLATFORM_LIBRARIES = (("libnvidia-egl-gbm.so.1.1.2", "libnvidia-egl-gbm.so.1"),
                          ("libnvidia-egl-wayland.so.1.1.19", "libnvidia-egl-wayland.so.1"))
XORG_DRIVER = "/usr/lib/xorg/modules/drivers/nvidia_drv.so"
XORG_GLX_DIR = "/usr/lib/xorg/modules/extensions"
DRM_MAJOR = 226
# Majors the kernel hands out at module load (what /proc/devices says; the generator checks
# nvidia-uvm's and nvidia-caps' nodes against it, NVIDIA's 195 and DRM's 226 being fixed).
UVM_MAJOR = 511
CAPS_MAJOR = 508


def write_proc_devices(proc, uvm=UVM_MAJOR, caps=CAPS_MAJOR):
    """PROC/devices as a kernel with the NVIDIA modules loaded writes it."""
    os.makedirs(proc, exist_ok=True)
    lines = ["Character devices:", "  1 mem", "  4 /dev/vc/0", "195 nvidia-frontend", "226 drm"]
    lines += [f"{caps} nvidia-caps"] if caps else []
    lines += [f"{uvm} nvidia-uvm"] if uvm else []
    lines += ["", "Block devices:", "  8 sd", f"{uvm or 259} blkext"]
    with open(os.path.join(proc, "devices"), "w") as out:
        out.write("\n".join(lines) + "\n")


def bus_id(index):
    """The kernel's PCI bus id of fake GPU INDEX (gpu_lines gives NVML's form of it)."""
    return f"0000:{0x10 + index:02x}:00.0"


def drm_names(index):
    return f"card{index + 1}", f"renderD{128 + index}"


BINARIES = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
            "nvidia-cuda-mps-server")


def need(name, package):
    path = shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/sbin/{name}") if os.access(p, os.X_OK)),
                                      None)
    if path is None:
        message = f"{name} not found: apt-get install {package}"
        if pytest is None:
            raise SystemExit(message)
        pytest.fail(message, pytrace=False)
    return path


def _run(argv):
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        raise AssertionError(f"{argv[0]} failed: {done.stderr}")


def build_nvml(path, soname="libnvidia-ml.so.1"):
    _run([need("gcc", "gcc"), "-shared", "-fPIC", "-O1", "-Wall", "-Werror", f"-Wl,-soname,{soname}", "-o", path,
          FAKE_NVML_C, "-ldl"])


def _soname(stem, kind, version):
    if kind == "v":
        return f"{stem}.so.{version}"
    return f"{stem}.so.{kind}"


def gpu_lines(count, uuid_format="GPU-{index:08x}-1111-2222-3333-{index:012x}"):
    return [f"gpu uuid={uuid_format.format(index=i)} minor={i} bus=00000000:{0x10 + i:02X}:00.0 name=NVIDIA_H100"
            for i in range(count)]


class FakeDriver:
    """A driver root and a dev root under BASE."""

    def __init__(self, base, version=VERSION, gpus=2, omit=(), nvml_lines=None, ldconfig=True, nodes=True,
                 merged_usr=False, absolute_links=False):
        """MERGED_USR: /lib is a link to usr/lib and ld.so.conf names /lib/x86_64-linux-gnu (the
        cache then names the libraries through the link). ABSOLUTE_LINKS: the SONAME links are
        absolute (/usr/lib/...), as a driver container's may be: they mean the root's files."""
        self.base = str(base)
        self.version = version
        self.root = os.path.join(self.base, "driver")
        self.dev_root = os.path.join(self.base, "devroot")
        self.proc = os.path.join(self.base, "proc")
        write_proc_devices(self.proc)
        self.libdir = self.root + LIBDIR
        self.absolute_links = absolute_links
        os.makedirs(self.libdir + "/vdpau", exist_ok=True)
        if merged_usr:
            os.symlink("usr/lib", self.root + "/lib")
        os.makedirs(self.root + "/etc", exist_ok=True)
        self.omit = omit
        self._install_userspace()
        self.set_gpus(gpus if nvml_lines is None else None, nvml_lines)
        for path, text in GRAPHICS_FILES:
            os.makedirs(os.path.dirname(self.root + path), exist_ok=True)
            with open(self.root + path, "w") as out:
                out.write(text)
        self.sysfs = os.path.join(self.base, "sysfs")
        os.makedirs(f"{self.root}/run/nvidia-persistenced", exist_ok=True)
        self._socket = socket.socket(socket.AF_UNIX)
        cwd = os.getcwd()
        os.chdir(f"{self.root}/run/nvidia-persistenced")   # a socket's path is at most 107 bytes
        try:
            self._socket.bind("socket")
        finally:
            os.chdir(cwd)
        with open(f"{self.root}/etc/ld.so.conf", "w") as out:
            out.write(f"{LIBDIR[4:] if merged_usr else LIBDIR}\n")
        if ldconfig:
            self.ldconfig()
        if nodes:
            self.make_nodes(gpus if isinstance(gpus, int) else 0)

    def _install_userspace(self):
        """The files of self.version: libraries, NVML, binaries, GSP firmware."""
        version, omit = self.version, self.omit
        gcc = need("gcc", "gcc")
        stub = os.path.join(self.base, "stub.c")
        with open(stub, "w") as out:
            out.write("int fake_driver_symbol(void) { return 42; }\n")
        obj = os.path.join(self.base, "stub.o")
        _run([gcc, "-c", "-fPIC", "-o", obj, stub])
        self.libraries = []
        for stem, kind, dev_link in LIBRARIES:
            if stem in omit:
                continue
            self._library(gcc, obj, self.libdir, stem, _soname(stem, kind, version), dev_link)
        if "libvdpau_nvidia" not in omit:
            self._library(gcc, obj, self.libdir + "/vdpau", "libvdpau_nvidia", "libvdpau_nvidia.so.1", False)
        self.graphics = []   # the Xorg modules and EGL platform libraries (paths in the root)
        for name, soname in EGL_PLATFORM_LIBRARIES:
            _run([gcc, "-shared", f"-Wl,-soname,{soname}", "-o", f"{self.libdir}/{name}", obj])
            if not os.path.lexists(f"{self.libdir}/{soname}"):
                os.symlink(name, f"{self.libdir}/{soname}")
            self.graphics.append(f"{LIBDIR}/{name}")
        os.makedirs(self.root + XORG_GLX_DIR, exist_ok=True)
        os.makedirs(os.path.dirname(self.root + XORG_DRIVER), exist_ok=True)
        glx = f"{XORG_GLX_DIR}/libglxserver_nvidia.so.{version}"
        for path in (XORG_DRIVER, glx):
            _run([gcc, "-shared", "-o", self.root + path, obj])
            self.graphics.append(path)
        if not os.path.lexists(f"{self.root}{XORG_GLX_DIR}/libglxserver_nvidia.so"):
            os.symlink(f"libglxserver_nvidia.so.{version}", f"{self.root}{XORG_GLX_DIR}/libglxserver_nvidia.so")
        if "libnvidia-ml" not in omit:
            self.nvml = f"{self.libdir}/libnvidia-ml.so.{version}"
            build_nvml(self.nvml)
            os.symlink(self._target(LIBDIR, f"libnvidia-ml.so.{version}"), f"{self.libdir}/libnvidia-ml.so.1")
            self.libraries.append(f"{LIBDIR}/libnvidia-ml.so.{version}")
        for name in BINARIES:
            if name in omit:
                continue
            path = f"{self.root}/usr/bin/{name}"
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path + ".new", "w") as out:
                out.write(f"#!/bin/sh\necho {name} {version}\n")
            os.chmod(path + ".new", 0o755)
            os.replace(path + ".new", path)
        firmware = f"{self.root}/lib/firmware/nvidia/{version}"
        os.makedirs(firmware, exist_ok=True)
        for name in ("gsp_ga10x.bin", "gsp_tu10x.bin"):
            with open(f"{firmware}/{name}", "wb") as out:
                out.write(b"\0" * 64)

    def remove_userspace(self):
        """Uninstall the libraries and firmware of self.version (the package manager's first
        half of an upgrade); the kernel module and /proc are the test's."""
        for directory in (self.libdir, self.libdir + "/vdpau"):
            for name in os.listdir(directory):
                if name.startswith("lib") and ".so" in name:
                    os.unlink(os.path.join(directory, name))
        shutil.rmtree(f"{self.root}/lib/firmware/nvidia/{self.version}", ignore_errors=True)
        for name in os.listdir(self.root + XORG_GLX_DIR):
            os.unlink(f"{self.root}{XORG_GLX_DIR}/{name}")
        self.libraries = []

    def upgrade(self, version, remove=True):
        """Replace the user-space driver by VERSION's: new libraries (gcc), NVML reporting
        VERSION, binaries, firmware, the root's ld.so.cache (ldconfig)."""
        if remove:
            self.remove_userspace()
        conf = f"{self.libdir}/fake-nvml.conf"
        with open(conf) as stream:
            lines = stream.read().splitlines()
        self.version = version
        self._install_userspace()
        self.set_gpus(lines=[f"driver {version}" if line.startswith("driver ") else line for line in lines])
        self.ldconfig()

    def _library(self, gcc, obj, directory, stem, soname, dev_link):
        name = f"{stem}.so.{self.version}"
        _run([gcc, "-shared", f"-Wl,-soname,{soname}", "-o", f"{directory}/{name}", obj])
        if soname != name:
            os.symlink(self._target(directory[len(self.root):], name), f"{directory}/{soname}")
        if dev_link:
            os.symlink(soname, f"{directory}/{stem}.so")
        self.libraries.append(f"{directory[len(self.root):]}/{name}")

    def _target(self, directory, name):
        return f"{directory}/{name}" if self.absolute_links else name

    def set_gpus(self, count=None, lines=None):
        """Describe the fake GPUs: COUNT standard ones, or the given description LINES."""
        if lines is None:
            lines = [f"driver {self.version}"] + gpu_lines(count or 0)
        with open(f"{self.libdir}/fake-nvml.conf", "w") as out:
            out.write("\n".join(lines) + "\n")

    def uuids(self, count):
        return [f"GPU-{i:08x}-1111-2222-3333-{i:012x}" for i in range(count)]

    def ldconfig(self):
        # -X: the links are the driver's own (made above); ldconfig only writes the cache.
        _run([need("ldconfig", "libc-bin"), "-X", "-r", self.root])

    def make_nodes(self, gpus, dev_root=None, drm_mode=0o666, drm_gid=0):
        """The device nodes of GPUS GPUs under DEV_ROOT (default: self.dev_root), their DRM
        nodes (mode DRM_MODE, group DRM_GID) with the by-path links, and their sysfs entries."""
        dev = os.path.join(dev_root or self.dev_root, "dev")
        os.makedirs(dev + "/dri/by-path", exist_ok=True)
        nodes = [("nvidiactl", 195, 255, 0o666, 0), ("nvidia-modeset", 195, 254, 0o666, 0),
                 ("nvidia-uvm", UVM_MAJOR, 0, 0o666, 0), ("nvidia-uvm-tools", UVM_MAJOR, 1, 0o666, 0)]
        nodes += [(f"nvidia{i}", 195, i, 0o666, 0) for i in range(gpus)]
        for i in range(gpus):
            card, render = drm_names(i)
            nodes += [(f"dri/{card}", DRM_MAJOR, i + 1, drm_mode, drm_gid),
                      (f"dri/{render}", DRM_MAJOR, 128 + i, drm_mode, drm_gid)]
            for kind, name in (("card", card), ("render", render)):
                link = f"{dev}/dri/by-path/pci-{bus_id(i)}-{kind}"
                if not os.path.lexists(link):
                    os.symlink(f"../{name}", link)
            device = f"{self.sysfs}/devices/pci0000:00/{bus_id(i)}"
            for name in (card, render):
                os.makedirs(f"{device}/drm/{name}", exist_ok=True)
            os.makedirs(f"{self.sysfs}/bus/pci/devices", exist_ok=True)
            if not os.path.lexists(f"{self.sysfs}/bus/pci/devices/{bus_id(i)}"):
                os.symlink(f"../../../devices/pci0000:00/{bus_id(i)}", f"{self.sysfs}/bus/pci/devices/{bus_id(i)}")
        for name, major, minor, mode, gid in nodes:
            path = os.path.join(dev, name)
            if not os.path.exists(path):
                os.mknod(path, mode | 0o020000, os.makedev(major, minor))
                os.chmod(path, mode)   # (mknod's mode is masked by the umask)
                os.chown(path, 0, gid)

    def close(self):
        self._socket.close()


_node = []


def node_cli():
    """cdi-shim of a node release (tests.helpers.node_release), made once: generate names the
    hook program by the release's stable path, `<prefix>/current/bin/cdi-shim-hook`."""
    if not _node:
        import atexit
        import tempfile

        from tests.helpers import node_release

        top = tempfile.mkdtemp(prefix="cdi-shim-node-")
        atexit.register(shutil.rmtree, top, True)
        _node.append(os.path.join(node_release(top), "current", "bin", "cdi-shim"))
    return _node[0]


class Runner:
    """`cdi-shim cdi generate` against the session's driver, with a per-test NVML description."""

    def __init__(self, driver, base):
        self.driver = driver
        self.base = str(base)
        self.config = os.path.join(self.base, "fake-nvml.conf")
        self.log = os.path.join(self.base, "nvml-calls.log")
        self.output = os.path.join(self.base, "cdi", "nvidia.yaml")
        self.gpus(2)

    def gpus(self, count=None, lines=None):
        if lines is None:
            lines = [f"driver {self.driver.version}"] + gpu_lines(count)
        with open(self.config, "w") as out:
            out.write("\n".join(lines) + "\n")

    def env(self):
        env = dict(os.environ, FAKE_NVML_CONFIG=self.config, FAKE_NVML_LOG=self.log)
        env.pop("XDG_DATA_DIRS", None)   # (where the generator looks for config files: its default here)
        return env

    def cli(self, *argv, check=None):
        done = subprocess.run([node_cli(), *argv], capture_output=True, text=True, env=self.env(), timeout=120)
        if check is not None:
            assert done.returncode == check, (done.returncode, done.stdout, done.stderr)
        return done

    def generate(self, *extra, check=0, roots=True, output=True):
        argv = ["cdi", "generate"]
        if roots:
            argv += ["--driver-root", self.driver.root, "--dev-root", self.driver.dev_root,
                     "--sysfs-root", self.driver.sysfs, "--proc-root", self.driver.proc]
        if output:
            argv += ["--output", self.output]
        return self.cli(*argv, *extra, check=check)

    def calls(self):
        try:
            with open(self.log) as stream:
                return stream.read().split()
        except FileNotFoundError:
            return []
