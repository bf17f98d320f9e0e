"""containerd's config.toml as a document: reading it (versions, runtimes), the runtime entry
written into it with tomlkit (comments, order and unrelated settings kept), and the drop-in file
that carries the entry instead."""
import copy
import fnmatch
import os
import re

import tomlkit
from cdi.safeio import UnsafeFile, read_config_file
from tomlkit.items import AoT, InlineTable, KeyType, SingleKey, Table

from .containerd import ContainerdConfigError, pid1_init

RUNTIME_EXECUTABLE = "cdi-shim-runtime"
RUNC_V2 = "io.containerd.runc.v2"
# config version -> the CRI plugin section holding runtimes and the CDI settings. Version 4
# (containerd 2.3) moves only server settings ([grpc], [ttrpc], [debug] address, metrics) into
# io.containerd.server.v1.* plugins (its `serviceMigrate`); the CRI sections are version 3's.
CRI_PLUGIN = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime", 4: "io.containerd.cri.v1.runtime"}
# the containerd that first loads each version; 2.0-2.2 refuse 4 ("expected containerd config
# version equal to or less than `3`"), 1.x refuses 3
LOADS_FROM = {2: (1, 0), 3: (2, 0), 4: (2, 3)}
DEFAULT_CDI_SPEC_DIRS = ["/etc/cdi", "/var/run/cdi"]
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


# --- reading ------------------------------------------------------------------------------------

MAX_CONFIG_BYTES = 16 << 20  # containerd's config.toml with every default written is ~10 KiB


def read_text(path):
    """The text of a file configure or install edits, None when missing (cdi.safeio's rule: a
    FIFO, a device or a link loop there is an error naming it, never a hang)."""
    try:
        data = read_config_file(path, MAX_CONFIG_BYTES)
        return None if data is None else data.decode("utf-8")
    except (UnsafeFile, UnicodeDecodeError) as err:
        raise ContainerdConfigError(f"cannot read {path}: {err}") from None


def parse_toml(path, text):
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
            "for containerd 1.x, 3 for containerd 2.0-2.2 and 4 for containerd 2.3+); refusing to edit it")
    return version


def lookup(container, keys):
    for key in keys:
        if container is None or not hasattr(container, "get"):
            return None
        container = container.get(key)
    return container


def unwrap(value):
    return value.unwrap() if hasattr(value, "unwrap") else value


def runtimes_of(doc, version):
    """The `runtimes` table of a parsed document (or None)."""
    return lookup(doc, ["plugins", CRI_PLUGIN[version], "containerd", "runtimes"])


# --- rendering ----------------------------------------------------------------------------------

def _key(name):
    return name if _BARE_KEY.match(name) else tomlkit.string(name).as_string()


def _header(version, *names):
    quote = '"' if version == 2 else "'"  # as each version's `containerd config default` writes
    return ".".join(["plugins", f"{quote}{CRI_PLUGIN[version]}{quote}"] + [_key(n) for n in names])


def _value(version, value):
    if isinstance(value, str) and version >= 3 and "'" not in value and "\n" not in value:
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
        result.append(key, _inline(item) if isinstance(item, Table) else tomlkit.item(unwrap(item)))
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
        if not _BARE_KEY.match(key) and version >= 3 and "'" not in key:
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
    if key in table and unwrap(table[key]) == value and type(unwrap(table[key])) is type(value):
        return False
    table[key] = value
    return True


class Edit:
    """What `configure` decided, for the report and the tests."""

    def __init__(self):
        self.notes, self.warnings = [], []
        self.cdi = None  # {"enable_cdi": bool, "cdi_spec_dirs": [...] or None}: what containerd must then see


def _systemd_choice(runc):
    options = runc.get("options") if _is_table(runc) else None
    if hasattr(options, "get") and "SystemdCgroup" in options and isinstance(unwrap(options["SystemdCgroup"]), bool):
        value = unwrap(options["SystemdCgroup"])
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
        default = lookup(doc, ["plugins", CRI_PLUGIN[version], "containerd", "default_runtime_name"])
        candidate = runtimes.get(unwrap(default)) if default is not None else None
        if hasattr(candidate, "get") and unwrap(candidate.get("runtime_type")) == RUNC_V2:
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
    default_name = unwrap(lookup(source, ["plugins", CRI_PLUGIN[version], "containerd", "default_runtime_name"]))
    default_name = default_name or "runc"
    if set_as_default:
        default_name = name
    runtime_indent = _indent_of(runc).lstrip("\n") if isinstance(runc, Table) and source is doc else ""
    if isinstance(runtimes, InlineTable) or isinstance(runc, InlineTable):
        runtime_indent = ""
    if not hasattr(runtimes, "get") or name not in runtimes:
        defined = set(runtimes) if hasattr(runtimes, "keys") else set()
        if version >= 3 and source is not doc:
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
        previous = unwrap(entry.get("runtime_type"))
        if _set(entry, "runtime_type", RUNC_V2) and previous:
            edit.warnings.append(f'runtime "{name}" had runtime_type "{previous}"; now "{RUNC_V2}" '
                                 f"(cdi-shim-runtime is a runc-compatible binary)")
        current = unwrap(entry.get("container_annotations", []))
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
    pod = unwrap(entry.get("pod_annotations", [])) or []
    leaked = [p for p in pod if any(fnmatch.fnmatchcase(pp.rstrip("*") + "x", p) for pp in patterns)]
    if leaked:
        edit.warnings.append(
            f'runtime "{name}" has pod_annotations {leaked}: any pod could then request any device past the '
            "device plugin; remove them (cdi-shim only needs container_annotations)")
    if set_as_default:
        containerd_table = lookup(doc, ["plugins", CRI_PLUGIN[version], "containerd"])
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


def ensure_import(doc, path, main_dir):
    """Make the main document import `path`; returns True when it changed."""
    if "imports" in doc:
        imports = doc["imports"]
        if not isinstance(unwrap(imports), list):
            raise ContainerdConfigError('"imports" must be a list of paths')
        target = os.path.normpath(path if os.path.isabs(path) else os.path.join(main_dir, path))
        if _imports_cover(unwrap(imports), target, main_dir):
            return False
        imports.append(path)
        return True
    doc["imports"] = [path]  # tomlkit puts a new top-level key before the first table
    return True


def dropin_document(main_doc, old_text, version, path):
    """The starting document of the drop-in file."""
    header = "# Written by `cdi-shim runtime configure`; imported by the main containerd config.\n"
    if version >= 3:
        if old_text is not None:
            doc = parse_toml(path, old_text)
            if doc and file_version(doc, path) == version:
                return doc
        doc = tomlkit.parse(header + "# Rerunning the command keeps other edits to this file.\n")
        doc.add("version", version)
        return doc
    # version 2: containerd 1.x would replace the main file's whole CRI section with ours
    doc = tomlkit.parse(header
                        + "# containerd 1.x replaces a plugin's whole section with an imported one, so this\n"
                        "# file carries a copy of the main file's CRI plugin section (refreshed on each run).\n")
    doc.add("version", 2)
    cri = lookup(main_doc, ["plugins", CRI_PLUGIN[2]])
    kept = {}
    if old_text is not None:
        old_doc = parse_toml(path, old_text)
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


# --- containerd's own CDI (1.7+) -------------------------------------------------------------------

def _put(table, key, value, version):
    """table[key] = value written as this version's `config default` writes it; a new key takes
    the indentation of the table's other keys."""
    item = tomlkit.parse(f"x = {_value(version, value)}\n").item("x")
    if key in table:
        old = table.item(key) if hasattr(table, "item") else None
        if old is not None:
            item.trivia.indent, item.trivia.comment_ws, item.trivia.comment = \
                old.trivia.indent, old.trivia.comment_ws, old.trivia.comment
        table[key] = item
        return
    _add(table, key, item)
    if isinstance(table, Table):
        # item(), not [key]: a tomlkit table gives a boolean out as a plain bool, without trivia
        table.item(key).trivia.indent = _key_indent(table, table.trivia.indent + "  " if table.trivia.indent else "")


def cdi_capable(version, installed, sections):
    """Whether the containerd reading this file injects CDI devices itself (1.7 and later).

    `installed`: (major, minor) of the installed containerd, or None; `sections`: the file's CRI
    sections (a version-2 file naming enable_cdi was written for 1.7+)."""
    if version >= 3:
        return True
    if installed is not None:
        return tuple(installed[:2]) >= (1, 7)
    return any(hasattr(s, "get") and ("enable_cdi" in s or "cdi_spec_dirs" in s) for s in sections)


def apply_cdi(doc, version, spec_dirs, enable=None, source=None, installed=None, edit=None):
    """Keep containerd's enable_cdi / cdi_spec_dirs consistent with cdi-shim's spec-dirs.

    With containerd's CDI on, containerd injects the devices a pod asks for (the CRI CDIDevices
    field, cdi.k8s.io/ annotations) from cdi_spec_dirs, so those must be our spec-dirs: they are
    set so, with a note naming the old value. `enable` (True/False) sets enable_cdi; None keeps
    it. Returns the Edit; `source` is the document whose values hold where `doc` sets none (the
    main file, for a drop-in)."""
    edit = edit or Edit()
    source = doc if source is None else source
    path = ["plugins", CRI_PLUGIN[version]]
    sections = [lookup(doc, path), lookup(source, path)]

    def effective(key):
        for section in sections:
            value = lookup(section, [key])
            if value is not None:
                return unwrap(value)
        return None

    spec_dirs = list(spec_dirs)
    if not cdi_capable(version, installed, sections):
        which = f"containerd {installed[0]}.{installed[1]}" if installed else "containerd (version unknown; the file " \
            "sets no enable_cdi)"
        if enable:
            raise ContainerdConfigError(f"{which} has no CDI support of its own (enable_cdi needs 1.7): drop "
                                        "--enable-cdi; cdi-shim-runtime injects the annotated devices itself")
        edit.notes.append(f"{which} has no CDI support of its own: cdi-shim-runtime injects the devices "
                          "(cdi.k8s.io/ annotations, the device env var) and does their hooks")
        return edit
    default_on = version >= 3  # 1.7 ships it off, 2.x on
    current = effective("enable_cdi")
    enabled = default_on if current is None else bool(current)
    section = doc
    for key in path:
        section = _ensure_table(section, key, version)
    if enable is not None and enable != enabled:
        _put(section, "enable_cdi", enable, version)
        edit.notes.append(f"enable_cdi = {str(enable).lower()} (was {str(enabled).lower()}"
                          f"{'' if current is not None else ', the default'})")
        enabled = enable
    edit.cdi = {"enable_cdi": enabled, "cdi_spec_dirs": spec_dirs if enabled else None}
    if enabled:
        dirs = effective("cdi_spec_dirs")
        dirs = list(dirs) if isinstance(dirs, list) else list(DEFAULT_CDI_SPEC_DIRS)
        if dirs != spec_dirs:
            _put(section, "cdi_spec_dirs", spec_dirs, version)
            edit.notes.append(f"cdi_spec_dirs = {spec_dirs}, cdi-shim's spec-dirs (was {dirs}"
                              f"{'' if effective('cdi_spec_dirs') is not None else ', the default'}): containerd and "
                              "cdi-shim-runtime must resolve devices from the same specs")
        edit.notes.append("enable_cdi = true: containerd injects the CDI devices a pod asks for (the CRI CDIDevices "
                          f"field, cdi.k8s.io/ annotations) from {spec_dirs}; cdi-shim-runtime then does the hooks of "
                          "the injected edits natively (linker cache, links) and the requests containerd does not "
                          "see (the device env var)")
    else:
        edit.notes.append("enable_cdi = false: containerd leaves CDI to cdi-shim-runtime, which injects the devices "
                          "of cdi.k8s.io/ annotations (allowed by container_annotations) and does their hooks; "
                          "the CRI CDIDevices field is dropped (--enable-cdi true lets containerd inject it)")
        dirs = effective("cdi_spec_dirs")
        if isinstance(dirs, list) and list(dirs) != spec_dirs:
            edit.notes.append(f"cdi_spec_dirs = {list(dirs)} differ from cdi-shim's spec-dirs {spec_dirs}; "
                              "unused while enable_cdi is off (left as they are)")
        if version >= 3:
            edit.warnings.append("enable_cdi = false on containerd 2.x: the device plugin's CDIDevices are dropped "
                                 "silently, and containerd 2.3 deprecates turning CDI off")
    return edit
