"""Register cdi-shim-runtime with Docker, safely (`cdi-shim runtime configure --runtime=docker`).

Policy:

* daemon.json is merged, never rewritten from scratch: every other key stays, and so does every
  other runtime (``nvidia`` included). Ours is ``runtimes["cdi-shim"] = {"path": <front end>}``,
  the node prefix's ``current/bin/cdi-shim-runtime`` on a node (installation.stable_program), so
  a new release needs no new daemon.json. An entry of that name that points elsewhere is
  refused: it is someone else's, or another install's, and silently replacing it would move
  every container that selects it.
* ``default-runtime`` changes only when asked (``set_as_default``).
* CDI (``cdi=True``): Docker 25 and later inject ``--device vendor/class=name`` themselves.
  25.0-28.1 do it only with ``features.cdi = true``; from 28.2 CDI is on unless that feature is
  false. Either way we set it, and keep ``cdi-spec-dirs`` equal to cdi-shim's spec-dirs, so the
  daemon and the runtime read the same specs. Docker 20.10 has no CDI at all: refused, naming
  the version and the fix.
* A file that is not JSON (named by line and column), not an object, or holds a key twice is
  refused; nothing is written on any error. The new text is checked by ``dockerd --validate``
  where the daemon has it (23.0+), then written beside the old file and renamed over it, after a
  backup; the whole read-to-rename runs under the containerd configure's lock (configure_lock).
* dockerd re-reads ``runtimes`` and ``default-runtime`` on SIGHUP; ``features`` and
  ``cdi-spec-dirs`` only when it restarts. The plan says which.
"""
import json
import re
import subprocess

from .containerd_config import FileChange

DEFAULT_DOCKER_CONFIG = "/etc/docker/daemon.json"
DEFAULT_RUNTIME_NAME = "cdi-shim"
DEFAULT_DOCKER_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
CDI_FROM = (25, 0)          # the first Docker with CDI injection
CDI_DEFAULT_ON_FROM = (28, 2)  # from here on unless features.cdi is false
RELOADABLE = ("runtimes", "default-runtime")  # SIGHUP is enough for these (dockerd's reload)
MAX_DAEMON_JSON = 1 << 20
LEGACY_HOOK_PROGRAM = "nvidia-container-runtime-hook"  # on dockerd's PATH: --gpus offered (requests.LEGACY_HOOK)


class DockerConfigError(Exception):
    pass


# --- facts about the node ------------------------------------------------------------------------

def docker_version(dockerd="dockerd"):
    """(major, minor, patch) of the installed dockerd, or None when it is not installed."""
    try:
        out = subprocess.run([dockerd, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"version v?(\d+)\.(\d+)(?:\.(\d+))?", out.stdout)
    if out.returncode != 0 or not match:
        return None
    return tuple(int(part or 0) for part in match.groups())


def _shown(version):
    return ".".join(str(part) for part in version)


# --- reading --------------------------------------------------------------------------------------

def read_daemon_json(path):
    """The text of daemon.json, or None when it does not exist."""
    from .containerd_config import read_config_text

    return read_config_text(path, MAX_DAEMON_JSON, DockerConfigError)


def parse_daemon_json(path, text):
    """The object in daemon.json TEXT; an empty file is an empty object (dockerd reads it so)."""
    if not text.strip():
        return {}

    def no_duplicates(pairs):
        seen = {}
        for key, value in pairs:
            if key in seen:
                raise DockerConfigError(f'{path}: key "{key}" appears twice in one object; dockerd would use '
                                        "only one of them: keep one and run this again")
            seen[key] = value
        return seen

    try:
        doc = json.loads(text, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as err:
        raise DockerConfigError(f"{path}: not valid JSON at line {err.lineno}, column {err.colno}: {err.msg}; "
                                "fix the file (dockerd refuses it too) and run this again") from None
    if not isinstance(doc, dict):
        raise DockerConfigError(f"{path}: the top level is a JSON {type(doc).__name__ if doc is not None else 'null'}"
                                ", not an object; dockerd expects an object such as {\"runtimes\": {...}}")
    return doc


# --- the whole operation ---------------------------------------------------------------------------

class Plan:
    """Everything configure will write, decided before anything is written."""

    def __init__(self, path, name, binary, version):
        self.path, self.name, self.binary, self.version = path, name, binary, version
        self.change = None
        self.notes, self.warnings = [], []
        self.changed_keys = []

    @property
    def changed(self):
        return self.change.changed

    @property
    def changes(self):
        return [self.change]

    def diff(self):
        return self.change.diff() if self.changed else ""

    @property
    def needs_restart(self):
        """True: dockerd must restart; False: a reload (SIGHUP) is enough; None: nothing changed."""
        if not self.changed:
            return None
        return any(key not in RELOADABLE for key in self.changed_keys)


def check_runtime_name(name):
    # dockerd takes any name but "runc" and the like are its own; a path-like name is a mistake
    if not name or not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", name):
        raise DockerConfigError(f'runtime name "{name}": use letters, digits, ".", "_" and "-" (docker run '
                                "--runtime=NAME selects it)")
    if name in ("runc", "io.containerd.runc.v2", "io.containerd.runtime.v1.linux"):
        raise DockerConfigError(f'runtime name "{name}" is one of dockerd\'s own: choose another')


def plan_configure(path=DEFAULT_DOCKER_CONFIG, runtime_name=DEFAULT_RUNTIME_NAME, binary=None,
                   set_as_default=False, cdi=False, spec_dirs=DEFAULT_DOCKER_SPEC_DIRS, dockerd="dockerd",
                   binary_root=None):
    """Decide the new daemon.json; reads only. `binary`: the runtime's path (default: the installed
    front end, installation.stable_program). `binary_root`: a node tree an explicit `binary` may be
    executable in instead of here."""
    from .containerd import ContainerdConfigError
    from .containerd_config import runtime_binary, trusted_path

    check_runtime_name(runtime_name)
    # a linked daemon.json stays linked: the file it names is edited (a link others control is refused)
    path = trusted_path(path, DockerConfigError)
    try:
        binary = runtime_binary(binary, root=binary_root)
    except ContainerdConfigError as err:
        raise DockerConfigError(str(err)) from None
    old = read_daemon_json(path)
    doc = parse_daemon_json(path, old) if old is not None else {}
    version = docker_version(dockerd)
    plan = Plan(path, runtime_name, binary, version)
    plan.notes.append(f"dockerd {_shown(version)}" if version else
                      f"dockerd is not installed here ({dockerd}): the file is written for Docker 25 or later")
    before = json.loads(json.dumps(doc))
    _add_runtime(plan, doc, set_as_default)
    _set_cdi(plan, doc, cdi, spec_dirs, dockerd)
    plan.changed_keys = sorted(key for key in set(doc) | set(before) if doc.get(key) != before.get(key))
    text = json.dumps(doc, indent=4, ensure_ascii=False) + "\n"  # other keys' text stays as written
    plan.change = FileChange(path, old, text if plan.changed_keys or old is None else old)
    return plan


def _add_runtime(plan, doc, set_as_default):
    """The plan's runtime entry in DOC (an entry of that name must already name its binary), and
    default-runtime set to it when SET_AS_DEFAULT; what changed in PLAN's notes."""
    path, runtime_name, binary = plan.path, plan.name, plan.binary
    runtimes = doc.get("runtimes")
    if runtimes is None:
        runtimes = doc["runtimes"] = {}
    if not isinstance(runtimes, dict):
        raise DockerConfigError(f"{path}: runtimes is a JSON {type(runtimes).__name__}, not an object")
    entry = runtimes.get(runtime_name)
    if entry is not None:
        if not isinstance(entry, dict):
            raise DockerConfigError(f'{path}: runtimes["{runtime_name}"] is not an object')
        current = entry.get("path")
        if current != binary:
            raise DockerConfigError(
                f'{path}: runtimes["{runtime_name}"].path is {json.dumps(current)}, not {binary}: that entry is '
                f"another program's (or another install's); remove it, choose another --runtime-name, or name "
                f"that program with --runtime-binary if it is this cdi-shim")
    else:
        runtimes[runtime_name] = {"path": binary}
    others = sorted(set(runtimes) - {runtime_name})
    if others:
        plan.notes.append(f"kept the other runtimes: {', '.join(others)}")
    if set_as_default:
        previous = doc.get("default-runtime")
        doc["default-runtime"] = runtime_name
        if previous not in (None, runtime_name):
            plan.notes.append(f'default-runtime was "{previous}", now "{runtime_name}"')
    elif doc.get("default-runtime") not in (None, "runc", runtime_name):
        plan.notes.append(f'default-runtime stays "{doc["default-runtime"]}"')


def _set_cdi(plan, doc, cdi, spec_dirs, dockerd):
    """With CDI: features.cdi on in DOC and cdi-spec-dirs cdi-shim's SPEC_DIRS (refused on a Docker
    older than CDI_FROM); without, a note where this Docker could do it."""
    path, runtime_name, version = plan.path, plan.name, plan.version
    if cdi:
        if version is not None and version[:2] < CDI_FROM:
            raise DockerConfigError(
                f"Docker {_shown(version)} ({dockerd}) has no CDI support (it came in Docker {_shown(CDI_FROM)}): "
                "--cdi cannot be applied; upgrade Docker, or leave out --cdi and select the runtime "
                f"(docker run --runtime={runtime_name} -e NVIDIA_VISIBLE_DEVICES=0, or --gpus): cdi-shim then "
                "injects the devices itself")
        features = doc.get("features")
        if features is None:
            features = doc["features"] = {}
        if not isinstance(features, dict):
            raise DockerConfigError(f"{path}: features is a JSON {type(features).__name__}, not an object")
        features["cdi"] = True
        dirs = doc.get("cdi-spec-dirs")
        if dirs is not None and not (isinstance(dirs, list) and all(isinstance(d, str) for d in dirs)):
            raise DockerConfigError(f"{path}: cdi-spec-dirs is not a list of strings")
        wanted = list(spec_dirs)
        if (dirs if dirs is not None else list(DEFAULT_DOCKER_SPEC_DIRS)) != wanted:
            if dirs is not None:
                plan.notes.append(f"cdi-spec-dirs was {json.dumps(dirs)}, now cdi-shim's spec-dirs "
                                  f"{json.dumps(wanted)} (the daemon and the runtime must read the same specs)")
            doc["cdi-spec-dirs"] = wanted
        plan.notes.append("features.cdi on: docker run --device VENDOR/CLASS=NAME is injected by dockerd, and "
                          f"cdi-shim-runtime does the spec's hooks where --runtime={runtime_name} (or the default) "
                          "selects it")
    elif version is not None and version[:2] >= CDI_FROM and (doc.get("features") or {}).get("cdi") is not True:
        plan.notes.append("pass --cdi to have dockerd inject --device vendor/class=name itself (Docker 25+)")


def validate_with_dockerd(path, dockerd="dockerd"):
    """(True, "") when `dockerd --validate` accepts the file, (False, reason) when it refuses it,
    (None, why) when it cannot tell (not installed, or older than 23.0, which lacks --validate)."""
    try:
        out = subprocess.run([dockerd, "--validate", "--config-file", path], capture_output=True, text=True,
                             timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, str(err)
    text = (out.stderr or out.stdout).strip()
    if out.returncode == 0:
        return True, ""
    if "unknown flag" in text:
        return None, "this dockerd has no --validate"
    return False, text.splitlines()[-1] if text else f"exit status {out.returncode}"


def write_plan(plan, dockerd="dockerd", validate=True):
    """Write daemon.json: a candidate beside it, checked by dockerd where it can, renamed over it
    after a backup. Returns (written, backups, checked). Nothing changes when the check fails."""
    from .containerd_config import write_single

    def check(candidate):
        if not validate:
            return False
        ok, why = validate_with_dockerd(candidate, dockerd)
        if ok is False:
            raise DockerConfigError(f"dockerd refuses the new {plan.change.path} ({why}); nothing was changed")
        return bool(ok)

    written, backups, checked = write_single(plan.change, check)
    return written, backups, bool(checked)


def restart_docker():
    """Restart dockerd through systemd; returns a message, raises when this host cannot."""
    from .containerd import restart_unit

    return restart_unit("docker", "dockerd", DockerConfigError, timeout=180)


# --- reading (doctor) --------------------------------------------------------------------------------

def load_daemon_json(path=DEFAULT_DOCKER_CONFIG):
    """The daemon.json object, {} when the file is missing; DockerConfigError when unreadable."""
    text = read_daemon_json(path)
    return parse_daemon_json(path, text) if text is not None else {}
