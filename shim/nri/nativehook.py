"""The toolkit's createContainer hooks in an NRI adjustment, replaced by one hook of ours.

Under NRI the runtime is the node's runc: nobody works on config.json before runc, so the hooks
stay hooks. The toolkit's update-ldcache, create-symlinks and chmod hooks (nvidia-cdi-hook,
nvidia-ctk hook, or our own cdi-shim(-hook)) of the createContainer stage become one call of

    cdi-shim-hook nri [--link TARGET::LINK]... [--chmod MODE:PATH]... [--folder DIR]...

(shim/nri/hook.py) in the place of the spec's update-ldcache hook (else of its first replaced
hook): one process instead of one per hook, none of them the toolkit's. It does their work in
their order -- links, modes, then the linker cache -- inside the container's root, after runc's
mounts. A hook with an option we do not know, and the toolkit's other hooks
(enable-cuda-compat, disable-device-node-modification, update-application-profile), are left
as the spec has them.
"""
import os

from ..linker.container import SAFE_HOOK_ENV, HookCall

REPLACED = {"update-ldcache": {"folder", "ldconfig-path"}, "create-symlinks": {"link"}, "chmod": {"mode", "path"}}
STAGE = "createContainer"


def _arguments(call):
    if call.command == "create-symlinks":
        return [arg for link in call.options.get("link") or () for arg in ("--link", link)]
    if call.command == "chmod":
        mode = (call.options.get("mode") or [""])[-1]
        return [arg for path in call.options.get("path") or () for arg in ("--chmod", f"{mode}:{path}")]
    return [arg for folder in call.options.get("folder") or () for arg in ("--folder", folder)]


def _replaceable(call):
    known = REPLACED.get(call.command)
    if known is None or not set(call.options) <= known:
        return False
    if call.command == "chmod":
        return len(call.options.get("mode") or ()) == 1 and bool(call.options.get("path"))
    return True


def native_hooks(hooks, program, options=()):
    """HOOKS ({stage: [OCI hook]}) with the createContainer stage's replaceable hooks made one
    call of PROGRAM `nri` with OPTIONS first (PROGRAM: cdi-shim-nshook, with --socket and
    --fallback: csrc/hooks/nrihook.c; or cdi-shim-hook: shim/nri/hook.py)."""
    entries = hooks.get(STAGE) or []
    calls = [HookCall(hook) for hook in entries]
    chosen = [i for i, call in enumerate(calls) if call.command and _replaceable(call)]
    if not chosen:
        return hooks
    links, modes, folders = [], [], []
    for i in chosen:
        arguments = _arguments(calls[i])
        {"create-symlinks": links, "chmod": modes, "update-ldcache": folders}[calls[i].command].extend(arguments)
    ours = {"path": program, "args": [os.path.basename(program), "nri", *options, *links, *modes, *folders],
            "env": list(SAFE_HOOK_ENV)}
    place = next((i for i in chosen if calls[i].command == "update-ldcache"), chosen[0])
    kept = [ours if i == place else hook for i, hook in enumerate(entries) if i == place or i not in chosen]
    return dict(hooks, **{STAGE: kept})
