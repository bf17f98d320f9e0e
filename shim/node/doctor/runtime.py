"""The RuntimeClass handlers and the runtime itself: its hook program, the resident process,
the log file."""
import os
import socket
import stat
import struct

from cdi import __version__
from cdi.safeio import UnsafeFile, read_config_file

from .base import FAIL, MAX_READ, RUNTIME_EXECUTABLE, WARN, Check, _ok
from .containerd import _get, configure_fix




def check_runtimeclasses(ctx):
    import yaml

    from ..runtimeclass import no_runtime_error

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
    problems, warnings, seen, missing = [], [], [], []
    for path in files:
        try:
            data = read_config_file(path, MAX_READ)
            if data is None:
                problems.append(f"{path}: does not exist")
                continue
            docs = [d for d in yaml.safe_load_all(data) if isinstance(d, dict)]
        except UnsafeFile as err:
            problems.append(f"{path}: cannot be read: {err}")
            continue
        except yaml.YAMLError as err:
            problems.append(f"{path}: {' '.join(str(err).split())}".replace('"<byte string>"', f'"{path}"'))
            continue
        classes = [d for d in docs if d.get("kind") == "RuntimeClass"]
        if not classes:
            problems.append(f"{path}: no RuntimeClass in it")
        for doc in classes:
            handler = doc.get("handler")
            name = _get(doc, "metadata", "name")
            if handler not in names:
                missing.append(handler)
                problems.append(f'RuntimeClass "{name}" ({path}): {no_runtime_error(handler)} (containerd has '
                                f"{', '.join(sorted(names))})")
            elif handler not in shim:
                warnings.append(f'RuntimeClass "{name}": handler "{handler}" does not run {RUNTIME_EXECUTABLE}')
            else:
                seen.append(f'RuntimeClass "{name}" -> "{handler}"')
    if problems:
        return Check("runtimeclass", "handler", FAIL, "; ".join(problems),
                     "set handler to the containerd runtime name of cdi-shim (`cdi-shim runtimeclass --config "
                     f"{view.path}` checks it), or register that name: "
                     + configure_fix(ctx, missing[0] if missing else None)
                     + (f" (and so for {', '.join(missing[1:])})" if missing[1:] else ""))
    if warnings:
        return Check("runtimeclass", "handler", WARN, "; ".join(warnings), "")
    return _ok("runtimeclass", "handler", ", ".join(seen))


# --- the runtime itself -------------------------------------------------------------------------

def _engine_runtimes(ctx):
    """[(engine, runtime path)] of the cdi-shim runtimes containerd, Docker and podman name."""
    from .docker import _view as docker_view
    from .podman import _view as podman_view

    found, view = [], ctx.containerd
    if not view.error and view.version is not None:
        found += [("containerd", _get(e, "options", "BinaryName")) for e in view.shim_runtimes().values()]
    docker, podman = docker_view(ctx), podman_view(ctx)
    if docker.present and not docker.error:
        found += [("Docker", path) for path in docker.ours().values()]
    if podman.present and not podman.error:
        found += [("podman", path) for paths in podman.ours().values() for path in paths]
    return [(engine, path) for engine, path in found if isinstance(path, str) and path.startswith("/")]


def check_release(ctx):
    """The node prefix's `current` link (and any other `current` an engine's runtime path goes
    through) leads to an installed release. A release moved or removed under it is one failure
    with one fix; the engine checks defer to it (ctx.deferred)."""
    from ...installation import DEFAULT_PREFIX

    node, engines = ctx.node, _engine_runtimes(ctx)
    links = {os.path.join(DEFAULT_PREFIX, "current")}
    links |= {path.partition("/current/")[0] + "/current" for _, path in engines if "/current/" in path}
    seen = []
    for link in sorted(links):
        entry = os.path.join(node.host(os.path.dirname(link)), os.path.basename(link))
        if not os.path.islink(entry):
            continue    # no such prefix (a development install), or a plain folder
        target, releases_dir = os.readlink(entry), os.path.join(os.path.dirname(link), "releases")
        installed = [name for name in node.listdir(releases_dir) or ()
                     if node.is_executable(os.path.join(releases_dir, name, "bin", RUNTIME_EXECUTABLE))]
        info = node.stat(link)
        if info is not None and stat.S_ISDIR(info.st_mode):
            seen.append(f"{link} -> {target}" + (f" ({len(installed)} release(s) in {releases_dir})"
                                                 if installed else ""))
            continue
        ctx.dangling_release = (link, target)
        users = sorted({engine for engine, path in engines if path.startswith(link + "/")}, key=str.lower)
        cost = (f"{', '.join(users)} name{'s' if len(users) == 1 else ''} {link}/bin/{RUNTIME_EXECUTABLE}, so every "
                "container of its runtime fails to start" if users else "nothing installed from it runs")
        if installed:
            newest = max(installed, key=lambda name: node.stat(os.path.join(releases_dir, name)).st_mtime)
            fix = (f"point {link} at an installed release: ln -sfn releases/{newest} {link} (installed: "
                   f"{', '.join(sorted(installed))}); or install the release again (docs/install.md)")
        else:
            fix = (f"install a release (docs/install.md: the node image's installer copies it to {releases_dir}/ "
                   f"and points {link} at it)")
        return Check("runtime", "release", FAIL, f"{node.show(link)} -> {target}, which does not exist (the release "
                     f"was moved or removed): {cost}", fix)
    if not seen:
        return None
    return _ok("runtime", "release", "; ".join(seen))


HOOK_PROGRAM = "cdi-shim-nshook"


def _registered_runtimes(ctx):
    """The executables containerd's cdi-shim runtime entries name (absolute, executable in the
    node), sorted; empty when containerd's config cannot be read."""
    view, node = ctx.containerd, ctx.node
    if view.error or view.version is None:
        return []
    named = (_get(entry, "options", "BinaryName") for entry in view.shim_runtimes().values())
    return sorted({binary for binary in named
                   if isinstance(binary, str) and binary.startswith("/") and node.is_executable(binary)})


def check_hook_program(ctx):
    """cdi-shim-nshook beside each registered cdi-shim-runtime (they are installed together):
    the hooks the runtime leaves to runc on a GPU node run it (the params bind of
    disable-device-node-modification, the /dev/dri/by-path links), so without it those
    creates fail."""
    node, binaries = ctx.node, _registered_runtimes(ctx)
    if not binaries:
        return None  # containerd.runtime says what is wrong with the entry
    found, missing = [], []
    for binary in binaries:
        resolved = "/" + os.path.relpath(node.host(binary), node.root)   # links followed inside the root
        program = os.path.join(os.path.dirname(resolved), HOOK_PROGRAM)
        (found if node.is_executable(program) else missing).append(program)
    if missing:
        return Check("runtime", "hooks", FAIL, f"{', '.join(missing)} missing beside {RUNTIME_EXECUTABLE}: GPU "
                     "containers whose spec has the toolkit's disable-device-node-modification or /dev/dri "
                     "by-path hooks fail to start",
                     "reinstall cdi-shim (pip install, or the node image): it installs both programs together")
    return _ok("runtime", "hooks", ", ".join(found))


def check_runtime_install(ctx):
    """Where each registered cdi-shim-runtime is installed. A node's container runtime belongs
    under a root-owned prefix (/opt/cdi-shim/current), not in a git working tree (a checkout's
    .venv: `git pull` or a rebuild changes it under running containers) nor anywhere another user
    can write to (they could replace what every container start runs as root)."""
    from ...installation import DEFAULT_PREFIX

    node, binaries = ctx.node, _registered_runtimes(ctx)
    if not binaries:
        return None
    problems = []
    for binary in binaries:
        resolved = "/" + os.path.relpath(node.host(binary), node.root)   # links followed inside the root
        path = resolved
        while True:
            info = node.stat(path)
            if info is not None and stat.S_ISDIR(info.st_mode) and node.exists(os.path.join(path, ".git")):
                problems.append(f"{binary} lies in the git working tree {path}")
                break
            if info is not None and (info.st_uid != 0 or info.st_mode & 0o022) and not (
                    stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX):
                problems.append(f"{binary}: {path} is owned by uid {info.st_uid}, mode "
                                f"{stat.S_IMODE(info.st_mode):04o} (not root-owned, or writable by others)")
                break
            if path == "/":
                break
            path = os.path.dirname(path)
    if problems:
        return Check("runtime", "install", WARN, "; ".join(problems),
                     f"install cdi-shim under {DEFAULT_PREFIX} (docs/install.md: the wheel or the node image) and "
                     f"rerun `{DEFAULT_PREFIX}/current/bin/cdi-shim install --node`")
    return _ok("runtime", "install", ", ".join(binaries))


def probe_resident(path, timeout=2.0):
    """Ask the resident process at PATH: a request of doctor's own version (PROBE_VERSION), which
    it declines with b"F" and its version before touching anything (the claim stays unread).
    Returns (answered, text, its version: None when it does not say, as an older one does not)."""
    from ...runtime.resident import CLAIM, MAGIC, PERMIT, PROBE_VERSION

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.settimeout(timeout)
    claim_read, claim_write = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        os.write(claim_write, CLAIM + PERMIT)
        sock.connect(path)
        body = b"\0".join([PROBE_VERSION.encode(), b"/", b"022", b"0"]) + b"\0"
        message = MAGIC + struct.pack("<I", len(body)) + body
        sock.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", claim_read))])
        reply = b""
        while len(reply) < 256:
            chunk = sock.recv(256)
            if not chunk:
                break
            reply += chunk
    except OSError as err:
        return False, err.strerror or str(err), None
    finally:
        for fd in (claim_read, claim_write):
            os.close(fd)
        sock.close()
    if reply.startswith(b"F"):
        version = reply[1:].split(b"\0", 1)[0].decode("ascii", "replace")
        return True, "answers", version or None
    if reply == b"":
        # A server of an older protocol closes without a word on our request
        return True, "answers, but not in this version's protocol", None
    return False, f"answered {reply[:32]!r}", None


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
        return Check("runtime", "resident", FAIL, f"{path} is not a socket", "remove it and restart the resident "
                     "process: systemctl restart cdi-shim-resident")
    answered, text, version = probe_resident(node.host(path))
    if not answered:
        return Check("runtime", "resident", WARN, f"{path}: {text}: the resident process is not answering "
                     "(creates fall back to the interpreter)", "systemctl restart cdi-shim-resident")
    if version != __version__:
        runs = f"runs cdi-shim {version}" if version else "runs an older cdi-shim (it does not say which)"
        return Check("runtime", "resident", WARN, f"{path}: the resident process {runs}, not {__version__} as "
                     "installed: it declines every create of this version's front end, which then starts the "
                     "interpreter itself (~15-20 ms slower per GPU container)",
                     "systemctl restart cdi-shim-resident")
    # The linker steps it keeps for the front end to replay (shim/linker/stepmemo.py): the
    # front end ignores them unless their directory is ours and no one else may write there.
    steps = os.path.join(os.path.dirname(path), "steps")
    info = node.stat(steps)
    if info is None:
        return _ok("runtime", "resident", f"{path} {text}; no linker step kept for the front end yet ({steps})")
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        return Check("runtime", "resident", WARN, f"{path} {text}, but {steps} is not a directory of uid "
                     f"{os.geteuid()} that no one else may write: the front end ignores the linker steps kept there "
                     "(each create of a config injected by containerd then asks the resident process)",
                     f"rm -rf {steps} (the resident process makes it again, mode 0700)")
    kept = [name for name in node.listdir(steps) or () if not name.startswith(".")]
    return _ok("runtime", "resident", f"{path} {text}; {len(kept)} linker step(s) kept for the front end in {steps}")


def check_runtime_log(ctx):
    from ...runtime.runlog import MAX_LOG_BYTES

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


def check_env_requests(ctx):
    """A Kubernetes node that takes device requests from the env var of unprivileged containers:
    an image that sets NVIDIA_VISIBLE_DEVICES=all gets every GPU, past the device plugin."""
    from ...config import DEFAULT_CONFIG_PATH
    from ..kubernetes import PLUGIN_STRATEGIES, kubernetes_marker, other_ways

    settings = ctx.options.settings
    marker = kubernetes_marker(ctx.node.exists)
    if marker is None or not settings.device_env:
        return None  # env requests are the interface of docker, podman and plain runc
    where = settings.source or ctx.node.show(DEFAULT_CONFIG_PATH)
    if not settings.accept_env_unprivileged:
        return _ok("runtime", "env-requests", f"a Kubernetes node ({marker}): {settings.device_env} of unprivileged "
                   f"containers is ignored (accept-env-unprivileged = false in {where})")
    ways = other_ways(settings, (ctx.containerd.effective_cri() or {}).get("enable_cdi")
                      if not ctx.containerd.error else None)
    return Check("runtime", "env-requests", WARN,
                 f"a Kubernetes node ({marker}) accepts {settings.device_env} from unprivileged containers "
                 f"(accept-env-unprivileged = true{' in ' + where if settings.source else ', the default'}): an image "
                 f"that sets {settings.device_env}=all gets every GPU, past the device plugin's allocation",
                 f"set accept-env-unprivileged = false in {where}, and have the device plugin pass its devices by "
                 + (", ".join(ways) if ways else "CDI annotations or volume mounts")
                 + f" ({PLUGIN_STRATEGIES}, not envvar)")
