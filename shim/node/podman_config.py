"""Register cdi-shim-runtime with podman, safely (`cdi-shim runtime configure --runtime=podman`).

Policy:

* containers.conf is merged through tomlkit, never rewritten from scratch: comments, order, every
  other key and every other runtime stay. Ours is ``[engine.runtimes] cdi-shim = ["<front end>"]``
  (podman takes the first existing path of the list), the node prefix's
  ``current/bin/cdi-shim-runtime`` on a node (installation.stable_program). An entry of that name
  whose list does not hold our path is refused: it is someone else's, or another install's.
* ``[engine] runtime`` (podman's default runtime) changes only when asked (``set_as_default``).
* Which file: root's podman reads /usr/share/containers/containers.conf, then
  /etc/containers/containers.conf (and its .d drop-ins), later files winning key by key; a rootless
  user's podman reads ``$XDG_CONFIG_HOME/containers/containers.conf`` (default
  ``~/.config/containers/containers.conf``) after those. So the default is the /etc file for
  root and the user's file for anyone else (default_path); ``$CONTAINERS_CONF`` replaces them all
  for podman, and so names the default file here too.
* A file that is not TOML (named by line and column) or whose ``engine`` / ``engine.runtimes`` is
  not a table is refused; nothing is written on any error. The new text is loaded by the
  installed podman (``CONTAINERS_CONF=NEW podman version``, which reads and type-checks the whole
  file, and refuses a default runtime whose paths do not exist) where podman is installed, then
  written beside the old file and renamed over it, after a backup; the whole read-to-rename runs
  under the configure lock (containerd_config.configure_lock).
* podman has no daemon: the next ``podman run`` reads the new file. Only a running ``podman system
  service`` (the Docker-compatible API) must restart.
"""
import os
import re
import subprocess

import tomlkit

from .containerd_config import FileChange

SYSTEM_CONFIG = "/etc/containers/containers.conf"
DEFAULT_RUNTIME_NAME = "cdi-shim"
MAX_CONTAINERS_CONF = 1 << 20
PODMAN_OWN_RUNTIMES = ("runc", "crun", "crun-wasm", "crun-vm", "kata", "runsc", "youki", "krun", "ocijail")


class PodmanConfigError(Exception):
    pass


def default_path(euid=None, environ=None):
    """The containers.conf podman reads last for this user: $CONTAINERS_CONF when set (podman then
    reads only it), root's /etc file, or a rootless user's own."""
    environ = os.environ if environ is None else environ
    if environ.get("CONTAINERS_CONF"):
        return environ["CONTAINERS_CONF"]
    if (os.geteuid() if euid is None else euid) == 0:
        return SYSTEM_CONFIG
    config_home = environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(config_home, "containers", "containers.conf")


def podman_version(podman="podman"):
    """(major, minor, patch) of the installed podman, or None when it is not installed."""
    try:
        out = subprocess.run([podman, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"version (\d+)\.(\d+)(?:\.(\d+))?", out.stdout)
    if out.returncode != 0 or not match:
        return None
    return tuple(int(part or 0) for part in match.groups())


# --- reading --------------------------------------------------------------------------------------

def read_containers_conf(path):
    """The text of containers.conf, or None when it does not exist."""
    from .containerd_config import read_config_text

    return read_config_text(path, MAX_CONTAINERS_CONF, PodmanConfigError)


def parse_containers_conf(path, text):
    """The tomlkit document of TEXT; a syntax error names the line and column."""
    try:
        return tomlkit.parse(text)
    except tomlkit.exceptions.ParseError as err:
        message = re.sub(r" at line \d+ col \d+$", "", str(err))
        # tomlkit counts columns from 0, editors from 1
        raise PodmanConfigError(f"{path}: not valid TOML at line {err.line}, column {err.col + 1}: {message}; fix the "
                                "file (podman refuses it too) and run this again") from None


def _table(doc, key, path, where):
    value = doc.get(key)
    if value is None:
        value = tomlkit.table()
        doc[key] = value
    if not isinstance(value, dict):
        raise PodmanConfigError(f"{path}: {where} is a {type(value).__name__}, not a table; podman expects "
                                f"[{where}]: fix the file and run this again")
    return value


def runtimes_of(doc):
    """{name: [paths]} of [engine.runtimes] in a parsed containers.conf (doctor's reading)."""
    engine = doc.get("engine")
    runtimes = engine.get("runtimes") if isinstance(engine, dict) else None
    if not isinstance(runtimes, dict):
        return {}
    return {str(name): [str(p) for p in paths] for name, paths in runtimes.items()
            if isinstance(paths, list) and all(isinstance(p, str) for p in paths)}


# --- the whole operation ---------------------------------------------------------------------------

class Plan:
    """Everything configure will write, decided before anything is written."""

    def __init__(self, path, name, binary, version):
        self.path, self.name, self.binary, self.version = path, name, binary, version
        self.change = None
        self.notes = []

    @property
    def changed(self):
        return self.change.changed

    def diff(self):
        return self.change.diff() if self.changed else ""


def check_runtime_name(name):
    # a TOML bare key podman's --runtime can name; the names of its own runtimes are not ours to take
    if not name or not re.match(r"^[A-Za-z0-9][A-Za-z0-9_-]*$", name):
        raise PodmanConfigError(f'runtime name "{name}": use letters, digits, "_" and "-" (podman run '
                                "--runtime NAME selects it)")
    if name in PODMAN_OWN_RUNTIMES:
        raise PodmanConfigError(f'runtime name "{name}" is one of podman\'s own: choose another')


def plan_configure(path=None, runtime_name=DEFAULT_RUNTIME_NAME, binary=None, set_as_default=False,
                   podman="podman", binary_root=None):
    """Decide the new containers.conf; reads only. `binary`: the runtime's path (default: the
    installed front end). `binary_root`: a node tree an explicit `binary` may be executable in."""
    from .containerd import ContainerdConfigError
    from .containerd_config import runtime_binary, trusted_path

    check_runtime_name(runtime_name)
    # a linked file stays linked: the file it names is edited (a link others control is refused)
    path = trusted_path(path or default_path(), PodmanConfigError)
    try:
        binary = runtime_binary(binary, root=binary_root)
    except ContainerdConfigError as err:
        raise PodmanConfigError(str(err)) from None
    old = read_containers_conf(path)
    doc = parse_containers_conf(path, old) if old is not None else tomlkit.document()
    version = podman_version(podman)
    plan = Plan(path, runtime_name, binary, version)
    plan.notes.append(f"podman {'.'.join(map(str, version))}" if version else
                      f"podman is not installed here ({podman}): the file is written unchecked")

    engine = _table(doc, "engine", path, "engine")
    runtimes = _table(engine, "runtimes", path, "engine.runtimes")
    entry = runtimes.get(runtime_name)
    if entry is not None:
        paths = entry.unwrap() if hasattr(entry, "unwrap") else entry
        if not isinstance(paths, list) or binary not in paths:
            raise PodmanConfigError(
                f"{path}: [engine.runtimes] {runtime_name} = {tomlkit.item(paths).as_string()} does not hold "
                f"{binary}: that entry is another program's (or another install's); remove it, choose another "
                "--runtime-name, or name that program with --runtime-binary if it is this cdi-shim")
    else:
        runtimes[runtime_name] = [binary]
    others = sorted(set(runtimes) - {runtime_name})
    if others:
        plan.notes.append(f"kept the other runtimes: {', '.join(others)}")
    previous = engine.get("runtime")
    if set_as_default:
        engine["runtime"] = runtime_name
        if previous not in (None, runtime_name):
            plan.notes.append(f'engine.runtime was "{previous}", now "{runtime_name}"')
    elif previous not in (None, runtime_name):
        plan.notes.append(f'engine.runtime stays "{previous}"')
    new = tomlkit.dumps(doc)
    plan.change = FileChange(path, old, new)
    return plan


def validate_with_podman(path, podman="podman"):
    """(True, "") when podman loads containers.conf PATH, (False, reason) when it refuses it,
    (None, why) when it cannot tell (podman not installed)."""
    env = dict(os.environ, CONTAINERS_CONF=path)
    try:
        out = subprocess.run([podman, "version"], capture_output=True, text=True, timeout=60, env=env)
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, str(err)
    if out.returncode == 0:
        return True, ""
    lines = [line for line in (out.stderr or out.stdout).strip().splitlines() if line.strip()]
    return False, lines[-1] if lines else f"exit status {out.returncode}"


def write_plan(plan, podman="podman", validate=True):
    """Write containers.conf: a candidate beside it, loaded by podman where it is installed, renamed
    over it after a backup. Returns (written, backups, checked). Nothing changes when podman
    refuses the candidate."""
    from .containerd_config import write_single

    def check(candidate):
        if not validate or plan.version is None:
            return False
        ok, why = validate_with_podman(candidate, podman)
        if ok is False:
            raise PodmanConfigError(f"podman refuses the new {plan.path} ({why}); nothing was changed")
        return bool(ok)

    written, backups, checked = write_single(plan.change, check)
    return written, backups, bool(checked)


# --- reading (doctor) --------------------------------------------------------------------------------

def load_containers_conf(path):
    """The parsed containers.conf, an empty document when the file is missing."""
    text = read_containers_conf(path)
    return parse_containers_conf(path, text) if text is not None else tomlkit.document()
