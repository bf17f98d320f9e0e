"""The CRI messages the pod benchmark's client uses, built at import from one table.

The wire format is protobuf's; the field numbers are k8s.io/cri-api's pkg/apis/runtime/v1/api.proto
(package runtime.v1). Only what the client reads or writes is declared: a runtime's other fields
are kept as unknown fields and skipped. tests/bench/test_cri_messages.py checks every message,
field and enum value here against tests/bench/data/cri-api.proto (the same subset in proto
syntax, upstream's numbers), compiled there by grpcio-tools.

No generated code, as for NRI (shim/nri/messages.py, whose table builder this reuses): an
installed node needs protobuf (a dependency of the package) and grpcio (the `bench` extra),
never grpcio-tools. Enum fields go on the wire as int32 (the same varint); their values are
the module's constants (POD, NODE, CONTAINER_EXITED, ...) and ENUMS.
"""
from types import SimpleNamespace

from google.protobuf import descriptor_pool

from shim.nri.messages import _classes, file_descriptor

PACKAGE = "runtime.v1"
RUNTIME_SERVICE = "/runtime.v1.RuntimeService/"
IMAGE_SERVICE = "/runtime.v1.ImageService/"

ENUMS = {
    "NamespaceMode": {"POD": 0, "CONTAINER": 1, "NODE": 2, "TARGET": 3},
    "PodSandboxState": {"SANDBOX_READY": 0, "SANDBOX_NOTREADY": 1},
    "MountPropagation": {"PROPAGATION_PRIVATE": 0, "PROPAGATION_HOST_TO_CONTAINER": 1,
                         "PROPAGATION_BIDIRECTIONAL": 2},
    "ContainerState": {"CONTAINER_CREATED": 0, "CONTAINER_RUNNING": 1, "CONTAINER_EXITED": 2,
                       "CONTAINER_UNKNOWN": 3},
}

_MAP = "map"
# message: [(field, number, type, repeated)]; a type is a scalar name, "map" (string to string),
# an enum of ENUMS, or another message's name.
MESSAGES = {
    "VersionRequest": [("version", 1, "string", False)],
    "VersionResponse": [("version", 1, "string", False), ("runtime_name", 2, "string", False),
                        ("runtime_version", 3, "string", False), ("runtime_api_version", 4, "string", False)],
    "NamespaceOption": [("network", 1, "NamespaceMode", False), ("pid", 2, "NamespaceMode", False),
                        ("ipc", 3, "NamespaceMode", False), ("target_id", 4, "string", False)],
    "LinuxSandboxSecurityContext": [("namespace_options", 1, "NamespaceOption", False),
                                    ("readonly_rootfs", 4, "bool", False), ("privileged", 6, "bool", False)],
    "LinuxPodSandboxConfig": [("cgroup_parent", 1, "string", False),
                              ("security_context", 2, "LinuxSandboxSecurityContext", False),
                              ("sysctls", 3, _MAP, False)],
    "PodSandboxMetadata": [("name", 1, "string", False), ("uid", 2, "string", False),
                           ("namespace", 3, "string", False), ("attempt", 4, "uint32", False)],
    "PodSandboxConfig": [("metadata", 1, "PodSandboxMetadata", False), ("hostname", 2, "string", False),
                         ("log_directory", 3, "string", False), ("labels", 6, _MAP, False),
                         ("annotations", 7, _MAP, False), ("linux", 8, "LinuxPodSandboxConfig", False)],
    "RunPodSandboxRequest": [("config", 1, "PodSandboxConfig", False), ("runtime_handler", 2, "string", False)],
    "RunPodSandboxResponse": [("pod_sandbox_id", 1, "string", False)],
    "StopPodSandboxRequest": [("pod_sandbox_id", 1, "string", False)],
    "StopPodSandboxResponse": [],
    "RemovePodSandboxRequest": [("pod_sandbox_id", 1, "string", False)],
    "RemovePodSandboxResponse": [],
    "PodSandboxStateValue": [("state", 1, "PodSandboxState", False)],
    "PodSandboxFilter": [("id", 1, "string", False), ("state", 2, "PodSandboxStateValue", False),
                         ("label_selector", 3, _MAP, False)],
    "ListPodSandboxRequest": [("filter", 1, "PodSandboxFilter", False)],
    "PodSandbox": [("id", 1, "string", False), ("metadata", 2, "PodSandboxMetadata", False),
                   ("state", 3, "PodSandboxState", False), ("created_at", 4, "int64", False),
                   ("labels", 5, _MAP, False), ("annotations", 6, _MAP, False),
                   ("runtime_handler", 7, "string", False)],
    "ListPodSandboxResponse": [("items", 1, "PodSandbox", True)],
    "ImageSpec": [("image", 1, "string", False), ("annotations", 2, _MAP, False)],
    "KeyValue": [("key", 1, "string", False), ("value", 2, "string", False)],
    "Mount": [("container_path", 1, "string", False), ("host_path", 2, "string", False),
              ("readonly", 3, "bool", False), ("selinux_relabel", 4, "bool", False),
              ("propagation", 5, "MountPropagation", False)],
    "Device": [("container_path", 1, "string", False), ("host_path", 2, "string", False),
               ("permissions", 3, "string", False)],
    "LinuxContainerSecurityContext": [("privileged", 2, "bool", False),
                                      ("namespace_options", 3, "NamespaceOption", False),
                                      ("readonly_rootfs", 7, "bool", False)],
    "LinuxContainerConfig": [("security_context", 2, "LinuxContainerSecurityContext", False)],
    "ContainerMetadata": [("name", 1, "string", False), ("attempt", 2, "uint32", False)],
    "ContainerConfig": [("metadata", 1, "ContainerMetadata", False), ("image", 2, "ImageSpec", False),
                        ("command", 3, "string", True), ("args", 4, "string", True),
                        ("working_dir", 5, "string", False), ("envs", 6, "KeyValue", True),
                        ("mounts", 7, "Mount", True), ("devices", 8, "Device", True),
                        ("labels", 9, _MAP, False), ("annotations", 10, _MAP, False),
                        ("log_path", 11, "string", False), ("linux", 15, "LinuxContainerConfig", False),
                        ("CDI_devices", 17, "CDIDevice", True)],     # containerd 1.7+ with enable_cdi
    "CDIDevice": [("name", 1, "string", False)],
    "CreateContainerRequest": [("pod_sandbox_id", 1, "string", False), ("config", 2, "ContainerConfig", False),
                               ("sandbox_config", 3, "PodSandboxConfig", False)],
    "CreateContainerResponse": [("container_id", 1, "string", False)],
    "StartContainerRequest": [("container_id", 1, "string", False)],
    "StartContainerResponse": [],
    "ContainerStateValue": [("state", 1, "ContainerState", False)],
    "ContainerFilter": [("id", 1, "string", False), ("state", 2, "ContainerStateValue", False),
                        ("pod_sandbox_id", 3, "string", False), ("label_selector", 4, _MAP, False)],
    "ListContainersRequest": [("filter", 1, "ContainerFilter", False)],
    "Container": [("id", 1, "string", False), ("pod_sandbox_id", 2, "string", False),
                  ("metadata", 3, "ContainerMetadata", False), ("image", 4, "ImageSpec", False),
                  ("image_ref", 5, "string", False), ("state", 6, "ContainerState", False),
                  ("created_at", 7, "int64", False), ("labels", 8, _MAP, False), ("annotations", 9, _MAP, False)],
    "ListContainersResponse": [("containers", 1, "Container", True)],
    "ContainerStatusRequest": [("container_id", 1, "string", False), ("verbose", 2, "bool", False)],
    "ContainerStatus": [("id", 1, "string", False), ("metadata", 2, "ContainerMetadata", False),
                        ("state", 3, "ContainerState", False), ("created_at", 4, "int64", False),
                        ("started_at", 5, "int64", False), ("finished_at", 6, "int64", False),
                        ("exit_code", 7, "int32", False), ("image", 8, "ImageSpec", False),
                        ("image_ref", 9, "string", False), ("reason", 10, "string", False),
                        ("message", 11, "string", False), ("labels", 12, _MAP, False),
                        ("annotations", 13, _MAP, False), ("mounts", 14, "Mount", True),
                        ("log_path", 15, "string", False)],
    "ContainerStatusResponse": [("status", 1, "ContainerStatus", False), ("info", 2, _MAP, False)],
    "Image": [("id", 1, "string", False), ("repo_tags", 2, "string", True)],
    "ImageStatusRequest": [("image", 1, "ImageSpec", False), ("verbose", 2, "bool", False)],
    "ImageStatusResponse": [("image", 1, "Image", False)],
    "RemoveImageRequest": [("image", 1, "ImageSpec", False)],
    "RemoveImageResponse": [],
}

# RPC: (service, request message, response message)
RPCS = {
    "Version": (RUNTIME_SERVICE, "VersionRequest", "VersionResponse"),
    "RunPodSandbox": (RUNTIME_SERVICE, "RunPodSandboxRequest", "RunPodSandboxResponse"),
    "StopPodSandbox": (RUNTIME_SERVICE, "StopPodSandboxRequest", "StopPodSandboxResponse"),
    "RemovePodSandbox": (RUNTIME_SERVICE, "RemovePodSandboxRequest", "RemovePodSandboxResponse"),
    "ListPodSandbox": (RUNTIME_SERVICE, "ListPodSandboxRequest", "ListPodSandboxResponse"),
    "CreateContainer": (RUNTIME_SERVICE, "CreateContainerRequest", "CreateContainerResponse"),
    "StartContainer": (RUNTIME_SERVICE, "StartContainerRequest", "StartContainerResponse"),
    "ListContainers": (RUNTIME_SERVICE, "ListContainersRequest", "ListContainersResponse"),
    "ContainerStatus": (RUNTIME_SERVICE, "ContainerStatusRequest", "ContainerStatusResponse"),
    "ImageStatus": (IMAGE_SERVICE, "ImageStatusRequest", "ImageStatusResponse"),
    "RemoveImage": (IMAGE_SERVICE, "RemoveImageRequest", "RemoveImageResponse"),
}


def wire_table(messages=None):
    """The table with every enum-typed field as int32, as shim.nri.messages.file_descriptor takes it."""
    return {name: [(field, number, "int32" if kind in ENUMS else kind, repeated)
                   for field, number, kind, repeated in fields]
            for name, fields in (messages or MESSAGES).items()}


def enum_name(enum, value):
    """The name of VALUE in ENUMS[enum] (or the number, for a value newer than the table)."""
    return next((name for name, number in ENUMS[enum].items() if number == value), str(value))


def _build():
    pool = descriptor_pool.DescriptorPool()     # our own: nothing registered globally
    pool.Add(file_descriptor("cdi_shim/cri/api.proto", PACKAGE, wire_table()))
    namespace = vars(_classes(pool, PACKAGE, MESSAGES))
    for values in ENUMS.values():
        namespace.update(values)
    return SimpleNamespace(**namespace)


pb = _build()
