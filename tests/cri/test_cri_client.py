"""The CRI client's messages (shim/bench/cri_messages.py): field numbers as upstream's."""
import pytest

# (message, field) -> number in k8s.io/cri-api pkg/apis/runtime/v1/api.proto
UPSTREAM = {
    ("RunPodSandboxRequest", "config"): 1, ("RunPodSandboxRequest", "runtime_handler"): 2,
    ("PodSandboxConfig", "metadata"): 1, ("PodSandboxConfig", "hostname"): 2,
    ("PodSandboxConfig", "log_directory"): 3, ("PodSandboxConfig", "labels"): 6,
    ("PodSandboxConfig", "annotations"): 7, ("PodSandboxConfig", "linux"): 8,
    ("LinuxPodSandboxConfig", "security_context"): 2, ("LinuxSandboxSecurityContext", "namespace_options"): 1,
    ("LinuxSandboxSecurityContext", "privileged"): 6, ("NamespaceOption", "network"): 1,
    ("NamespaceOption", "pid"): 2, ("NamespaceOption", "ipc"): 3,
    ("CreateContainerRequest", "pod_sandbox_id"): 1, ("CreateContainerRequest", "config"): 2,
    ("CreateContainerRequest", "sandbox_config"): 3,
    ("ContainerConfig", "metadata"): 1, ("ContainerConfig", "image"): 2, ("ContainerConfig", "command"): 3,
    ("ContainerConfig", "args"): 4, ("ContainerConfig", "envs"): 6, ("ContainerConfig", "mounts"): 7,
    ("ContainerConfig", "devices"): 8, ("ContainerConfig", "annotations"): 10, ("ContainerConfig", "log_path"): 11,
    ("ContainerConfig", "linux"): 15, ("LinuxContainerConfig", "security_context"): 2,
    ("LinuxContainerSecurityContext", "namespace_options"): 3,
    ("ContainerStatus", "state"): 3, ("ContainerStatus", "exit_code"): 7, ("ContainerStatus", "annotations"): 13,
    ("ContainerStatusResponse", "status"): 1, ("ListContainersRequest", "filter"): 1,
    ("ContainerFilter", "pod_sandbox_id"): 3, ("Container", "state"): 6, ("Container", "annotations"): 9,
    ("StopPodSandboxRequest", "pod_sandbox_id"): 1, ("RemovePodSandboxRequest", "pod_sandbox_id"): 1,
    ("StartContainerRequest", "container_id"): 1, ("PodSandbox", "runtime_handler"): 7,
}


@pytest.fixture(scope="module")
def pb():
    from cdi_shim_lab import cri

    return cri.messages()


def test_the_lab_uses_the_packages_client(pb):
    """One client: the lab's name for it is the installed package's (shim/bench, the `bench` extra),
    whose messages come from a table; nothing is compiled at run time."""
    from cdi_shim_lab import cri
    from shim.bench import cri as installed
    from shim.bench.cri_messages import pb as table

    assert cri.CRIClient is installed.CRIClient and pb is table


@pytest.mark.parametrize("message,field", sorted(UPSTREAM))
def test_field_numbers_are_upstreams(pb, message, field):
    assert getattr(pb, message).DESCRIPTOR.fields_by_name[field].number == UPSTREAM[(message, field)]


def test_service_and_enums(pb):
    from shim.bench.cri_messages import RPCS

    assert {name for name, (service, _, _) in RPCS.items() if service == "/runtime.v1.RuntimeService/"} >= {
        "RunPodSandbox", "CreateContainer", "StartContainer", "ContainerStatus", "StopPodSandbox",
        "RemovePodSandbox", "ListContainers"}
    assert (pb.POD, pb.CONTAINER, pb.NODE) == (0, 1, 2)
    assert (pb.CONTAINER_CREATED, pb.CONTAINER_RUNNING, pb.CONTAINER_EXITED) == (0, 1, 2)


def test_container_log_parsing(tmp_path):
    from shim.bench.cri import read_container_log

    log = tmp_path / "c.log"
    log.write_text("2024-01-01T00:00:00.000000000Z stdout F hello world\n"
                   "2024-01-01T00:00:00.000000001Z stdout P part-\n"
                   "2024-01-01T00:00:00.000000002Z stdout F one\n"
                   "2024-01-01T00:00:00.000000003Z stderr F err: x y\n")
    assert read_container_log(log) == ["hello world", "part-one", "err: x y"]
    assert read_container_log(tmp_path / "missing.log") == []
