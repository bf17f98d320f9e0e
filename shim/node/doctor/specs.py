"""The CDI layer: spec files found, valid, placed where they are read, without conflicts, naming files that exist."""
import os
import stat

from cdi.safeio import UnsafeFile

from .base import _DIR_VERSION, FAIL, SHOWN, WARN, Check, _ok, listed
from .driver import _version_of




SPEC_LOOKALIKE = (".json", ".yaml", ".yml")
# where specs are found by mistake (besides containerd's cdi_spec_dirs)
ELSEWHERE = ("/etc/cdi", "/var/run/cdi", "/run/cdi")


def _misplaced(ctx, spec_dirs):
    """Files that look like specs but that no registry over SPEC_DIRS reads."""
    from cdi.spec_dirs import is_spec_file_name, placement_problem

    node, problems = ctx.node, []
    ours = {node.host(d) for d in spec_dirs}
    for directory in spec_dirs:
        for name in node.listdir(directory) or []:
            path = os.path.join(directory, name)
            info = node.stat(path)
            if info is not None and stat.S_ISDIR(info.st_mode):
                for inner in node.listdir(path) or []:
                    if inner.endswith(SPEC_LOOKALIKE):
                        problems.append(placement_problem(os.path.join(path, inner), spec_dirs))
            elif name.lower().endswith(SPEC_LOOKALIKE) and not is_spec_file_name(name):  # .yml, .YAML
                problems.append(placement_problem(path, spec_dirs))
    cri_dirs = ctx.containerd.cdi_spec_dirs if ctx.containerd else None
    for directory in list(ELSEWHERE) + list(cri_dirs or ()):
        if node.host(directory) in ours:
            continue
        ours.add(node.host(directory))
        for name in node.listdir(directory) or []:
            if name.endswith(SPEC_LOOKALIKE):
                problems.append(placement_problem(os.path.join(directory, name), spec_dirs))
    return problems


def load_specs(ctx):
    """[(priority, node path, Spec or error text)] of the spec directories."""
    from cdi.errors import SpecError
    from cdi.spec import MAX_SPEC_BYTES, parse_spec
    from cdi.spec_dirs import is_spec_file_name

    node, results = ctx.node, []
    for priority, directory in enumerate(ctx.options.spec_dirs):
        for name in node.listdir(directory) or []:
            if not is_spec_file_name(name):
                continue
            path = os.path.join(directory, name)
            info = node.stat(path)
            if info is not None and stat.S_ISDIR(info.st_mode):
                continue
            try:
                data = node.read_checked(path, MAX_SPEC_BYTES)
            except UnsafeFile as err:
                results.append((priority, path, f"{path}: cannot be read: {err}"))
                continue
            if data is None:
                results.append((priority, path, f"{path}: cannot be read: its link leads nowhere"))
                continue
            try:
                results.append((priority, path, parse_spec(data, path, priority)))
            except SpecError as err:
                results.append((priority, path, str(err)))
    return results


def check_specs(ctx):
    spec_dirs = ctx.options.spec_dirs
    loaded = load_specs(ctx)
    ctx.specs = [spec for _, _, spec in loaded if not isinstance(spec, str)]
    errors = [spec for _, _, spec in loaded if isinstance(spec, str)]
    misplaced = _misplaced(ctx, spec_dirs)
    where = ", ".join(spec_dirs)
    if not ctx.specs and not errors:
        fix = "write one: `cdi-shim cdi generate --output /etc/cdi/nvidia.yaml`"
        if misplaced:
            fix = "rename or move the file into a spec directory as NAME.yaml or NAME.json; or " + fix
        return Check("cdi", "specs", FAIL, f"no CDI spec in {where}" + (": " + "; ".join(misplaced) if misplaced
                                                                        else ""), fix)
    parts = [f"{len(ctx.specs)} spec(s) loaded: " + ", ".join(
        f"{s.path} ({s.kind}: {len(s.devices)} devices)" for s in ctx.specs)] if ctx.specs else []
    if errors or misplaced:
        return Check("cdi", "specs", FAIL, "; ".join(parts + errors + misplaced),
                     "fix or remove the invalid files (`cdi-shim cdi validate` shows every error); rename "
                     "misplaced files to NAME.yaml or NAME.json directly in a spec directory "
                     f"({where}); or regenerate: `cdi-shim cdi generate`")
    return _ok("cdi", "specs", "; ".join(parts))


def check_spec_conflicts(ctx):
    if not ctx.specs:
        return None
    owners = {}
    for spec in ctx.specs:
        for qualified in spec.qualified_names():
            owners.setdefault(qualified, []).append(spec)
    conflicts, shadowed = [], []
    for qualified, specs in sorted(owners.items()):
        if len(specs) < 2:
            continue
        top = max(s.priority for s in specs)
        winners = [s for s in specs if s.priority == top]
        if len(winners) > 1:
            conflicts.append(f"{qualified} in {', '.join(s.path for s in winners)}")
        else:
            hidden = ", ".join(s.path for s in specs if s is not winners[0])
            shadowed.append(f"{qualified}: {winners[0].path} hides {hidden}")
    if conflicts:
        return Check("cdi", "conflicts", FAIL,
                     "devices defined twice in one directory, so neither resolves: " + "; ".join(conflicts),
                     "keep one spec per kind in each directory: remove or rename the duplicate devices")
    if shadowed:
        return Check("cdi", "conflicts", WARN, "a higher-priority directory redefines devices: " + "; ".join(shadowed),
                     "remove the spec you do not mean (later directories win)")
    return _ok("cdi", "conflicts", "no device is defined twice")


def _spec_paths(spec):
    """(device nodes, mount sources, driver versions named) of a spec."""
    from cdi.host_files import DEVICE_NODE, host_files

    blocks = [spec.edits] + [(d.get("containerEdits") or {}) for d in spec.devices.values()]
    nodes, sources, versions = [], [], set()
    for edits in blocks:
        for what, path, _ in host_files(edits):   # every device node: on a GPU node each should be there
            if what == DEVICE_NODE:
                if path not in nodes:
                    nodes.append(path)
            else:
                source = path
                if source not in sources:
                    sources.append(source)
                version = _version_of(source)
                match = _DIR_VERSION.search(source)
                if version and ("nvidia" in source or "libcuda" in source):
                    versions.add(version)
                elif match and "nvidia" in source:
                    versions.add(match.group(1))
        for hook in edits.get("hooks") or ():
            for arg in hook.get("args") or ():
                if arg.startswith("--host-driver-version="):
                    versions.add(arg.split("=", 1)[1])
    return nodes, sources, versions


def check_spec_paths(ctx):
    if not ctx.specs:
        return None
    node, driver = ctx.node, ctx.driver_version
    missing, kernel_side, stale, counted = [], [], [], 0
    for spec in ctx.specs:
        nodes, sources, versions = _spec_paths(spec)
        counted += len(nodes) + len(sources)
        for path in nodes + sources:
            if not node.exists(path):
                (kernel_side if path in ctx.missing_devices or path in nodes and ctx.failed & {"kernel.devices"}
                 else missing).append(f"{path} ({os.path.basename(spec.path)})")
        # with versions in disagreement (userspace.versions) "the driver's version" is no one value
        old = sorted(versions - {driver}) if driver and "userspace.versions" not in ctx.failed else []
        if old:
            stale.append(f"{spec.path} names driver {', '.join(old)} files, the driver is {driver}")
    if stale:
        def saw(shown):
            return "stale spec: " + "; ".join(stale) + (f"; missing: {listed(missing, shown)}" if missing else "")
        return Check("cdi", "paths", FAIL, saw(None),
                     "regenerate it for the installed driver: `cdi-shim cdi generate` (after every driver upgrade)",
                     brief=saw(SHOWN))
    if missing:
        return Check("cdi", "paths", FAIL, "spec names files that do not exist: " + listed(missing, None),
                     "regenerate the spec for this node: `cdi-shim cdi generate`",
                     brief="spec names files that do not exist: " + listed(missing))
    if kernel_side:
        said = "device nodes missing (see kernel.devices): "
        return Check("cdi", "paths", WARN, said + listed(kernel_side, None), "fix kernel.devices first",
                     brief=said + listed(kernel_side))
    return _ok("cdi", "paths", f"all {counted} device nodes and mount sources exist"
               + (f"; driver {driver}" if driver else ""))


def check_host_dirs(ctx):
    """The one-mount layout's host directories (shim/generate/hostdir.py) the specs bind: there,
    root's and writable by no one else, holding the driver's libraries, for the loaded driver."""
    from ...driver_version import ONE_MOUNT_LIB
    from ...generate import hostdir

    named = {}
    for spec in ctx.specs:
        blocks = [spec.edits] + [(d.get("containerEdits") or {}) for d in spec.devices.values()]
        for edits in blocks:
            for mount in edits.get("mounts") or ():
                if mount.get("containerPath") == ONE_MOUNT_LIB and isinstance(mount.get("hostPath"), str):
                    named.setdefault(os.path.dirname(mount["hostPath"].rstrip("/")), spec.path)
    if not named:
        return None
    bad, stale = [], []
    for directory, spec_path in named.items():
        host = ctx.node.host(directory)
        found = hostdir.problems(host)
        lib = os.path.join(host, "lib64")
        if not found:
            found += [f"{lib} has no {name}" for name in ("libcuda.so.1", "libnvidia-ml.so.1")
                      if not os.path.exists(os.path.join(lib, name))]
        if found:
            bad.append(f"{directory} ({os.path.basename(spec_path)}): " + "; ".join(found[:3]))
        version = hostdir.version_of(os.path.basename(directory))
        driver = ctx.driver_version
        if version and driver and version != driver and "userspace.versions" not in ctx.failed:
            stale.append(f"{directory} holds driver {version} files, the driver is {driver}")
    if bad:
        return Check("cdi", "host-dirs", FAIL, "the one-mount layout's host directory is not right: " + " | ".join(bad),
                     "regenerate: `cdi-shim cdi generate --layout one-mount` makes a new directory (a directory "
                     "others can write to is refused: remove it first)")
    if stale:
        return Check("cdi", "host-dirs", FAIL, "; ".join(stale),
                     "regenerate for the installed driver: `cdi-shim cdi generate --layout one-mount`")
    return _ok("cdi", "host-dirs", f"{len(named)} host director{'y' if len(named) == 1 else 'ies'} of the one-mount "
               "layout: root's, writable by no one else, with the driver's libraries")
