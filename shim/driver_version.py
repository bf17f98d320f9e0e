"""Whether a generated CDI spec is stale: the driver version it was made for against the host's.

The host's version is the loaded kernel module's, from /proc/driver/nvidia/version
("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.10  ..." or "... Open Kernel Module
for x86_64  570.86.10  ..."); $CDI_SHIM_DRIVER_VERSION_FILE names another file, for tests.
When the file is absent (no module loaded, or a /proc without it) nothing is reported.

The create path imports this module (only `os`): it reads the file once, and only when a
resolved device's spec records a version.
"""
import os

VERSION_FILE = "/proc/driver/nvidia/version"
VERSION_FILE_ENV = "CDI_SHIM_DRIVER_VERSION_FILE"   # for tests: another file in place of VERSION_FILE
ANNOTATION = "cdi-shim.dev/driver-version"
_MODULE = "Kernel Module"
_NVML = "/libnvidia-ml.so."
ONE_MOUNT_LIB = "/usr/local/nvidia/lib64"     # the one-mount layout (shim/generate/hostdir.py) binds
# <base>/<version>-<digest>/lib64 there


def version_file(proc=None):
    """The file to read: $CDI_SHIM_DRIVER_VERSION_FILE, else PROC/driver/nvidia/version."""
    given = os.environ.get(VERSION_FILE_ENV)
    if given:
        return given
    return VERSION_FILE if proc in (None, "/proc") else f"{proc}/driver/nvidia/version"


def parse_module_version(text):
    """The version after "Kernel Module" (and "for <arch>") in TEXT, else None."""
    at = text.find(_MODULE)
    if at < 0:
        return None
    words = text[at + len(_MODULE):].split()
    if words[:1] == ["for"]:
        words = words[2:]
    for word in words[:1]:
        if "." in word and all(c.isdigit() or c == "." for c in word):
            return word
    return None


def host_driver_version(path=None):
    """The loaded module's version, or None when the file is absent, unreadable or says none."""
    try:
        with open(path or version_file(), "rb") as stream:
            text = stream.read(4096).decode("utf-8", "replace")
    except OSError:
        return None
    return parse_module_version(text)


def recorded_driver_version(doc):
    """The driver version a generated spec was made for: its annotation, else the version
    suffix of its libnvidia-ml mount, or of the one-mount layout's host directory (named
    <version>-<digest>); None when none is there."""
    version = (doc.get("annotations") or {}).get(ANNOTATION)
    if version:
        return version
    for mount in (doc.get("containerEdits") or {}).get("mounts") or ():
        host = mount.get("hostPath", "")
        if mount.get("containerPath") == ONE_MOUNT_LIB:
            name = host.rstrip("/").rpartition("/")[0].rpartition("/")[2]
            version, _, digest = name.rpartition("-")
            if "." in version and len(digest) == 12:
                return version
            continue
        at = host.rfind(_NVML)          # one search a mount: this runs on the create path
        if at >= 0:
            version = host[at + len(_NVML):]
            if "." in version and "/" not in version:
                return version
    return None


def stale_message(path, recorded, host):
    return (f"the CDI spec {path} was generated for NVIDIA driver {recorded}; the host has {host}; "
            f"run `cdi-shim cdi generate`")


def check_spec(doc, path, edit_blocks=None, owners=None, host=None):
    """(level, message) for a spec, else None: "error" when a host file its edits need is missing
    (cdi/host_files.py: at any driver version), naming each with the device that needs it (the
    stale note first when the spec was made for another driver); "warning" for a stale spec whose
    files are there. EDIT_BLOCKS (default: every edit block of DOC) and OWNERS, the device names
    each block is for (None: the spec's own edits). HOST: the host's version, read here when not
    given (and only when DOC records one)."""
    from cdi.host_files import describe_missing, missing_host_files

    if edit_blocks is None:
        devices = [d for d in doc.get("devices") or () if isinstance(d, dict)]
        edit_blocks = [doc.get("containerEdits")] + [d.get("containerEdits") for d in devices]
        kind = doc.get("kind", "")
        owners = [None] + [f"{kind}={d.get('name', '')}" for d in devices]
    owners = owners or [None] * len(edit_blocks)
    missing = []
    for owner, edits in zip(owners, edit_blocks):
        missing += [(owner, what, file) for what, file in missing_host_files(edits)]
    stale = None
    recorded = recorded_driver_version(doc)
    if recorded:
        if host is None:
            host = host_driver_version()
        if host and host != recorded:
            stale = stale_message(path, recorded, host)
    if missing:
        if stale:
            return "error", f"{stale} (missing: {describe_missing(missing)})"
        return "error", (f"the CDI spec {path} names host files that do not exist: {describe_missing(missing)}; "
                         "restore them, or regenerate the spec (`cdi-shim cdi generate`)")
    if stale:
        return "warning", stale
    return None
