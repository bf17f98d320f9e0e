"""The CRI client's proto: compiled by grpcio-tools at test time, field numbers as upstream's."""
import os

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
def pb(cri_build_dir):
    from cdi_shim_lab import cri

    return cri.messages()


def test_compiled_into_the_build_dir(pb, cri_build_dir):
    assert pb.__file__.startswith(cri_build_dir)
    assert os.path.basename(pb.__file__) == "cdi_shim_cri_pb2.py"
    from cdi_shim_lab import cri

    assert cri.compile_proto() == pb.__file__  # cached: not compiled twice


@pytest.mark.parametrize("message,field", sorted(UPSTREAM))
def test_field_numbers_are_upstreams(pb, message, field):
    assert getattr(pb, message).DESCRIPTOR.fields_by_name[field].number == UPSTREAM[(message, field)]


def test_service_and_enums(pb):
    service = pb.DESCRIPTOR.services_by_name["RuntimeService"]
    assert service.full_name == "runtime.v1.RuntimeService"
    assert {m.name for m in service.methods} >= {"RunPodSandbox", "CreateContainer", "StartContainer",
                                                 "ContainerStatus", "StopPodSandbox", "RemovePodSandbox",
                                                 "ListContainers"}
    assert (pb.POD, pb.CONTAINER, pb.NODE) == (0, 1, 2)
    assert (pb.CONTAINER_CREATED, pb.CONTAINER_RUNNING, pb.CONTAINER_EXITED) == (0, 1, 2)


def test_container_log_parsing(tmp_path):
    from cdi_shim_lab.cri.client import read_container_log

    log = tmp_path / "c.log"
    log.write_text("2024-01-01T00:00:00.000000000Z stdout F hello world\n"
                   "2024-01-01T00:00:00.000000001Z stdout P part-\n"
                   "2024-01-01T00:00:00.000000002Z stdout F one\n"
                   "2024-01-01T00:00:00.000000003Z stderr F err: x y\n")
    assert read_container_log(log) == ["hello world", "part-one", "err: x y"]
    assert read_container_log(tmp_path / "missing.log") == []
