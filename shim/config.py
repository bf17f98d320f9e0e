"""cdi-shim's configuration: /etc/cdi-shim/config.toml, or the file $CDI_SHIM_CONFIG names.

Every key is optional. A missing file means the defaults; a malformed file, an unknown key or a
value of the wrong type is an error naming the file and the key, never a silent default.
"""
import os
from dataclasses import dataclass, field, fields

DEFAULT_CONFIG_PATH = "/etc/cdi-shim/config.toml"
CONFIG_ENV = "CDI_SHIM_CONFIG"
LOG_LEVELS = ("debug", "info", "warning", "error")


class ConfigError(Exception):
    pass


@dataclass(frozen=True)
class Config:
    runtime: str = "runc"
    spec_dirs: tuple = ("/etc/cdi", "/var/run/cdi")
    annotation_prefixes: tuple = ("cdi.k8s.io/",)
    device_env: str = "NVIDIA_VISIBLE_DEVICES"
    default_kind: str = "nvidia.com/gpu"
    log_file: str = ""
    log_level: str = "info"
    accept_env_unprivileged: bool = True
    source: str = field(default="", compare=False)  # the file it came from ("" = defaults)


_TYPES = {"runtime": str, "spec_dirs": tuple, "annotation_prefixes": tuple, "device_env": str,
          "default_kind": str, "log_file": str, "log_level": str, "accept_env_unprivileged": bool}


def config_path():
    return os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG_PATH


def _parse_toml(text):
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomlkit

        return tomlkit.parse(text).unwrap()
    return tomllib.loads(text)


def load_config(path=None):
    """Load the configuration; raises ConfigError on any problem except a missing file."""
    path = path or config_path()
    try:
        with open(path, "rb") as stream:
            raw = stream.read(1 << 20)
    except FileNotFoundError:
        return Config()
    except OSError as err:
        raise ConfigError(f"cannot read cdi-shim config {path}: {err.strerror}") from None
    try:
        values = _parse_toml(raw.decode("utf-8"))
    except Exception as err:  # tomllib and tomlkit raise their own error types
        raise ConfigError(f"malformed cdi-shim config {path}: {err}") from None
    settings = {}
    for key, value in values.items():
        name = key.replace("-", "_")
        expected = _TYPES.get(name)
        if expected is None or "_" in key:
            known = ", ".join(f.name.replace("_", "-") for f in fields(Config) if f.name != "source")
            raise ConfigError(f'cdi-shim config {path}: unknown key "{key}" (known keys: {known})')
        if expected is tuple:
            if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
                raise ConfigError(f'cdi-shim config {path}: "{key}" must be a list of strings, not {value!r}')
            value = tuple(value)
        elif not isinstance(value, expected):
            raise ConfigError(f'cdi-shim config {path}: "{key}" must be a {expected.__name__}, not {value!r}')
        settings[name] = value
    if settings.get("log_level", "info") not in LOG_LEVELS:
        raise ConfigError(f'cdi-shim config {path}: "log-level" must be one of {", ".join(LOG_LEVELS)}, '
                          f'not "{settings["log_level"]}"')
    return Config(source=path, **settings)
