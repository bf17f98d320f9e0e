"""The NRI plugin's policy: which requests, which namespaces, and an adjustment that gives the
container exactly what the runtime's injection gives (the adjustment applied as containerd's NRI
applies it: containerd/nri pkg/runtime-tools/generate, modelled in containerd_nri.py)."""
import pytest

from cdi.registry import Registry
from shim.config import Config
from shim.nri.messages import nri
from shim.nri.policy import CreateFailure, Policy, oci_config, requested_devices
from tests.conftest import write_spec
from tests.nri.containerd_nri import nri_apply

HOOK = "/opt/cdi-shim/bin/cdi-shim-hook"
SPEC = """cdiVersion: "0.6.0"
kind: nvidia.com/gpu
containerEdits:
  env: [NVIDIA_VISIBLE_DEVICES=void, SPEC_LEVEL=1]
  mounts:
    - {hostPath: /usr/lib, containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.1, options: [ro, nosuid, nodev, bind]}
  hooks:
    - hookName: createContainer
      path: /usr/bin/nvidia-cdi-hook
      args: [nvidia-cdi-hook, create-symlinks, --link, libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so]
    - hookName: createContainer
      path: /usr/bin/nvidia-cdi-hook
      args: [nvidia-cdi-hook, enable-cuda-compat, --host-driver-version=555.42.06]
    - hookName: createContainer
      path: /usr/bin/nvidia-cdi-hook
      args: [nvidia-cdi-hook, update-ldcache, --folder, /usr/lib/x86_64-linux-gnu]
    - hookName: createContainer
      path: /usr/bin/nvidia-cdi-hook
      args: [nvidia-cdi-hook, chmod, --mode, "755", --path, /dev/dri]
devices:
  - name: "0"
    containerEdits:
      deviceNodes: [{path: /dev/nvidia0, hostPath: /dev/null}, {path: /dev/nvidiactl, hostPath: /dev/zero,
                     permissions: rw}]
      env: [GPU0=yes]
  - name: "1"
    containerEdits:
      deviceNodes: [{path: /dev/nvidia1, hostPath: /dev/full}]
      mounts: [{hostPath: /etc/hostname, containerPath: /etc/gpu1, options: [ro, bind]}]
  - name: all
    containerEdits:
      deviceNodes: [{path: /dev/nvidia0, hostPath: /dev/null}, {path: /dev/nvidia1, hostPath: /dev/full}]
"""


@pytest.fixture
def policy(tmp_path, cache_dir):
    write_spec(str(tmp_path / "cdi"), "gpu.yaml", SPEC)
    settings = Config(spec_dirs=(str(tmp_path / "cdi"),))
    logged = []
    made = Policy(settings, ("gpu-operator", "ml"), HOOK, lambda level, message: logged.append((level, message)))
    made.logged = logged
    return made


def pod(namespace="ml", **annotations):
    return nri.PodSandbox(id="p1", name="trainer", namespace=namespace, annotations=annotations)


def container(name="cuda", env=("PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"), annotations=None, uid=None):
    made = nri.Container(id="c1", name=name, env=list(env), annotations=annotations or {})
    made.mounts.add(destination="/proc", type="proc", source="proc", options=["nosuid", "noexec", "nodev"])
    made.mounts.add(destination="/etc/hostname", type="bind", source="/var/lib/x/hostname", options=["rbind", "rw"])
    made.linux.namespaces.add(type="mount")
    if uid is not None:
        made.user.uid, made.user.gid = uid, uid
    return made


def mount_set(config):
    return sorted((m["destination"], m["source"], tuple(m["options"])) for m in config["mounts"])


def rule_set(config):
    rules = (config["linux"].get("resources") or {}).get("devices") or []
    return sorted((r["type"], r["major"], r["minor"], r.get("access", "")) for r in rules if r["allow"])


@pytest.mark.parametrize("names, uid", [(["nvidia.com/gpu=0"], None), (["nvidia.com/gpu=0", "nvidia.com/gpu=1"], 1000),
                                        (["nvidia.com/gpu=all"], None)])
def test_the_container_gets_what_the_runtime_gives(policy, names, uid):
    box = container(uid=uid)
    adjust = policy.create_container(pod(**{"cdi.k8s.io/gpu": ",".join(names)}), box)
    config = oci_config(box)
    ours = nri_apply(config, adjust)
    runtime = Registry(policy.settings.spec_dirs).refresh().inject(config, names)
    assert ours["process"]["env"] == runtime["process"]["env"]
    assert ours["linux"]["devices"] == runtime["linux"]["devices"]
    assert mount_set(ours) == mount_set(runtime)
    # every rule the runtime adds is there (NRI adds an "rw" rule of its own per device node)
    assert set(rule_set(runtime)) <= set(rule_set(ours))
    # the toolkit's hooks: ours once, in update-ldcache's place (enable-cuda-compat too: its
    # host versions before the folder it is read by, as the spec orders them)
    hooks = ours["hooks"]["createContainer"]
    assert [h["args"][:2] for h in hooks] == [["cdi-shim-hook", "nri"]]
    assert hooks[0]["path"] == HOOK
    assert hooks[0]["args"][2:] == ["--link", "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so",
                                    "--chmod", "755:/dev/dri", "--cuda-compat", "555.42.06:",
                                    "--folder", "/usr/lib/x86_64-linux-gnu"]
    assert hooks[0]["env"] == ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]


def test_requests_from_pod_container_and_the_toolkit_key():
    settings = Config()
    got = requested_devices(pod(**{"cdi.k8s.io/a": "nvidia.com/gpu=0", "nvidia.cdi.k8s.io/container.cuda": "1, all",
                                   "nvidia.cdi.k8s.io/container.other": "nvidia.com/gpu=2"}),
                            container(annotations={"cdi.k8s.io/b": "nvidia.com/gpu=0,nvidia.com/gpu=3"}), settings)
    assert got == ["nvidia.com/gpu=0", "nvidia.com/gpu=3", "nvidia.com/gpu=1", "nvidia.com/gpu=all"]
    assert requested_devices(pod(), container(), settings) == []


def test_a_namespace_not_allowed_is_refused_whole_and_logged(policy):
    adjust = policy.create_container(pod(namespace="default", **{"nvidia.cdi.k8s.io/container.cuda": "0"}),
                                     container())
    assert adjust == nri.ContainerAdjustment()
    assert policy.logged and policy.logged[-1][0] == "warning"
    assert "namespace 'default' is not allowed" in policy.logged[-1][1]


def test_star_allows_every_namespace(policy):
    policy.namespaces = ("*",)
    adjust = policy.create_container(pod(namespace="default", **{"nvidia.cdi.k8s.io/container.cuda": "0"}),
                                     container())
    assert [d.path for d in adjust.linux.devices] == ["/dev/nvidia0", "/dev/nvidiactl"]


def test_no_request_no_adjustment(policy):
    assert policy.create_container(pod(), container()) == nri.ContainerAdjustment()
    assert policy.logged == []


def test_an_unresolvable_device_fails_with_the_runtimes_text(policy):
    with pytest.raises(CreateFailure) as failed:
        policy.create_container(pod(**{"nvidia.cdi.k8s.io/container.cuda": "0,7"}), container())
    text = str(failed.value)
    assert text.startswith("container cuda: ")
    assert "nvidia.com/gpu=7" in text and "searched" in text
    registry = Registry(policy.settings.spec_dirs).refresh()
    with pytest.raises(Exception) as runtime:
        registry.resolve(["nvidia.com/gpu=0", "nvidia.com/gpu=7"])
    assert text == f"container cuda: {runtime.value}"


def test_edits_nri_cannot_carry_fail_the_creation(tmp_path, cache_dir):
    write_spec(str(tmp_path / "cdi"), "gids.yaml", 'cdiVersion: "0.7.0"\nkind: example.com/dev\ndevices:\n'
               '  - name: a\n    containerEdits:\n      additionalGids: [44]\n')
    made = Policy(Config(spec_dirs=(str(tmp_path / "cdi"),)), ("*",), HOOK, lambda *_: None)
    with pytest.raises(CreateFailure, match="additionalGids, which NRI cannot carry"):
        made.create_container(pod(**{"cdi.k8s.io/x": "example.com/dev=a"}), container())


def test_devices_the_runtime_already_injected_add_no_second_hook(policy):
    names = ["nvidia.com/gpu=0"]
    config = oci_config(container())
    injected = Registry(policy.settings.spec_dirs).refresh().inject(config, names)
    box = container(env=injected["process"]["env"])
    for device in injected["linux"]["devices"]:
        box.linux.devices.add(path=device["path"], type=device["type"], major=device["major"],
                              minor=device["minor"]).file_mode.value = device["fileMode"]
    for hook in injected["hooks"]["createContainer"]:
        box.hooks.create_container.add(path=hook["path"], args=hook["args"])
    for mount in injected["mounts"][2:]:
        box.mounts.add(destination=mount["destination"], type=mount.get("type", ""), source=mount["source"],
                       options=mount["options"])
    adjust = policy.create_container(pod(**{"cdi.k8s.io/gpu": names[0]}), box)
    assert not adjust.env and not adjust.linux.devices and not adjust.mounts
    assert not adjust.hooks.create_container
