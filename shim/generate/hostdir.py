"""The one-mount layout's host directory: the driver's user-space libraries and tools in one
folder on the host, bound whole at /usr/local/nvidia/lib64 and /usr/local/nvidia/bin (the GKE
and CUDA-image convention) instead of one bind a file.

    BASE/<driver version>-<digest>/lib64   the driver's lib*.so.<version>, the EGL platform
                                           libraries, their SONAME links and the links
                                           applications dlopen (libcuda.so,
                                           libGLX_indirect.so.0, ...); in subfolders (not
                                           scanned by ldconfig) the files other loaders find
                                           through a variable the spec sets (SEARCH): the
                                           VDPAU driver, the GBM backend link, the Vulkan ICD
                                           and layer files, the EGL vendor and platform files
    BASE/<driver version>-<digest>/bin     the driver's tools (nvidia-smi, ...)

The digest covers every entry: its name and, for a file, the source's device, inode, size,
mtime and mode; for a link, its target. A driver upgrade (or a reinstall that changes a file)
gives another name, so a directory is never changed once made: it is built under
BASE/.new-<name>-<pid> and renamed into place, and the spec names the versioned directory
itself (no "current" link: a running container's bind keeps the directory it was given, and
a new container gets the one its spec names).

Files are hard links to the driver's own when the driver root is on BASE's filesystem and
the file is root's and writable by no one else (a link shares the inode: we take only what no
one but root can change); otherwise copies (root's, 0644 or 0755). A hard link costs no space
and keeps the old inode alive when a package manager replaces the driver's files (it unlinks
and renames), so running containers keep reading the libraries they started with. Read-only
binds made once a boot would also share the files but need a boot-time unit and die with the
mount namespace of whoever made them; we do not use them.

A directory no spec names and no mount namespace uses is removed by collect(), which `cdi
generate` (after writing a spec of this layout), `generate --watch` (after every attempt)
and `install --node` run. "Uses" is read from every process's /proc/PID/mountinfo: a bind
of the directory (or of its lib64 or bin) on BASE's device.
"""
import errno
import hashlib
import os
import posixpath
import re
import shutil
import stat

from . import GenerateError
from ..driver_version import ONE_MOUNT_LIB as LIB_DIR   # (one definition: the create path reads it too)

BASE = "/var/lib/cdi-shim/driver"
BIN_DIR = "/usr/local/nvidia/bin"
LAYOUTS = ("files", "one-mount")    # (the first the default; the CLI's --layout choices)
_FORMAT = "cdi-shim one-mount 2"      # in the digest: a change of this module's layout renames

# The subfolders of lib64 whose loader reads a search path from the environment: (subfolder,
# variable, what follows ours in it). Ours comes first, then the loader's own default, so the
# image's files are still found (the variable replaces the default list; docs/one-mount.md).
# The Vulkan loader reads $XDG_CONFIG_DIRS/vulkan/{icd.d,implicit_layer.d} in every version
# (VK_ADD_DRIVER_FILES needs 1.3.207, and implicit layers have no adding variable before
# 1.3.2xx); glvnd, NVIDIA's EGL and libvdpau read theirs only when not set-id, as Mesa's GBM.
SEARCH = (
    ("xdg", "XDG_CONFIG_DIRS", ("/etc/xdg",)),
    ("glvnd/egl_vendor.d", "__EGL_VENDOR_LIBRARY_DIRS", ("/etc/glvnd/egl_vendor.d", "/usr/share/glvnd/egl_vendor.d")),
    ("egl/egl_external_platform.d", "__EGL_EXTERNAL_PLATFORM_CONFIG_DIRS",
     ("/etc/egl/egl_external_platform.d", "/usr/share/egl/egl_external_platform.d")),
    ("gbm", "GBM_BACKENDS_PATH", ("/usr/lib/{machine}-linux-gnu/gbm", "/usr/lib64/gbm", "/usr/lib/gbm")),
    ("vdpau", "VDPAU_DRIVER_PATH", ()),     # (libvdpau falls back to its own module folder)
)
# Configuration files moved into lib64: (container folder, subfolder). The others (OpenCL's
# vendors, read from one folder only by ocl-icd; nvoptix.bin and the Xorg configuration, read
# at fixed paths) keep their binds.
MOVED_CONFIGS = (
    ("/etc/vulkan/icd.d", "xdg/vulkan/icd.d"),
    ("/etc/vulkan/implicit_layer.d", "xdg/vulkan/implicit_layer.d"),
    ("*/glvnd/egl_vendor.d", "glvnd/egl_vendor.d"),
    ("*/egl/egl_external_platform.d", "egl/egl_external_platform.d"),
)
LIB_SUBFOLDERS = ("vdpau", "gbm")   # a driver library folder's subfolders held in lib64's
_NAME = re.compile(r"^(?P<version>[0-9][0-9A-Za-z.]*)-(?P<digest>[0-9a-f]{12})$")


def version_of(name):
    """The driver version in a host directory's NAME, or None when NAME is not one."""
    match = _NAME.match(name)
    return match.group("version") if match else None


class Entry:
    """One name in the directory (SUB: lib64, bin or a folder under lib64): a file (FD, open in
    the driver root) or a link (TARGET, a name in the same folder, or ../NAME from a subfolder)."""

    __slots__ = ("sub", "name", "fd", "target")

    def __init__(self, sub, name, fd=None, target=None):
        self.sub, self.name, self.fd, self.target = sub, name, fd, target


class Plan:
    """The host directory of one generation: its entries (files opened in the driver root, so
    what is linked or copied is what was looked at), its name, the libraries it does not hold."""

    def __init__(self, base, version, machine="x86_64"):
        self.base = os.path.abspath(base)
        self.version = version
        self.machine = machine
        self.entries = []
        self.left = []          # [discover.Library] that keep their own mount
        self.left_links = []    # create-symlinks links of those
        self.moved = set()      # container paths of graphics and config files in the directory
        self.name = None

    @property
    def path(self):
        return os.path.join(self.base, self.name)

    def lib(self):
        return os.path.join(self.path, "lib64")

    def bin(self):
        return os.path.join(self.path, "bin")

    def has_bin(self):
        return any(e.sub == "bin" for e in self.entries)

    def env(self):
        """The spec's variables that point loaders at lib64's subfolders that hold something."""
        out = []
        for sub, variable, defaults in SEARCH:
            if any(e.sub == f"lib64/{sub}" or e.sub.startswith(f"lib64/{sub}/") for e in self.entries):
                dirs = [f"{LIB_DIR}/{sub}"] + [d.format(machine=self.machine) for d in defaults]
                out.append(f"{variable}={':'.join(dict.fromkeys(dirs))}")
        return out

    def close(self):
        for entry in self.entries:
            if entry.fd is not None:
                os.close(entry.fd)
                entry.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- making it ------------------------------------------------------------------------

    def make(self):
        """Make the directory unless it is there; returns its path. GenerateError on failure
        (nothing half-made is left at its name)."""
        try:
            return self._make()
        except OSError as err:
            raise GenerateError(f"cannot make the driver's host directory {self.path}: "
                                f"{err.strerror or err}{' (' + err.filename + ')' if err.filename else ''}") from None

    def _make(self):
        os.makedirs(self.base, mode=0o755, exist_ok=True)
        problem = base_problem(self.base)
        if problem:
            raise GenerateError(f"will not use {self.base} for the driver's host directory: {problem}")
        try:
            info = os.lstat(self.path)
        except FileNotFoundError:
            info = None
        if info is not None:
            if stat.S_ISDIR(info.st_mode) and info.st_uid == 0 and not info.st_mode & 0o022:
                return self.path        # made before, never changed since (its name is its content)
            raise GenerateError(f"{self.path} is there and is not a root-owned directory only root can write; "
                                "remove it, then generate again")
        new = os.path.join(self.base, f".new-{self.name}-{os.getpid()}")
        shutil.rmtree(new, ignore_errors=True)
        os.mkdir(new, 0o755)
        try:
            same_fs = os.stat(self.base).st_dev
            folders = ["", "lib64", "bin"]
            for entry in self.entries:
                parts = entry.sub.split("/")
                folders += ["/".join(parts[:i]) for i in range(2, len(parts) + 1)]
            folders = list(dict.fromkeys(folders))
            for sub in folders[1:]:
                os.mkdir(os.path.join(new, sub), 0o755)
            for entry in self.entries:
                dest = os.path.join(new, entry.sub, entry.name)
                if entry.target is not None:
                    os.symlink(entry.target, dest)
                else:
                    _place(entry.fd, dest, same_fs)
            for sub in folders:
                os.chmod(os.path.join(new, sub), 0o755)
            try:
                os.rename(new, self.path)
            except OSError as err:
                if err.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                shutil.rmtree(new, ignore_errors=True)   # another generation made it first: same content
        except BaseException:
            shutil.rmtree(new, ignore_errors=True)
            raise
        return self.path


def _place(fd, dest, same_fs):
    """DEST as a hard link to the open file FD, or a copy of it."""
    info = os.fstat(fd)
    if info.st_dev == same_fs and info.st_uid == 0 and not info.st_mode & 0o7022:
        top = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:    # (a dir fd makes Python call linkat(AT_SYMLINK_FOLLOW): the inode we opened, not the magic link)
            os.link(f"/proc/self/fd/{fd}", dest, src_dir_fd=top, follow_symlinks=True)
            return
        except OSError as err:
            if err.errno not in (errno.EXDEV, errno.EPERM, errno.ENOENT, errno.EMLINK):
                raise
        finally:
            os.close(top)
    mode = 0o755 if info.st_mode & 0o111 else 0o644
    out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
    try:
        offset = 0
        try:
            while True:
                sent = os.copy_file_range(fd, out, 1 << 24, offset, None)
                if not sent:
                    break
                offset += sent
        except (AttributeError, OSError):       # (filesystems or kernels without it: EXDEV, EINVAL...)
            pass
        if offset < info.st_size:
            os.lseek(fd, offset, os.SEEK_SET)
            os.lseek(out, offset, os.SEEK_SET)
            while True:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                os.write(out, chunk)
        os.fchmod(out, mode)
    finally:
        os.close(out)


def base_problem(base):
    """Why BASE cannot hold host directories (someone but root could change what containers
    load), or None."""
    from cdi.safeio import private_dir_problem

    problem = private_dir_problem(base)
    if problem:
        return problem
    if os.stat(base).st_uid != 0:
        return f"{base} is not owned by root"
    return None


# -- planning ---------------------------------------------------------------------------------

def plan(root, files, version, base=BASE):
    """The Plan of the driver files FILES (discover.DriverFiles) found in ROOT (a DriverRoot,
    still open). Every file is opened now, inside the root; the caller closes the plan."""
    made = Plan(base, version, getattr(root, "machine", None) or "x86_64")
    digest = hashlib.sha256(_FORMAT.encode())
    taken = set()       # (sub, name)

    def add(sub, name, fd=None, target=None):
        taken.add((sub, name))
        made.entries.append(Entry(sub, name, fd=fd, target=target))

    try:
        lib_dirs = set(files.lib_dirs)
        for lib in files.libraries:
            sub = _lib_sub(posixpath.dirname(lib.path), lib_dirs)
            name = posixpath.basename(lib.path)
            if sub is None or (sub, name) in taken:     # (a name twice: the first)
                made.left.append(lib)
                continue
            add(sub, name, fd=_open(root, lib.host))
        for host, path in files.graphics:    # the EGL platform libraries: the ICD files name their SONAME
            directory, name = posixpath.split(path)
            if directory not in lib_dirs or ("lib64", name) in taken:
                continue
            soname = root.soname(path if root.path == "/" else host[len(root.path):])
            if soname is None:
                continue
            made.moved.add(path)
            add("lib64", name, fd=_open(root, host))
            if soname and soname != name and ("lib64", soname) not in taken:
                add("lib64", soname, target=name)
        # Links: those in a library folder first (a subfolder's link may lead to one of them).
        links = [link.partition("::")[::2] for link in files.links]
        for target, path in sorted(links, key=lambda link: posixpath.dirname(link[1]) not in lib_dirs):
            directory, name = posixpath.split(path)
            sub = _lib_sub(directory, lib_dirs)
            if sub is not None and (sub, name) in taken:
                continue
            if sub == "lib64" and "/" not in target:
                add(sub, name, target=target)
                continue
            if sub is not None and not target.startswith("/") and target.count("/") <= sub.count("/") \
                    and tuple(posixpath.normpath(posixpath.join(sub, target)).rsplit("/", 1)) in taken:
                add(sub, name, target=target)     # (in a subfolder: to a file of it, or ../NAME of lib64)
                continue
            link = f"{target}::{path}"
            # A link left to the hook whose target was in a library folder now leads into lib64.
            at_dir, at_name = posixpath.split(posixpath.normpath(posixpath.join(directory, target)))
            if at_dir in lib_dirs and ("lib64", at_name) in taken:
                link = f"{LIB_DIR}/{at_name}::{path}"
            made.left_links.append(link)
        for host, path in files.configs:
            directory, name = posixpath.split(path)
            sub = _config_sub(directory)
            if sub is None or (sub, name) in taken:     # (found twice: the second keeps its bind)
                continue
            made.moved.add(path)
            add(sub, name, fd=_open(root, host))
        tools = set()
        for host, path in files.binaries:
            name = posixpath.basename(path)
            if name not in tools:
                tools.add(name)
                add("bin", name, fd=_open(root, host))
        for entry in sorted(made.entries, key=lambda e: (e.sub, e.name)):
            if entry.target is not None:
                line = f"{entry.sub}/{entry.name} -> {entry.target}\n"
            else:
                info = os.fstat(entry.fd)
                line = (f"{entry.sub}/{entry.name} {info.st_dev} {info.st_ino} {info.st_size} "
                        f"{info.st_mtime_ns} {info.st_mode:o} {info.st_uid}\n")
            digest.update(line.encode())
    except BaseException:
        made.close()
        raise
    made.name = f"{version}-{digest.hexdigest()[:12]}"
    if version_of(made.name) is None:
        made.close()
        raise GenerateError(f"driver version {version!r} cannot name a host directory (digits, letters, dots)")
    return made


def _lib_sub(directory, lib_dirs):
    """Where the directory holds what is in the driver's library folder DIRECTORY: lib64, a
    subfolder of it (LIB_SUBFOLDERS), or None (it keeps its own mount)."""
    if directory in lib_dirs:
        return "lib64"
    parent, name = posixpath.split(directory)
    return f"lib64/{name}" if parent in lib_dirs and name in LIB_SUBFOLDERS else None


def _config_sub(directory):
    """The lib64 subfolder that holds the configuration files of the container folder
    DIRECTORY (MOVED_CONFIGS), or None."""
    for pattern, sub in MOVED_CONFIGS:
        if directory == pattern or pattern.startswith("*/") and directory.endswith(pattern[1:]):
            return f"lib64/{sub}"
    return None


def _open(root, host):
    """An O_RDONLY descriptor of the regular file at HOST (a host path in ROOT, resolved)."""
    from ..ldconfig.engine import O_NOFOLLOW

    path = host if root.path == "/" else host[len(root.path):]
    fd = root.tree.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | O_NOFOLLOW)
    if fd < 0:
        raise GenerateError(f"cannot open {host} in the driver root {root.path} (it changed while the spec "
                            "was made?)")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise GenerateError(f"{host} in the driver root {root.path} is not a regular file")
    return fd


# -- the spec's edits ---------------------------------------------------------------------------

def mounts(made, options):
    """The two directory binds of the layout."""
    out = [{"hostPath": made.lib(), "containerPath": LIB_DIR, "options": list(options)}]
    if made.has_bin():
        out.append({"hostPath": made.bin(), "containerPath": BIN_DIR, "options": list(options)})
    return out


# -- collecting -------------------------------------------------------------------------------

def named_by_specs(base, spec_dirs):
    """Names of the host directories under BASE that the spec files in SPEC_DIRS name."""
    found = set()
    pattern = re.compile(re.escape(os.path.abspath(base).rstrip("/") + "/") + r"([^/\"'\s]+)/")
    for directory in spec_dirs:
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            if not name.endswith((".yaml", ".json")):
                continue
            try:
                with open(os.path.join(directory, name), "rb") as stream:
                    text = stream.read(64 << 20).decode("utf-8", "replace")
            except OSError:
                continue
            found.update(pattern.findall(text))
    return found


def in_use(base, proc="/proc"):
    """Names under BASE that some mount namespace binds (any process's mountinfo)."""
    try:
        info = os.stat(base)
    except OSError:
        return set()
    device = f"{os.major(info.st_dev)}:{os.minor(info.st_dev)}"
    seen_ns, used = set(), set()
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return used
    for pid in pids:
        try:
            ns = os.readlink(f"{proc}/{pid}/ns/mnt")
        except OSError:
            ns = None
        if ns is not None and ns in seen_ns:
            continue
        try:
            with open(f"{proc}/{pid}/mountinfo", "rb") as stream:
                text = stream.read().decode("utf-8", "replace")
        except OSError:
            continue
        if ns is not None:
            seen_ns.add(ns)
        for line in text.splitlines():
            fields = line.split(" ")
            if len(fields) < 5 or fields[2] != device:
                continue
            for part in fields[3].replace("\\040", " ").split("/"):
                if _NAME.match(part):
                    used.add(part)
    return used


def collect(base=BASE, keep=(), spec_dirs=(), proc="/proc"):
    """Remove the host directories under BASE that are not in KEEP, not named by a spec in
    SPEC_DIRS and bound by no mount namespace, and leftovers of interrupted makes (.new-*
    of a process that is gone). Returns the names removed."""
    try:
        entries = os.listdir(base)
    except OSError:
        return []
    keep = set(keep) | named_by_specs(base, spec_dirs)
    removed, used = [], None
    for name in sorted(entries):
        path = os.path.join(base, name)
        if name.startswith(".new-"):
            pid = name.rpartition("-")[2]
            if pid.isdigit() and not os.path.exists(f"{proc}/{pid}"):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(name)
            continue
        if version_of(name) is None or name in keep:
            continue
        if used is None:
            used = in_use(base, proc)
        if name in used:
            continue
        # Out of the way first, by one rename: a half-removed directory never has a name a spec uses.
        gone = os.path.join(base, f".new-{name}-0")
        try:
            os.rename(path, gone)
        except OSError:
            continue
        shutil.rmtree(gone, ignore_errors=True)
        removed.append(name)
    return removed


# -- checking (doctor) --------------------------------------------------------------------------

def problems(path):
    """What is wrong with the host directory at PATH: [text]."""
    found = []
    try:
        top = os.lstat(path)
    except OSError as err:
        return [f"{path}: {err.strerror}"]
    if not stat.S_ISDIR(top.st_mode):
        return [f"{path} is not a directory"]
    for current, dirs, names in os.walk(path):
        for name in [""] + dirs + names:
            full = os.path.join(current, name) if name else current
            try:
                info = os.lstat(full)
            except OSError as err:
                found.append(f"{full}: {err.strerror}")
                continue
            if stat.S_ISLNK(info.st_mode):
                target = os.readlink(full)
                if not _link_inside(os.path.relpath(full, path), target):
                    found.append(f"{full} is a link out of its folder ({target})")
                continue
            if info.st_uid != 0:
                found.append(f"{full} is owned by uid {info.st_uid}, not root")
            if info.st_mode & 0o022:
                found.append(f"{full} is writable by group or others (mode {stat.S_IMODE(info.st_mode):o})")
            if info.st_mode & 0o6000:
                found.append(f"{full} is set-uid or set-gid")
        if len(found) > 20:
            break
    return found


def _link_inside(rel, target):
    """A link at REL (lib64/..., bin/...) leads to a name in its folder, or (from a subfolder
    of lib64) up to a name in a folder above it, never out of the bound folder."""
    ups = target.split("/")
    depth = rel.count("/") - 1      # folders below lib64 or bin
    return (not target.startswith("/") and len(ups) - 1 <= depth and all(p == ".." for p in ups[:-1])
            and ups[-1] not in ("", ".", ".."))
