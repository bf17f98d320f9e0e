"""podman's layer of the doctor: containers.conf's registration of cdi-shim-runtime (a runtime
whose path list names it, and that path existing) and podman's default runtime.

root's podman reads /usr/share/containers/containers.conf, then /etc/containers/containers.conf
(the file doctor --podman-config names), then its containers.conf.d/*.conf, later files winning
key by key; that merge is what is checked. podman is there when it is on the node's PATH or
the named file exists; otherwise every check here is left out. (A rootless user's own file,
~/.config/containers/containers.conf, is theirs: not read here.)
"""
import os

from ..podman_config import PodmanConfigError, parse_containers_conf, runtimes_of
from .base import FAIL, OK, WARN, Check, RUNTIME_EXECUTABLE

CONFIGURE = "cdi-shim runtime configure --runtime=podman"
VENDOR_CONFIG = "/usr/share/containers/containers.conf"


class PodmanView:
    """The containers.conf files under the node's root, merged as podman merges them."""

    def __init__(self, ctx):
        node, path = ctx.node, ctx.options.podman_config
        self.shown = node.show(path)
        drop_ins = [os.path.join(path + ".d", name) for name in node.listdir(path + ".d") or []
                    if name.endswith(".conf")]
        texts = [(p, node.read_text(p)) for p in [VENDOR_CONFIG, path] + drop_ins]
        self.present = texts[1][1] is not None or bool(node.which_all("podman"))
        self.error = None
        self.runtimes, self.default, self.where = {}, None, {}
        for name, text in texts:
            if text is None:
                continue
            try:
                doc = parse_containers_conf(node.show(name), text)
            except PodmanConfigError as err:
                self.error = str(err)
                return
            for runtime, paths in runtimes_of(doc).items():
                self.runtimes[runtime], self.where[runtime] = paths, node.show(name)
            engine = doc.get("engine")
            if isinstance(engine, dict) and isinstance(engine.get("runtime"), str):
                self.default = str(engine["runtime"])

    def ours(self):
        """{name: [paths]} of the runtimes whose path list names cdi-shim-runtime."""
        return {name: paths for name, paths in self.runtimes.items()
                if any(os.path.basename(p) == RUNTIME_EXECUTABLE for p in paths)}


def _view(ctx):
    view = getattr(ctx, "_podman_view", None)
    if view is None:
        view = ctx._podman_view = PodmanView(ctx)
    return view


def check_podman_runtime(ctx):
    view = _view(ctx)
    if not view.present:
        return None
    if view.error:
        return Check("podman", "runtime", FAIL, view.error, f"fix the file by hand; then run {CONFIGURE}")
    ours = view.ours()
    if not ours:
        return Check("podman", "runtime", WARN, f"no runtime in {view.shown} (or the files podman reads with it) "
                     f"runs {RUNTIME_EXECUTABLE}: podman run --runtime cdi-shim is refused and the spec's hooks "
                     "run as programs under runc", CONFIGURE)
    for name, paths in sorted(ours.items()):
        # podman takes the first path of the list that exists
        usable = [p for p in paths if p.startswith("/") and ctx.node.is_executable(p)]
        if not usable and any(ctx.deferred(p) for p in paths):   # runtime.release names the one fix
            return Check("podman", "runtime", WARN, f"{view.where[name]}: [engine.runtimes] {name} names "
                         f"{', '.join(paths)}, none of which exists (see runtime.release)")
        if not usable:
            return Check("podman", "runtime", FAIL, f"{view.where[name]}: [engine.runtimes] {name} names "
                         f"{', '.join(paths)}, none of which exists as an executable file: podman run --runtime "
                         f"{name} fails", f"reinstall cdi-shim, or rerun {CONFIGURE} after removing the entry")
    return Check("podman", "runtime", OK, ", ".join(f"[engine.runtimes] {name} = {paths[0]}"
                                                   for name, paths in sorted(ours.items())))


def check_podman_default_runtime(ctx):
    view = _view(ctx)
    if not view.present or view.error:
        return None
    default = view.default or "crun"
    if default in view.ours():
        return Check("podman", "default-runtime", OK, f'engine.runtime = "{default}" (cdi-shim): podman run '
                     "--device nvidia.com/gpu=0 has its hooks done natively without --runtime")
    names = sorted(view.ours())
    return Check("podman", "default-runtime", OK, f'engine.runtime = "{default}": containers get cdi-shim only with '
                 f"--runtime {names[0] if names else 'cdi-shim'}")
