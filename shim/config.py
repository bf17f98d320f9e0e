"""cdi-shim's configuration: /etc/cdi-shim/config.toml, or the file $CDI_SHIM_CONFIG names.

Every key is optional. A missing /etc/cdi-shim/config.toml means the defaults; a file that
$CDI_SHIM_CONFIG names and that does not exist, a malformed file, an unknown key or a value of
the wrong type is an error naming the file (and the key), never a silent default.
"""
import os

from cdi.safeio import UnsafeFile, read_config_file

DEFAULT_CONFIG_PATH = "/etc/cdi-shim/config.toml"
CONFIG_ENV = "CDI_SHIM_CONFIG"
LOG_LEVELS = ("debug", "info", "warning", "error")
MAX_CONFIG_BYTES = 1 << 20


class ConfigError(Exception):
    pass


# Every key, once: (key, type, default, allowed values or None, what the native front end does
# with it, meaning). Config's defaults and checks, the default file `install --node` writes and
# the front end's csrc/frontend/config_keys.h (shim/native_headers.py) come from this table.
# The front end "reads" a key it needs to pass runc calls through, and "skips" (after checking
# its syntax) one only the Python half needs: no key may send a passthrough call to Python.
KEYS = (
    ("runtime", str, "runc", None, "reads", "low-level runtime: a name on PATH or an absolute path"),
    ("spec-dirs", tuple, ("/etc/cdi", "/var/run/cdi"), None, "skips", "CDI spec folders, in rising priority"),
    ("annotation-prefixes", tuple, ("cdi.k8s.io/",), None, "reads",
     "annotation keys with these prefixes request CDI devices"),
    ("device-env", str, "NVIDIA_VISIBLE_DEVICES", None, "reads", 'the env request variable; "" turns env requests off'),
    ("default-kind", str, "nvidia.com/gpu", None, "skips", "the kind of a bare index or UUID in an env request"),
    ("log-file", str, "", None, "reads", 'our own log; "" = only runc\'s --log file and stderr'),
    ("log-level", str, "info", LOG_LEVELS, "reads", '"debug" adds per-phase timings'),
    ("accept-env-unprivileged", bool, True, None, "skips",
     "env requests of containers without CAP_SYS_ADMIN count (false on Kubernetes nodes)"),
    ("volume-mount-requests", str, "dev-null", ("dev-null", "off"), "skips",
     "the device plugin's /var/run/nvidia-container-devices mounts request devices"),
    ("env-vendors", tuple, (), None, "skips", "vendors env requests may name; [] = default-kind's only"),
    ("resident-socket", str, "/run/cdi-shim/runtime.sock", None, "reads",
     'the resident process; "" = always start the interpreter'),
    ("file-binds", str, "hook", ("hook", "runc"), "reads", "who binds a device's library files: our hook, or runc"),
    ("nri-namespaces", tuple, ("gpu-operator",), None, "skips",
     'the NRI plugin serves pods of these namespaces ("*": all)'),
)


class Config:
    """The settings; a plain class (importing dataclasses would cost every create)."""

    DEFAULTS = {key.replace("-", "_"): default for key, _, default, *_ in KEYS}
    __slots__ = tuple(DEFAULTS) + ("source", "text")

    def __init__(self, source="", text=b"", **settings):
        for name, default in self.DEFAULTS.items():
            setattr(self, name, settings.pop(name, default))
        if settings:
            raise TypeError(f"unknown settings {sorted(settings)}")
        self.source = source  # the file it came from ("" = defaults)
        self.text = text      # its bytes (a request's recipe is keyed by them: csrc/engine/request.c)

    def __eq__(self, other):
        return isinstance(other, Config) and all(
            getattr(self, name) == getattr(other, name) for name in self.DEFAULTS)

    def __repr__(self):
        return "Config(" + ", ".join(f"{name}={getattr(self, name)!r}" for name in self.DEFAULTS) + ")"


_TYPES = {key.replace("-", "_"): kind for key, kind, *_ in KEYS}
_CHOICES = {key.replace("-", "_"): choices for key, _, _, choices, *_ in KEYS if choices}


def toml_value(value):
    """VALUE (a str, bool or tuple of str) as our config file writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    return '"' + value + '"'


def default_config_text(values=None, why=""):
    """The config file `install --node` writes: every key at its default, or at VALUES[key],
    each with its meaning; WHY (comment lines) explains the values that differ."""
    values = values or {}
    unknown = set(values) - {key for key, *_ in KEYS}
    if unknown:
        raise ValueError(f"unknown config keys {sorted(unknown)}")
    lines = ["# cdi-shim's configuration (written by `cdi-shim install --node`; yours to edit, it is never",
             "# rewritten). Every key is optional: a key left out takes the default written here."]
    lines += [line for line in why.splitlines()]
    for key, _, default, _, _, meaning in KEYS:
        setting = f"{key} = {toml_value(values.get(key, default))}"
        lines.append(f"{setting:<48} # {meaning}")
    return "\n".join(lines) + "\n"


def config_path():
    return os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG_PATH


def _parse_simple_toml(text):
    """The subset of TOML our config uses, without importing tomllib (and `re`, a cost on every create):
    ``key = "string"``, ``key = ["a", "b"]`` on one line, ``key = true|false``, comments.
    Returns None for anything else, which then goes to the full parser."""
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, rest = line.partition("=")
        key, rest = key.strip(), rest.strip()
        if not sep or not key or "\\" in rest or "'" in rest or not all(c.isalnum() or c in "-_" for c in key):
            return None
        value, rest = _simple_value(rest)
        if value is None or (rest and not rest.startswith("#")) or key in values:
            return None
        values[key] = value
    return values


def _simple_value(text):
    if text.startswith('"'):
        end = text.find('"', 1)
        return (None, "") if end < 0 else (text[1:end], text[end + 1:].strip())
    if text.startswith("["):
        items, rest = [], text[1:].strip()
        while not rest.startswith("]"):
            item, rest = _simple_value(rest)
            if not isinstance(item, str):
                return None, ""
            items.append(item)
            rest = rest[1:].strip() if rest.startswith(",") else rest
            if not rest:
                return None, ""
        return items, rest[1:].strip()
    for word, value in (("true", True), ("false", False)):
        if text == word or text.startswith(word + " ") or text.startswith(word + "#"):
            return value, text[len(word):].strip()
    return None, ""


def _parse_toml(text):
    simple = _parse_simple_toml(text)
    if simple is not None:
        return simple
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomlkit

        return tomlkit.parse(text).unwrap()
    return tomllib.loads(text)


def load_config(path=None):
    """Load the configuration from PATH, else from $CDI_SHIM_CONFIG's file, else from the default
    one; raises ConfigError on any problem except a missing file that the environment did not
    name (the user who names a file means that file)."""
    named = os.environ.get(CONFIG_ENV) if path is None else None
    return _load(path or named or DEFAULT_CONFIG_PATH, named)


def _suggestion(key):
    """': did you mean "log-level"?' for log_level or a near miss, else the known keys."""
    import difflib  # only on this error path

    known = [name.replace("_", "-") for name in Config.DEFAULTS]
    spelled = key.replace("_", "-").lower()
    close = [spelled] if spelled in known else difflib.get_close_matches(spelled, known, n=1)
    if close:
        return f': did you mean "{close[0]}"? (keys are written with "-")' if "_" in key else \
            f': did you mean "{close[0]}"?'
    return f" (known keys: {', '.join(known)})"


def _load(path, named):
    try:
        raw = read_config_file(path, MAX_CONFIG_BYTES)
    except UnsafeFile as err:
        raise ConfigError(f"cannot read cdi-shim config {path}: {err}") from None
    if raw is None:
        if named:
            raise ConfigError(f"cdi-shim config {path} does not exist (named by ${CONFIG_ENV})") from None
        return Config()
    try:
        values = _parse_toml(raw.decode("utf-8"))
    except Exception as err:  # tomllib and tomlkit raise their own error types
        raise ConfigError(f"malformed cdi-shim config {path}: {err}") from None
    settings = {}
    for key, value in values.items():
        name = key.replace("-", "_")
        expected = _TYPES.get(name)
        if expected is None or "_" in key:
            raise ConfigError(f'cdi-shim config {path}: unknown key "{key}"{_suggestion(key)}')
        if expected is tuple:
            if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
                raise ConfigError(f'cdi-shim config {path}: "{key}" must be a list of strings, not {value!r}')
            value = tuple(value)
        elif not isinstance(value, expected):
            raise ConfigError(f'cdi-shim config {path}: "{key}" must be a {expected.__name__}, not {value!r}')
        settings[name] = value
    for name, choices in _CHOICES.items():
        if name in settings and settings[name] not in choices:
            raise ConfigError(f'cdi-shim config {path}: "{name.replace("_", "-")}" must be one of '
                              f'{", ".join(chr(34) + c + chr(34) for c in choices)}, not "{settings[name]}"')
    return Config(source=path, text=raw, **settings)

