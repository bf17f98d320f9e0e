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
import copy
import difflib
import fnmatch
import glob
import os
import re
import shutil
import sys
import time

import tomlkit
from tomlkit.items import AoT, InlineTable, KeyType, SingleKey, Table

from .containerd import ContainerdConfigError, containerd_dump, containerd_version, pid1_init

DEFAULT_CONTAINERD_CONFIG = "/etc/containerd/config.toml"
DROP_IN_NAME = "99-cdi-shim.toml"
RUNTIME_EXECUTABLE = "cdi-shim-runtime"
RUNC_V2 = "io.containerd.runc.v2"
CRI_PLUGIN = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}
CONTAINERD_FOR = {2: "containerd 1.x", 3: "containerd 2.x"}
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


# --- facts about the node ---------------------------------------------------------------------

def runtime_binary(explicit=None):
    """Absolute path of cdi-shim-runtime: the given one, the one beside this interpreter, or PATH's."""
    if explicit:
        path = os.path.abspath(explicit)
        if not os.access(path, os.X_OK):
            raise ContainerdConfigError(f"{path} is not an executable file")
        return path
    beside = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), RUNTIME_EXECUTABLE)
    if os.access(beside, os.X_OK):
        return beside
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


# --- reading ------------------------------------------------------------------------------------

def _read(path):
    try:
        with open(path, encoding="utf-8") as stream:
            return stream.read()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise ContainerdConfigError(f"cannot read {path}: {err}") from None


def _parse(path, text):
    try:
        return tomlkit.parse(text)
    except Exception as err:  # tomlkit's ParseError and friends
        raise ContainerdConfigError(f"{path} is not valid TOML ({err}); containerd could not load it either, "
                                    "fix it first") from None


def file_version(doc, path):
    """The config version a parsed file declares; None for a file with no settings at all."""
    if "version" not in doc:
        if not doc:  # empty, or comments only
            return None
        raise ContainerdConfigError(
            f'{path} has no "version" key, so containerd reads it as version 1, which cdi-shim does not '
            f"edit (and containerd 2.x no longer loads): convert it with `containerd config migrate` "
            f"(containerd 2.x) or rewrite it from `containerd config default`, then run this again")
    version = doc["version"]
    if isinstance(version, bool) or not isinstance(version, int):
        raise ContainerdConfigError(f'{path}: "version" must be an integer, not {version!r}')
    version = int(version)
    if version == 1:
        raise ContainerdConfigError(
            f"{path} is a version 1 config, which cdi-shim does not edit (containerd 2.x no longer loads it): "
            "convert it with `containerd config migrate` (containerd 2.x) or rewrite it from "
            "`containerd config default`, then run this again")
    if version not in CRI_PLUGIN:
        raise ContainerdConfigError(
            f"{path} declares config version {version}, which cdi-shim does not know (it writes version 2 "
            "for containerd 1.x and version 3 for containerd 2.x); refusing to edit it")
    return version


def _lookup(container, keys):
    for key in keys:
        if container is None or not hasattr(container, "get"):
            return None
        container = container.get(key)
    return container


def _unwrap(value):
    return value.unwrap() if hasattr(value, "unwrap") else value


def runtimes_of(doc, version):
    """The `runtimes` table of a parsed document (or None)."""
    return _lookup(doc, ["plugins", CRI_PLUGIN[version], "containerd", "runtimes"])


# --- rendering ----------------------------------------------------------------------------------

def _key(name):
    return name if _BARE_KEY.match(name) else tomlkit.string(name).as_string()


def _header(version, *names):
    quote = '"' if version == 2 else "'"
    return ".".join(["plugins", f"{quote}{CRI_PLUGIN[version]}{quote}"] + [_key(n) for n in names])


def _value(version, value):
    if isinstance(value, str) and version == 3 and "'" not in value and "\n" not in value:
        return tomlkit.string(value, literal=True).as_string()
    if isinstance(value, list):
        return "[" + ", ".join(_value(version, v) for v in value) + "]"
    return tomlkit.item(value).as_string()


def _is_table(item):
    """A table of any shape containerd accepts: [header] (also split over several headers,
    tomlkit's out-of-order proxy) or { inline }."""
    return isinstance(item, (Table, InlineTable)) or type(item).__name__ == "OutOfOrderTableProxy"


def _add(container, key, value):
    """container[key] = value for every shape: an out-of-order proxy has no append, and an
    inline table can hold no [header] table (so VALUE goes in as an inline table)."""
    if isinstance(container, InlineTable) and isinstance(value, Table):
        value = _inline(value)
    if hasattr(container, "append"):
        container.append(key, value)
    else:
        container[key] = value


def _inline(table):
    """An inline-table copy of a table (its plain values and sub-tables)."""
    result = tomlkit.inline_table()
    for key, item in _raw_items(table):
        result.append(key, _inline(item) if isinstance(item, Table) else tomlkit.item(_unwrap(item)))
    return result


def _indent_of(table):
    return table.trivia.indent if isinstance(table, Table) else ""


def _key_indent(table, fallback):
    """Indentation of the first plain key of a table (its style for new keys)."""
    if isinstance(table, Table):
        for key, item in table.value.body:
            if key is not None and not isinstance(item, (Table, AoT)):
                return item.trivia.indent
    return fallback


def _raw_items(table):
    """(key, tomlkit item) pairs of a table, as written (items() converts some values)."""
    if not isinstance(table, (Table, InlineTable)):  # an out-of-order proxy: its items
        for key in table:
            yield key, table[key]
        return
    for key, item in table.value.body:
        if key is not None:
            yield key.key, item


def _new_entry(version, name, runc, binary, patterns, systemd, indent):
    """The text of a new runtime entry: a copy of the runc entry's plain settings, then ours."""
    inner = indent + "  "
    lines = [f"{indent}[{_header(version, 'containerd', 'runtimes', name)}]",
             f"{inner}runtime_type = {_value(version, RUNC_V2)}"]
    skip = {"runtime_type", "pod_annotations", "container_annotations", "options"}
    if _is_table(runc):
        for key, item in _raw_items(runc):
            if key not in skip and not isinstance(item, (Table, InlineTable, AoT)):
                lines.append(f"{inner}{_key(key)} = {item.as_string().strip()}")
    lines.append(f"{inner}container_annotations = {_value(version, list(patterns))}")
    lines += ["", f"{inner}[{_header(version, 'containerd', 'runtimes', name, 'options')}]"]
    options = runc.get("options") if _is_table(runc) else None
    ours = {"BinaryName": binary, "SystemdCgroup": systemd}
    if _is_table(options):
        for key, item in _raw_items(options):
            if isinstance(item, (Table, InlineTable, AoT)):
                continue
            text = _value(version, ours.pop(key)) if key in ours else item.as_string().strip()
            lines.append(f"{inner}  {_key(key)} = {text}")
    for key, value in ours.items():
        lines.append(f"{inner}  {key} = {_value(version, value)}")
    return "\n".join(lines) + "\n\n"


def _ensure_table(container, key, version=2):
    """container[key] as a table, creating an implicit (super) table when missing."""
    if key not in container:
        name = key
        if not _BARE_KEY.match(key) and version == 3 and "'" not in key:
            name = SingleKey(key, t=KeyType.Literal)  # containerd 2.x writes 'io.containerd...'
        _add(container, name, tomlkit.table(is_super_table=True))
    table = container[key]
    if not hasattr(table, "get"):
        raise ContainerdConfigError(f'"{key}" is not a table')
    return table


def _insert_entry(doc, version, name, text, indent):
    runtimes = doc
    for key in ("plugins", CRI_PLUGIN[version], "containerd", "runtimes"):
        runtimes = _ensure_table(runtimes, key, version)
    parsed = tomlkit.parse(text)
    entry = runtimes_of(parsed, version)[name]
    blank = False
    if isinstance(runtimes, Table) and runtimes.value.body:
        # a blank line between the previous entry and ours, as `containerd config default` writes
        blank = not runtimes.as_string().endswith("\n\n")
    else:
        blank = bool(doc.body) and not tomlkit.dumps(doc).endswith("\n\n")
    _add(runtimes, name, entry)
    if not isinstance(runtimes, InlineTable):
        runtimes[name].trivia.indent = ("\n" if blank else "") + indent


def _set(table, key, value):
    """table[key] = value, touching nothing when it is already so (keeps the text as it was)."""
    if key in table and _unwrap(table[key]) == value and type(_unwrap(table[key])) is type(value):
        return False
    table[key] = value
    return True


class Edit:
    """What `configure` decided, for the report and the tests."""

    def __init__(self):
        self.notes, self.warnings = [], []


def _systemd_choice(runc):
    options = runc.get("options") if _is_table(runc) else None
    if hasattr(options, "get") and "SystemdCgroup" in options and isinstance(_unwrap(options["SystemdCgroup"]), bool):
        value = _unwrap(options["SystemdCgroup"])
        return value, f'SystemdCgroup = {str(value).lower()}: copied from the "runc" runtime'
    systemd, init = pid1_init()
    why = "PID 1 is systemd" if systemd else f'PID 1 is "{init}", not systemd'
    return systemd, f'SystemdCgroup = {str(systemd).lower()}: the "runc" runtime sets none and {why}'


def _find_runc(doc, version):
    runtimes = runtimes_of(doc, version)
    if not hasattr(runtimes, "get"):
        return None
    runc = runtimes.get("runc")
    if runc is None:
        default = _lookup(doc, ["plugins", CRI_PLUGIN[version], "containerd", "default_runtime_name"])
        candidate = runtimes.get(_unwrap(default)) if default is not None else None
        if hasattr(candidate, "get") and _unwrap(candidate.get("runtime_type")) == RUNC_V2:
            runc = candidate
    return runc


def apply_runtime(doc, version, name, binary, patterns, set_as_default=False, source=None, edit=None):
    """Add or update runtime `name` in a parsed document; returns the Edit (notes, warnings).

    `source` is the document whose runc entry is copied (the main file for a drop-in)."""
    edit = edit or Edit()
    source = doc if source is None else source
    runc = _find_runc(source, version)
    systemd, why = _systemd_choice(runc)
    edit.notes.append(why)
    runtimes = runtimes_of(doc, version)
    default_name = _unwrap(_lookup(source, ["plugins", CRI_PLUGIN[version], "containerd", "default_runtime_name"]))
    default_name = default_name or "runc"
    if set_as_default:
        default_name = name
    runtime_indent = _indent_of(runc).lstrip("\n") if isinstance(runc, Table) and source is doc else ""
    if isinstance(runtimes, InlineTable) or isinstance(runc, InlineTable):
        runtime_indent = ""
    if not hasattr(runtimes, "get") or name not in runtimes:
        defined = set(runtimes) if hasattr(runtimes, "keys") else set()
        if version == 3 and source is not doc:
            # containerd 2.x merges imported files: the main file's runtimes stay defined
            source_runtimes = runtimes_of(source, version)
            defined |= set(source_runtimes) if hasattr(source_runtimes, "keys") else set()
        if not defined:
            # the file defines no runtime yet, so containerd uses its built-in "runc"; containerd 1.x
            # replaces that list with the file's as soon as it defines one: keep runc defined
            runc_text = (f"[{_header(version, 'containerd', 'runtimes', 'runc')}]\n"
                         f"  runtime_type = {_value(version, RUNC_V2)}\n\n")
            _insert_entry(doc, version, "runc", runc_text, runtime_indent)
            defined.add("runc")
            edit.notes.append('added a plain "runc" runtime: a file that defines any runtime replaces '
                              "containerd's built-in list, and runc must stay defined")
        if default_name not in defined | {name}:
            raise ContainerdConfigError(
                f'default_runtime_name is "{default_name}", but no runtime of that name is configured; '
                "containerd's CRI plugin would not start: fix that first")
        _insert_entry(doc, version, name, _new_entry(version, name, runc, binary, patterns, systemd, runtime_indent),
                      runtime_indent)
        entry = runtimes_of(doc, version)[name]
    else:
        entry = runtimes[name]
        if not hasattr(entry, "get"):
            raise ContainerdConfigError(f'runtime "{name}" is not a table')
        previous = _unwrap(entry.get("runtime_type"))
        if _set(entry, "runtime_type", RUNC_V2) and previous:
            edit.warnings.append(f'runtime "{name}" had runtime_type "{previous}"; now "{RUNC_V2}" '
                                 f"(cdi-shim-runtime is a runc-compatible binary)")
        current = _unwrap(entry.get("container_annotations", []))
        if not isinstance(current, list):
            raise ContainerdConfigError(f'runtime "{name}": container_annotations must be a list')
        missing = [p for p in patterns if p not in current]
        if missing:
            if "container_annotations" in entry:
                for pattern in missing:
                    entry["container_annotations"].append(pattern)
            else:
                entry["container_annotations"] = list(patterns)
        if "options" not in entry:
            _add(entry, "options", tomlkit.inline_table() if isinstance(entry, InlineTable) else tomlkit.table())
        options = entry["options"]
        _set(options, "BinaryName", binary)
        _set(options, "SystemdCgroup", systemd)
    pod = _unwrap(entry.get("pod_annotations", [])) or []
    leaked = [p for p in pod if any(fnmatch.fnmatchcase(pp.rstrip("*") + "x", p) for pp in patterns)]
    if leaked:
        edit.warnings.append(
            f'runtime "{name}" has pod_annotations {leaked}: any pod could then request any device past the '
            "device plugin; remove them (cdi-shim only needs container_annotations)")
    if set_as_default:
        containerd_table = _lookup(doc, ["plugins", CRI_PLUGIN[version], "containerd"])
        _set(containerd_table, "default_runtime_name", name)
        edit.warnings.append(f'default_runtime_name = "{name}": every pod without a RuntimeClass now goes '
                             f"through {RUNTIME_EXECUTABLE}")
    return edit


# --- drop-in --------------------------------------------------------------------------------------

def _imports_cover(imports, path, main_dir):
    for pattern in imports:
        if not isinstance(pattern, str):
            continue
        full = pattern if os.path.isabs(pattern) else os.path.join(main_dir, pattern)
        full = os.path.normpath(full)
        if full == path or (os.path.dirname(full) == os.path.dirname(path)
                            and fnmatch.fnmatchcase(os.path.basename(path), os.path.basename(full))):
            return True
    return False


def _ensure_import(doc, path, main_dir):
    """Make the main document import `path`; returns True when it changed."""
    if "imports" in doc:
        imports = doc["imports"]
        if not isinstance(_unwrap(imports), list):
            raise ContainerdConfigError('"imports" must be a list of paths')
        if _imports_cover(_unwrap(imports), path, main_dir):
            return False
        imports.append(path)
        return True
    doc["imports"] = [path]  # tomlkit puts a new top-level key before the first table
    return True


def _dropin_document(main_doc, old_text, version, path):
    """The starting document of the drop-in file."""
    header = "# Written by `cdi-shim runtime configure`; imported by the main containerd config.\n"
    if version == 3:
        if old_text is not None:
            doc = _parse(path, old_text)
            if doc and file_version(doc, path) == 3:
                return doc
        doc = tomlkit.parse(header + "# Rerunning the command keeps other edits to this file.\n")
        doc.add("version", 3)
        return doc
    # version 2: containerd 1.x would replace the main file's whole CRI section with ours
    doc = tomlkit.parse(header + "# containerd 1.x replaces a plugin's whole section with an imported one, so this\n"
                                 "# file carries a copy of the main file's CRI plugin section (refreshed on each run).\n")
    doc.add("version", 2)
    cri = _lookup(main_doc, ["plugins", CRI_PLUGIN[2]])
    kept = {}
    if old_text is not None:
        old_doc = _parse(path, old_text)
        if old_doc:
            file_version(old_doc, path)
            old_runtimes = runtimes_of(old_doc, 2)
            main_runtimes = runtimes_of(main_doc, 2) or {}
            if hasattr(old_runtimes, "items"):
                kept = {k: v for k, v in old_runtimes.items() if k not in main_runtimes}
    if cri is not None:
        plugins = tomlkit.table(is_super_table=True)
        plugins.append(CRI_PLUGIN[2], copy.deepcopy(cri))
        doc.add(tomlkit.nl())
        doc.append("plugins", plugins)
    if kept:
        runtimes = doc
        for key in ("plugins", CRI_PLUGIN[2], "containerd", "runtimes"):
            runtimes = _ensure_table(runtimes, key)
        for key, value in kept.items():
            runtimes.append(key, copy.deepcopy(value))
            runtimes[key].trivia.indent = value.trivia.indent
    return doc


# --- the whole operation -------------------------------------------------------------------------

class FileChange:
    def __init__(self, path, old, new):
        self.path, self.old, self.new = path, old, new

    @property
    def changed(self):
        return self.old != self.new

    def diff(self):
        return "".join(difflib.unified_diff(
            (self.old or "").splitlines(True), self.new.splitlines(True),
            fromfile=self.path if self.old is not None else "/dev/null", tofile=self.path))


class Plan:
    """Everything `configure` will write, decided before anything is written."""

    def __init__(self, path, version, version_source, name, binary, patterns):
        self.path, self.version, self.version_source = path, version, version_source
        self.name, self.binary, self.patterns = name, binary, tuple(patterns)
        self.changes, self.notes, self.warnings = [], [], []
        self.drop_in = None

    @property
    def changed(self):
        return any(change.changed for change in self.changes)

    def diff(self):
        return "".join(change.diff() for change in self.changes if change.changed)


def plan_configure(path=DEFAULT_CONTAINERD_CONFIG, runtime_name="nvidia", binary=None,
                   annotation_prefixes=("cdi.k8s.io/",), set_as_default=False, config_version="auto",
                   drop_in=None, containerd="containerd"):
    """Decide the new text of the config file(s); reads only."""
    check_runtime_name(runtime_name)
    path = os.path.realpath(path)  # a linked config stays linked: the file it names is edited
    binary = runtime_binary(binary)
    patterns = []
    for prefix in annotation_prefixes:
        pattern = prefix + "*"
        if pattern not in patterns:
            patterns.append(pattern)
    if not patterns:
        raise ContainerdConfigError("no annotation prefixes are configured: containerd would pass no CDI "
                                    "annotation to the runtime")
    old = _read(path)
    doc = _parse(path, old) if old is not None else tomlkit.document()
    declared = file_version(doc, path)
    installed = containerd_version(containerd)
    wanted = None if config_version in (None, "auto") else int(config_version)
    if wanted is not None and wanted not in CRI_PLUGIN:
        raise ContainerdConfigError(f"config version {wanted} is not one cdi-shim writes (2 or 3)")
    if declared is not None:
        if wanted is not None and wanted != declared:
            raise ContainerdConfigError(
                f"{path} is a version {declared} config, but --config-version {wanted} was given: headers of the "
                f"wrong version would be ignored by containerd; convert the file first (`containerd config migrate`)")
        version, source = declared, "the file's version key"
    elif wanted is not None:
        version, source = wanted, "--config-version"
    elif installed is not None:
        version = 3 if installed[0] >= 2 else 2
        source = f"the installed containerd {installed[0]}.{installed[1]} (the file is {'empty' if old else 'missing'})"
    else:
        raise ContainerdConfigError(
            f"{path} is {'empty' if old else 'missing'} and containerd is not installed, so the config version "
            "cannot be told: pass --config-version 2 (containerd 1.x) or 3 (containerd 2.x)")
    if installed is not None and installed[0] < 2 and version == 3:
        raise ContainerdConfigError(
            f"{path} is a version 3 config, which the installed containerd {installed[0]}.{installed[1]} cannot "
            "load (version 3 needs containerd 2.x)")
    plan = Plan(path, version, source, runtime_name, binary, patterns)
    plan.notes.append(f"config version {version} ({CONTAINERD_FOR[version]}), from {source}")
    if declared is None:
        doc["version"] = version  # before the first table
    edit = Edit()
    if drop_in:
        directory = os.path.abspath(drop_in)
        dropin_path = os.path.join(directory, DROP_IN_NAME)
        plan.drop_in = dropin_path
        dropin_old = _read(dropin_path)
        dropin_doc = _dropin_document(doc, dropin_old, version, dropin_path)
        apply_runtime(dropin_doc, version, runtime_name, binary, patterns, set_as_default, source=doc, edit=edit)
        if version == 2:
            edit.notes.append("the drop-in carries a copy of the main file's CRI plugin section (containerd 1.x "
                              "replaces a plugin's whole section on import); later edits to that section belong "
                              "in the drop-in, or rerun this command")
        _ensure_import(doc, dropin_path, os.path.dirname(path))
        plan.changes.append(FileChange(dropin_path, dropin_old, tomlkit.dumps(dropin_doc)))
        plan.changes.append(FileChange(path, old, tomlkit.dumps(doc)))
    else:
        apply_runtime(doc, version, runtime_name, binary, patterns, set_as_default, edit=edit)
        plan.changes.append(FileChange(path, old, tomlkit.dumps(doc)))
    plan.notes += edit.notes
    plan.notes.append(f'runtime "{runtime_name}": BinaryName = {binary}; container_annotations allow '
                      f"{', '.join(patterns)} (never pod_annotations)")
    plan.warnings += edit.warnings
    for change in plan.changes:  # what we wrote must parse back
        _parse(change.path, change.new)
    return plan


# --- validation and writing --------------------------------------------------------------------

def _load_toml(text):
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        return tomlkit.parse(text).unwrap()
    return tomllib.loads(text)


def check_dump(dump_text, name, binary, patterns):
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
        self.path = os.path.realpath(path)
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


def _backup(path):
    stamp = time.strftime("%Y%m%d-%H%M%S")
    backup, n = f"{path}.bak-{stamp}", 1
    while os.path.exists(backup):
        n += 1
        backup = f"{path}.bak-{stamp}.{n}"
    shutil.copy2(path, backup)
    return backup


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
            mode = os.stat(change.path).st_mode & 0o7777 if change.old is not None else 0o644
            candidates[change.path] = _write_beside(change.path, change.new, mode)
        checked = False
        if validate:
            main_candidate = candidates.get(plan.path)
            if plan.drop_in and plan.drop_in in candidates:
                # the main candidate must import the drop-in candidate, not the old drop-in
                check_doc = tomlkit.parse(next(c.new for c in plan.changes if c.path == plan.path))
                main_dir = os.path.dirname(plan.path)
                imports = [i for i in _unwrap(check_doc.get("imports", [])) or []
                           if os.path.normpath(os.path.join(main_dir, i)) != plan.drop_in]
                check_doc["imports"] = imports + [candidates[plan.drop_in]]
                main_text = tomlkit.dumps(check_doc)
                mode = os.stat(plan.path).st_mode & 0o7777 if os.path.exists(plan.path) else 0o644
                main_candidate = _write_beside(plan.path + ".check", main_text, mode)
                candidates[plan.path + ".check"] = main_candidate
            if main_candidate is None:
                main_candidate = plan.path
            ok, text = containerd_dump(main_candidate, containerd)
            if ok is False:
                raise ContainerdConfigError(f"containerd refuses the new config ({text}); nothing was changed")
            if ok:
                check_dump(text, plan.name, plan.binary, plan.patterns)
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
    text = _read(path)
    if text is None:
        raise ContainerdConfigError(f"{path} does not exist")
    doc = _parse(path, text)
    version = file_version(doc, path)
    if version is None:
        return "runc", ["runc"]
    files = [(path, doc)]
    imports = _unwrap(doc.get("imports", [])) or []
    for pattern in imports:
        full = pattern if os.path.isabs(pattern) else os.path.join(os.path.dirname(path), pattern)
        for name in sorted(glob.glob(full)) if glob.has_magic(full) else [full]:
            imported_text = _read(name)
            if imported_text is None:
                continue
            files.append((name, _parse(name, imported_text)))
    default, names, seen_section = "runc", {"runc"}, False
    for name, one in files:
        section = _lookup(one, ["plugins", CRI_PLUGIN[version]])
        if section is None:
            continue
        runtimes = _unwrap(_lookup(section, ["containerd", "runtimes"])) or {}
        this_default = _unwrap(_lookup(section, ["containerd", "default_runtime_name"]))
        if version == 2:
            names = set(runtimes) if runtimes else {"runc"}
            default = this_default or "runc"
        else:
            names = (names if seen_section else {"runc"}) | set(runtimes)
            default = this_default or default
        seen_section = True
    return default, sorted(names)
