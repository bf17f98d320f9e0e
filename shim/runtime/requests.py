"""Which CDI devices a container asks for: annotations, the device env var, device-plugin
volume mounts, and the runtime's own ``--device`` options, in that order."""
import posixpath

from cdi.annotations import parse_annotations
from cdi.errors import CDIError
from cdi.parser import is_qualified_name

DEVICE_MOUNT_ROOT = "/var/run/nvidia-container-devices/"
# Values of the device env var that request nothing, and beat any other value of it.
NO_REQUEST_VALUES = ("void", "none")
# Bounds on the device env var (issue 14): its value comes from the image or the pod, so the work
# it causes must be linear in its length and capped. A node has at most a few hundred GPUs or MIG
# slices; 1,024 UUIDs (~41 chars each) fit in 64 KiB.
MAX_ENV_CHARS = 64 * 1024
MAX_REQUESTS = 1024
# Docker's `--gpus` (moby daemon/nvidia_linux.go, 19.03 to 28.x at least): the daemon appends
# NVIDIA_VISIBLE_DEVICES=<the request> to the env and a prestart hook running this program, found
# on its PATH. Its value is the request; the hook is dropped, as the toolkit's runtime does in CDI
# mode (cdi-shim ships a program of that name that only fails: runc must never run it).
LEGACY_HOOK = "nvidia-container-runtime-hook"
LEGACY_HOOK_ENV = "NVIDIA_VISIBLE_DEVICES"
SHOWN_CHARS = 120  # how much of a long value an error or warning quotes


class RequestError(CDIError):
    pass


def env_values(env, name):
    """Every value of `name` in an OCI process.env list, in order."""
    prefix = name + "="
    return [entry[len(prefix):] for entry in env or () if isinstance(entry, str) and entry.startswith(prefix)]


def shown(text):
    """TEXT for a message: whole when short, else its start and its length."""
    if len(text) <= SHOWN_CHARS:
        return text
    return f"{text[:SHOWN_CHARS]}... ({len(text)} characters)"


def env_devices(values, default_kind, name="the device env var"):
    """Devices from the values of the device env var (NVIDIA_VISIBLE_DEVICES semantics).

    If it appears more than once: `void` beats `none` beats everything else, and `all` beats
    a list. A bare index or UUID becomes ``<default_kind>=<value>``; a qualified name stays.
    Raises RequestError (naming NAME) for a value longer than MAX_ENV_CHARS in all or more
    than MAX_REQUESTS items; the work is linear in the length of the values.
    """
    if not values:
        return []
    total = sum(len(value) for value in values)
    if total > MAX_ENV_CHARS:
        raise RequestError(f"{name}: its value is {total} characters long; at most {MAX_ENV_CHARS} are "
                           f"accepted (value: {shown(','.join(values))})")
    stripped = [value.strip() for value in values]
    if any(value in stripped for value in NO_REQUEST_VALUES):
        return []
    if "all" in stripped:
        return [f"{default_kind}=all"]
    devices = []
    for value in stripped:
        for item in value.split(","):
            item = item.strip()
            if not item or item in NO_REQUEST_VALUES:
                continue
            devices.append(item if is_qualified_name(item) else f"{default_kind}={item}")
            if len(devices) > MAX_REQUESTS:
                raise RequestError(f"{name}: it requests more than {MAX_REQUESTS} devices; at most "
                                   f"{MAX_REQUESTS} devices are accepted (value: {shown(','.join(values))})")
    return devices


VOLUME_MOUNT_REQUESTS = ("dev-null", "off")  # the values of the config key volume-mount-requests


def mount_devices(mounts, default_kind, strategy="dev-null"):
    """Devices requested by the device plugin's volume-mount strategy.

    As in the toolkit, only a mount whose source is /dev/null (what the device plugin mounts)
    counts: any pod can mount an ordinary directory (an emptyDir) at such a path. With the
    strategy "off", no mount is a request.
    """
    devices = []
    if strategy == "off":
        return devices
    for mount in mounts or ():
        if not isinstance(mount, dict):
            continue
        destination, source = mount.get("destination", ""), mount.get("source")
        if not isinstance(source, str) or posixpath.normpath(source) != "/dev/null":
            continue
        if isinstance(destination, str) and destination.startswith(DEVICE_MOUNT_ROOT):
            device_id = destination.rstrip("/").rsplit("/", 1)[-1]
            if device_id and destination.rstrip("/") != DEVICE_MOUNT_ROOT.rstrip("/"):
                devices.append(device_id if is_qualified_name(device_id) else f"{default_kind}={device_id}")
    return devices


def _check_env_vendors(devices, settings):
    """Env requests come from the image or the pod spec, not from the device plugin: they may
    name only devices of the allowed vendors (env-vendors; by default default-kind's vendor), so
    NVIDIA_VISIBLE_DEVICES=example.com/secret=key cannot reach another vendor's device."""
    allowed = settings.env_vendors or (settings.default_kind.partition("/")[0],)
    for device in devices:
        vendor = device.partition("/")[0]
        if vendor not in allowed:
            raise RequestError(
                f"{settings.device_env} names {device}, a device of vendor {vendor}; requests through "
                f"{settings.device_env} may name only devices of {', '.join(allowed)} (env-vendors in the "
                "cdi-shim config; annotations and --device are not limited)")


def drop_legacy_hook(config):
    """(CONFIG without the prestart hooks of LEGACY_HOOK, whether there were any). A new dict when
    there were; CONFIG itself otherwise."""
    hooks = config.get("hooks")
    prestart = hooks.get("prestart") if isinstance(hooks, dict) else None
    if not isinstance(prestart, list):
        return config, False
    kept = [hook for hook in prestart if not (isinstance(hook, dict) and isinstance(hook.get("path"), str)
                                                and posixpath.basename(hook["path"]) == LEGACY_HOOK)]
    if len(kept) == len(prestart):
        return config, False
    hooks = dict(hooks, prestart=kept)
    if not kept:
        del hooks["prestart"]
    return dict(config, hooks=hooks), True


def has_cap_sys_admin(config):
    caps = ((config.get("process") or {}).get("capabilities") or {}).get("bounding") or ()
    return "CAP_SYS_ADMIN" in caps


def collect_requests(config, settings, cli_devices=(), warn=lambda message: None, legacy_hook=False):
    """The ordered, de-duplicated list of devices the container requests.

    `legacy_hook`: the config had Docker's --gpus hook (drop_legacy_hook): the last value of
    NVIDIA_VISIBLE_DEVICES is the daemon's (it appends it after the image's and the user's), so it
    is the request, whatever device-env and accept-env-unprivileged say.

    `settings` is a shim.config.Config. Raises RequestError for a malformed request, naming
    where it came from.
    """
    requested = []  # (device, where it came from)
    annotations = config.get("annotations") or {}
    if not isinstance(annotations, dict):
        raise RequestError("config.json: annotations is not an object")
    for key in sorted(annotations):
        try:
            devices = parse_annotations({key: annotations[key]}, settings.annotation_prefixes)[1]
        except CDIError as err:
            raise RequestError(f'malformed CDI request in annotation "{key}": {err}') from None
        requested += [(device, f'annotation "{key}"') for device in devices]
    process = config.get("process") or {}
    if not isinstance(process, dict):
        raise RequestError("config.json: process is not an object")
    if not isinstance(process.get("env") or [], list):
        raise RequestError("config.json: process.env is not a list")
    if not isinstance(config.get("mounts") or [], list):
        raise RequestError("config.json: mounts is not a list")
    if legacy_hook:
        values = env_values(process.get("env"), LEGACY_HOOK_ENV)[-1:]
        devices = env_devices(values, settings.default_kind, LEGACY_HOOK_ENV)
        _check_env_vendors(devices, settings)
        origin = f"docker --gpus ({LEGACY_HOOK_ENV}={shown(','.join(values))} and the {LEGACY_HOOK} hook)"
        requested += [(device, origin) for device in devices]
    if settings.device_env and not (legacy_hook and settings.device_env == LEGACY_HOOK_ENV):
        values = env_values(process.get("env"), settings.device_env)
        devices = env_devices(values, settings.default_kind, settings.device_env)
        # one origin text for all of them: built per device it made the work quadratic
        origin = f"{settings.device_env}={shown(','.join(values))}"
        if devices and not settings.accept_env_unprivileged and not has_cap_sys_admin(config):
            warn(f"ignoring {origin}: the container lacks CAP_SYS_ADMIN and accept-env-unprivileged is false")
            devices = []
        _check_env_vendors(devices, settings)
        requested += [(device, origin) for device in devices]
    requested += [(device, "a device-plugin mount under " + DEVICE_MOUNT_ROOT)
                  for device in mount_devices(config.get("mounts"), settings.default_kind,
                                              settings.volume_mount_requests)]
    requested += [(device, "--device") for device in cli_devices]
    if len(requested) > MAX_REQUESTS:
        raise RequestError(f"the container requests {len(requested)} devices; at most {MAX_REQUESTS} are accepted")
    for device, origin in requested:
        if not is_qualified_name(device):
            raise RequestError(f'malformed CDI device request "{device}" (from {origin}): expected a '
                               "qualified name such as vendor.com/class=name")
    return list(dict.fromkeys(device for device, _ in requested))
