"""Register cdi-shim-runtime as a containerd CRI runtime, safely (`cdi-shim runtime configure`).

Policy, in the order a node admin would ask about it:

* The config version comes from the file itself (``version = 2``: containerd 1.x, runtimes under
  ``plugins."io.containerd.grpc.v1.cri".containerd.runtimes``; ``version = 3``: containerd 2.x,
  ``plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes``), never from ``containerd config
  dump``. A file without ``version`` is version 1 to containerd: refused, with the hint to run
  ``containerd config migrate``. Only a missing or empty file takes its version from the
  installed ``containerd --version``.
* The runtime entry: ``runtime_type = "io.containerd.runc.v2"``, ``options.BinaryName`` = the
  absolute path of ``cdi-shim-runtime``, ``options.SystemdCgroup`` copied from the runc entry (or
  true exactly when PID 1 is systemd), and a ``container_annotations`` allow-list made from the
  configured annotation prefixes: containerd passes no other annotations to a runtime. Never
  ``pod_annotations``: whoever creates a pod writes its annotations, so allowing them would let
  any pod ask for any device past the device plugin. A new entry starts as a copy of the runc
  entry's settings (its ``Root``, ``ShimCgroup``, ... apply to the wrapped runc too).
* ``default_runtime_name`` is changed only when asked (``set_as_default``).
* Edits go through tomlkit: comments, order and unrelated settings stay as they were, and a second
  run changes nothing. A drop-in (``drop_in=DIR``) goes to ``DIR/99-cdi-shim.toml`` and the main
  file imports it. containerd 1.x replaces a plugin's whole section with an imported file's (its
  issue 5837: ``containerd config dump`` here shows the runc runtime and every other CRI setting
  of the main file gone), so a version-2 drop-in carries a copy of the main file's CRI section;
  containerd 2.x merges imports, so a version-3 drop-in carries only our entry.
* Never break the node: new text is written beside the old file, loaded by the installed
  containerd (``containerd --config NEW config dump``) and checked (our runtime, its BinaryName,
  the default runtime still defined), and only then renamed over the old file, after a backup.
"""
import difflib
import glob
import os
import re
import shlex
import shutil
import sys
import time

import tomlkit

from .containerd import MIGRATE_BY_HAND, ContainerdConfigError, containerd_dump, containerd_migrate, containerd_version
from .containerd_toml import (CRI_PLUGIN, DEFAULT_CDI_SPEC_DIRS, LOADS_FROM, RUNTIME_EXECUTABLE, Edit, apply_cdi,
                              apply_runtime, dropin_document, ensure_import, file_version, lookup, parse_toml,
                              read_text, unwrap)

DEFAULT_CONTAINERD_CONFIG = "/etc/containerd/config.toml"
DROP_IN_NAME = "99-cdi-shim.toml"
CONTAINERD_FOR = {2: "containerd 1.x", 3: "containerd 2.x", 4: "containerd 2.3+"}
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


# --- facts about the node ---------------------------------------------------------------------

def runtime_binary(explicit=None, root=None):
    """Absolute path of cdi-shim-runtime: the given one, the one beside this interpreter, or PATH's.

    ROOT (a node tree being set up): the given path is the node's, so it may be an executable
    inside ROOT rather than here."""
    if explicit:
        path = os.path.abspath(explicit)
        inside = os.path.join(root, path.lstrip("/")) if root and root != "/" else None
        if not os.access(path, os.X_OK) and not (inside and os.access(inside, os.X_OK)):
            raise ContainerdConfigError(f"{inside or path} is not an executable file")
        return path
    from ..installation import bin_dir, stable_program

    if os.access(os.path.join(bin_dir(), RUNTIME_EXECUTABLE), os.X_OK):
        return stable_program(RUNTIME_EXECUTABLE)   # the node prefix's `current` for a release
    found = shutil.which(RUNTIME_EXECUTABLE)
    if found:
        return os.path.abspath(found)
    raise ContainerdConfigError(f"{RUNTIME_EXECUTABLE} is neither beside {sys.executable} nor on PATH: "
                                "install cdi-shim, or name it with --runtime-binary")


def check_runtime_name(name):
    if not _DNS_LABEL.match(name or ""):
        raise ContainerdConfigError(
            f'runtime name "{name}" is not a DNS label (lowercase letters, digits and "-", at most 63): '
            "a RuntimeClass handler must be one, so no pod could select it")


def _configure_words(path, containerd):
    """`cdi-shim runtime configure` for PATH with the containerd asked, as words to paste."""
    words = ["cdi-shim", "runtime", "configure", "--config", path]
    return words + (["--containerd-binary", containerd] if containerd != "containerd" else [])


def _newest_version(installed):
    """The config version the installed containerd's `config default` writes (None: not installed)."""
    if installed is None:
        return None
    return max(v for v, first in LOADS_FROM.items() if tuple(installed[:2]) >= first)


# --- the whole operation -------------------------------------------------------------------------

class FileChange:
    def __init__(self, path, old, new):
        self.path, self.old, self.new = path, old, new

    @property
    def changed(self):
        """Whether the file's parsed content changes: new text that differs only in whitespace
        (or comments) from the old is not written, so a rerun never rewrites, backs up or asks
        for a restart over a blank line."""
        if self.old == self.new:
            return False
        return self.old is None or not _same_content(self.old, self.new)

    def diff(self):
        return "".join(difflib.unified_diff(
            (self.old or "").splitlines(True), self.new.splitlines(True),
            fromfile=self.path if self.old is not None else "/dev/null", tofile=self.path))


def _same_content(old, new):
    try:
        return _load_toml(old) == _load_toml(new)
    except Exception:   # an old file that does not parse: the new text replaces it
        return False


class Plan:
    """Everything `configure` will write, decided before anything is written."""

    def __init__(self, path, version, version_source, name, binary, patterns):
        self.path, self.version, self.version_source = path, version, version_source
        self.name, self.binary, self.patterns = name, binary, tuple(patterns)
        self.changes, self.notes, self.warnings = [], [], []
        self.drop_in = None
        self.cdi = None
        self.migrated_from = None   # the file's version when `containerd config migrate` rewrote it

    @property
    def changed(self):
        return any(change.changed for change in self.changes)

    def diff(self):
        return "".join(change.diff() for change in self.changes if change.changed)


def _annotation_patterns(prefixes):
    """The container_annotations patterns of the annotation PREFIXES ("PREFIX*"), each once."""
    patterns = []
    for prefix in prefixes:
        pattern = prefix + "*"
        if pattern not in patterns:
            patterns.append(pattern)
    if not patterns:
        raise ContainerdConfigError("no annotation prefixes are configured: containerd would pass no CDI "
                                    "annotation to the runtime")
    return patterns


def _migrated(path, doc, installed, newest, migrate, containerd):
    """(DOC, None), or, where MIGRATE (plan_configure's) has it so, (the installed containerd's
    `config migrate` of PATH, the version it was migrated from). A file whose sections the
    installed containerd 2.x no longer reads is refused unless migrated."""
    raw_version = unwrap(doc.get("version", 1)) if doc else None
    if isinstance(raw_version, bool):
        raw_version = None  # file_version says what is wrong with it
    migrated_from = None
    old_sections = isinstance(raw_version, int) and newest is not None and installed[0] >= 2 and \
        CRI_PLUGIN.get(raw_version) != CRI_PLUGIN[newest]
    if migrate == "auto":
        migrate = old_sections
    if migrate and (installed is None or installed[0] < 2):
        which = f"containerd {installed[0]}.{installed[1]}" if installed else "no containerd (not installed)"
        raise ContainerdConfigError(f"--migrate runs the installed containerd's `config migrate`, which containerd "
                                    f"2.0 and later have; here there is {which}")
    if isinstance(raw_version, int) and newest is not None and raw_version < newest and (migrate or old_sections):
        if not migrate:
            # what doctor says of it: 2.x migrates it in memory at every start, so the runtime
            # entry and enable_cdi must be written where the migrated file has them
            raise ContainerdConfigError(
                f"{path} is a version {raw_version} config; the installed containerd {installed[0]}.{installed[1]} "
                f"reads version {newest}: this file is migrated to version {newest} in memory at every start, so "
                f"entries written in version {raw_version}'s sections are not what it uses: migrate it first, "
                f"`{shlex.join(_configure_words(path, containerd) + ['--migrate'])}` (runs this containerd's "
                f"`config migrate` and installs its output, after a backup), or {MIGRATE_BY_HAND}")
        doc = parse_toml(f"`containerd config migrate` of {path}", containerd_migrate(path, containerd))
        migrated_from = raw_version
    return doc, migrated_from


def _config_version(path, doc, old, config_version, installed, newest, migrated_from):
    """(the version DOC declares or None, the version to write, where that came from): the file's
    own, else --config-version (CONFIG_VERSION), else what the installed containerd writes; refused
    when it disagrees with --config-version or the installed containerd cannot load it."""
    declared = file_version(doc, path)
    if migrated_from is not None and declared != newest:
        raise ContainerdConfigError(f"`containerd config migrate` of {path} gave version {declared}, not {newest}; "
                                    "nothing was changed")
    wanted = None if config_version in (None, "auto") else int(config_version)
    if wanted is not None and wanted not in CRI_PLUGIN:
        raise ContainerdConfigError(f"config version {wanted} is not one cdi-shim writes (2, 3 or 4)")
    if declared is not None:
        if wanted is not None and wanted != declared:
            raise ContainerdConfigError(
                f"{path} is a version {declared} config, but --config-version {wanted} was given: headers of the "
                f"wrong version would be ignored by containerd; convert the file first (`containerd config migrate`)")
        version, source = declared, "the file's version key"
        if migrated_from is not None:
            source = f"`containerd config migrate` of the file's version {migrated_from}"
    elif wanted is not None:
        version, source = wanted, "--config-version"
    elif installed is not None:
        # what the installed containerd's `config default` writes
        version = newest
        source = f"the installed containerd {installed[0]}.{installed[1]} (the file is {'empty' if old else 'missing'})"
    else:
        raise ContainerdConfigError(
            f"{path} is {'empty' if old else 'missing'} and containerd is not installed, so the config version "
            "cannot be told: pass --config-version 2 (containerd 1.x), 3 (containerd 2.0-2.2) or 4 (containerd 2.3+)")
    if installed is not None and tuple(installed[:2]) < LOADS_FROM[version]:
        first = LOADS_FROM[version]
        raise ContainerdConfigError(
            f"{path} is a version {version} config, which the installed containerd {installed[0]}.{installed[1]} "
            f"cannot load (version {version} needs containerd {first[0]}.{first[1]} or later"
            + (": run `containerd config migrate` on a newer containerd only" if version == 4 else "") + ")")
    return declared, version, source


def plan_configure(path=DEFAULT_CONTAINERD_CONFIG, runtime_name="nvidia", binary=None,
                   annotation_prefixes=("cdi.k8s.io/",), set_as_default=False, config_version="auto",
                   drop_in=None, containerd="containerd", import_as=None, binary_root=None,
                   spec_dirs=DEFAULT_CDI_SPEC_DIRS, enable_cdi=None, migrate=False):
    """Decide the new text of the config file(s); reads only.

    `import_as` is the text the main file's `imports` names the drop-in by (default: its absolute
    path); a path relative to the main file's directory stays right when the tree is mounted
    elsewhere (a node image under --root), since containerd resolves it against the main file.
    `binary_root`: the tree in which an explicit `binary` must be executable (besides here).
    On containerd 1.7+ also keeps its enable_cdi / cdi_spec_dirs consistent with `spec_dirs`
    (cdi-shim's); `enable_cdi` True/False sets enable_cdi, None keeps it. `migrate`: a file older
    than the installed containerd 2.x writes is first rewritten by its `config migrate`; without
    it such a file is refused, with that fix; "auto" (install --node): migrated exactly when it
    would be refused."""
    check_runtime_name(runtime_name)
    # a linked config stays linked: the file it names is edited (a link others control is refused)
    path = trusted_path(path, ContainerdConfigError)
    binary = runtime_binary(binary, root=binary_root)
    patterns = _annotation_patterns(annotation_prefixes)
    old = read_text(path)
    doc = parse_toml(path, old) if old is not None else tomlkit.document()
    installed = containerd_version(containerd)
    newest = _newest_version(installed)
    doc, migrated_from = _migrated(path, doc, installed, newest, migrate, containerd)
    declared, version, source = _config_version(path, doc, old, config_version, installed, newest, migrated_from)
    plan = Plan(path, version, source, runtime_name, binary, patterns)
    plan.notes.append(f"config version {version} ({CONTAINERD_FOR[version]}), from {source}"
                      + (f"; installed: containerd {installed[0]}.{installed[1]}" if installed else ""))
    plan.migrated_from = migrated_from
    if migrated_from is not None:
        plan.notes.append(f"migrated {path} from version {migrated_from} to {version} with the installed containerd's "
                          "`config migrate` (imported files' settings folded in, the imports kept)")
    if declared is None:
        doc["version"] = version  # before the first table
    edit = Edit()
    if drop_in:
        directory = trusted_path(drop_in, ContainerdConfigError)
        dropin_path = os.path.join(directory, DROP_IN_NAME)
        plan.drop_in = dropin_path
        dropin_old = read_text(dropin_path)
        dropin_doc = dropin_document(doc, dropin_old, version, dropin_path)
        apply_runtime(dropin_doc, version, runtime_name, binary, patterns, set_as_default, source=doc, edit=edit)
        apply_cdi(dropin_doc, version, spec_dirs, enable_cdi, source=doc, installed=installed, edit=edit)
        if version == 2:
            edit.notes.append("the drop-in carries a copy of the main file's CRI plugin section (containerd 1.x "
                              "replaces a plugin's whole section on import); later edits to that section belong "
                              "in the drop-in, or rerun this command")
        ensure_import(doc, import_as or dropin_path, os.path.dirname(path))
        plan.changes.append(FileChange(dropin_path, dropin_old, tomlkit.dumps(dropin_doc)))
        plan.changes.append(FileChange(path, old, tomlkit.dumps(doc)))
    else:
        apply_runtime(doc, version, runtime_name, binary, patterns, set_as_default, edit=edit)
        apply_cdi(doc, version, spec_dirs, enable_cdi, installed=installed, edit=edit)
        plan.changes.append(FileChange(path, old, tomlkit.dumps(doc)))
    plan.notes += edit.notes
    plan.cdi = edit.cdi
    plan.notes.append(f'runtime "{runtime_name}": BinaryName = {binary}; container_annotations allow '
                      f"{', '.join(patterns)} (never pod_annotations)")
    plan.warnings += edit.warnings
    for change in plan.changes:  # what we wrote must parse back
        parse_toml(change.path, change.new)
    return plan


# --- validation and writing --------------------------------------------------------------------

def _load_toml(text):
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        return tomlkit.parse(text).unwrap()
    return tomllib.loads(text)


def check_dump(dump_text, name, binary, patterns, cdi=None):
    """Check containerd's view of a config; returns the runtime names, raises on a problem."""
    try:
        dump = _load_toml(dump_text)
    except Exception as err:
        raise ContainerdConfigError(f"cannot read `containerd config dump` output: {err}") from None
    plugins = dump.get("plugins", {})
    section = None
    for version in (2, 3):
        section = (plugins.get(CRI_PLUGIN[version]) or {}).get("containerd")
        if section and "runtimes" in section:
            break
    if not section:
        raise ContainerdConfigError("containerd's view of the config has no CRI runtimes section")
    runtimes = section.get("runtimes") or {}
    entry = runtimes.get(name)
    if entry is None:
        raise ContainerdConfigError(f'containerd does not see runtime "{name}" (another imported file may '
                                    "replace the CRI section)")
    if (entry.get("options") or {}).get("BinaryName") != binary:
        raise ContainerdConfigError(f'containerd sees runtime "{name}" with BinaryName '
                                    f"{(entry.get('options') or {}).get('BinaryName')!r}, not {binary}")
    missing = [p for p in patterns if p not in (entry.get("container_annotations") or [])]
    if missing:
        raise ContainerdConfigError(f'containerd sees runtime "{name}" without container_annotations {missing}')
    section_parent = None
    for version in (2, 3):
        candidate = plugins.get(CRI_PLUGIN[version]) or {}
        if candidate.get("containerd") is section:
            section_parent = candidate
    cri = section_parent or {}
    if cdi and cri:
        if bool(cri.get("enable_cdi")) != cdi["enable_cdi"]:
            raise ContainerdConfigError(f"containerd sees enable_cdi = {str(bool(cri.get('enable_cdi'))).lower()}, "
                                        f"not {str(cdi['enable_cdi']).lower()} (another imported file may set it)")
        if cdi["cdi_spec_dirs"] is not None and list(cri.get("cdi_spec_dirs") or []) != list(cdi["cdi_spec_dirs"]):
            raise ContainerdConfigError(f"containerd sees cdi_spec_dirs = {cri.get('cdi_spec_dirs')}, not "
                                        f"{list(cdi['cdi_spec_dirs'])} (another imported file may set it)")
    default = section.get("default_runtime_name") or "runc"
    if default not in runtimes:
        raise ContainerdConfigError(f'containerd would have no runtime for default_runtime_name "{default}"; '
                                    "its CRI plugin would not start")
    return sorted(runtimes)


def _write_beside(path, text, mode):
    """A new candidate file beside PATH, with a name of its own (parallel runs never share one)."""
    import tempfile

    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, candidate = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.cdi-shim-new.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(candidate, mode)
    except BaseException:
        os.unlink(candidate)
        raise
    return candidate


class configure_lock:
    """An exclusive flock on a lock file beside the config (``.NAME.cdi-shim.lock``), held from
    reading the file to renaming the new one over it: parallel runs then follow one another
    instead of each editing the same old text and the last rename dropping the others' entries.
    The holder removes the file before it lets go, so nothing is left beside the config; a run
    that waited on a file since removed (or replaced) takes the lock again on the current one."""

    def __init__(self, path, wait_note=None):
        self.path = trusted_path(path, ContainerdConfigError)
        directory = os.path.dirname(self.path)
        self.lock_path = os.path.join(directory, f".{os.path.basename(self.path)}.cdi-shim.lock")
        self.wait_note, self.fd = wait_note, -1

    def __enter__(self):
        import fcntl

        noted = False
        while True:
            try:
                os.makedirs(os.path.dirname(self.lock_path), exist_ok=True)
                fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            except OSError as err:
                raise ContainerdConfigError(f"cannot open the lock file {self.lock_path}: {err.strerror}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if self.wait_note and not noted:
                    self.wait_note(f"waiting for another run that edits {self.path} (lock {self.lock_path})")
                    noted = True
                fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                current = os.stat(self.lock_path, follow_symlinks=False)
            except FileNotFoundError:
                current = None
            held = os.fstat(fd)
            if current is not None and (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino):
                self.fd = fd
                return self
            os.close(fd)  # its holder removed it while we waited: lock the current file

    def __exit__(self, *exc):
        try:
            os.unlink(self.lock_path)  # while still held: a waiter then sees it gone and retries
        except OSError:
            pass
        os.close(self.fd)
        self.fd = -1


def trusted_path(path, error):
    """PATH with its links resolved, each followed only where cdi.safeio.resolve_trusted's rule
    allows (a link another user owns or can replace is not: it would choose which root-owned
    file we rewrite); ERROR (an exception class) says why not."""
    from cdi.safeio import UnsafePath, resolve_trusted

    try:
        return resolve_trusted(path)
    except UnsafePath as err:
        raise error(f"{path}: {err}") from None


def config_mode(mode):
    """The mode a config file containerd (root) reads is written with: its old mode, never more
    than 0644 (a file others could write would let them choose what root runs)."""
    return mode & 0o644


def _backup(path):
    stamp = time.strftime("%Y%m%d-%H%M%S")
    backup, n = f"{path}.bak-{stamp}", 1
    while os.path.lexists(backup):
        n += 1
        backup = f"{path}.bak-{stamp}.{n}"
    info = os.stat(path)
    with open(path, "rb") as stream:
        data = stream.read()
    # Made private, then given the config's mode at most: never a moment writable by others.
    fd = os.open(backup, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, config_mode(info.st_mode))
        os.utime(fd, ns=(info.st_atime_ns, info.st_mtime_ns))
    finally:
        os.close(fd)
    return backup


def read_config_text(path, limit, error):
    """The UTF-8 text of the config file PATH (at most LIMIT bytes), or None when it does not exist;
    ERROR (an exception class) names the file for anything else."""
    from cdi.safeio import UnsafeFile, read_regular_file

    try:
        data, _ = read_regular_file(path, limit)
    except FileNotFoundError:
        return None
    except UnsafeFile as err:
        raise error(f"{path}: {err}") from None
    except OSError as err:
        raise error(f"cannot read {path}: {err.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise error(f"{path}: not UTF-8 text (byte {err.start}); its engine cannot read it either") from None


def write_single(change, check=None):
    """Write one changed file: a candidate beside it, CHECK(candidate) (raises to refuse it), then
    a backup of the old file and the rename. Returns (written, backups, check's result); nothing
    changes when the check raises."""
    if not change.changed:
        return [], [], None
    mode = config_mode(os.stat(change.path).st_mode) if change.old is not None else 0o644
    candidate = _write_beside(change.path, change.new, mode)
    try:
        checked = check(candidate) if check else None
        backups = [_backup(change.path)] if change.old is not None else []
        os.replace(candidate, change.path)
        candidate = None
        return [change.path], backups, checked
    finally:
        if candidate is not None:
            try:
                os.unlink(candidate)
            except FileNotFoundError:
                pass


def write_plan(plan, containerd="containerd", validate=True):
    """Write the changed files: candidates beside the old ones, checked by containerd, then renamed.

    Returns (written, backups, checked) where checked says whether containerd loaded the result.
    Nothing is renamed when the check fails; the candidates are removed."""
    changes = [c for c in plan.changes if c.changed]
    if not changes:
        return [], [], False
    candidates = {}
    try:
        for change in changes:
            mode = config_mode(os.stat(change.path).st_mode) if change.old is not None else 0o644
            candidates[change.path] = _write_beside(change.path, change.new, mode)
        checked = False
        if validate:
            main_candidate = candidates.get(plan.path)
            if plan.drop_in and plan.drop_in in candidates:
                # the main candidate must import the drop-in candidate, not the old drop-in
                check_doc = tomlkit.parse(next(c.new for c in plan.changes if c.path == plan.path))
                main_dir = os.path.dirname(plan.path)
                imports = [i for i in unwrap(check_doc.get("imports", [])) or []
                           if os.path.normpath(os.path.join(main_dir, i)) != plan.drop_in]
                check_doc["imports"] = imports + [candidates[plan.drop_in]]
                main_text = tomlkit.dumps(check_doc)
                mode = config_mode(os.stat(plan.path).st_mode) if os.path.exists(plan.path) else 0o644
                main_candidate = _write_beside(plan.path + ".check", main_text, mode)
                candidates[plan.path + ".check"] = main_candidate
            if main_candidate is None:
                main_candidate = plan.path
            ok, text = containerd_dump(main_candidate, containerd)
            if ok is False:
                raise ContainerdConfigError(f"containerd refuses the new config ({text}); nothing was changed")
            if ok:
                check_dump(text, plan.name, plan.binary, plan.patterns, plan.cdi)
                checked = True
        written, backups = [], []
        # the drop-in first, so the main file never imports a file that is not there yet
        for change in sorted(changes, key=lambda c: c.path == plan.path):
            if change.old is not None:
                backups.append(_backup(change.path))
            os.replace(candidates.pop(change.path), change.path)
            written.append(change.path)
        return written, backups, checked
    finally:
        for candidate in candidates.values():
            try:
                os.unlink(candidate)
            except FileNotFoundError:
                pass


# --- reading runtime names (for RuntimeClass checks) --------------------------------------------

def configured_runtimes(path):
    """(default_runtime_name, sorted runtime names) as containerd would load `path` and its imports.

    Version 2 (containerd 1.x): an imported file's CRI section replaces the earlier one whole.
    Version 3 (containerd 2.x): sections merge."""
    text = read_text(path)
    if text is None:
        raise ContainerdConfigError(f"{path} does not exist")
    doc = parse_toml(path, text)
    version = file_version(doc, path)
    if version is None:
        return "runc", ["runc"]
    files = [(path, doc)]
    imports = unwrap(doc.get("imports", [])) or []
    for pattern in imports:
        full = pattern if os.path.isabs(pattern) else os.path.join(os.path.dirname(path), pattern)
        for name in sorted(glob.glob(full)) if glob.has_magic(full) else [full]:
            imported_text = read_text(name)
            if imported_text is None:
                continue
            files.append((name, parse_toml(name, imported_text)))
    default, names, seen_section = "runc", {"runc"}, False
    for name, one in files:
        section = lookup(one, ["plugins", CRI_PLUGIN[version]])
        if section is None:
            continue
        runtimes = unwrap(lookup(section, ["containerd", "runtimes"])) or {}
        this_default = unwrap(lookup(section, ["containerd", "default_runtime_name"]))
        if version == 2:
            names = set(runtimes) if runtimes else {"runc"}
            default = this_default or "runc"
        else:
            names = (names if seen_section else {"runc"}) | set(runtimes)
            default = this_default or default
        seen_section = True
    return default, sorted(names)
