"""The plugin's life on the runtime's NRI socket: connect, register, serve, reconnect.

Registration: RegisterPlugin(name, index) on the runtime's service; the runtime then calls
Configure (we subscribe to CreateContainer only) and Synchronize (nothing to change), and from
then on CreateContainer for every container. When the connection ends (containerd restarted or
stopped, or it asked us to Shutdown), the plugin connects again as soon as the socket answers,
waiting a little longer each time (up to RETRY_MAX seconds), and registers anew: containerd
keeps no state about external plugins.
"""
import socket
import sys
import time

from .messages import CREATE_CONTAINER, nri
from .policy import CreateFailure
from .protocol import Connection, ProtocolError, RemoteError

DEFAULT_SOCKET = "/var/run/nri/nri.sock"
PLUGIN_NAME = "cdi-shim"
PLUGIN_INDEX = "10"
REGISTRATION_TIMEOUT = 5.0       # seconds (containerd's own default for the registration)
RETRY_FIRST, RETRY_MAX = 0.2, 5.0


def stderr_log(level, message):
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    sys.stderr.write(f"{stamp} cdi-shim nri {level}: {message}\n")
    sys.stderr.flush()


class Plugin:
    """POLICY's decisions served to the runtime at SOCKET_PATH."""

    def __init__(self, policy, socket_path=DEFAULT_SOCKET, name=PLUGIN_NAME, index=PLUGIN_INDEX, log=stderr_log):
        self.policy = policy
        self.socket_path = socket_path
        self.name = name
        self.index = index
        self.log = log
        self.served = 0          # CreateContainer calls answered (for tests and logs)

    def service(self):
        return {
            "Configure": (nri.ConfigureRequest, self.configure),
            "Synchronize": (nri.SynchronizeRequest, lambda request: nri.SynchronizeResponse(more=request.more)),
            "Shutdown": (nri.Empty, self.shutdown),
            "CreateContainer": (nri.CreateContainerRequest, self.create_container),
            "StateChange": (nri.StateChangeEvent, lambda request: nri.Empty()),
        }

    def configure(self, request):
        version = f" (NRI {request.NRI_version})" if request.NRI_version else ""
        self.log("info", f"configured by {request.runtime_name} {request.runtime_version}{version}")
        return nri.ConfigureResponse(events=1 << (CREATE_CONTAINER - 1))

    def shutdown(self, request):
        self.log("info", "the runtime asked the plugin to shut down; it will connect again")
        return nri.Empty()

    def create_container(self, request):
        self.served += 1
        try:
            adjust = self.policy.create_container(request.pod, request.container)
        except CreateFailure as err:
            self.log("error", str(err))
            raise
        return nri.CreateContainerResponse(adjust=adjust)

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        return sock

    def session(self, sock):
        """Register on SOCK and serve until the connection ends."""
        connection = Connection(sock, self.service())
        registration = nri.RegisterPluginRequest(plugin_name=self.name, plugin_idx=self.index)
        connection.call("RegisterPlugin", registration, nri.Empty, timeout=REGISTRATION_TIMEOUT)
        self.log("info", f"registered as {self.index}-{self.name} on {self.socket_path}")
        connection.serve()

    def run(self, once=False):
        """Serve for ever (or, with ONCE, one connection): returns only with ONCE."""
        delay, said = RETRY_FIRST, ""
        while True:
            try:
                sock = self.connect()
            except OSError as err:
                reason = f"cannot connect to {self.socket_path}: {err.strerror or err}"
                if once:
                    raise ProtocolError(reason) from None
                if reason != said:
                    self.log("warning", reason + "; retrying")
                    said = reason
                time.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
                continue
            delay, said = RETRY_FIRST, ""
            try:
                self.session(sock)
            except (ProtocolError, RemoteError, OSError) as err:
                self.log("warning", f"NRI connection ended: {err}")
                if once:
                    return
            finally:
                sock.close()
            time.sleep(delay)
