"""containerd's side of an NRI CreateContainer, modelled for tests and the hook differential
(benchmarks/hook_differential.py --way nri): the NRI Container message containerd sends for an
OCI config, and the plugin's ContainerAdjustment applied to that config as containerd's NRI
applies it (containerd/nri pkg/runtime-tools/generate: AdjustEnv, AdjustDevices,
AdjustResources' device rules, AdjustMounts with its sort, AdjustHooks)."""
import os

from shim.nri.messages import nri
from shim.nri.policy import HOOK_STAGES, oci_device, oci_hook


def container_of(config, name="c", container_id="c1"):
    """The NRI Container containerd would send for the OCI CONFIG (a dict): its env, mounts,
    device nodes, namespaces and user (what the plugin's policy reads)."""
    made = nri.Container(id=container_id, name=name, env=list((config.get("process") or {}).get("env") or []),
                         annotations=dict(config.get("annotations") or {}))
    for mount in config.get("mounts") or []:
        made.mounts.add(destination=mount["destination"], type=mount.get("type", ""), source=mount.get("source", ""),
                        options=mount.get("options") or [])
    linux = config.get("linux") or {}
    for namespace in linux.get("namespaces") or []:
        made.linux.namespaces.add(type=namespace["type"], path=namespace.get("path", ""))
    for device in linux.get("devices") or []:
        out = made.linux.devices.add(path=device["path"], type=device["type"], major=device.get("major", 0),
                                     minor=device.get("minor", 0))
        for key, field in (("fileMode", "file_mode"), ("uid", "uid"), ("gid", "gid")):
            if device.get(key) is not None:
                getattr(out, field).value = device[key]
    user = (config.get("process") or {}).get("user")
    if user:
        made.user.uid, made.user.gid = user.get("uid", 0), user.get("gid", 0)
    return made


def nri_apply(config, adjust):
    """ADJUST applied to CONFIG as containerd's NRI does; CONFIG itself is not changed."""
    config = {key: (dict(value) if isinstance(value, dict) else value) for key, value in config.items()}
    env = list(config["process"]["env"])
    changes = {kv.key: kv.value for kv in adjust.env}
    out = []
    for entry in env:
        key = entry.partition("=")[0]
        out.append(f"{key}={changes.pop(key)}" if key in changes else entry)
    out += [f"{kv.key}={kv.value}" for kv in adjust.env if kv.key in changes]
    config["process"] = dict(config["process"], env=out)
    linux = dict(config["linux"])
    devices = list(linux.get("devices") or [])
    rules = []
    for device in adjust.linux.devices:
        devices = [d for d in devices if d["path"] != device.path]
        devices.append(oci_device(device))
        rules.append({"allow": True, "type": device.type, "major": device.major, "minor": device.minor,
                      "access": "rw" + ("m" if device.type == "b" else "")})
    for rule in adjust.linux.resources.devices:
        rules.append({"allow": rule.allow, "type": rule.type, "major": rule.major.value, "minor": rule.minor.value,
                      "access": rule.access})
    linux["devices"] = devices
    if rules:       # (after the config's own rules: runc's default deny-all stays first)
        resources = dict(linux.get("resources") or {})
        resources["devices"] = list(resources.get("devices") or []) + rules
        linux["resources"] = resources
    config["linux"] = linux
    mounts = list(config["mounts"])
    for mount in adjust.mounts:
        mounts = [m for m in mounts if m["destination"] != mount.destination]
        mounts.append({"destination": mount.destination, "type": mount.type, "source": mount.source,
                       "options": list(mount.options)})
    mounts.sort(key=lambda m: (os.path.normpath(m["destination"]).count("/"), m["destination"]))
    config["mounts"] = mounts
    hooks = {stage: list(entries) for stage, entries in (config.get("hooks") or {}).items()}
    for stage, field in HOOK_STAGES:
        hooks.setdefault(stage, []).extend(oci_hook(hook) for hook in getattr(adjust.hooks, field))
    hooks = {stage: entries for stage, entries in hooks.items() if entries}
    if hooks:
        config["hooks"] = hooks
    return config
