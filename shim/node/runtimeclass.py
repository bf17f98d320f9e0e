"""RuntimeClass (node.k8s.io/v1) YAML for the runtime registered by `cdi-shim runtime configure`.

A RuntimeClass's ``handler`` must equal the name of a containerd CRI runtime; otherwise every pod
using it fails at sandbox creation with containerd's ``no runtime for "<handler>" is configured``
(kubectl describe pod: ``failed to get sandbox runtime: no runtime for "x" is configured``).
`check_handler` refuses such a mismatch up front, with that text, when a containerd config is given.
"""
import re

import yaml

from .containerd_config import ContainerdConfigError, configured_runtimes

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

EXAMPLE_IMAGE = "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0"


class RuntimeClassError(Exception):
    pass


def no_runtime_error(handler):
    """containerd's own words for a handler that names no runtime (pkg/cri/server, sandbox_run.go)."""
    return f'no runtime for "{handler}" is configured'


def check_names(name, handler):
    if not name or len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        raise RuntimeClassError(f'RuntimeClass name "{name}" is not a DNS subdomain (lowercase letters, digits, '
                                '"-" and ".")')
    if not _DNS_LABEL.match(handler or ""):
        raise RuntimeClassError(f'handler "{handler}" is not a DNS label (lowercase letters, digits and "-", '
                                "at most 63): the API server rejects such a RuntimeClass")


def check_handler(handler, containerd_config):
    """Raise RuntimeClassError with containerd's error text when `handler` names no configured runtime."""
    try:
        default, names = configured_runtimes(containerd_config)
    except ContainerdConfigError as err:
        raise RuntimeClassError(str(err)) from None
    if handler not in names:
        raise RuntimeClassError(
            f"{no_runtime_error(handler)}: {containerd_config} (with its imports) configures "
            f"{', '.join(names)}; every pod of this RuntimeClass would fail with "
            f'"failed to get sandbox runtime: {no_runtime_error(handler)}". Run '
            f"`cdi-shim runtime configure --runtime-name {handler}` or pass --handler with one of those")
    return names


def runtime_class(name="nvidia", handler="nvidia"):
    return {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name},
            "handler": handler}


def example_pod(runtime_class_name="nvidia", kind="nvidia.com/gpu", image=EXAMPLE_IMAGE):
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "cdi-shim-gpu-example"},
        "spec": {
            "runtimeClassName": runtime_class_name,
            "restartPolicy": "Never",
            "containers": [{
                "name": "cuda",
                "image": image,
                "resources": {"limits": {kind: 1}},
            }],
        },
    }


EXAMPLE_POD_NOTE = """\
# The device reaches cdi-shim as a CDI annotation on the container, which the device plugin adds
# when it allocates the nvidia.com/gpu limit (NVIDIA's plugin with --device-list-strategy=cdi-annotations):
#   cdi.k8s.io/nvidia-device-plugin_<uid>: nvidia.com/gpu=<index or UUID>
# containerd passes it on because the runtime entry allows container_annotations ["cdi.k8s.io/*"].
# Do not put cdi.k8s.io/ annotations in the pod's metadata: pod annotations are written by whoever
# creates the pod, so cdi-shim's runtime entry never allows them (pod_annotations) and they are dropped.
"""


def render(name="nvidia", handler="nvidia", with_example_pod=False, kind="nvidia.com/gpu"):
    text = yaml.safe_dump(runtime_class(name, handler), sort_keys=False)
    if with_example_pod:
        text += "---\n" + EXAMPLE_POD_NOTE + yaml.safe_dump(example_pod(name, kind), sort_keys=False)
    return text
