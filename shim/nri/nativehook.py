"""The toolkit's createContainer hooks in an NRI adjustment, replaced by one hook of ours.

Under NRI the runtime is the node's runc: nobody works on config.json before runc, so the hooks
stay hooks. The toolkit's update-ldcache, create-symlinks and chmod hooks (nvidia-cdi-hook,
nvidia-ctk hook, or our own cdi-shim(-hook)), and its enable-cuda-compat, of the createContainer
stage become one call of

    cdi-shim-hook nri [--link TARGET::LINK]... [--chmod MODE:PATH]... [--cuda-compat DRIVER:CUDA | --folder DIR]...

(shim/nri/hook.py) in the place of the spec's update-ldcache hook (else of its first replaced
hook): one process instead of one per hook, none of them the toolkit's. It does their work in
their order -- links, modes, then the linker cache -- inside the container's root, after runc's
mounts. The cache's items keep the spec's order: an enable-cuda-compat before an update-ldcache
has its compat folder read first by that cache (as the runtime's step; cache.py), one after
every update-ldcache only its drop-in written; an update-ldcache without a --folder is
`--folder ""` (it rebuilds the cache all the same). A hook with an option we do not know is left as
the spec has it; disable-device-node-modification and update-application-profile are done by
the plugin's files (native_files).
"""
import os

from ..linker.container import SAFE_HOOK_ENV, HookCall

REPLACED = {"update-ldcache": {"folder", "ldconfig-path"}, "create-symlinks": {"link"}, "chmod": {"mode", "path"},
            "enable-cuda-compat": {"host-driver-version", "host-cuda-version"}}
STAGE = "createContainer"


def _arguments(call):
    if call.command == "create-symlinks":
        return [arg for link in call.options.get("link") or () for arg in ("--link", link)]
    if call.command == "chmod":
        mode = (call.options.get("mode") or [""])[-1]
        return [arg for path in call.options.get("path") or () for arg in ("--chmod", f"{mode}:{path}")]
    if call.command == "enable-cuda-compat":
        versions = [(call.options.get(key) or [""])[-1] for key in ("host-driver-version", "host-cuda-version")]
        return ["--cuda-compat", ":".join(versions)]
    # (an update-ldcache without a folder rebuilds the cache all the same: "" says it is there)
    return [arg for folder in call.options.get("folder") or [""] for arg in ("--folder", folder)]


def _replaceable(call):
    known = REPLACED.get(call.command)
    if known is None or not set(call.options) <= known:
        return False
    if call.command == "chmod":
        return len(call.options.get("mode") or ()) == 1 and bool(call.options.get("path"))
    if call.command == "enable-cuda-compat":     # (a ":" would not survive DRIVER:CUDA)
        return not any(":" in value for values in call.options.values() for value in values)
    return True


def native_hooks(hooks, program, options=()):
    """HOOKS ({stage: [OCI hook]}) with the createContainer stage's replaceable hooks made one
    call of PROGRAM `nri` with OPTIONS first (PROGRAM: cdi-shim-nshook, with --socket and
    --fallback: csrc/hooks/nrihook.c; or cdi-shim-hook: shim/nri/hook.py)."""
    entries = hooks.get(STAGE) or []
    calls = [HookCall(hook) for hook in entries]
    chosen = [i for i, call in enumerate(calls) if call.command and _replaceable(call)]
    if not chosen:
        if "--params" not in options:
            return hooks
        ours = {"path": program, "args": [os.path.basename(program), "nri", *options], "env": list(SAFE_HOOK_ENV)}
        return dict(hooks, **{STAGE: [*entries, ours]})
    links, modes, folders = [], [], []      # (folders: and the compat calls, in the spec's order)
    for i in chosen:
        arguments = _arguments(calls[i])
        {"create-symlinks": links, "chmod": modes}.get(calls[i].command, folders).extend(arguments)
    ours = {"path": program, "args": [os.path.basename(program), "nri", *options, *links, *modes, *folders],
            "env": list(SAFE_HOOK_ENV)}
    place = next((i for i in chosen if calls[i].command == "update-ldcache"), chosen[0])
    kept = [ours if i == place else hook for i, hook in enumerate(entries) if i == place or i not in chosen]
    return dict(hooks, **{STAGE: kept})


FILE_HOOKS = ("update-application-profile", "disable-device-node-modification")


class ToolkitFiles:
    """The files the toolkit's update-application-profile and disable-device-node-modification
    hooks would write, made by the plugin at CreateContainer in DIRECTORY (a folder runc's hooks
    see; named by content, so one file serves every container that needs the same bytes)."""

    def __init__(self, directory):
        self.directory = directory

    def write(self, prefix, data):
        import hashlib

        from cdi.safeio import write_file_atomic

        os.makedirs(self.directory, mode=0o755, exist_ok=True)
        path = os.path.join(self.directory, f"{prefix}-{hashlib.sha256(data).hexdigest()[:24]}")
        if not os.path.exists(path):
            write_file_atomic(path, data, 0o444, prefix=f".{prefix}.")
        return path

    def profile(self, config):
        """The read-only bind mount of the application profile for CONFIG's /dev/nvidiaN, or None."""
        from ..linker.toolkit_hooks import PROFILE_PATH, application_profile

        data = application_profile(config)
        if data is None:
            return None
        return {"destination": PROFILE_PATH, "type": "bind", "source": self.write("profile", data),
                "options": ["rbind", "ro", "nosuid", "nodev", "rprivate"]}

    def params(self):
        """The host's params with ModifyDeviceFiles 0, as a file, or None (nothing to do)."""
        from ..linker.toolkit_hooks import params_contents

        data = params_contents()
        return None if data is None else self.write("params", data)


def native_files(hooks, config, files):
    """HOOKS ({stage: [OCI hook]}) without the createContainer stage's update-application-profile
    and disable-device-node-modification (no options), done by FILES (ToolkitFiles) for the
    container whose edited config is CONFIG: (hooks, mounts to add, params file or None)."""
    entries = hooks.get(STAGE) or []
    done = [i for i, hook in enumerate(entries)
            if (call := HookCall(hook)).command in FILE_HOOKS and not call.options]
    if files is None or not done:
        return hooks, [], None
    mounts, params = [], None
    for i in done:
        if HookCall(entries[i]).command == "update-application-profile":
            mount = files.profile(config)
            if mount:
                mounts.append(mount)
        else:
            params = files.params()
    kept = [hook for i, hook in enumerate(entries) if i not in done]
    return dict(hooks, **{STAGE: kept}), mounts, params
