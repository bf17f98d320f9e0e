"""The recipe of a request's injection, for the front end to replay without the worker.

After a create that asked for devices and whose step has a recipe (shim/linker/stepmemo.py), the
worker has C (cds_request_recipe_write, csrc/engine/recipe.c, beside its reader) write what the
injection did (injected.py: its key and its edits' record) into the steps directory, with the
identities of the spec directories and files and of the host files the edits need, and the
driver version file's bytes. The front end (csrc/engine/replay.c, replay_request) checks all of
them, applies the edits to its config's text and replays the step of the result. Nothing is
written for a create whose resolution warned, that came with Docker's --gpus hook, whose edits
touched anything else, or that read a file changed within the settle window (docs/fast.md).
"""
import os

from cdi.spec_dirs import SPEC_EXTENSIONS

from .._native import ffi, lib


def host_paths(settings, blocks):
    """What the resolution read of the host: the spec directories, their spec files, and the
    files the edits need (cdi/host_files.py), as cds_memo_identify's host entries."""
    from cdi.host_files import host_files

    paths = []
    for directory in settings.spec_dirs:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            names = []
        paths += [directory] + [os.path.join(directory, name) for name in names if name.endswith(SPEC_EXTENSIONS)]
    for block in blocks:
        paths += [path for _, path, _ in host_files(block)]
    return [b"h" + os.fsencode(path) for path in dict.fromkeys(paths)]


def export(found, settings, blocks, devices, directory, started):
    """Write the recipe of the Injection FOUND (BLOCKS: the spec's edit blocks; DEVICES: the
    devices injected) into DIRECTORY, the steps directory, with C's writer (recipe.c); STARTED:
    when the resolution started (the settle window's reference). None, or why nothing was
    written."""
    from cdi import __version__

    from ..linker.stepleft import identify

    entries = host_paths(settings, blocks)
    identities = identify("/", entries, started) if entries else ffi.new("struct cds_identity[]", 1)
    if identities is None:
        return "a spec or host file changed within the settle window"
    paths, key, edits, version, named = (ffi.new("char[]", value) for value in (
        b"\0".join(entries) + b"\0" if entries else b"", found.key, found.recorded, __version__.encode(),
        ", ".join(devices).encode()))
    recipe = ffi.new("struct cds_request_recipe *", (version, key, len(found.key), paths, len(paths) - 1, len(entries),
                                                     identities, named, found.stepped, edits, len(found.recorded)))
    if lib.cds_request_recipe_write(os.fsencode(directory), recipe) != 0:
        return f"cannot write it: {os.strerror(ffi.errno)}"   # (the worker keeps doing the injection: only slower)
    return None
