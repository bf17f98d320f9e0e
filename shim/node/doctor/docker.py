"""Docker's layer of the doctor: daemon.json's registration of cdi-shim-runtime, its default
runtime, dockerd's own CDI and the program that offers `docker run --gpus`.

Docker is there when daemon.json exists or dockerd is on the node's PATH; otherwise every check
here is left out. dockerd's version is asked (`dockerd --version`, local) only for ROOT "/".
"""
import json
import os

from ..docker_config import (CDI_DEFAULT_ON_FROM, CDI_FROM, DEFAULT_DOCKER_SPEC_DIRS, LEGACY_HOOK_PROGRAM,
                             DockerConfigError, docker_version, parse_daemon_json)
from .base import FAIL, OK, RUNTIME_EXECUTABLE, WARN, Check

CONFIGURE = "cdi-shim runtime configure --runtime=docker"


class DockerView:
    """daemon.json under the node's root, and the dockerd on its PATH."""

    def __init__(self, ctx):
        node, path = ctx.node, ctx.options.docker_config
        self.path = path
        self.shown = node.show(path)
        self.text = node.read_text(path)
        found = node.which_all("dockerd")
        self.dockerd = found[0][0] if found else None
        self.present = self.text is not None or self.dockerd is not None
        self.error, self.doc = None, {}
        if self.text is not None:
            try:
                self.doc = parse_daemon_json(self.shown, self.text)
            except DockerConfigError as err:
                self.error = str(err)
        self.version = docker_version(found[0][1]) if found and node.root == "/" else None
        runtimes = self.doc.get("runtimes")
        self.runtimes = runtimes if isinstance(runtimes, dict) else {}

    def ours(self):
        """{name: path} of the runtimes that run cdi-shim-runtime."""
        return {name: entry.get("path") for name, entry in self.runtimes.items()
                if isinstance(entry, dict) and isinstance(entry.get("path"), str)
                and os.path.basename(entry["path"]) == RUNTIME_EXECUTABLE}


def _view(ctx):
    view = getattr(ctx, "_docker_view", None)
    if view is None:
        view = ctx._docker_view = DockerView(ctx)
    return view


def check_docker_runtime(ctx):
    view = _view(ctx)
    if not view.present:
        return None
    if view.error:
        return Check("docker", "runtime", FAIL, view.error, f"fix the file by hand; then run {CONFIGURE}")
    ours = view.ours()
    if not ours:
        where = view.shown if view.text is not None else f"{view.shown} (missing)"
        return Check("docker", "runtime", WARN, f"no runtime in {where} runs {RUNTIME_EXECUTABLE}: docker run "
                     "--runtime=cdi-shim is refused (unknown runtime) and no container gets cdi-shim's devices",
                     f"{CONFIGURE}, then reload dockerd")
    broken = {name: path for name, path in ours.items() if not path.startswith("/")
              or not ctx.node.is_executable(path)}
    deferred = sorted(name for name, path in broken.items() if ctx.deferred(path))
    if deferred and len(deferred) == len(broken):   # runtime.release names the one fix
        return Check("docker", "runtime", WARN, ", ".join(f'runtimes["{n}"].path {broken[n]}' for n in deferred)
                     + " does not exist (see runtime.release)")
    if broken:
        name, path = sorted(broken.items())[0]
        return Check("docker", "runtime", FAIL, f'{view.shown}: runtimes["{name}"].path is {path}, which '
                     "does not exist (or is not an executable file): every container of that runtime fails to start",
                     f"reinstall cdi-shim, or rerun {CONFIGURE} after removing the entry")
    return Check("docker", "runtime", OK,
                 ", ".join(f'runtimes["{name}"] = {path}' for name, path in sorted(ours.items())))


def check_docker_default_runtime(ctx):
    view = _view(ctx)
    if not view.present or view.error:
        return None
    default = view.doc.get("default-runtime") or "runc"
    if default != "runc" and default not in view.runtimes:
        return Check("docker", "default-runtime", FAIL, f'{view.shown}: default-runtime "{default}" names no '
                     f"runtime of the file: dockerd refuses to start",
                     f'set "default-runtime": "runc", or {CONFIGURE} --set-as-default')
    if default in view.ours():
        return Check("docker", "default-runtime", OK, f'default-runtime = "{default}" (cdi-shim): --gpus and '
                     "NVIDIA_VISIBLE_DEVICES work without --runtime")
    names = sorted(view.ours())
    return Check("docker", "default-runtime", OK, f'default-runtime = "{default}": containers get cdi-shim only '
                 f"with --runtime={names[0] if names else 'cdi-shim'}")


def check_docker_cdi(ctx):
    """dockerd's own CDI (--device vendor/class=name): the feature, and spec dirs equal to ours."""
    view = _view(ctx)
    if not view.present or view.error:
        return None
    features = view.doc.get("features") if isinstance(view.doc.get("features"), dict) else {}
    feature = features.get("cdi")
    version = view.version
    shown_version = ".".join(map(str, version)) if version else "unknown"
    if version is not None and version[:2] < CDI_FROM:
        if feature:
            return Check("docker", "cdi", WARN, f"features.cdi is on, but dockerd {shown_version} has no CDI: "
                         "--device vendor/class=name is taken for a host path",
                         "select the runtime instead (--runtime=cdi-shim -e NVIDIA_VISIBLE_DEVICES=0, or --gpus)")
        return Check("docker", "cdi", OK, f"dockerd {shown_version}: no CDI of its own (cdi-shim injects)")
    on = feature is True or (feature is None and version is not None and version[:2] >= CDI_DEFAULT_ON_FROM)
    if not on:
        return Check("docker", "cdi", WARN, f"dockerd's CDI is off (features.cdi = {json.dumps(feature)}, dockerd "
                     f"{shown_version}): docker run --device nvidia.com/gpu=0 is not injected",
                     f"{CONFIGURE} --cdi, then restart dockerd")
    dirs = view.doc.get("cdi-spec-dirs", list(DEFAULT_DOCKER_SPEC_DIRS))
    ours = list(ctx.options.spec_dirs)
    if dirs != ours:
        return Check("docker", "cdi", WARN, f"cdi-spec-dirs = {json.dumps(dirs)}, cdi-shim's spec-dirs = "
                     f"{json.dumps(ours)}: the daemon and the runtime read different specs",
                     f"{CONFIGURE} --cdi (keeps them equal), then restart dockerd")
    return Check("docker", "cdi", OK, f"features.cdi on, cdi-spec-dirs = {json.dumps(dirs)}")


def check_docker_gpus(ctx):
    """`docker run --gpus` is offered only when nvidia-container-runtime-hook is on dockerd's PATH."""
    view = _view(ctx)
    if not view.present:
        return None
    from ...installation import stable_program

    found = ctx.node.which_all(LEGACY_HOOK_PROGRAM)
    if not found:
        return Check("docker", "gpus", WARN, f"no {LEGACY_HOOK_PROGRAM} on PATH: dockerd refuses --gpus "
                     "(could not select device driver \"\" with capabilities: [[gpu]])",
                     f"ln -s {stable_program(LEGACY_HOOK_PROGRAM)} /usr/local/bin/ and restart dockerd "
                     "(cdi-shim's stand-in: the runtime does its work), or run cdi-shim install --node")
    return Check("docker", "gpus", OK, f"{found[0][0]}: --gpus offered (it needs --runtime=cdi-shim or cdi-shim "
                 "as the default runtime)")
