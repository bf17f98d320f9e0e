"""A lab whose containerd has NRI on, with `cdi-shim nri` on its socket (docs/nri.md).

containerd 2.x has NRI on by default; 1.7 has it off (`[plugins."io.containerd.nri.v1.nri"]
disable = true`): the lab turns it on. Either way the NRI socket is the lab's own (in its short
socket folder, reachable from this mount namespace: containerd 2.x runs with a /run of its own),
so the system's NRI socket and other labs stay untouched. Pods run on the stock `runc`
handler, with no RuntimeClass: every device they get is the plugin's.
"""
import os
import subprocess
import time

import tomlkit

from .hosttools import LabError, stop_process
from .lab import Lab

NRI_PLUGIN = "io.containerd.nri.v1.nri"
REGISTERED = "registered as "


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
