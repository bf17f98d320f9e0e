"""NRI's wire protocol: ttrpc over NRI's multiplexed connection (no policy here).

One unix stream connection to the runtime carries two logical connections (containerd/nri
pkg/net/multiplex): frames of a 4-byte connection id and a 4-byte payload length, both big
endian, then the payload; a logical connection is a byte stream cut into frames at will.
Connection 1 carries the plugin's service (the runtime calls us: Configure, Synchronize,
CreateContainer, ...), connection 2 the runtime's (we call RegisterPlugin).

On each, ttrpc (containerd/ttrpc channel.go): a 10-byte header -- payload length (u32), stream
id (u32), type (u8: 1 request, 2 response, 3 data), flags (u8) -- then a protobuf payload: a
ttrpc.Request (service, method, payload) or a ttrpc.Response (status, payload). A client's
streams have odd ids, rising by 2; a response carries its request's id. A payload is at most
4 MiB.

A frame we write carries at most WRITE_FRAME (4096) bytes: the runtime's ttrpc reads each
logical connection through a bufio.Reader of Go's default 4096 bytes, and the mux hands a frame
only to a read whose buffer holds all of it (ENOMEM otherwise, and the runtime closes the
connection: "ttrpc: closed"). Go's own peer writes through a bufio.Writer of the same size.

`Connection` is single-threaded: while it waits for the answer to its own call it serves the
runtime's requests as they come (the runtime configures the plugin before it answers the
registration).
"""
import socket
import struct

from .messages import NRI_PACKAGE, ttrpc

PLUGIN_CONN = 1            # multiplex.PluginServiceConn: the runtime calls the plugin
RUNTIME_CONN = 2           # multiplex.RuntimeServiceConn: the plugin calls the runtime
MUX_HEADER = struct.Struct(">II")
TTRPC_HEADER = struct.Struct(">IIBB")
REQUEST, RESPONSE, DATA = 1, 2, 3
MAX_MESSAGE = 4 << 20
MAX_FRAME = TTRPC_HEADER.size + MAX_MESSAGE   # the largest frame we read
WRITE_FRAME = 4096                            # the largest frame we write (see above)
PLUGIN_SERVICE = NRI_PACKAGE + ".Plugin"
RUNTIME_SERVICE = NRI_PACKAGE + ".Runtime"
# gRPC status codes used in answers
UNKNOWN, INVALID_ARGUMENT, UNIMPLEMENTED = 2, 3, 12


class ProtocolError(Exception):
    """The peer broke the framing, or the connection ended."""


class RemoteError(Exception):
    """A call answered with a non-zero status."""

    def __init__(self, code, message):
        super().__init__(f"{message} (status {code})")
        self.code = code


class Connection:
    """The plugin's end of one NRI connection, SOCK. SERVICE maps a method of the plugin
    service to (request class, handler); a handler takes the request message and returns the
    response message, or raises (the call is answered with status UNKNOWN and the error's text)."""

    def __init__(self, sock, service):
        self.sock = sock
        self.service = service
        self._streams = {PLUGIN_CONN: bytearray(), RUNTIME_CONN: bytearray()}
        self._messages = []
        self._next_stream = 1
        self._last_served = 0

    # --- frames ----------------------------------------------------------------------------

    def _read_exact(self, count):
        chunks, left = [], count
        while left:
            chunk = self.sock.recv(min(left, 1 << 16))
            if not chunk:
                raise ProtocolError("the runtime closed the NRI connection")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _write(self, conn, data):
        frames = []
        for start in range(0, len(data), WRITE_FRAME):
            chunk = data[start:start + WRITE_FRAME]
            frames.append(MUX_HEADER.pack(conn, len(chunk)) + chunk)
        self.sock.sendall(b"".join(frames))

    def send(self, conn, stream, kind, payload, flags=0):
        if len(payload) > MAX_MESSAGE:
            raise ProtocolError(f"a ttrpc message of {len(payload)} bytes is over the {MAX_MESSAGE} limit")
        self._write(conn, TTRPC_HEADER.pack(len(payload), stream, kind, flags) + payload)

    def receive(self):
        """The next whole ttrpc message: (conn, stream, type, flags, payload)."""
        while not self._messages:
            conn, length = MUX_HEADER.unpack(self._read_exact(MUX_HEADER.size))
            if length > MAX_FRAME:
                raise ProtocolError(f"a multiplexed frame of {length} bytes is over the {MAX_FRAME} limit")
            payload = self._read_exact(length)
            buffer = self._streams.get(conn)
            if buffer is None:
                continue          # a connection nobody opened here: dropped, as the mux does
            buffer += payload
            while len(buffer) >= TTRPC_HEADER.size:
                size, stream, kind, flags = TTRPC_HEADER.unpack_from(buffer)
                if size > MAX_MESSAGE:
                    raise ProtocolError(f"a ttrpc message of {size} bytes is over the {MAX_MESSAGE} limit")
                end = TTRPC_HEADER.size + size
                if len(buffer) < end:
                    break
                self._messages.append((conn, stream, kind, flags, bytes(buffer[TTRPC_HEADER.size:end])))
                del buffer[:end]
        return self._messages.pop(0)

    # --- the plugin's service -------------------------------------------------------------

    def _answer(self, stream, payload=b"", code=0, message=""):
        response = ttrpc.Response(payload=payload)
        if code:
            response.status.code = code
            response.status.message = message
        self.send(PLUGIN_CONN, stream, RESPONSE, response.SerializeToString())

    def serve_one(self, stream, kind, payload):
        """Answer one message the runtime sent on the plugin connection."""
        if kind != REQUEST:
            return                # data or stray responses: no streaming method here
        if stream % 2 == 0 or stream <= self._last_served:
            self._answer(stream, code=INVALID_ARGUMENT, message="StreamID must be odd and increment")
            return
        self._last_served = stream
        try:
            request = ttrpc.Request.FromString(payload)
        except Exception as err:   # noqa: BLE001 -- protobuf's DecodeError, any shape
            self._answer(stream, code=INVALID_ARGUMENT, message=f"unmarshal request error: {err}")
            return
        entry = self.service.get(request.method) if request.service == PLUGIN_SERVICE else None
        if entry is None:
            self._answer(stream, code=UNIMPLEMENTED,
                         message=f"{request.service}.{request.method}: method not implemented")
            return
        request_class, handler = entry
        try:
            argument = request_class.FromString(request.payload)
        except Exception as err:   # noqa: BLE001
            self._answer(stream, code=INVALID_ARGUMENT, message=f"unmarshal {request.method} error: {err}")
            return
        try:
            result = handler(argument)
        except Exception as err:   # noqa: BLE001 -- the runtime gets the reason, the plugin goes on
            self._answer(stream, code=UNKNOWN, message=str(err) or type(err).__name__)
            return
        self._answer(stream, result.SerializeToString())

    def serve(self):
        """Serve the runtime's requests until the connection ends (ProtocolError)."""
        while True:
            conn, stream, kind, _, payload = self.receive()
            if conn == PLUGIN_CONN:
                self.serve_one(stream, kind, payload)

    # --- calls to the runtime -------------------------------------------------------------

    def call(self, method, message, response_class, timeout=None):
        """Call METHOD of the runtime's service with MESSAGE; its answer as RESPONSE_CLASS.
        The runtime's own requests that come meanwhile are served."""
        stream = self._next_stream
        self._next_stream += 2
        request = ttrpc.Request(service=RUNTIME_SERVICE, method=method, payload=message.SerializeToString())
        if timeout:
            request.timeout_nano = int(timeout * 1e9)
        self.sock.settimeout(timeout)
        try:
            self.send(RUNTIME_CONN, stream, REQUEST, request.SerializeToString())
            while True:
                conn, got, kind, _, payload = self.receive()
                if conn == PLUGIN_CONN:
                    self.serve_one(got, kind, payload)
                elif kind == RESPONSE and got == stream:
                    break
        except socket.timeout:
            raise ProtocolError(f"no answer to {method} within {timeout} s") from None
        finally:
            self.sock.settimeout(None)
        response = ttrpc.Response.FromString(payload)
        if response.status.code:
            raise RemoteError(response.status.code, response.status.message)
        return response_class.FromString(response.payload)
