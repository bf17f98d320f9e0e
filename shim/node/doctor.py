"""`cdi-shim doctor`: why a container sees no GPU, layer by layer, offline.

The cause of "the driver works, nvidia-smi works, but the container has no GPU" lies in one of
three layers: the kernel (nvidia.ko, /dev/nvidia*), the user-space driver (libcuda.so,
libnvidia-ml.so, nvidia-smi) or injection (the CDI specs, containerd's registration, the
RuntimeClass, the runtime itself). Each check is a small function of a `Context` returning
one `Check(layer, name, status, saw, fix)`; a check whose input is missing (no spec loaded, no
containerd config) is left out rather than reported twice.

Everything is read from the node under ROOT (default "/"): paths named by the node's own files
(/proc/modules, /dev, /etc/ld.so.cache, the spec directories, containerd's config and its
imports, PATH) are resolved inside ROOT, an absolute symlink meaning ROOT's own file, never
the host's. No GPU, no network, no write.
"""
import errno
import fnmatch
import os
import re
import socket
import stat
import struct
import subprocess

OK, WARN, FAIL = "ok", "warn", "fail"
STATUSES = (OK, WARN, FAIL)
NVIDIA_MAJOR = 195
SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
RUNTIME_EXECUTABLE = "cdi-shim-runtime"
RUNC_V2 = "io.containerd.runc.v2"
CRI_RUNTIME = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime", 4: "io.containerd.cri.v1.runtime"}
OLD_CRI = "io.containerd.grpc.v1.cri"
# What containerd 2.x still reads under plugins."io.containerd.grpc.v1.cri" in a version-3 file
# (the streaming server); everything else there moved to the cri.v1 plugins and is ignored.
V3_OLD_CRI_KEYS = {"disable_tcp_service", "stream_server_address", "stream_server_port", "stream_idle_timeout",
                   "enable_tls_streaming", "x509_key_pair_streaming"}
NEW_CRI_PLUGINS = ("io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images")
KUBELET_CONFIG = "/var/lib/kubelet/config.yaml"
DRIVER_LIBRARIES = ("libcuda.so.1", "libnvidia-ml.so.1")
_SO_VERSION = re.compile(r"\.so\.(\d+\.\d+(?:\.\d+)?)$")
_DIR_VERSION = re.compile(r"/(\d{3,}\.\d+(?:\.\d+)?)(?:/|$)")  # /lib/firmware/nvidia/570.86.10/gsp.bin
_MODULE_VERSION = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)")
MAX_READ = 4 << 20


class Check:
    """One line of the report."""

    __slots__ = ("layer", "name", "status", "saw", "fix")

    def __init__(self, layer, name, status, saw, fix=""):
        assert status in STATUSES, status
        self.layer, self.name, self.status, self.saw, self.fix = layer, name, status, saw, fix

    @property
    def id(self):
        return f"{self.layer}.{self.name}"

    def as_dict(self):
        return {"check": self.id, "layer": self.layer, "name": self.name, "status": self.status,
                "saw": self.saw, "fix": self.fix}

    def __repr__(self):
        return f"Check({self.id}, {self.status}, {self.saw!r})"


def _ok(layer, name, saw):
    return Check(layer, name, OK, saw)


# --- the node under ROOT ------------------------------------------------------------------------

class Node:
    """Files of the node, read under ROOT with every link resolved inside ROOT."""

    def __init__(self, root="/", path_dirs=None):
        self.root = os.path.abspath(root)
        if path_dirs is None:
            if self.root == "/":
                path_dirs = [d for d in os.environ.get("PATH", "").split(":") if d.startswith("/")]
            path_dirs = list(path_dirs or []) or list(SYSTEM_PATH)
        self.path_dirs = path_dirs

    def host(self, path):
        """The host path of the node's PATH: symlinks resolved inside ROOT (an absolute target
        is ROOT's file, ".." stops at ROOT). A missing component ends the resolution."""
        parts = [p for p in path.split("/") if p not in ("", ".")]
        parts.reverse()
        resolved, links, missing = [], 0, False
        while parts:
            part = parts.pop()
            if part in ("", "."):
                continue
            if part == "..":
                if resolved:
                    resolved.pop()
                continue
            if missing:
                resolved.append(part)
                continue
            candidate = os.path.join(self.root, *resolved, part)
            try:
                info = os.lstat(candidate)
            except OSError:
                resolved.append(part)
                missing = True  # the rest is only named, never looked at
                continue
            if stat.S_ISLNK(info.st_mode):
                links += 1
                if links > 40:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
                target = os.readlink(candidate)
                if target.startswith("/"):
                    resolved = []
                parts.extend(reversed(target.split("/")))
            else:
                resolved.append(part)
        return os.path.join(self.root, *resolved)

    def stat(self, path):
        """os.stat of the node's PATH, or None."""
        try:
            return os.lstat(self.host(path))
        except OSError:
            return None

    def exists(self, path):
        return self.stat(path) is not None

    def is_executable(self, path):
        info = self.stat(path)
        return info is not None and stat.S_ISREG(info.st_mode) and info.st_mode & 0o111 != 0

    def read_bytes(self, path, limit=MAX_READ):
        """The bytes of a regular file (None when missing); FIFOs and devices are not opened."""
        info = self.stat(path)
        if info is None or not stat.S_ISREG(info.st_mode):
            return None
        try:
            fd = os.open(self.host(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            chunks, size = [], 0
            while size < limit:
                chunk = os.read(fd, min(1 << 16, limit - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def read_text(self, path, limit=MAX_READ):
        data = self.read_bytes(path, limit)
        return None if data is None else data.decode("utf-8", "replace")

    def listdir(self, path):
        try:
            return sorted(os.listdir(self.host(path)))
        except OSError:
            return None

    def which_all(self, name):
        """[(node path, host path)] of every NAME on PATH, each file once (links resolved)."""
        found, seen = [], set()
        for directory in self.path_dirs:
            candidate = os.path.join(directory, name)
            if not self.is_executable(candidate):
                continue
            host = self.host(candidate)
            if host not in seen:
                seen.add(host)
                found.append((candidate, host))
        return found

    def show(self, path):
        return path if self.root == "/" else f"{path} (in {self.root})"


# --- inputs and shared facts ----------------------------------------------------------------------

class Options:
    def __init__(self, root="/", containerd_config="/etc/containerd/config.toml", spec_dirs=None,
                 runtimeclasses=(), containerd_binary=None, settings=None, shim_as_default=False,
                 path_dirs=None):
        from ..config import Config

        self.root = root
        self.containerd_config = containerd_config
        self.settings = settings or Config()
        self.spec_dirs = tuple(spec_dirs) if spec_dirs else tuple(self.settings.spec_dirs)
        self.runtimeclasses = tuple(runtimeclasses)
        self.containerd_binary = containerd_binary
        self.shim_as_default = shim_as_default
        self.path_dirs = path_dirs


class Context:
    """The node and what earlier checks learnt about it (so later checks do not re-report)."""

    def __init__(self, options):
        self.options = options
        self.node = Node(options.root, options.path_dirs)
        self.failed = set()          # ids of checks that failed
        self.missing_devices = set()  # device nodes the kernel check found missing
        self.library_versions = {}   # soname -> {version}
        self.kernel_version = None   # from /proc/driver/nvidia/version
        self.specs = []              # loaded cdi.spec.Spec objects
        self._containerd = False

    @property
    def driver_version(self):
        """The user-space driver's version (what a spec generated now would name), else the
        kernel module's."""
        versions = self.library_versions.get("libcuda.so.1") or self.library_versions.get("libnvidia-ml.so.1")
        if versions and len(versions) == 1:
            return next(iter(versions))
        return self.kernel_version

    @property
    def containerd(self):
        if self._containerd is False:
            self._containerd = ContainerdView.load(self)
        return self._containerd


# --- kernel ---------------------------------------------------------------------------------------

def check_kernel_module(ctx):
    text = ctx.node.read_text("/proc/modules")
    if text is None:
        return Check("kernel", "module", FAIL, "/proc/modules cannot be read",
                     "run doctor on the node itself (or give --root a tree with proc/modules)")
    modules = {line.split()[0] for line in text.splitlines() if line.split()}
    if "nvidia" not in modules:
        return Check("kernel", "module", FAIL, "nvidia is not in /proc/modules: the kernel driver is not loaded",
                     "load it: `modprobe nvidia` (see `dmesg | grep -i nvrm` if that fails; after a kernel "
                     "upgrade, rebuild it: `dkms autoinstall`)")
    extra = sorted(m for m in modules if m.startswith("nvidia_"))
    return _ok("kernel", "module", "nvidia loaded" + (f" (with {', '.join(extra)})" if extra else ""))


def _device_problem(node, path, major):
    info = node.stat(path)
    if info is None:
        return "missing"
    if not stat.S_ISCHR(info.st_mode):
        return "not a character device"
    if major is not None and os.major(info.st_rdev) != major:
        return f"major {os.major(info.st_rdev)}, not {major}"
    return None


def check_kernel_devices(ctx):
    node = ctx.node
    names = node.listdir("/dev") or []
    gpus = sorted((n for n in names if re.fullmatch(r"nvidia\d+", n)), key=lambda n: int(n[6:]))
    problems, seen = [], []
    for path, major in [("/dev/nvidiactl", NVIDIA_MAJOR)] + [(f"/dev/{g}", NVIDIA_MAJOR) for g in gpus] \
            + [("/dev/nvidia-uvm", None)]:
        problem = _device_problem(node, path, major)
        if problem:
            problems.append(f"{path} {problem}")
            if problem == "missing":
                ctx.missing_devices.add(path)
        else:
            seen.append(path)
    if not gpus:
        problems.append("no /dev/nvidia[0-9]* node")
        ctx.missing_devices.add("/dev/nvidia0")
    if problems:
        return Check("kernel", "devices", FAIL, "; ".join(problems),
                     "create the nodes: `nvidia-modprobe -c 0 -u` (or `nvidia-smi` once as root); a node whose "
                     f"major is not {NVIDIA_MAJOR} was not made by the NVIDIA driver: remove it and recreate it")
    return _ok("kernel", "devices", ", ".join(seen))


# --- user space -----------------------------------------------------------------------------------

def _version_of(name):
    match = _SO_VERSION.search(name)
    return match.group(1) if match else None


def check_libraries(ctx):
    from ..linker.ldcache import LdcacheError, read_root_cache

    node = ctx.node
    try:
        cache = read_root_cache(node.root)
    except (LdcacheError, OSError) as err:
        return Check("userspace", "libraries", FAIL, f"cannot read /etc/ld.so.cache: {err}",
                     "run `ldconfig` (as root) to rebuild it")
    missing, seen = [], []
    for soname in DRIVER_LIBRARIES:
        paths = [e.path for e in cache.entries if e.soname == soname]
        if not paths:
            missing.append(soname)
            continue
        versions = set()
        for path in paths:
            if not node.exists(path):
                missing.append(f"{soname} ({path} in the cache does not exist)")
                continue
            version = _version_of(os.path.basename(node.host(path)))
            if version:
                versions.add(version)
        ctx.library_versions[soname] = versions
        seen.append(f"{soname} -> {paths[0]}" + (f" ({', '.join(sorted(versions))})" if versions else ""))
    if missing:
        return Check("userspace", "libraries", FAIL, f"not in /etc/ld.so.cache: {', '.join(missing)}",
                     "install the driver's user-space libraries (e.g. the libcuda1/libnvidia-ml1 or "
                     "nvidia-driver packages of the driver's version); if they are installed in a directory "
                     "ldconfig does not scan, add it to /etc/ld.so.conf.d/ and run `ldconfig`")
    return _ok("userspace", "libraries", "; ".join(seen))


def check_versions(ctx):
    text = ctx.node.read_text("/proc/driver/nvidia/version")
    if text is not None:
        match = _MODULE_VERSION.search(text)
        ctx.kernel_version = match.group(1) if match else None
    sources = {}
    for soname in DRIVER_LIBRARIES:
        for version in ctx.library_versions.get(soname, ()):
            sources.setdefault(version, []).append(soname)
    if ctx.kernel_version:
        sources.setdefault(ctx.kernel_version, []).append("/proc/driver/nvidia/version")
    saw = "; ".join(f"{v}: {', '.join(names)}" for v, names in sorted(sources.items()))
    if len(sources) > 1:
        return Check("userspace", "versions", FAIL, f"driver versions disagree: {saw}",
                     "install the user-space libraries of the loaded module's version (or reboot after a driver "
                     "upgrade so the new module loads); then `cdi-shim cdi generate`")
    if text is None:
        return Check("userspace", "versions", WARN,
                     f"/proc/driver/nvidia/version is missing (module not loaded?); libraries: {saw or 'none'}",
                     "load the module: `modprobe nvidia`")
    if not ctx.kernel_version:
        return Check("userspace", "versions", WARN, "cannot read a version in /proc/driver/nvidia/version", "")
    return _ok("userspace", "versions", f"{ctx.kernel_version} everywhere ({saw})")


def check_nvidia_smi(ctx):
    found = ctx.node.which_all("nvidia-smi")
    if not found:
        return Check("userspace", "nvidia-smi", FAIL,
                     f"nvidia-smi is not on PATH ({':'.join(ctx.node.path_dirs)})",
                     "install the driver's utilities (nvidia-smi, e.g. the nvidia-smi or nvidia-utils package); "
                     "`cdi-shim cdi generate` mounts it into containers")
    return _ok("userspace", "nvidia-smi", found[0][0])


# --- CDI ------------------------------------------------------------------------------------------

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
            data = node.read_bytes(path, MAX_SPEC_BYTES + 1)
            if data is None:
                results.append((priority, path, f"{path}: cannot be read (missing link target, or not a file)"))
                continue
            if len(data) > MAX_SPEC_BYTES:
                results.append((priority, path, f"{path}: larger than {MAX_SPEC_BYTES} bytes, refused"))
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
    blocks = [spec.edits] + [(d.get("containerEdits") or {}) for d in spec.devices.values()]
    nodes, sources, versions = [], [], set()
    for edits in blocks:
        for dev in edits.get("deviceNodes") or ():
            path = dev.get("hostPath") or dev.get("path")
            if path and path not in nodes:
                nodes.append(path)
        for mount in edits.get("mounts") or ():
            source = mount.get("hostPath") or ""
            kind = mount.get("type") or ""
            if source.startswith("/") and kind in ("", "bind", "rbind", "none"):
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
        return Check("cdi", "paths", FAIL, "stale spec: " + "; ".join(stale)
                     + (f"; missing: {', '.join(missing)}" if missing else ""),
                     "regenerate it for the installed driver: `cdi-shim cdi generate` (after every driver upgrade)")
    if missing:
        return Check("cdi", "paths", FAIL, "spec names files that do not exist: " + ", ".join(missing),
                     "regenerate the spec for this node: `cdi-shim cdi generate`")
    if kernel_side:
        return Check("cdi", "paths", WARN, "device nodes missing (see kernel.devices): " + ", ".join(kernel_side),
                     "fix kernel.devices first")
    return _ok("cdi", "paths", f"all {counted} device nodes and mount sources exist"
               + (f"; driver {driver}" if driver else ""))


# --- containerd -------------------------------------------------------------------------------------

def _toml(text):
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomlkit

        return tomlkit.parse(text).unwrap()
    return tomllib.loads(text)


def _get(table, *keys):
    for key in keys:
        if not isinstance(table, dict):
            return None
        table = table.get(key)
    return table


def _merge(base, extra):
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def parse_containerd_version(text):
    """(major, minor) from `containerd --version` output."""
    words = text.split()
    for word in words[2:3] + words:
        match = re.match(r"^v?(\d+)\.(\d+)", word)
        if match:
            return int(match.group(1)), int(match.group(2))
    return None


class ContainerdView:
    """containerd's config on the node (with its imports) and the installed containerd."""

    def __init__(self):
        self.path = self.error = self.version = None
        self.files = []          # [(node path, parsed dict)]
        self.doc = {}            # the merged view
        self.installed = None    # (major, minor) or None
        self.installed_text = ""
        self.binary = None       # host path of the containerd asked
        self.binaries = []       # [(node path, host path)] on PATH

    @classmethod
    def load(cls, ctx):
        view, node, options = cls(), ctx.node, ctx.options
        view.path = options.containerd_config
        view.binaries = node.which_all("containerd")
        if options.containerd_binary:
            view.binary = options.containerd_binary
        elif view.binaries:
            view.binary = view.binaries[0][1]
        if view.binary:
            try:
                out = subprocess.run([view.binary, "--version"], capture_output=True, text=True, timeout=30)
                view.installed_text = out.stdout.strip()
                view.installed = parse_containerd_version(view.installed_text)
            except (OSError, subprocess.TimeoutExpired) as err:
                view.installed_text = str(err)
        text = node.read_text(view.path)
        if text is None:
            view.error = "missing" if not node.exists(view.path) else "not readable here (run doctor as root)"
            return view
        try:
            doc = _toml(text)
        except Exception as err:  # noqa: BLE001 - tomllib's and tomlkit's errors
            view.error = f"not valid TOML: {err}"
            return view
        version = doc.get("version", 1)
        view.version = version if isinstance(version, int) and not isinstance(version, bool) else None
        view.files.append((view.path, doc))
        merged = doc
        for pattern in doc.get("imports") or ():
            if not isinstance(pattern, str):
                continue
            full = pattern if pattern.startswith("/") else os.path.join(os.path.dirname(view.path), pattern)
            directory, name = os.path.split(full)
            names = [n for n in node.listdir(directory) or [] if fnmatch.fnmatchcase(n, name)]
            for one in names:
                one_path = os.path.join(directory, one)
                one_text = node.read_text(one_path)
                if one_text is None:
                    continue
                try:
                    one_doc = _toml(one_text)
                except Exception:  # noqa: BLE001
                    continue
                view.files.append((one_path, one_doc))
                if view.major == 1:  # containerd 1.x: an imported plugin section replaces the earlier one
                    merged = dict(merged)
                    plugins = dict(merged.get("plugins") or {})
                    plugins.update(one_doc.get("plugins") or {})
                    merged["plugins"] = plugins
                    merged.update({k: v for k, v in one_doc.items() if k != "plugins"})
                else:
                    merged = _merge(merged, one_doc)
        view.doc = merged
        return view

    @property
    def major(self):
        """containerd's major version: the installed one, else what the file's version implies."""
        if self.installed:
            return self.installed[0]
        return {2: 1, 3: 2}.get(self.version)

    @property
    def read_as(self):
        """The config version containerd reads the file as: containerd 1.x reads any version above
        2 as 2 (measured: 1.6's `config dump` of a version-3 file says version = 2)."""
        if self.major == 1 and self.version and self.version > 2:
            return 2
        return self.version

    @property
    def cri(self):
        return _get(self.doc, "plugins", CRI_RUNTIME.get(self.read_as, OLD_CRI)) or {}

    @property
    def runtimes(self):
        return _get(self.cri, "containerd", "runtimes") or {}

    @property
    def default_runtime(self):
        return _get(self.cri, "containerd", "default_runtime_name") or "runc"

    @property
    def cdi_spec_dirs(self):
        dirs = self.cri.get("cdi_spec_dirs") if self.version else None
        return dirs if isinstance(dirs, list) else None

    def shim_runtimes(self, names=()):
        """{name: entry} of the runtimes that run cdi-shim-runtime (and NAMES)."""
        found = {}
        for name, entry in self.runtimes.items():
            binary = _get(entry, "options", "BinaryName")
            if name in names or (isinstance(binary, str) and os.path.basename(binary) == RUNTIME_EXECUTABLE):
                found[name] = entry if isinstance(entry, dict) else {}
        return found

    def where(self):
        version = self.read_as
        return f"[plugins.{_quote(version)}{CRI_RUNTIME.get(version, OLD_CRI)}{_quote(version)}]"


def _quote(version):
    return '"' if version == 2 else "'"


CONFIGURE = "`cdi-shim runtime configure --runtime=containerd`"
CONFIGURE_AS = "`cdi-shim runtime configure --runtime=containerd --runtime-name HANDLER`"


def check_containerd_binaries(ctx):
    view = ctx.containerd
    found = view.binaries
    answer = view.installed_text.splitlines()[0] if view.installed_text else "no version"
    if len(found) > 1:
        return Check("containerd", "binaries", WARN,
                     "several containerd executables on PATH: " + ", ".join(p for p, _ in found)
                     + f"; {view.binary} answers {answer}",
                     "remove the ones the service does not run (`systemctl cat containerd` shows ExecStart), so "
                     "version checks and `ctr` talk about the same containerd")
    if not found and not ctx.options.containerd_binary:
        return Check("containerd", "binaries", WARN, "no containerd on PATH; the version rules below use the config "
                     "file's version", "install containerd, or name it with --containerd-binary")
    return _ok("containerd", "binaries", f"{view.binary}: {answer}")


def check_containerd_version(ctx):
    view = ctx.containerd
    if view.error == "missing":
        return Check("containerd", "config", FAIL, f"{view.path} does not exist: containerd runs with built-in "
                     "defaults, which know no cdi-shim runtime", f"create it: {CONFIGURE}")
    if view.error:
        return Check("containerd", "config", FAIL, f"{view.path} is {view.error}; containerd will not start",
                     "fix the file (`containerd config default` shows a valid one)")
    version, installed = view.version, view.installed
    who = f"containerd {installed[0]}.{installed[1]}" if installed else "containerd (not found; assumed from the file)"
    saw = f"{view.path}: version = {version}; {who}"
    if version is None:
        return Check("containerd", "config", FAIL, f'{view.path}: "version" is not an integer',
                     "set version = 2 (containerd 1.x) or 3 (containerd 2.x)")
    if installed is None:
        return _ok("containerd", "config", saw)
    major, minor = installed
    migrate = "`containerd config migrate > NEW` and install NEW as the config"
    if major < 2:
        if version >= 3:
            return Check("containerd", "config", FAIL, f"{saw}: containerd 1.x knows versions 1 and 2 only and "
                         "reads this file as version 2, ignoring every section of the version-3 plugins",
                         "write a version 2 config (`containerd config default`), then " + CONFIGURE)
        if version == 1:
            return Check("containerd", "config", WARN, f"{saw}: version 1 is deprecated", migrate)
        return _ok("containerd", "config", saw)
    newest = 4 if (major, minor) >= (2, 3) else 3
    if version == 1:
        return Check("containerd", "config", FAIL, f"{saw}: containerd 2.x no longer reads version 1", migrate)
    if version > newest:
        return Check("containerd", "config", FAIL, f"{saw}: containerd {major}.{minor} reads at most version "
                     f"{newest}", f"write a version {newest} config, or upgrade containerd")
    if version < newest:
        return Check("containerd", "config", WARN, f"{saw}: migrated to version {newest} in memory at every start",
                     migrate)
    return _ok("containerd", "config", saw)


def check_ignored_sections(ctx):
    """Sections containerd will not read: old CRI headers in a version-3 file (containerd 2.x
    ignores them silently: measured), the cri.v1 plugins' sections under containerd 1.x (it knows
    no such plugins; measured: 1.6's `config dump` drops them without a word)."""
    view = ctx.containerd
    if view.error or view.version is None:
        return None
    ignored, old_reader = [], view.major == 1
    for path, doc in view.files:
        version = doc.get("version", view.version)
        plugins = doc.get("plugins") if isinstance(doc.get("plugins"), dict) else {}
        if not old_reader and isinstance(version, int) and version >= 3 and isinstance(plugins.get(OLD_CRI), dict):
            keys = sorted(k for k in plugins[OLD_CRI] if k not in V3_OLD_CRI_KEYS)
            if keys:
                ignored.append(f'{path}: [plugins."{OLD_CRI}"] {", ".join(keys)} (a version {version} file: '
                               f"containerd 2.x reads these under 'io.containerd.cri.v1.runtime' / "
                               f"'io.containerd.cri.v1.images')")
        if old_reader:
            for name in NEW_CRI_PLUGINS:
                if name in plugins:
                    ignored.append(f"{path}: [plugins.'{name}'] (containerd 1.x has no such plugin)")
    if ignored:
        return Check("containerd", "ignored-sections", FAIL, "containerd ignores, silently: " + "; ".join(ignored),
                     "move the settings under the headers of the file's version (version 3: "
                     "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.NAME], version 2: "
                     f'[plugins."{OLD_CRI}".containerd.runtimes.NAME]), or rewrite the entry with {CONFIGURE}')
    return _ok("containerd", "ignored-sections", "every CRI section is one containerd reads")


def check_containerd_loads(ctx):
    """The installed containerd loads the file (`containerd --config F config dump`)."""
    view, node = ctx.containerd, ctx.node
    if view.error or not view.binary or not view.installed:
        return None
    if node.root != "/" and view.doc.get("imports"):
        return None  # its imports name the host's files, not ROOT's
    try:
        out = subprocess.run([view.binary, "--config", node.host(view.path), "config", "dump"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        return Check("containerd", "loads", WARN, f"cannot run {view.binary}: {err}", "")
    if out.returncode != 0:
        lines = [line for line in (out.stderr or out.stdout).splitlines() if line.strip()]
        return Check("containerd", "loads", FAIL, f"{view.binary} refuses {view.path}: "
                     f"{lines[-1] if lines else out.returncode}", "fix the file; `containerd config dump` "
                     "shows the error")
    return _ok("containerd", "loads", f"`containerd --config {view.path} config dump` succeeds")


def _annotation_patterns(ctx):
    return [p + "*" for p in ctx.options.settings.annotation_prefixes]


def check_runtime_entry(ctx):
    view, node = ctx.containerd, ctx.node
    if view.error or view.version is None:
        return None
    entries = view.shim_runtimes()
    if not entries:
        names = ", ".join(sorted(view.runtimes)) or "none"
        return Check("containerd", "runtime", FAIL, f"no runtime in {view.where()} runs {RUNTIME_EXECUTABLE} "
                     f"(runtimes: {names})", f"register it: {CONFIGURE}")
    problems, seen = [], []
    for name, entry in sorted(entries.items()):
        kind = entry.get("runtime_type")
        binary = _get(entry, "options", "BinaryName")
        if kind != RUNC_V2:
            problems.append(f'"{name}": runtime_type is {kind!r}, not "{RUNC_V2}"')
        if not isinstance(binary, str) or not binary.startswith("/"):
            problems.append(f'"{name}": BinaryName {binary!r} is not an absolute path (containerd-shim-runc-v2 '
                            "looks it up on its own PATH, which need not hold it)")
        elif not node.is_executable(binary):
            problems.append(f'"{name}": BinaryName {binary} is not an executable file')
        allowed = entry.get("container_annotations") or []
        missing = [p for p in _annotation_patterns(ctx) if p not in allowed]
        if missing:
            problems.append(f'"{name}": container_annotations lacks {", ".join(missing)} (containerd drops the '
                            "device plugin's CDI annotations before the runtime sees them)")
        if entry.get("pod_annotations"):
            problems.append(f'"{name}": pod_annotations {entry["pod_annotations"]} lets any pod request any '
                            "device past the device plugin")
        seen.append(f'"{name}" -> {binary}')
    if problems:
        return Check("containerd", "runtime", FAIL, "; ".join(problems),
                     f"rewrite the entry: {CONFIGURE_AS.replace('HANDLER', 'NAME')} (it sets runtime_type, the "
                     "absolute "
                     "BinaryName and the annotation allow-list)")
    return _ok("containerd", "runtime", ", ".join(seen))


def check_cri_cdi(ctx):
    view = ctx.containerd
    if view.error or view.version is None:
        return None
    major = view.major
    minor = view.installed[1] if view.installed else None
    enabled = view.cri.get("enable_cdi")
    dirs = view.cdi_spec_dirs
    ours = list(ctx.options.spec_dirs)
    where = view.where()
    if major == 1 and minor is not None and minor < 7:
        return _ok("containerd", "cdi", f"containerd 1.{minor} has no CDI support of its own; CDI annotations "
                   f"reach {RUNTIME_EXECUTABLE} through container_annotations")
    default = major is not None and major >= 2
    effective = default if enabled is None else bool(enabled)
    if not effective:
        if major is not None and major >= 2:
            return Check("containerd", "cdi", FAIL, f"enable_cdi = false in {where}: containerd 2.x then drops the "
                         "CDI devices the device plugin asks for (the CRI CDIDevices field), silently",
                         f"set enable_cdi = true in {where} (the default in 2.x) and restart containerd")
        return Check("containerd", "cdi", WARN, f"enable_cdi is off in {where}: CDI devices in the CRI CDIDevices "
                     f"field are dropped; only annotations reach {RUNTIME_EXECUTABLE}",
                     f"set enable_cdi = true and cdi_spec_dirs = {ours} in {where}")
    effective_dirs = dirs if dirs is not None else ["/etc/cdi", "/var/run/cdi"]
    if [ctx.node.host(d) for d in effective_dirs] != [ctx.node.host(d) for d in ours]:
        return Check("containerd", "cdi", FAIL, f"containerd resolves CDI devices from {effective_dirs}, "
                     f"cdi-shim from {ours}: the same request gets other edits, or fails in one of them",
                     f"set cdi_spec_dirs = {ours} in {where} (or spec-dirs in /etc/cdi-shim/config.toml)")
    return _ok("containerd", "cdi", f"enable_cdi on, cdi_spec_dirs = {effective_dirs}")


def _init_is_systemd(node):
    """True / False / None (cannot tell) for the node's init."""
    comm = node.read_text("/proc/1/comm")
    if comm is not None:
        return comm.strip() == "systemd", f'PID 1 is "{comm.strip()}"'
    try:
        init = node.host("/sbin/init")
    except OSError:
        return None, "no /proc/1/comm"
    if os.path.exists(init):
        name = os.path.basename(init)
        return name == "systemd", f"/sbin/init is {name}"
    return None, "neither /proc/1/comm nor /sbin/init"


def check_cgroup_driver(ctx):
    import yaml

    view, node = ctx.containerd, ctx.node
    if view.error or view.version is None:
        return None
    entries = view.shim_runtimes()
    if not entries:
        return None
    systemd, init = _init_is_systemd(node)
    wanted = {}
    if systemd is not None:
        wanted["the host's init"] = (systemd, init)
    text = node.read_text(KUBELET_CONFIG)
    if text is not None:
        try:
            kubelet = yaml.safe_load(text) or {}
            driver = kubelet.get("cgroupDriver", "cgroupfs") if isinstance(kubelet, dict) else None
        except yaml.YAMLError:
            driver = None
        if driver in ("systemd", "cgroupfs"):
            wanted["the kubelet"] = (driver == "systemd", f"{KUBELET_CONFIG} cgroupDriver: {driver}")
    runc = view.runtimes.get("runc")
    runc_value = _get(runc, "options", "SystemdCgroup") if isinstance(runc, dict) else None
    problems, seen = [], []
    for name, entry in sorted(entries.items()):
        value = bool(_get(entry, "options", "SystemdCgroup"))
        seen.append(f'"{name}" SystemdCgroup = {str(value).lower()}')
        for who, (expected, why) in wanted.items():
            if value != expected:
                problems.append(f'"{name}" has SystemdCgroup = {str(value).lower()} but {why}')
        if isinstance(runc_value, bool) and runc_value != value:
            problems.append(f'"{name}" has SystemdCgroup = {str(value).lower()}, the "runc" runtime '
                            f"{str(runc_value).lower()}")
    host, kubelet = wanted.get("the host's init"), wanted.get("the kubelet")
    if host and kubelet and host[0] != kubelet[0]:
        problems.append(f"{host[1]} but {kubelet[1]}")
    if problems:
        target = next(iter(wanted.values()))[0] if wanted else True
        return Check("containerd", "cgroup", FAIL, "; ".join(problems),
                     f"set SystemdCgroup = {str(target).lower()} in every runtime's options (and cgroupDriver: "
                     f"{'systemd' if target else 'cgroupfs'} in the kubelet config), then restart containerd and the "
                     "kubelet")
    return _ok("containerd", "cgroup", "; ".join(seen + [why for _, why in wanted.values()]))


def check_default_runtime(ctx):
    view = ctx.containerd
    if view.error or view.version is None:
        return None
    default = view.default_runtime
    if default not in view.runtimes and view.runtimes:
        return Check("containerd", "default-runtime", FAIL, f'default_runtime_name = "{default}" names no '
                     f"configured runtime ({', '.join(sorted(view.runtimes))}): the CRI plugin will not start",
                     'set default_runtime_name = "runc"')
    if default in view.shim_runtimes():
        if ctx.options.shim_as_default:
            return _ok("containerd", "default-runtime", f'default_runtime_name = "{default}" (intended: '
                       "--shim-as-default)")
        return Check("containerd", "default-runtime", FAIL, f'default_runtime_name = "{default}": every pod '
                     f"without a RuntimeClass goes through {RUNTIME_EXECUTABLE}",
                     f'set default_runtime_name = "runc" in {view.where()} and select the shim with a RuntimeClass '
                     "(or pass --shim-as-default if this is intended)")
    return _ok("containerd", "default-runtime", f'default_runtime_name = "{default}"')


# --- RuntimeClass -------------------------------------------------------------------------------

def check_runtimeclasses(ctx):
    import yaml

    from .runtimeclass import no_runtime_error

    files = ctx.options.runtimeclasses
    if not files:
        return None
    view = ctx.containerd
    if view.error or view.version is None:
        return Check("runtimeclass", "handler", WARN, f"not checked: {view.path} cannot be read (see "
                     "containerd.config)", "")
    # containerd 1.x: a file's runtimes replace the built-in "runc"; 2.x merges them with it
    names = set(view.runtimes) if view.read_as == 2 and view.runtimes else set(view.runtimes) | {"runc"}
    shim = set(view.shim_runtimes())
    problems, warnings, seen = [], [], []
    for path in files:
        try:
            with open(path, encoding="utf-8") as stream:
                docs = [d for d in yaml.safe_load_all(stream) if isinstance(d, dict)]
        except (OSError, yaml.YAMLError) as err:
            problems.append(f"{path}: {err}")
            continue
        classes = [d for d in docs if d.get("kind") == "RuntimeClass"]
        if not classes:
            problems.append(f"{path}: no RuntimeClass in it")
        for doc in classes:
            handler = doc.get("handler")
            name = _get(doc, "metadata", "name")
            if handler not in names:
                problems.append(f'RuntimeClass "{name}" ({path}): {no_runtime_error(handler)} (containerd has '
                                f"{', '.join(sorted(names))})")
            elif handler not in shim:
                warnings.append(f'RuntimeClass "{name}": handler "{handler}" does not run {RUNTIME_EXECUTABLE}')
            else:
                seen.append(f'RuntimeClass "{name}" -> "{handler}"')
    if problems:
        return Check("runtimeclass", "handler", FAIL, "; ".join(problems),
                     "set handler to the containerd runtime name of cdi-shim (`cdi-shim runtimeclass --config "
                     f"{view.path}` checks it), or register that name: {CONFIGURE_AS}")
    if warnings:
        return Check("runtimeclass", "handler", WARN, "; ".join(warnings), "")
    return _ok("runtimeclass", "handler", ", ".join(seen))


# --- the runtime itself -------------------------------------------------------------------------

def probe_resident(path, timeout=2.0):
    """Ask the resident process at PATH: a request of an unknown version, which it declines with
    b"F" before touching anything. Returns (answered, text)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.settimeout(timeout)
    devnull = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        sock.connect(path)
        body = b"\0".join([b"doctor-probe", b"/", b"022", b"0"]) + b"\0"
        message = b"CDSHIM1\0" + struct.pack("<I", len(body)) + body
        sock.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", devnull))])
        reply = sock.recv(16)
    except OSError as err:
        return False, err.strerror or str(err)
    finally:
        os.close(devnull)
        sock.close()
    if reply == b"F":
        return True, "answers"
    return False, f"answered {reply!r}"


def check_resident(ctx):
    node, path = ctx.node, ctx.options.settings.resident_socket
    if not path:
        return _ok("runtime", "resident", 'resident-socket = "": the interpreter starts for every GPU create')
    info = node.stat(path)
    if info is None:
        return Check("runtime", "resident", WARN, f"{path} does not exist: the resident process is not running, "
                     "each GPU container create starts an interpreter (~15-20 ms slower)",
                     "systemctl enable --now cdi-shim-resident (contrib/cdi-shim-resident.service)")
    if not stat.S_ISSOCK(info.st_mode):
        return Check("runtime", "resident", FAIL, f"{path} is not a socket", f"remove it and restart the resident "
                     "process: systemctl restart cdi-shim-resident")
    answered, text = probe_resident(node.host(path))
    if not answered:
        return Check("runtime", "resident", WARN, f"{path}: {text}: the resident process is not answering "
                     "(creates fall back to the interpreter)", "systemctl restart cdi-shim-resident")
    return _ok("runtime", "resident", f"{path} {text}")


def check_runtime_log(ctx):
    from ..runtime.runlog import MAX_LOG_BYTES

    node, path = ctx.node, ctx.options.settings.log_file
    if not path:
        return _ok("runtime", "log", 'log-file = "": messages go to runc\'s --log file (containerd removes it '
                   "with the container) and stderr")
    directory = os.path.dirname(path)
    if not node.exists(directory):
        return Check("runtime", "log", FAIL, f"log-file {path}: {directory} does not exist, so nothing is logged",
                     f"create {directory}, or set log-file to \"\"")
    info = node.stat(path)
    size = info.st_size if info is not None else 0
    if info is not None and not stat.S_ISREG(info.st_mode):
        return Check("runtime", "log", FAIL, f"log-file {path} is not a regular file", "remove it")
    if size > 2 * MAX_LOG_BYTES:
        return Check("runtime", "log", FAIL, f"log-file {path} is {size} bytes: it is not being rotated (past "
                     f"{MAX_LOG_BYTES} bytes the runtime renames it to {path}.1)",
                     f"check that the runtime may rename files in {directory}; truncate it")
    return _ok("runtime", "log", f"log-file {path} ({size} bytes): the runtime rotates it past {MAX_LOG_BYTES} "
               "bytes, one old copy kept")


# --- running them ---------------------------------------------------------------------------------

CHECKS = (
    check_kernel_module, check_kernel_devices,
    check_libraries, check_versions, check_nvidia_smi,
    check_specs, check_spec_conflicts, check_spec_paths,
    check_containerd_binaries, check_containerd_version, check_ignored_sections, check_containerd_loads,
    check_runtime_entry, check_cri_cdi, check_cgroup_driver, check_default_runtime,
    check_runtimeclasses,
    check_resident, check_runtime_log,
)


def run_checks(options, checks=CHECKS):
    """Every check's result, in order (checks whose input is missing are left out)."""
    ctx = Context(options)
    results = []
    for check in checks:
        try:
            result = check(ctx)
        except Exception as err:  # noqa: BLE001 - one broken check must not hide the others
            name = check.__name__.replace("check_", "")
            result = Check("doctor", name, FAIL, f"the check itself failed: {type(err).__name__}: {err}",
                           "report this as a cdi-shim bug")
        if result is None:
            continue
        if result.status == FAIL:
            ctx.failed.add(result.id)
        results.append(result)
    return results
