"""`cdi-shim doctor`: why a container sees no GPU, layer by layer, offline.

The cause of "the driver works, nvidia-smi works, but the container has no GPU" lies in one of
three layers: the kernel (nvidia.ko, /dev/nvidia*), the user-space driver (libcuda.so,
libnvidia-ml.so, nvidia-smi) or injection (the CDI specs, containerd's registration, the
RuntimeClass, the runtime itself). Each check is a small function of a `Context` returning
one `Check(layer, name, status, saw, fix)`; a check whose input is missing (no spec loaded, no
containerd config) is left out rather than reported twice.

Everything is read from the node under ROOT (default "/"): paths named by the node's own files
(/proc/modules, /dev, /etc/ld.so.cache, the spec directories, containerd's config and its
imports, PATH) are resolved inside ROOT, an absolute symlink meaning ROOT's own file, never
the host's. No GPU, no network, no write.
"""

from .base import FAIL, OK, WARN, Check, Context, Node, Options  # noqa: F401  (the public surface)
from .containerd import (ContainerdView, check_cgroup_driver, check_config_owner, check_containerd_binaries,
                         check_containerd_loads, check_containerd_version, check_cri_cdi, check_dev_char,
                         check_default_runtime, check_ignored_sections, check_runtime_entry)
from .docker import check_docker_cdi, check_docker_default_runtime, check_docker_gpus, check_docker_runtime
from .podman import check_podman_default_runtime, check_podman_runtime
from .driver import check_kernel_devices, check_kernel_module, check_libraries, check_nvidia_smi, check_versions
from .runtime import (check_env_requests, check_hook_program, check_release, check_resident, check_runtime_install,
                      check_runtime_log, check_runtimeclasses)
from .specs import check_host_dirs, check_spec_conflicts, check_spec_paths, check_specs


# --- running them ---------------------------------------------------------------------------------

CHECKS = (
    check_kernel_module, check_kernel_devices,
    check_libraries, check_versions, check_nvidia_smi,
    check_specs, check_spec_conflicts, check_spec_paths, check_host_dirs,
    check_release,    # before the engines' checks, which defer to it
    check_containerd_binaries, check_containerd_version, check_config_owner, check_ignored_sections,
    check_containerd_loads,
    check_runtime_entry, check_cri_cdi, check_cgroup_driver, check_dev_char, check_default_runtime,
    check_runtimeclasses,
    check_docker_runtime, check_docker_default_runtime, check_docker_cdi, check_docker_gpus,
    check_podman_runtime, check_podman_default_runtime,
    check_hook_program, check_runtime_install, check_resident, check_runtime_log, check_env_requests,
)


def run_checks(options, checks=CHECKS):
    """Every check's result, in order (checks whose input is missing are left out)."""
    ctx = Context(options, ContainerdView.load)
    results = []
    for check in checks:
        try:
            result = check(ctx)
        except Exception as err:  # noqa: BLE001 - one broken check must not hide the others
            name = check.__name__.replace("check_", "")
            result = Check("doctor", name, FAIL, f"the check itself failed: {type(err).__name__}: {err}",
                           "report this as a cdi-shim bug")
        if result is None:
            continue
        if result.status == FAIL:
            ctx.failed.add(result.id)
        results.append(result)
    return results
