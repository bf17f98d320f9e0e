"""CRIClient: a client of one CRI endpoint (containerd's socket) over grpcio.

RunPodSandbox, CreateContainer, StartContainer, ContainerStatus, StopPodSandbox, RemovePodSandbox,
ListContainers, ListPodSandbox, Version, ImageStatus and RemoveImage: what the pod benchmark and
the lab's tests use. The messages come from cri_messages.py (a table, nothing generated); the
RPCs are plain unary_unary calls. grpcio is imported when a client is made: it is the `bench`
extra, and CRIUnavailable says so where it is missing.
"""
import os
import time

from . import EXTRA


class CRIUnavailable(ImportError):
    """grpcio (the `bench` extra) is missing."""


class CRIError(Exception):
    """A failed CRI call: `code` is the gRPC status name, `details` the runtime's message."""

    def __init__(self, method, code, details):
        super().__init__(f"{method}: {code}: {details}")
        self.method, self.code, self.details = method, code, details


def socket_path(endpoint):
    """The socket path of a CRI endpoint: unix:///run/containerd/containerd.sock or a bare path."""
    if endpoint.startswith("unix://"):
        return endpoint[len("unix://"):]
    if "://" in endpoint:
        raise ValueError(f"{endpoint}: only unix:// endpoints (a local socket) are supported")
    return endpoint


def messages():
    """The CRI message classes and enum values (cri_messages.pb)."""
    from .cri_messages import pb

    return pb


class CRIClient:
    """A client of one CRI endpoint (a unix socket path, or unix://PATH)."""

    def __init__(self, socket, timeout=60.0):
        try:
            import grpc
        except ImportError as err:
            raise CRIUnavailable(f"the CRI client needs grpcio ({err}): {EXTRA}") from None
        from .cri_messages import RPCS

        self.grpc = grpc
        self.pb = messages()
        self.timeout = timeout
        self.socket = socket_path(socket)
        self.channel = grpc.insecure_channel(f"unix://{os.path.abspath(self.socket)}")
        self._calls = {}
        for name, (service, request, response) in RPCS.items():
            self._calls[name] = self.channel.unary_unary(
                service + name, request_serializer=getattr(self.pb, request).SerializeToString,
                response_deserializer=getattr(self.pb, response).FromString)

    def close(self):
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def call(self, method, request, timeout=None):
        try:
            return self._calls[method](request, timeout=timeout or self.timeout)
        except self.grpc.RpcError as err:
            raise CRIError(method, err.code().name, err.details()) from None

    # -- the RPCs --

    def version(self, timeout=None):
        return self.call("Version", self.pb.VersionRequest(version="v1"), timeout)

    def run_pod_sandbox(self, config, runtime_handler=""):
        request = self.pb.RunPodSandboxRequest(config=config, runtime_handler=runtime_handler)
        return self.call("RunPodSandbox", request).pod_sandbox_id

    def create_container(self, pod_sandbox_id, config, sandbox_config):
        request = self.pb.CreateContainerRequest(pod_sandbox_id=pod_sandbox_id, config=config,
                                                 sandbox_config=sandbox_config)
        return self.call("CreateContainer", request).container_id

    def start_container(self, container_id):
        self.call("StartContainer", self.pb.StartContainerRequest(container_id=container_id))

    def container_status(self, container_id, verbose=False):
        request = self.pb.ContainerStatusRequest(container_id=container_id, verbose=verbose)
        return self.call("ContainerStatus", request)

    def stop_pod_sandbox(self, pod_sandbox_id):
        self.call("StopPodSandbox", self.pb.StopPodSandboxRequest(pod_sandbox_id=pod_sandbox_id))

    def remove_pod_sandbox(self, pod_sandbox_id):
        self.call("RemovePodSandbox", self.pb.RemovePodSandboxRequest(pod_sandbox_id=pod_sandbox_id))

    def list_containers(self, pod_sandbox_id=""):
        request = self.pb.ListContainersRequest(filter=self.pb.ContainerFilter(pod_sandbox_id=pod_sandbox_id))
        return list(self.call("ListContainers", request).containers)

    def list_pod_sandboxes(self, labels=None):
        request = self.pb.ListPodSandboxRequest(filter=self.pb.PodSandboxFilter(label_selector=labels or {}))
        return list(self.call("ListPodSandbox", request).items)

    def image_status(self, image):
        """The CRI plugin's view of an image reference (its `image.id` is "" when unknown)."""
        return self.call("ImageStatus", self.pb.ImageStatusRequest(image=self.pb.ImageSpec(image=image)))

    def remove_image(self, image):
        self.call("RemoveImage", self.pb.RemoveImageRequest(image=self.pb.ImageSpec(image=image)))

    # -- helpers --

    def wait_images(self, images, timeout=30.0):
        """Wait until the CRI plugin knows every image (containerd 2.x learns of an import by events)."""
        deadline = time.monotonic() + timeout
        for image in images:
            while not self.image_status(image).image.id:
                if time.monotonic() > deadline:
                    raise CRIError("ImageStatus", "DEADLINE_EXCEEDED", f"image {image} unknown after {timeout:.0f}s")
                time.sleep(0.02)

    def wait_ready(self, timeout=30.0):
        """Wait until the CRI service answers Version; returns the response."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.version(timeout=2)
            except CRIError as err:
                if time.monotonic() > deadline:
                    raise CRIError("Version", err.code, f"CRI not ready after {timeout:.0f}s: {err.details}") from None
                time.sleep(0.05)

    def wait_exited(self, container_id, timeout=60.0, interval=0.002):
        """Poll ContainerStatus until the container has exited; returns its status."""
        from .cri_messages import enum_name

        deadline = time.monotonic() + timeout
        exited = self.pb.CONTAINER_EXITED
        while True:
            status = self.container_status(container_id).status
            if status.state == exited:
                return status
            if time.monotonic() > deadline:
                raise CRIError("ContainerStatus", "DEADLINE_EXCEEDED",
                               f"container {container_id} still {enum_name('ContainerState', status.state)} "
                               f"after {timeout:.0f}s")
            time.sleep(interval)

    def pod_config(self, name, uid, log_directory, namespace="default", annotations=None, labels=None):
        """A host-network pod (no CNI needed; no hostname, which needs a UTS namespace)."""
        pb = self.pb
        return pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace=namespace, attempt=0),
            log_directory=log_directory,
            labels=labels or {},
            annotations=annotations or {},
            linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
                namespace_options=pb.NamespaceOption(network=pb.NODE, pid=pb.CONTAINER, ipc=pb.POD))))

    def container_config(self, name, image, command=(), args=(), envs=None, annotations=None, log_path="",
                         labels=None, mounts=(), devices=(), cdi_devices=()):
        pb = self.pb
        return pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name, attempt=0),
            image=pb.ImageSpec(image=image),
            command=list(command), args=list(args),
            envs=[pb.KeyValue(key=k, value=v) for k, v in (envs or {}).items()],
            mounts=list(mounts),
            devices=list(devices),
            CDI_devices=[pb.CDIDevice(name=name) for name in cdi_devices],
            labels=labels or {},
            annotations=annotations or {},
            log_path=log_path,
            linux=pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
                namespace_options=pb.NamespaceOption(network=pb.NODE, pid=pb.CONTAINER, ipc=pb.POD))))


def read_container_log(path):
    """The text lines of a CRI container log ("<time> <stream> <P|F> <text>" lines)."""
    lines, partial = [], ""
    try:
        with open(path, encoding="utf-8", errors="replace") as stream:
            for raw in stream:
                parts = raw.rstrip("\n").split(" ", 3)
                if len(parts) < 4:
                    continue
                partial += parts[3]
                if parts[2] == "F":
                    lines.append(partial)
                    partial = ""
    except FileNotFoundError:
        return []
    if partial:
        lines.append(partial)
    return lines
