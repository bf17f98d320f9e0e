"""Which containers get which CDI devices over NRI, and the adjustment that gives them.

Requests (in this order, duplicates dropped):
- CDI's standard annotations (annotation-prefixes, `cdi.k8s.io/` by default) on the pod, then
  on the container;
- the toolkit plugin's pod annotation `nvidia.cdi.k8s.io/container.<container name>`: a comma
  list of device names (a bare name, e.g. `all` or `0`, is of default-kind).

A pod outside the allowed namespaces (config key nri-namespaces, plus the plugin's
--namespace options; "*" allows every namespace) gets nothing: its request is logged and
refused as a whole. Devices resolve through the same registry and spec folders as the runtime's;
an unresolvable one fails CreateContainer with the runtime's error text.

The edits are applied, as the runtime applies them (cdi.container_edits), to the OCI config the
container would have; what they changed becomes the NRI ContainerAdjustment: env entries,
device nodes with their cgroup rules, mounts, and hooks, the toolkit's hooks replaced by one
call of our own hook program (nativehook.py). An edit NRI cannot carry (netDevices, intelRdt,
additionalGids) fails the creation: nothing is half-applied.
"""
from cdi.annotations import parse_annotations
from cdi.errors import CDIError
from cdi.parser import is_qualified_name

from .messages import nri
from .nativehook import native_files, native_hooks

TOOLKIT_KEY = "nvidia.cdi.k8s.io/container."
ALL_NAMESPACES = "*"
HOOK_STAGES = (("prestart", "prestart"), ("createRuntime", "create_runtime"),
               ("createContainer", "create_container"), ("startContainer", "start_container"),
               ("poststart", "poststart"), ("poststop", "poststop"))


class Refused(Exception):
    """A request this plugin does not serve (a namespace not on the list)."""


class CreateFailure(Exception):
    """The container must not be created: the reason goes back to the runtime."""


def requested_devices(pod, container, settings):
    """The CDI device names POD and CONTAINER (NRI messages) request."""
    names = []
    for annotations in (pod.annotations, container.annotations):
        try:
            names += parse_annotations(dict(annotations), settings.annotation_prefixes)[1]
        except CDIError as err:
            raise CreateFailure(f"container {container.name}: {err}") from None
    value = pod.annotations.get(TOOLKIT_KEY + container.name, "")
    for name in (part.strip() for part in value.split(",")):
        if name:
            names.append(name if is_qualified_name(name) else f"{settings.default_kind}={name}")
    return list(dict.fromkeys(names))


def namespace_allowed(namespace, allowed):
    return ALL_NAMESPACES in allowed or namespace in allowed


def _optional(message, value):
    if value is not None:
        message.value = value


def _oci_mount(mount):
    entry = {"destination": mount.destination}
    for key in ("type", "source"):
        if getattr(mount, key):
            entry[key] = getattr(mount, key)
    if mount.options:
        entry["options"] = list(mount.options)
    return entry


def oci_device(device):
    """The OCI config's linux.devices entry of an NRI LinuxDevice."""
    entry = {"path": device.path, "type": device.type, "major": device.major, "minor": device.minor}
    for key in ("file_mode", "uid", "gid"):
        if device.HasField(key):
            entry["fileMode" if key == "file_mode" else key] = getattr(device, key).value
    return entry


def oci_hook(hook):
    """The OCI config's hook entry of an NRI Hook."""
    entry = {"path": hook.path}
    if hook.args:
        entry["args"] = list(hook.args)
    if hook.env:
        entry["env"] = list(hook.env)
    if hook.HasField("timeout"):
        entry["timeout"] = hook.timeout.value
    return entry


def oci_config(container):
    """The parts of the OCI config CONTAINER (an NRI Container) will have that CDI edits read."""
    config = {"process": {"env": list(container.env)},
              "mounts": [_oci_mount(m) for m in container.mounts],
              "linux": {"devices": [], "namespaces": [{"type": n.type, "path": n.path}
                                                      for n in container.linux.namespaces]}}
    if container.HasField("user"):
        config["process"]["user"] = {"uid": container.user.uid, "gid": container.user.gid}
    config["linux"]["devices"] = [oci_device(device) for device in container.linux.devices]
    hooks = {}
    for oci, field in HOOK_STAGES:
        for hook in getattr(container.hooks, field):
            hooks.setdefault(oci, []).append(oci_hook(hook))
    if hooks:
        config["hooks"] = hooks
    return config


def _added(before, after):
    """The entries of AFTER not in BEFORE (lists of JSON values), in AFTER's order."""
    left = list(before)
    added = []
    for entry in after:
        if entry in left:
            left.remove(entry)
        else:
            added.append(entry)
    return added


def adjustment(config, edited, hook_program, hook_options=(), files=None):
    """The ContainerAdjustment that turns CONFIG (oci_config) into EDITED (the edits applied);
    FILES (nativehook.ToolkitFiles) does the toolkit's profile and params hooks."""
    adjust = nri.ContainerAdjustment()
    for entry in _added(config["process"]["env"], edited["process"].get("env") or []):
        key, _, value = entry.partition("=")
        adjust.env.add(key=key, value=value)
    for device in _added(config["linux"]["devices"], edited["linux"].get("devices") or []):
        out = adjust.linux.devices.add(path=device["path"], type=device["type"], major=device.get("major", 0),
                                       minor=device.get("minor", 0))
        if device.get("fileMode") is not None:
            out.file_mode.value = device["fileMode"]
        for key in ("uid", "gid"):
            if device.get(key) is not None:
                getattr(out, key).value = device[key]
    for rule in (edited["linux"].get("resources") or {}).get("devices") or []:
        out = adjust.linux.resources.devices.add(allow=bool(rule.get("allow")), type=rule.get("type", ""),
                                                 access=rule.get("access", ""))
        _optional(out.major, rule.get("major"))
        _optional(out.minor, rule.get("minor"))
    # a hook the container has already (a runtime injected the same devices) is not added twice
    new_hooks = {stage: [hook for hook in entries if hook not in ((config.get("hooks") or {}).get(stage) or [])]
                 for stage, entries in (edited.get("hooks") or {}).items()}
    new_hooks, file_mounts, params = native_files(new_hooks, edited, files)
    if params:
        hook_options = (*hook_options, "--params", params)
    for mount in _added(config["mounts"], edited.get("mounts") or []) + file_mounts:
        adjust.mounts.add(destination=mount["destination"], type=mount.get("type", ""),
                          source=mount.get("source", ""), options=mount.get("options") or [])
    for oci, field in HOOK_STAGES:
        for hook in native_hooks(new_hooks, hook_program, hook_options).get(oci) or []:
            out = getattr(adjust.hooks, field).add(path=hook["path"], args=hook.get("args") or [],
                                                   env=hook.get("env") or [])
            _optional(out.timeout, hook.get("timeout"))
    return adjust


UNCARRIED = ("netDevices", "intelRdt", "additionalGids")


class Policy:
    """CreateContainer's decisions, with the registry kept between calls."""

    def __init__(self, settings, namespaces, hook_program, log, hook_options=(), files=None):
        self.settings = settings
        self.namespaces = tuple(namespaces)
        self.hook_program = hook_program
        self.hook_options = tuple(hook_options)     # the hook's own options (nativehook.py)
        self.files = files                          # nativehook.ToolkitFiles, or None
        self.log = log
        self._registry = None

    def registry(self):
        from cdi.registry import Registry

        if self._registry is None:
            self._registry = Registry(self.settings.spec_dirs)
        return self._registry.refresh()

    def create_container(self, pod, container):
        """The adjustment for CONTAINER of POD (NRI messages); an empty one when it asks for
        nothing or is refused. Raises CreateFailure."""
        from cdi.container_edits import apply_edits, merge_edits

        devices = requested_devices(pod, container, self.settings)
        if not devices:
            return nri.ContainerAdjustment()
        where = f"container {container.name} of pod {pod.namespace}/{pod.name}"
        if not namespace_allowed(pod.namespace, self.namespaces):
            self.log("warning", f"refused: {where} requests {', '.join(devices)}, but namespace "
                                f"{pod.namespace!r} is not allowed (nri-namespaces: {', '.join(self.namespaces)})")
            return nri.ContainerAdjustment()
        registry = self.registry()
        if registry.cache_problem:
            self.log("warning", registry.cache_problem)
        try:
            blocks, origins = registry.resolve(devices)
        except CDIError as err:
            raise CreateFailure(f"container {container.name}: {err}") from None
        merged = merge_edits(blocks)
        uncarried = [key for key in UNCARRIED if merged.get(key)]
        specs = ", ".join(sorted({path for _, path in origins}))
        if uncarried:
            raise CreateFailure(f"container {container.name}: the edits of {', '.join(devices)} (from {specs}) "
                                f"have {', '.join(uncarried)}, which NRI cannot carry: use the runtime handler")
        config = oci_config(container)
        try:
            edited = apply_edits(config, merged)
        except CDIError as err:
            raise CreateFailure(f"container {container.name}: failed to inject devices "
                                f"{', '.join(devices)} (from {specs}): {err}") from None
        self.log("info", f"{where}: {', '.join(devices)} (from {specs})")
        return adjustment(config, edited, self.hook_program, self.hook_options, self.files)
