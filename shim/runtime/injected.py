"""An injection as the front end's C applies it (csrc/engine/request.c): the key of the request
(cds_request_key) and the record of what the edits changed (cds_request_edits, read back by
cds_request_apply, beside it): each changed place of config.json (process.env, mounts,
linux.devices, linux.resources.devices, hooks) as elements of the input config or new JSON text.
A record is made only when the C apply of it gives exactly the config the worker made; a request
recipe (requestmemo.py) holds it."""
import os

from .. import fastjson
from .._native import ffi, lib

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
    text = settings.text or b""
    return _handed_over(lambda out, size: lib.cds_request_key(
        raw, len(raw), prefixes, len(prefixes), os.fsencode(settings.device_env), options, len(options), text,
        len(text), out, size))


def apply(raw, edits):
    """config.json's bytes RAW with the recorded EDITS applied by the front end's code, or None."""
    return _handed_over(lambda out, size: lib.cds_request_apply(raw, len(raw), edits, len(edits), out, size),
                        "char **")


def _handed_over(call, pointer="uint8_t **"):
    """The bytes a cds_request_* CALL(out, size) hands over (freed here), or None when it fails."""
    out, size = ffi.new(pointer), ffi.new("size_t *")
    if call(out, size) != 0:
        return None
    try:
        return bytes(ffi.buffer(out[0], size[0]))
    finally:
        lib.cds_request_free(out[0])


def edits(config, edited, merged):
    """The record of what the injection changed from CONFIG to EDITED (MERGED: the spec's edits,
    cdi.container_edits.merge_edits; written by cds_request_edits, request.c), or None when it
    changed anything else."""
    if _without_places(config) != _without_places(edited):
        return None
    # Elements the edits set are always new text: another container's element at that index
    # (an env entry of the same name, a mount at the same destination) is what they replace.
    set_by_edits = {
        "E": {entry.partition("=")[0] for entry in merged.get("env") or ()},
        "M": {mount.get("containerPath") for mount in merged.get("mounts") or ()},
    }
    keep, places = [], []
    for tag, path in _PLACES:
        before, after = _get(config, path), _get(edited, path)
        if before == after:
            continue
        if after is None:
            return None
        if tag == "H":
            keep.append(ffi.new("char[]", fastjson.dumpb(after)))
            places.append((tag.encode(), keep[-1], len(keep[-1]) - 1, ffi.NULL, 0))
            continue
        if not isinstance(after, list) or not isinstance(before or [], list):
            return None
        used, items = set(), []
        for element in after:
            index = None
            if not _set_by_edits(tag, element, set_by_edits):
                index = next((at for at, old in enumerate(before or ()) if at not in used and old == element), None)
            if index is None:
                keep.append(ffi.new("char[]", fastjson.dumpb(element)))
                items.append((0, keep[-1], len(keep[-1]) - 1))
            else:
                used.add(index)
                items.append((index, ffi.NULL, 0))
        keep.append(ffi.new("struct cds_request_item[]", items))
        places.append((tag.encode(), ffi.NULL, 0, keep[-1], len(items)))
    records = ffi.new("struct cds_request_place[]", places)
    return _handed_over(lambda out, size: lib.cds_request_edits(records, len(places), out, size))


def _set_by_edits(tag, element, set_by_edits):
    if tag == "E":
        return isinstance(element, str) and element.partition("=")[0] in set_by_edits["E"]
    if tag == "M":
        return isinstance(element, dict) and element.get("destination") in set_by_edits["M"]
    return False


class Injection:
    """What a recipe of this injection would hold: the request's KEY, the RECORDED edits, the
    injected config's TEXT as the front end makes it from them, and whether the step follows
    (STEPPED) or TEXT is the config.json of the create."""
    __slots__ = ("key", "recorded", "text", "stepped")

    def __init__(self, request_key, recorded, text, stepped):
        self.key, self.recorded, self.text, self.stepped = request_key, recorded, text, stepped


def record(raw, options, config, edited, merged, settings, stepped=True):
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
