"""The plugin against a fake runtime speaking NRI's framing (a multiplexed unix connection, ttrpc
messages), written here from containerd/nri's pkg/net/multiplex and containerd/ttrpc's channel.go:
registration, configuration before the registration's answer, synchronisation, CreateContainer
answered with an adjustment or a failure, frames cut at odd places, reconnection."""
import os
import socket
import struct
import threading

import pytest

from shim.config import Config
from shim.nri.messages import nri, ttrpc
from shim.nri.plugin import Plugin
from shim.nri.policy import Policy
from tests.conftest import write_spec

SPEC = ('cdiVersion: "0.6.0"\nkind: example.com/dev\ndevices:\n  - name: a\n    containerEdits:\n'
        '      env: [A=1]\n      deviceNodes: [{path: /dev/a, hostPath: /dev/null}]\n')


class FakeRuntime:
    """The runtime's end of one plugin connection, frames cut into pieces of CHUNK bytes."""

    def __init__(self, conn, chunk=7):
        self.conn, self.chunk = conn, chunk
        self.buffers = {1: b"", 2: b""}
        self.next_stream = 1

    def send(self, cid, stream, kind, payload):
        data = struct.pack(">IIBB", len(payload), stream, kind, 0) + payload
        for start in range(0, len(data), self.chunk):      # a byte stream, cut at will
            piece = data[start:start + self.chunk]
            self.conn.sendall(struct.pack(">II", cid, len(piece)) + piece)

    def _exact(self, count):
        data = b""
        while len(data) < count:
            more = self.conn.recv(count - len(data))
            assert more, "the plugin closed the connection"
            data += more
        return data

    def receive(self, cid):
        while True:
            buffer = self.buffers[cid]
            if len(buffer) >= 10:
                size, stream, kind, flags = struct.unpack(">IIBB", buffer[:10])
                if len(buffer) >= 10 + size:
                    self.buffers[cid] = buffer[10 + size:]
                    return stream, kind, buffer[10:10 + size]
            got, length = struct.unpack(">II", self._exact(8))
            self.buffers[got] += self._exact(length)

    def call(self, method, message, answer_class):
        stream = self.next_stream
        self.next_stream += 2
        request = ttrpc.Request(service="nri.pkg.api.v1alpha1.Plugin", method=method,
                                payload=message.SerializeToString())
        self.send(1, stream, 1, request.SerializeToString())
        got, kind, payload = self.receive(1)
        assert (got, kind) == (stream, 2)
        response = ttrpc.Response.FromString(payload)
        return response.status, answer_class.FromString(response.payload)

    def accept_registration(self):
        """Configure and Synchronize the plugin before answering its RegisterPlugin (as the
        runtime may); returns the registration and the subscribed events."""
        stream, kind, payload = self.receive(2)
        request = ttrpc.Request.FromString(payload)
        assert (kind, stream % 2, request.service, request.method) == (1, 1, "nri.pkg.api.v1alpha1.Runtime",
                                                                       "RegisterPlugin")
        status, configured = self.call("Configure", nri.ConfigureRequest(runtime_name="fake", runtime_version="0"),
                                       nri.ConfigureResponse)
        assert status.code == 0
        status, synced = self.call("Synchronize", nri.SynchronizeRequest(more=False), nri.SynchronizeResponse)
        assert status.code == 0 and not synced.update
        self.send(2, stream, 2, ttrpc.Response(payload=nri.Empty().SerializeToString()).SerializeToString())
        return nri.RegisterPluginRequest.FromString(request.payload), configured.events


@pytest.fixture
def runtime_socket(tmp_path, cache_dir):
    write_spec(str(tmp_path / "cdi"), "dev.yaml", SPEC)
    path = str(tmp_path / "nri.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)
    server.settimeout(20)
    logged = []

    def log(level, message):
        logged.append((level, message))

    policy = Policy(Config(spec_dirs=(str(tmp_path / "cdi"),)), ("ml",), "/bin/cdi-shim-hook", log)
    plugin = Plugin(policy, path, log=log)
    thread = threading.Thread(target=plugin.run, daemon=True)
    thread.start()
    yield server, plugin, logged
    server.close()


def create(runtime, namespace, request):
    pod = nri.PodSandbox(id="p", name="pod", namespace=namespace,
                         annotations={"nvidia.cdi.k8s.io/container.c": request})
    box = nri.Container(id="c", name="c", env=["PATH=/bin"])
    return runtime.call("CreateContainer", nri.CreateContainerRequest(pod=pod, container=box),
                        nri.CreateContainerResponse)


def test_registration_configuration_and_create_container(runtime_socket):
    server, plugin, logged = runtime_socket
    conn, _ = server.accept()
    runtime = FakeRuntime(conn)
    registration, events = runtime.accept_registration()
    assert (registration.plugin_name, registration.plugin_idx) == ("cdi-shim", "10")
    assert events == 1 << 3          # CreateContainer only
    status, answer = create(runtime, "ml", "example.com/dev=a")
    assert status.code == 0
    assert [(kv.key, kv.value) for kv in answer.adjust.env] == [("A", "1")]
    device = answer.adjust.linux.devices[0]
    assert (device.path, device.type, device.major, device.minor) == ("/dev/a", "c", 1, 3)
    status, answer = create(runtime, "default", "example.com/dev=a")
    assert status.code == 0 and answer.adjust == nri.ContainerAdjustment()
    status, _ = create(runtime, "ml", "example.com/dev=b")
    assert status.code != 0
    assert status.message.startswith("container c: ") and "example.com/dev=b" in status.message
    status, _ = runtime.call("NoSuchMethod", nri.Empty(), nri.Empty)
    assert status.code == 12
    assert plugin.served == 3
    assert any("not allowed" in message for _, message in logged)
    conn.close()


def test_the_plugin_registers_again_after_the_runtime_restarts(runtime_socket):
    server, plugin, logged = runtime_socket
    for _ in range(2):
        conn, _ = server.accept()
        runtime = FakeRuntime(conn, chunk=4096)
        runtime.accept_registration()
        status, answer = create(runtime, "ml", "example.com/dev=a")
        assert status.code == 0 and answer.adjust.env[0].key == "A"
        conn.close()                 # containerd goes away; the plugin comes back
    assert any("connection ended" in message for _, message in logged)


def test_a_frame_for_an_unknown_connection_is_dropped(runtime_socket):
    server, _, _ = runtime_socket
    conn, _ = server.accept()
    runtime = FakeRuntime(conn)
    conn.sendall(struct.pack(">II", 9, 3) + b"xyz")
    runtime.accept_registration()
    status, _ = create(runtime, "ml", "example.com/dev=a")
    assert status.code == 0
    conn.close()


def test_the_cli_explains_itself():
    import subprocess
    import sys

    done = subprocess.run([os.path.join(os.path.dirname(sys.executable), "cdi-shim"), "nri", "--help"],
                          capture_output=True, text=True)
    assert done.returncode == 0
    assert "/var/run/nri/nri.sock" in done.stdout and "nvidia.cdi.k8s.io/container." in done.stdout


def test_frames_written_fit_the_runtimes_4096_byte_reads():
    """containerd's ttrpc reads each logical connection through a 4096-byte bufio.Reader, and
    the mux refuses (ENOMEM) a frame larger than the read: a larger frame closed the connection
    ("ttrpc: closed") at the first adjustment over 4 KiB (30 library mounts and the hooks)."""
    from shim.nri.protocol import Connection

    ours, theirs = socket.socketpair()
    with ours, theirs:
        message = bytes(range(256)) * 40           # 10240 bytes
        Connection(ours, {}).send(1, 3, 2, message)
        ours.shutdown(socket.SHUT_WR)
        data = b""
        while True:
            more = theirs.recv(1 << 16)
            if not more:
                break
            data += more
    payload, sizes = b"", []
    while data:
        cid, length = struct.unpack(">II", data[:8])
        assert cid == 1
        sizes.append(length)
        payload, data = payload + data[8:8 + length], data[8 + length:]
    assert max(sizes) == 4096 and len(sizes) == 3
    assert payload == struct.pack(">IIBB", len(message), 3, 2, 0) + message
