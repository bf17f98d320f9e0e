"""A lab whose containerd has NRI on, with `cdi-shim nri` on its socket (docs/nri.md).

containerd 2.x has NRI on by default; 1.7 has it off (`[plugins."io.containerd.nri.v1.nri"]
disable = true`): the lab turns it on. Either way the NRI socket is the lab's own (in its short
socket folder, reachable from this mount namespace: containerd 2.x runs with a /run of its own),
so the system's NRI socket and other labs stay untouched. Pods run on the stock `runc`
handler, with no RuntimeClass: every device they get is the plugin's.
"""
import io
import os
import subprocess
import tarfile
import time

import tomlkit

from .hosttools import CMD_TIMEOUT, LabError, find_tool, stop_process
from .images import DRIVER_FOLDER, DRIVER_VERSION, build_oci_archive
from .lab import Lab

NRI_PLUGIN = "io.containerd.nri.v1.nri"
REGISTERED = "registered as "
# An image with CUDA's forward-compatibility libcuda, as CUDA images ship it: the folder reached
# through the /usr/local/cuda link (the toolkit's hook names it resolved).
COMPAT_IMAGE = "localhost/busybox-cuda-compat:local"
COMPAT_VERSION = "570.86.10"
COMPAT_FOLDER = "/usr/local/cuda-12.8/compat"
COMPAT_KIND = "bench.cdi-shim.dev/compat"


def _gcc_library(path, soname, marker, gcc):
    with open(f"{path}.c", "w") as stream:
        stream.write(f"int fake_cuda_major(void) {{ return {marker}; }}\n")
    subprocess.run([gcc, "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", path, f"{path}.c"], check=True,
                   capture_output=True, timeout=CMD_TIMEOUT)
    os.unlink(f"{path}.c")


def compat_layer(libcuda):
    """A layer tar: LIBCUDA (a host file) as COMPAT_FOLDER/libcuda.so.COMPAT_VERSION with its
    libcuda.so.1 link, /usr/local/cuda -> cuda-12.8, an ld.so.conf reading ld.so.conf.d."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def entry(name, kind, mode, link="", data=b""):
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime, info.linkname, info.size = kind, mode, 0, link, len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)

        for folder in ("usr/local", "usr/local/cuda-12.8", COMPAT_FOLDER.lstrip("/"), "etc/ld.so.conf.d"):
            entry(folder, tarfile.DIRTYPE, 0o755)
        with open(libcuda, "rb") as stream:
            entry(f"{COMPAT_FOLDER.lstrip('/')}/libcuda.so.{COMPAT_VERSION}", tarfile.REGTYPE, 0o755,
                  data=stream.read())
        entry(f"{COMPAT_FOLDER.lstrip('/')}/libcuda.so.1", tarfile.SYMTYPE, 0o777, f"libcuda.so.{COMPAT_VERSION}")
        entry("usr/local/cuda", tarfile.SYMTYPE, 0o777, "cuda-12.8")
        entry("etc/ld.so.conf", tarfile.REGTYPE, 0o644, data=b"include /etc/ld.so.conf.d/*.conf\n")
    return buffer.getvalue()


class NRILab(Lab):
    def __init__(self, base, **options):
        super().__init__(base, **options)
        if self.containerd_version == "1.6":
            raise LabError("containerd 1.6 has no NRI (1.7 and 2.x have)")
        self.nri_socket = os.path.join(self.socket_dir, "nri.sock")
        # the plugin's hook socket: where runc's hooks see it (containerd 2.x's /run is its own)
        self.hook_socket = os.path.join(self.socket_dir, "hook", "h.sock")
        self.plugin_log = os.path.join(self.base, "nri-plugin.log")
        self.plugin = None

    def base_config_text(self):
        doc = tomlkit.parse(super().base_config_text())
        nri = doc["plugins"][NRI_PLUGIN]
        nri["disable"] = False
        nri["socket_path"] = self.nri_socket
        return tomlkit.dumps(doc)

    def add_compat_image(self, hook_program):
        """COMPAT_IMAGE imported, and the spec of COMPAT_KIND: the driver's libcuda
        (DRIVER_VERSION, bind-mounted into DRIVER_FOLDER) with the toolkit's enable-cuda-compat and
        update-ldcache hooks, HOOK_PROGRAM their program. Device "newer": a host driver older
        than the image's compat libcuda (which is to be chosen); "older": one newer (the driver's
        stays). Returns {"newer": device, "older": device}."""
        gcc = find_tool("gcc", "gcc")
        work = os.path.join(self.base, "compat")
        os.makedirs(work, exist_ok=True)
        driver = os.path.join(work, f"libcuda.so.{DRIVER_VERSION}")
        _gcc_library(driver, "libcuda.so.1", 550, gcc)
        _gcc_library(os.path.join(work, "compat.so"), "libcuda.so.1", 570, gcc)
        layer = compat_layer(os.path.join(work, "compat.so"))
        archive = build_oci_archive(os.path.join(work, "image.tar"), self.busybox,
                                    {COMPAT_IMAGE: (None, ["/bin/sh"], [layer])})
        self.ctr_cmd("images", "import", "--all-platforms", archive)
        self.client.wait_images([COMPAT_IMAGE])
        name = os.path.basename(hook_program)

        def hooks(host):
            return "".join(f"        - hookName: createContainer\n          path: {hook_program}\n"
                           f"          args: [{name}, {args}]\n"
                           for args in (f"enable-cuda-compat, --host-driver-version={host}",
                                        f"update-ldcache, --folder, {DRIVER_FOLDER}"))
        devices = "".join(f'  - name: "{key}"\n    containerEdits:\n      hooks:\n' + hooks(host)
                          for key, host in (("newer", DRIVER_VERSION), ("older", "580.65.06")))
        self.write_spec("bench-compat.yaml", f'cdiVersion: "0.5.0"\nkind: {COMPAT_KIND}\ndevices:\n{devices}'
                        "containerEdits:\n  mounts:\n"
                        f"    - hostPath: {driver}\n      containerPath: {DRIVER_FOLDER}/libcuda.so.{DRIVER_VERSION}\n"
                        "      options: [ro, nosuid, nodev, bind]\n")
        return {"newer": f"{COMPAT_KIND}=newer", "older": f"{COMPAT_KIND}=older"}

    def plugin_registrations(self):
        try:
            with open(self.plugin_log, errors="replace") as stream:
                return stream.read().count(REGISTERED)
        except FileNotFoundError:
            return 0

    def plugin_log_text(self):
        try:
            with open(self.plugin_log, errors="replace") as stream:
                return stream.read()
        except FileNotFoundError:
            return ""

    def start_plugin(self, namespaces=("default",), wait=True, args=()):
        """`cdi-shim nri` on this lab's NRI socket, serving NAMESPACES; with WAIT, until it has
        registered (once more than before)."""
        before = self.plugin_registrations()
        command = [self.cli, "nri", "--socket", self.nri_socket, "--hook-socket", self.hook_socket] + [
            arg for name in namespaces for arg in ("--namespace", name)] + list(args)
        log = open(self.plugin_log, "ab")
        try:
            self.plugin = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           env=self.env(), start_new_session=True)
        finally:
            log.close()
        if wait:
            self.wait_registered(before + 1)
        return self.plugin

    def wait_registered(self, count, timeout=30):
        """Until the plugin's log says it registered COUNT times in all."""
        deadline = time.monotonic() + timeout
        while self.plugin_registrations() < count:
            if self.plugin is None or self.plugin.poll() is not None or time.monotonic() > deadline:
                raise LabError(f"cdi-shim nri did not register on {self.nri_socket}: "
                               f"{self.plugin_log_text()[-2000:]} {self.containerd_log_tail()}")
            time.sleep(0.02)

    def stop_plugin(self):
        stop_process(self.plugin, 15)
        self.plugin = None

    def restart_containerd(self):
        """Stop containerd (its pods stay) and start it again on the same config and state."""
        self.client.close()
        self.client = None
        stop_process(self.process, 15)
        self.process = None
        self.start()

    def stop(self):
        self.stop_plugin()
        super().stop()
