"""The spec document for this node's GPUs, and `generate()`, which makes it.

Its shape is the toolkit 1.20's (`nvidia-ctk cdi generate`): kind nvidia.com/gpu; one
device per GPU and naming strategy (index "0", UUID "GPU-..."), holding only the GPU's own
device nodes (/dev/nvidiaN and its DRM nodes, with a create-symlinks hook for their
/dev/dri/by-path links); for a GPU in MIG mode, one per MIG device instead ("0:1", "MIG-..."),
with the GPU's node and its GPU- and compute-instance capability nodes; "all" with every node;
the rest in the spec-level edits: env NVIDIA_CTK_LIBCUDA_DIR and NVIDIA_VISIBLE_DEVICES=void, the
control device nodes, the hooks (create-symlinks, update-ldcache, and the toolkit's others when
its hook program is named), and the mounts (EGL platform libraries and Xorg modules,
configuration and ICD files, libraries, IPC sockets, GSP firmware, binaries). With the
one-mount layout (hostdir.py, docs/one-mount.md) the libraries and binaries are one host
directory's two binds instead, and the hooks name what is left.

Device nodes carry their path and, when it differs (a --dev-root), their hostPath; major,
minor and mode are left to injection time, which reads them from the host node, so the spec
does not go stale when nvidia-uvm gets another major number after a module reload. Every
node whose group is not root's carries that gid, as nvidia-ctk 1.20 writes it (world-accessible
render nodes included); one that only its group may use (not world-readable and -writable: DRM
nodes, typically) also names the group in its device's additionalGids, as the toolkit's edits
do (internal/edits/device.go); that alone needs cdiVersion 0.7.0. Every host path is resolved
inside the driver or dev root (shim/inroot.py; docs/security.md).

The output's extension (.yaml, .json) decides its format, as nvidia-ctk's: a --format that
disagrees is a warning.

cdiVersion is the minimum the content needs (0.5.0 with index names: they start with a
digit), or --spec-version when that is enough. The driver version the spec was made for is
data either way: every library mount names it (libnvidia-ml.so.<version>;
`recorded_driver_version()` reads it back). The annotation `cdi-shim.dev/driver-version`
holds it too when the spec's version allows annotations (0.6.0 and later): we do not raise
the version for it by default, because readers of CDI 0.5 (Debian's podman 4.3: CDI v0.5.2)
refuse specs newer than 0.5.0. The YAML file also says it in its first line,
a comment for the reader.
"""
import copy
import os
import posixpath
import sys
import time

from ..driver_version import ANNOTATION
from . import GenerateError, hostdir
from .discover import (IPC_MOUNT_OPTIONS, MOUNT_OPTIONS, DevRoot, DriverRoot, control_nodes, discover_files,
                       gpu_nodes, mig_caps, mig_nodes)

DEFAULT_OUTPUT = "/var/run/cdi/nvidia.yaml"
DEFAULT_STRATEGIES = ("index", "uuid")
STRATEGIES = ("index", "uuid", "type-index")
HOOK_PROGRAM = "cdi-shim-hook"
NS_HOOK_PROGRAM = "cdi-shim-nshook"   # installed beside HOOK_PROGRAM: csrc/hooks/nshook.c
# Hook programs that implement the toolkit's whole set of hooks, and those that (like ours)
# implement update-ldcache and create-symlinks only.
TOOLKIT_HOOK_PROGRAMS = ("nvidia-cdi-hook", "nvidia-ctk")


class Options:
    """What `cdi-shim cdi generate` was asked for."""

    def __init__(self, output=DEFAULT_OUTPUT, fmt=None, vendor="nvidia.com", cls="gpu", strategies=(),
                 driver_root="/", dev_root=None, hook_program=None, spec_version=None, sysfs="/sys",
                 proc="/proc", machine=None, layout="files", driver_dir=None, make_dir=True):
        self.output = output
        self.fmt = fmt
        self.vendor = vendor
        self.cls = cls
        self.strategies = tuple(dict.fromkeys(strategies)) or DEFAULT_STRATEGIES
        self.driver_root = driver_root
        self.dev_root = dev_root or driver_root
        self.hook_program = hook_program
        self.spec_version = spec_version
        self.sysfs = sysfs
        self.proc = proc
        self.machine = machine
        self.layout = layout            # hostdir.LAYOUTS
        self.driver_dir = driver_dir    # the one-mount layout's base (default hostdir.BASE)
        self.make_dir = make_dir        # False: name the host directory, make nothing (--dry-run)


class Result:
    """A generated spec: the document, its text, where it goes, what to warn about, timings."""

    def __init__(self, doc, text, path, warnings, nvml, timings, host_dir=None):
        self.doc = doc
        self.host_dir = host_dir    # the one-mount layout's host directory (a path), else None
        self.text = text
        self.path = path
        self.warnings = warnings
        self.nvml = nvml            # nvml.NvmlInfo
        self.timings = timings      # {phase: seconds}


def default_hook_program():
    """This install's cdi-shim-hook, by the path that outlives the release (installation.py)."""
    from ..installation import stable_program

    return stable_program(HOOK_PROGRAM)


def _hook_program(given, warnings):
    if given is None:
        from ..installation import DEFAULT_PREFIX, bin_dir, node_prefix

        path = default_hook_program()
        if not os.access(os.path.join(bin_dir(), HOOK_PROGRAM), os.X_OK):
            raise GenerateError(f"{HOOK_PROGRAM} is not installed beside {sys.executable}: "
                                "reinstall cdi-shim, or name a hook program with --hook-program "
                                "(e.g. /usr/bin/nvidia-cdi-hook)")
        if node_prefix() is None:
            warnings.append(f"the spec names the hook program {path}, of a development install: the spec "
                            f"breaks when that folder moves; generate it with the node's cdi-shim "
                            f"({DEFAULT_PREFIX}/current/bin/cdi-shim), or name --hook-program")
        return path
    if not posixpath.isabs(given):
        raise GenerateError(f"--hook-program {given}: an absolute path is needed (runtimes run hooks by path)")
    if not os.access(given, os.X_OK):
        warnings.append(f"the hook program {given} is not an executable on this node: containers that run "
                        "the spec's hooks will fail until it is")
    return given


def _hook_factory(program):
    """hook(name, *args) -> a createContainer hook of PROGRAM, in the toolkit's form."""
    base = posixpath.basename(program)
    fixed = [base, "hook"] if base in ("nvidia-ctk", "cdi-shim") else [base]
    env = ["NVIDIA_CTK_DEBUG=false"] if base in TOOLKIT_HOOK_PROGRAMS else []

    def hook(*args):
        entry = {"hookName": "createContainer", "path": program, "args": fixed + list(args)}
        if env:
            entry["env"] = list(env)
        return entry

    return hook


def _symlinks_hook(program, links):
    return _hook_factory(program)("create-symlinks", *[arg for link in links for arg in ("--link", link)])


def _device_links_hook(program, links):
    """The device's /dev/dri/by-path links lie under /dev, which runc mounts: only a hook can
    make them, in the container's mount namespace. With our own hook program, our C one beside
    it (`cdi-shim-nshook symlinks`, the rootfs from the OCI state: no interpreter start per
    container, under podman or plain runc as under cdi-shim-runtime)."""
    if posixpath.basename(program) == HOOK_PROGRAM:
        nshook = posixpath.join(posixpath.dirname(program), NS_HOOK_PROGRAM)
        if os.access(nshook, os.X_OK):
            return _hook_factory(nshook)("symlinks", *[arg for link in links for arg in ("--link", link)])
    return _symlinks_hook(program, links)


def _hooks(program, files, version, made=None):
    """The spec-level hooks; with MADE (the one-mount layout's hostdir.Plan) the links and the
    folder of its libraries are in the host directory: the hooks name what is left."""
    hook = _hook_factory(program)
    toolkit = posixpath.basename(program) in TOOLKIT_HOOK_PROGRAMS
    hooks = []
    links = files.links if made is None else made.left_links
    if links:
        hooks.append(_symlinks_hook(program, links))
    if toolkit:
        hooks.append(hook("enable-cuda-compat", f"--host-driver-version={version}"))
    folders = [] if made is None else [hostdir.LIB_DIR]
    for lib in (files.libraries if made is None else made.left):
        directory = posixpath.dirname(lib.path)
        if directory not in folders:
            folders.append(directory)
    if folders:
        hooks.append(hook("update-ldcache", *[arg for folder in folders for arg in ("--folder", folder)]))
    if toolkit:
        hooks.append(hook("disable-device-node-modification"))
        hooks.append(hook("update-application-profile"))
    return hooks


def _node(node):
    entry = {"path": node.path, "hostPath": node.host} if node.host != node.path else {"path": node.path}
    if node.gid != 0:   # as nvidia-ctk 1.20: every node whose group is not root's, world-accessible or not
        entry["gid"] = node.gid
    return entry


def _node_edits(nodes, links, program):
    """Container edits of device NODES ([discover.Node]) and create-symlinks LINKS: the nodes,
    the groups a process needs to use them (additionalGids), the links' hook."""
    edits = {"deviceNodes": [_node(node) for node in nodes]}
    gids = sorted({node.gid for node in nodes if node.group_only()})
    if gids:
        edits["additionalGids"] = gids
    if links:
        edits["hooks"] = [_device_links_hook(program, links)]
    return edits


def _mount(host, path, options):
    return {"hostPath": host, "containerPath": path, "options": list(options)}


def device_entries(options, dev_root, info, warnings):
    """[(names, nodes, links)]: a GPU's names, device nodes and /dev/dri/by-path links, or, for
    a GPU in MIG mode, each of its MIG devices' (names "<gpu>:<slot>" and the MIG UUID; the
    toolkit gives such a GPU no device of its own)."""
    entries, caps = [], None
    for gpu in info.gpus:
        if not gpu.mig_enabled:
            names = [_gpu_name(s, gpu) for s in options.strategies]
            entries.append((names, *gpu_nodes(dev_root, gpu, options.sysfs)))
            continue
        if not gpu.migs:
            warnings.append(f"GPU {gpu.index} ({gpu.uuid}) is in MIG mode and has no MIG device: "
                            "the spec has no device for it")
            continue
        if caps is None:
            caps = mig_caps(options.proc)
        for mig in gpu.migs:
            names = [_mig_name(s, gpu, mig) for s in options.strategies]
            entries.append((names, mig_nodes(dev_root, gpu, mig, caps, options.proc), []))
    return entries


def _gpu_name(strategy, gpu):
    """A GPU's device name: "0" (index), "gpu0" (type-index), or its UUID."""
    return {"index": str(gpu.index), "type-index": f"gpu{gpu.index}"}.get(strategy, gpu.uuid)


def _mig_name(strategy, gpu, mig):
    """A MIG device's name: "0:1" (index), "mig0:1" (type-index), or its UUID."""
    return {"index": f"{gpu.index}:{mig.index}", "type-index": f"mig{gpu.index}:{mig.index}"}.get(strategy, mig.uuid)


def build_doc(options, info, files, control, entries, hook_program, made=None):
    """The spec document (without cdiVersion); MADE: the one-mount layout's hostdir.Plan."""
    devices, everything, every_link, seen = [], [], [], set()
    for names, nodes, links in entries:
        edits = _node_edits(nodes, links, hook_program)
        for name in names:
            devices.append({"name": name, "containerEdits": copy.deepcopy(edits)})  # no YAML aliases
        everything += [node for node in nodes if node.path not in seen]
        seen.update(node.path for node in nodes)
        every_link += [link for link in links if link not in every_link]
    devices.append({"name": "all", "containerEdits": _node_edits(everything, every_link, hook_program)})
    moved = made.moved if made is not None else ()
    mounts = [_mount(h, p, MOUNT_OPTIONS) for h, p in files.graphics + files.configs if p not in moved]
    if made is None:
        mounts += [_mount(lib.host, lib.path, MOUNT_OPTIONS) for lib in files.libraries]
    else:
        mounts += hostdir.mounts(made, MOUNT_OPTIONS) + [_mount(lib.host, lib.path, MOUNT_OPTIONS) for lib in made.left]
    mounts += [_mount(h, p, IPC_MOUNT_OPTIONS) for h, p in files.ipc]
    mounts += [_mount(h, p, MOUNT_OPTIONS) for h, p in files.firmware + (files.binaries if made is None else [])]
    lib_dirs = files.lib_dirs if made is None else [hostdir.LIB_DIR]
    edits = {
        "env": ["NVIDIA_CTK_LIBCUDA_DIR=" + ":".join(lib_dirs), "NVIDIA_VISIBLE_DEVICES=void"]
               + (made.env() if made is not None else []),
        **_node_edits(control, [], hook_program),
        "hooks": _hooks(hook_program, files, info.driver_version, made),
        "mounts": mounts,
    }
    return {"kind": f"{options.vendor}/{options.cls}", "devices": devices,
            "containerEdits": {key: value for key, value in edits.items() if value}}


_NEEDS = {
    "0.4.0": "mount types",
    "0.5.0": "device names that start with a digit (the index naming) or device nodes with a hostPath (--dev-root)",
    "0.6.0": "annotations, or a dot in the class",
    "0.7.0": "additionalGids: device nodes only their group may use (e.g. /dev/dri/card*, mode 0660); "
             "readers of older CDI versions (podman before 4.9) refuse such a spec",
}


def _version(options, doc):
    from cdi.version import _key, minimum_version, normalize_version

    needed = minimum_version(doc)
    if options.spec_version is None:
        return needed
    version = normalize_version(options.spec_version)
    if version is None:
        raise GenerateError(f"--spec-version {options.spec_version}: not a CDI version "
                            "(known: 0.3.0 ... 1.1.0)")
    if _key(version) < _key(needed):
        raise GenerateError(f"--spec-version {options.spec_version}: this spec needs at least {needed} "
                            f"({_NEEDS.get(needed, 'its content')})")
    return version


def output_path(output, fmt, warnings=None):
    """Where the spec goes and so its format: OUTPUT's extension (.yaml, .json) says it, as
    nvidia-ctk 1.20 decides; --format only names the extension of an OUTPUT that has none.
    A --format that disagrees with the extension is a warning (nvidia-ctk's too), not an error."""
    from cdi.spec import spec_path

    if fmt is not None and output.endswith((".json", ".yaml")) and not output.endswith("." + fmt):
        if warnings is not None:
            warnings.append(f"--format {fmt} disagrees with the output file {output}: written as "
                            f"{output.rpartition('.')[2]}, by its extension")
        fmt = None
    return spec_path(output, fmt)


def generate(options):
    """Result for OPTIONS; raises GenerateError (nothing written, nothing changed)."""
    from cdi.errors import CDIError
    from cdi.spec import render_spec

    from . import nvml

    from cdi import parser

    started = time.perf_counter()
    for option, value, check in (("--vendor", options.vendor, parser.validate_vendor_name),
                                 ("--class", options.cls, parser.validate_class_name)):
        try:
            check(value)
        except CDIError as err:
            raise GenerateError(f"{option} {value}: {err}") from None
    if options.layout not in hostdir.LAYOUTS:
        raise GenerateError(f"--layout {options.layout}: not a layout (known: {', '.join(hostdir.LAYOUTS)})")
    warnings = []
    hook_program = _hook_program(options.hook_program, warnings)
    path = output_path(options.output, options.fmt, warnings)
    with DriverRoot(options.driver_root, options.machine) as root:
        t0 = time.perf_counter()
        library = root.nvml_library()
        t1 = time.perf_counter()
        info = nvml.query(library)
        t2 = time.perf_counter()
        if not info.gpus:
            raise GenerateError(f"NVML ({library}) reports no GPU on this node (driver {info.driver_version}): "
                                "a spec needs at least one device; nothing written")
        if not library.endswith(".so." + info.driver_version):
            warnings.append(f"{nvml.LIBRARY} is {library}, whose name does not end in the version NVML reports "
                            f"({info.driver_version}): the driver root's files may not match the loaded driver")
        files = discover_files(root, info.driver_version)
        warnings += files.warnings
        made = None
        if options.layout == "one-mount":
            with hostdir.plan(root, files, info.driver_version, options.driver_dir or hostdir.BASE) as made:
                if options.make_dir:
                    made.make()
    with DevRoot(options.dev_root, options.proc) as dev_root:
        try:
            control = control_nodes(dev_root, warnings)
            entries = device_entries(options, dev_root, info, warnings)
        finally:
            warnings += dev_root.warnings
    if not entries:
        raise GenerateError("no GPU or MIG device to put in a spec (see the warnings); nothing written")
    t3 = time.perf_counter()
    doc = build_doc(options, info, files, control, entries, hook_program, made)
    version = _version(options, doc)
    if version not in ("0.3.0", "0.4.0", "0.5.0"):
        doc = dict(doc, annotations={ANNOTATION: info.driver_version})
    doc = {"cdiVersion": version, **doc}
    comment = (f"Generated by cdi-shim cdi generate for NVIDIA driver {info.driver_version}, "
               f"{len(info.gpus)} GPU(s).")
    try:
        doc, text = render_spec(doc, path, comment)
    except CDIError as err:
        raise GenerateError(f"the generated spec does not validate (a bug): {err}") from None
    t4 = time.perf_counter()
    timings = {"find-nvml": t1 - t0, "nvml-import": info.import_seconds,
               "nvml-load": info.load_seconds, "nvml-calls": info.call_seconds,
               "nvml": t2 - t1, "discover": t3 - t2, "build": t4 - t3, "total": t4 - started}
    return Result(doc, text, path, warnings, info, timings, made.path if made else None)


def write(result):
    """Write RESULT's text atomically at its path (0644). A link on the way is followed only where
    cdi.safeio.resolve_trusted allows (one another user owns or can replace would choose the
    folder root writes in): GenerateError otherwise; a link at the path itself is replaced."""
    from cdi.safeio import UnsafePath, resolve_trusted, write_file_atomic

    try:
        path = resolve_trusted(result.path, follow_last=False)
    except UnsafePath as err:
        raise GenerateError(f"will not write {result.path}: {err}") from None
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    write_file_atomic(path, result.text.encode(), 0o644, prefix="spec.", sync=True)
    if result.host_dir:
        collect_host_dirs(result.host_dir, directory)
    return result.path


def collect_host_dirs(host_dir, spec_dir):
    """Remove the one-mount host directories beside HOST_DIR that no spec (in SPEC_DIR, the
    standard spec directories and the configured ones) names and no container uses; returns
    their names."""
    from cdi.spec_dirs import DEFAULT_SPEC_DIRS

    from ..config import ConfigError, load_config

    try:
        configured = list(load_config().spec_dirs)
    except ConfigError:
        configured = []     # (then only the standard ones: a directory in use is kept anyway)
    base, name = os.path.split(host_dir)
    dirs = list(dict.fromkeys([spec_dir, *DEFAULT_SPEC_DIRS, *configured]))
    return hostdir.collect(base, keep={name}, spec_dirs=dirs)
