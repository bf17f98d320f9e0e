"""The recipe of a request's injection, for the front end to replay without the worker.

A create that asks for devices (annotations, the device env var, device-plugin mounts, the
runtime's --device options) goes to a resident worker, which reads the request, resolves it,
checks the spec's files and applies the edits (shim/runtime/main.py). For the next container
with the same request, specs and host files that work gives the same edits again. So after a
create whose step has a recipe (shim/linker/stepmemo.py), the worker writes what the injection
did into the steps directory: each changed place of config.json (process.env, mounts,
linux.devices, linux.resources.devices, hooks) as elements of the input config or new JSON text,
under the key of what the resolution and the edits read (cds_request_key, csrc/engine/request.c,
whose key_fields lists the fields of config.json it covers: tests/runtime/test_request_key.py); the
identities of the spec directories and files and of the host files the edits need; and the
driver version file's bytes. The front end (csrc/engine/replay.c, replay_request) checks all of
them, applies the edits to its config's text and replays the step of the result. Nothing is
written for a create whose resolution warned, that came with Docker's --gpus hook, whose edits
touched anything else, or that read a file changed within the settle window; and a recipe is
written only when the C apply of it gives exactly the config the worker made.
"""
import os
import struct

from cdi.spec_dirs import SPEC_EXTENSIONS

from .. import fastjson
from .._native import ffi, lib

MAGIC = b"CDSREQ1"
DRIVER_VERSION_BYTES = 4096     # what shim/driver_version.py reads of the file
# config.json's places an injection may change, by the byte the recipe names them with
_PLACES = (("E", ("process", "env")), ("M", ("mounts",)), ("D", ("linux", "devices")),
           ("R", ("linux", "resources", "devices")), ("H", ("hooks",)))


def _get(config, path):
    for name in path:
        if not isinstance(config, dict) or name not in config:
            return None
        config = config[name]
    return config


def _without_places(config):
    """CONFIG with the places dropped (each object along their paths copied, never changed)."""
    config = dict(config)
    for _, path in _PLACES:
        parent, objects = config, []
        for name in path[:-1]:
            inner = parent.get(name)
            if not isinstance(inner, dict):
                break
            inner = dict(inner)
            parent[name] = inner
            objects.append(inner)
            parent = inner
        else:
            parent.pop(path[-1], None)
    return config


def key(raw, settings, devices=()):
    """The front end's key of the request in config.json's bytes RAW and the runtime's --device
    options DEVICES under SETTINGS, or None."""
    prefixes = b"".join(os.fsencode(prefix) + b"\0" for prefix in settings.annotation_prefixes)
    options = b"".join(os.fsencode(device) + b"\0" for device in devices)
    out = ffi.new("uint8_t **")
    size = ffi.new("size_t *")
    text = settings.text or b""
    if lib.cds_request_key(raw, len(raw), prefixes, len(prefixes), os.fsencode(settings.device_env), options,
                           len(options), text, len(text), out, size) != 0:
        return None
    try:
        return bytes(ffi.buffer(out[0], size[0]))
    finally:
        lib.cds_request_free(out[0])


def apply(raw, edits):
    """config.json's bytes RAW with the recorded EDITS applied by the front end's code, or None."""
    out = ffi.new("char **")
    size = ffi.new("size_t *")
    if lib.cds_request_apply(raw, len(raw), edits, len(edits), out, size) != 0:
        return None
    try:
        return bytes(ffi.buffer(out[0], size[0]))
    finally:
        lib.cds_request_free(out[0])


def edits(config, edited, merged):
    """The record of what the injection changed from CONFIG to EDITED (MERGED: the spec's edits,
    cdi.container_edits.merge_edits), or None when it changed anything else."""
    if _without_places(config) != _without_places(edited):
        return None
    # Elements the edits set are always new text: another container's element at that index
    # (an env entry of the same name, a mount at the same destination) is what they replace.
    set_by_edits = {
        "E": {entry.partition("=")[0] for entry in merged.get("env") or ()},
        "M": {mount.get("containerPath") for mount in merged.get("mounts") or ()},
    }
    out = b""
    for tag, path in _PLACES:
        before, after = _get(config, path), _get(edited, path)
        if before == after:
            continue
        if after is None:
            return None
        if tag == "H":
            text = fastjson.dumpb(after)
            out += b"HV" + struct.pack("<I", len(text)) + text
            continue
        if not isinstance(after, list) or not isinstance(before or [], list):
            return None
        used, items = set(), []
        for element in after:
            index = None
            if not _set_by_edits(tag, element, set_by_edits):
                index = next((at for at, old in enumerate(before or ()) if at not in used and old == element), None)
            if index is None:
                text = fastjson.dumpb(element)
                items.append(b"T" + struct.pack("<I", len(text)) + text)
            else:
                used.add(index)
                items.append(b"I" + struct.pack("<I", index))
        out += tag.encode() + b"L" + struct.pack("<I", len(items)) + b"".join(items)
    return out


def _set_by_edits(tag, element, set_by_edits):
    if tag == "E":
        return isinstance(element, str) and element.partition("=")[0] in set_by_edits["E"]
    if tag == "M":
        return isinstance(element, dict) and element.get("destination") in set_by_edits["M"]
    return False


def host_paths(settings, blocks):
    """What the resolution read of the host: the spec directories, their spec files, and the
    files the edits need (cdi/host_files.py), as cds_memo_identify's host entries."""
    from cdi.host_files import host_files

    paths = []
    for directory in settings.spec_dirs:
        paths.append(directory)
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        paths += [os.path.join(directory, name) for name in names if name.endswith(SPEC_EXTENSIONS)]
    for block in blocks:
        paths += [path for _, path, _ in host_files(block)]
    return [b"h" + os.fsencode(path) for path in dict.fromkeys(paths)]


def driver_version_bytes():
    """The driver version file as the front end compares it: b"0" (unreadable), or b"1" and its
    first DRIVER_VERSION_BYTES bytes."""
    from ..driver_version import version_file

    try:
        with open(version_file(), "rb") as stream:
            return b"1" + stream.read(DRIVER_VERSION_BYTES)
    except OSError:
        return b"0"


class Injection:
    """What a recipe of this injection would hold: the request's KEY, the RECORDED edits, the
    injected config's TEXT as the front end makes it from them, and whether the step follows
    (STEPPED) or TEXT is the config.json of the create."""
    __slots__ = ("key", "recorded", "text", "stepped")

    def __init__(self, request_key, recorded, text, stepped):
        self.key, self.recorded, self.text, self.stepped = request_key, recorded, text, stepped


def injection(raw, options, config, edited, merged, settings, stepped=True):
    """(the Injection from config.json's bytes RAW (CONFIG parsed) and the runtime's --device
    OPTIONS to EDITED, with the spec's edits MERGED, None), or (None, why not): the config
    is not one the front end reads, the edits changed another part of it, or the front end's
    apply of the record would not give EDITED exactly. STEPPED: the step follows, and is to
    be keyed by the Injection's TEXT, so that the front end finds the step's recipe after
    its own apply; else EDITED is what the step (with nothing to do) left, the create's
    config.json."""
    request_key = key(raw, settings, options)
    if request_key is None:
        return None, "its config.json is not one the front end reads"
    recorded = edits(config, edited, merged)
    if recorded is None:
        return None, "the edits change more of config.json than env, mounts, devices and hooks"
    text = apply(raw, recorded)
    if text is None or fastjson.loads(text) != edited:
        return None, "the front end's apply of it gives another config"
    return Injection(request_key, recorded, text, stepped), None


def export(found, settings, blocks, devices, directory, started):
    """Write the recipe of the Injection FOUND (BLOCKS: the spec's edit blocks; DEVICES: the
    devices injected) into DIRECTORY, the steps directory; STARTED: when the resolution started
    (the settle window's reference). None, or why nothing was written."""
    from cdi import __version__

    from ..linker.stepmemo import prune
    from ..linker.stepresult import identify

    entries = host_paths(settings, blocks)
    identities = identify("/", entries, started) if entries else ffi.new("struct cds_identity[]", 1)
    if identities is None:
        return "a spec or host file changed within the settle window"
    parts = (__version__.encode(), found.key, b"\0".join(entries) + b"\0" if entries else b"",
             struct.pack("<I", len(entries)),
             bytes(ffi.buffer(identities, len(entries) * ffi.sizeof("struct cds_identity"))),
             driver_version_bytes(), ", ".join(devices).encode(), b"S" if found.stepped else b"N", found.recorded)
    data = MAGIC + b"".join(struct.pack("<I", len(part)) + part for part in parts)
    data += struct.pack("<Q", lib.cds_fnv1a(data, len(data)))
    name = f"q{lib.cds_fnv1a(found.key, len(found.key)):016x}"
    try:
        from cdi.safeio import write_file_atomic

        os.makedirs(directory, mode=0o700, exist_ok=True)
        write_file_atomic(os.path.join(directory, name), data, 0o600, temp_name=f".{name}.{os.getpid()}")
        prune(directory)
    except OSError as err:
        return f"cannot write it: {err.strerror}"   # (the worker keeps doing the injection: only slower)
    return None
