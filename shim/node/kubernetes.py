"""Whether a node runs Kubernetes pods: one rule for `install --node` (which then turns env
requests from unprivileged containers off) and `doctor` (which warns while they are on).

On such a node the device plugin allocates GPUs, and an image must not be able to pick its own
with NVIDIA_VISIBLE_DEVICES=all; the plugin passes its allocation as CDI annotations, the CRI
CDI field or volume mounts under /var/run/nvidia-container-devices instead (its
deviceListStrategy cdi-annotations, cdi-cri or volume-mounts)."""

KUBELET_CONFIG = "/var/lib/kubelet/config.yaml"
# a node's kubelet leaves one of these: kubeadm and most distributions, EKS, GKE, k3s and rke2
MARKERS = (KUBELET_CONFIG, "/etc/kubernetes/kubelet.conf", "/etc/kubernetes/kubelet/kubelet-config.json",
           "/var/lib/kubelet/kubeconfig", "/var/lib/rancher/k3s/agent", "/var/lib/rancher/rke2/agent")
# what a device plugin must use where env requests from unprivileged containers are off
PLUGIN_STRATEGIES = "deviceListStrategy cdi-annotations, cdi-cri or volume-mounts"


def kubernetes_marker(exists):
    """The first of MARKERS that EXISTS (a predicate on node paths), else None."""
    return next((path for path in MARKERS if exists(path)), None)


def other_ways(settings, cri_cdi=None):
    """The ways the node's devices reach containers besides the env var, under SETTINGS (and
    containerd's enable_cdi, CRI_CDI, when known)."""
    ways = []
    if cri_cdi:
        ways.append("the CRI CDI field (containerd's enable_cdi)")
    if settings.annotation_prefixes:
        ways.append("CDI annotations (" + ", ".join(p + "*" for p in settings.annotation_prefixes) + ")")
    if settings.volume_mount_requests != "off":
        ways.append("volume mounts under /var/run/nvidia-container-devices")
    return ways
