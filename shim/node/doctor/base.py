"""What every check of the doctor shares: the report line (Check), the node under ROOT
(Node: paths resolved inside it), the options and the facts the checks compute once (Context)."""
import errno
import os
import re
import stat

from cdi.safeio import UnsafeFile, open_problem, read_config_file

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
from ..kubernetes import KUBELET_CONFIG  # noqa: E402,F401  (one definition, shared with install)
DRIVER_LIBRARIES = ("libcuda.so.1", "libnvidia-ml.so.1")
_SO_VERSION = re.compile(r"\.so\.(\d+\.\d+(?:\.\d+)?)$")
_DIR_VERSION = re.compile(r"/(\d{3,}\.\d+(?:\.\d+)?)(?:/|$)")  # /lib/firmware/nvidia/570.86.10/gsp.bin
_MODULE_VERSION = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)")
MAX_READ = 4 << 20



class Check:
    """One line of the report."""

    __slots__ = ("layer", "name", "status", "saw", "fix", "brief")

    def __init__(self, layer, name, status, saw, fix="", brief=None):
        assert status in STATUSES, status
        self.layer, self.name, self.status, self.saw, self.fix = layer, name, status, saw, fix
        self.brief = brief or saw   # the report's line: long lists capped (SAW, in --json, keeps them all)

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


SHOWN = 3   # paths a report line names before "and N more", as `cdi validate` names missing files


def listed(items, shown=SHOWN):
    """ITEMS joined by ", "; with SHOWN, the first SHOWN and "and N more" (cdi.host_files's way)."""
    items = list(items)
    if shown is None or len(items) <= shown:
        return ", ".join(items)
    return ", ".join(items[:shown]) + f" and {len(items) - shown} more"


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
        """The bytes of a regular file of at most LIMIT bytes; None when it is missing or cannot
        be read (read_checked says why)."""
        try:
            return self.read_checked(path, limit)
        except UnsafeFile:
            return None

    def read_checked(self, path, limit=MAX_READ):
        """The bytes of the node's PATH, None when it does not exist; UnsafeFile with the reason
        (a FIFO or device, a link loop, too large, permission denied) when it cannot be read.
        cdi.safeio's rule: opened without blocking, only a regular file is read."""
        try:
            host = self.host(path)
        except OSError as err:
            raise UnsafeFile(open_problem(err)) from None
        # host() resolved every link inside ROOT: one appearing since is not followed out of it
        return read_config_file(host, limit, follow_links=False)

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
                 path_dirs=None, docker_config="/etc/docker/daemon.json",
                 podman_config="/etc/containers/containers.conf"):
        from ...config import Config

        self.root = root
        self.containerd_config = containerd_config
        self.settings = settings or Config()
        self.spec_dirs = tuple(spec_dirs) if spec_dirs else tuple(self.settings.spec_dirs)
        self.runtimeclasses = tuple(runtimeclasses)
        self.containerd_binary = containerd_binary
        self.shim_as_default = shim_as_default
        self.path_dirs = path_dirs
        self.docker_config = docker_config
        self.podman_config = podman_config


class Context:
    """The node and what earlier checks learnt about it (so later checks do not re-report)."""

    def __init__(self, options, load_containerd):
        self.options = options
        self.node = Node(options.root, options.path_dirs)
        self.failed = set()          # ids of checks that failed
        self.missing_devices = set()  # device nodes the kernel check found missing
        self.library_versions = {}   # soname -> {version}
        self.kernel_version = None   # from /proc/driver/nvidia/version
        self.specs = []              # loaded cdi.spec.Spec objects
        self._containerd = False
        self.dangling_release = None  # (link, its target) of a release link leading nowhere (runtime.release)
        self._load_containerd = load_containerd   # containerd.ContainerdView.load, passed in (no import circle)

    @property
    def driver_version(self):
        """The user-space driver's version (what a spec generated now would name), else the
        kernel module's."""
        versions = self.library_versions.get("libcuda.so.1") or self.library_versions.get("libnvidia-ml.so.1")
        if versions and len(versions) == 1:
            return next(iter(versions))
        return self.kernel_version

    def deferred(self, path):
        """Whether PATH, a runtime an engine names, lies under the release link runtime.release
        found dangling: that check names the one fix; the engine checks defer to it."""
        link = self.dangling_release[0] if self.dangling_release else None
        return bool(link) and isinstance(path, str) and path.startswith(link + "/")

    @property
    def containerd(self):
        if self._containerd is False:
            self._containerd = self._load_containerd(self)
        return self._containerd
