"""The container's linker cache and library links, prepared before runc starts.

The toolkit's specs carry createContainer hooks that run the host's ldconfig inside the
container (`update-ldcache`) and make soname links (`create-symlinks`). Here the cache is
computed natively from the image's own cache plus the libraries the edits mount (read on the
host) and written, with ld.so.conf where missing and the drop-ins, where the hook's ldconfig
leaves them, in the root (a later ldconfig in the container works and keeps the folders); a
read-only root gets them in an overlay of its /etc from the bundle instead (etcfiles.py), and
where neither can be done the cache alone is written into the bundle and bind-mounted read-only
over /etc/ld.so.cache. The update-ldcache hook is then dropped, so its process (ldconfig on the
image) never runs. A create-symlinks hook is dropped when every link already exists by other
means (a mount at the link's path) or after its links were made here, inside the rootfs and
without following anything out of it (links.py); when that cannot be done safely (the link
lies under a directory a mount will cover, as the toolkit's /dev/dri/by-path links under runc's
/dev) the hook becomes our own `cdi-shim-nshook symlinks` (C, csrc/hooks/nshook.c), which makes
them in the container's mount namespace, resolved inside the rootfs. Last, the library mounts
(and the files we bound from the bundle) may leave config.json for our binds hook, which makes
them in a few syscalls where runc resolves each several times over (filebinds.py).

`prepare_linker(config, bundle, log, file_binds=True)` returns the new config (file_binds=False,
the config key `file-binds = "runc"`: every mount stays in config.json for runc). A cache that cannot be
computed or written leaves the hooks as the spec wrote them, with a warning. Two exceptions fail
the create instead: an image past a bound on the work (include globs looking into too many
directories, the wall-clock bound on the whole step: engine.MAX_GLOB_DIRS, LINKER_TIME_LIMIT)
raises LinkerLimitError, since the hook would only repeat the same work inside runc, unbounded;
and an image with no place for /etc/ld.so.cache (its /etc a regular file, or /etc/ld.so.cache a
directory), where runc cannot bind a file, raises NoPlaceForCache when the spec asks for the
cache (update-ldcache) — a cache that only we wanted (library mounts, no hook) is left out
with a warning.
"""
import errno
import os
import posixpath
import stat
import sys
import time

from ..bundle import rootfs_path
from .etcfiles import compat_alone, compat_files, overlay_etc, readonly_root, write_etc_in_root
from .links import MountPlaces, call_links, dangling_later, made_links, make_soname_links, soname_links_to_make
from .mountpoints import make_mount_points

CACHE_FILE = "cdi-shim.ld.so.cache"
UNDER_A_MOUNT = "a link lies under a mounted directory"
HOOK_PROGRAMS = ("nvidia-cdi-hook", "nvidia-ctk", "cdi-shim", "cdi-shim-hook")
LIBRARY_MARKER = ".so"


class NoPlaceForCache(Exception):
    """The spec asks for a linker cache (update-ldcache) that the image has no place for."""


class LinkerLimitError(Exception):
    """The image's linker configuration is past a bound on the work (see the module)."""


class HookCall:
    """A hook of ours or the toolkit's: its subcommand and options."""

    def __init__(self, hook, at=None):
        self.hook = hook
        self.at = at    # (stage, index) in config.json's hooks
        self.command, self.options = "", {}
        args = hook.get("args") or [hook.get("path", "")]
        if posixpath.basename(hook.get("path", "")) not in HOOK_PROGRAMS \
                and posixpath.basename(args[0] if args else "") not in HOOK_PROGRAMS:
            return
        rest = list(args[1:])
        if rest[:1] == ["hook"]:
            rest = rest[1:]
        if not rest:
            return
        self.command = rest[0]
        index = 1
        while index < len(rest):
            name, sep, value = rest[index].partition("=")
            if name.startswith("--") and not sep and index + 1 < len(rest) and not rest[index + 1].startswith("--"):
                index += 1
                value = rest[index]
            self.options.setdefault(name.lstrip("-"), []).append(value)
            index += 1


def _is_library(path):
    name = posixpath.basename(path)
    return name.startswith("lib") and (name.endswith(LIBRARY_MARKER) or LIBRARY_MARKER + "." in name)


def _hook_calls(config):
    hooks = config.get("hooks") or {}
    for stage, entries in hooks.items():
        for index, entry in enumerate(entries or ()):
            if isinstance(entry, dict):
                call = HookCall(entry, (stage, index))
                if call.command:
                    yield stage, call


def has_known_hooks(config):
    """True when config.json holds a hook of one of HOOK_PROGRAMS."""
    return any(True for _ in _hook_calls(config))


def _bind(config, destination, source, out=None):
    if out is not None:
        out.bound(destination, source)
    mount = {"destination": destination, "type": "bind", "source": source,
             "options": ["bind", "ro", "nosuid", "nodev"]}
    mounts = [m for m in config.get("mounts") or () if m.get("destination") != destination]
    return dict(config, mounts=mounts + [mount])


def _no_place_for(rootfs, destination):
    """Why runc could not bind a file at DESTINATION in the rootfs (a parent that is not a
    directory, or DESTINATION itself a directory), or "" when it can."""

    from ..ldconfig.engine import LdcacheError, Root

    try:
        root = Root(rootfs)
    except LdcacheError:
        return ""  # the planner says why, with its own words
    with root:
        found = root.stat(destination)
        if found is None:
            if root.errno != errno.ENOTDIR:
                return ""  # missing (runc makes it) or unreadable (the planner reports it)
            parent = posixpath.dirname(destination)
            while parent != "/" and root.stat(parent) is None and root.errno == errno.ENOTDIR:
                parent = posixpath.dirname(parent)
            return f"the image's {parent} is not a directory"
        if stat.S_ISDIR(found[0]):
            # The kernel binds a file over any non-directory (a FIFO, a device: the image's own
            # cache is never opened), but never over a directory.
            return f"the image's {destination} is a directory"
    return ""


def prepare_linker(config, bundle, log, file_binds=True, raw=None, memo=None):
    """Return `config` with the linker cache prepared and the hooks we replaced removed; FILE_BINDS:
    whether the library mounts and our bundle files may go to our binds hook (_bind_files). MEMO:
    a resident worker's stepmemo.StepMemo, which keeps the step as a recipe for the C replay
    (with the binds hook only: what a recipe replays); RAW: config.json's bytes when CONFIG is
    exactly what they say (the step's key is read from them; else from CONFIG written out)."""
    from . import stepleft, stepmemo, toolkit_hooks as toolkit
    from .stepresult import StepResult

    start = time.monotonic()
    calls, mounts, libraries = _step_inputs(config, log)
    if not calls and not libraries:
        return config
    rootfs = rootfs_path(config, bundle) or os.path.join(bundle, "rootfs")
    if memo is None or not file_binds:
        return _step(StepResult(log, config), bundle, rootfs, calls, mounts, libraries, start, file_binds).config
    # (the params file as the step reads it, for the recipe: the C replay compares it)
    params = toolkit.params_file() if any(c.command == "disable-device-node-modification" for c in calls) else False
    with StepResult(log, config, observe=True) as out:
        out.trusted = stepleft.trusted(memo.left_folder, rootfs)
        _step(out, bundle, rootfs, calls, mounts, libraries, start, file_binds)
    if raw is None:
        from .. import fastjson

        raw = fastjson.dumpb(config)
    why = memo.keep(stepmemo.step_key_of(raw), out, rootfs, bundle, params, isolate_hooks(out.config))
    if why:
        stepleft.left(memo.left_folder, out, rootfs)
        log.debug(f"linker step not kept for a later container: {why}")
    return out.config


def _step_inputs(config, log=None):
    """(the hook calls whose work the step does, the mounts, {destination: source} of the
    library mounts) of CONFIG: the step has nothing to do, whatever the root, without a call or
    a library."""
    from . import toolkit_hooks as toolkit

    calls = []
    for _, call in _hook_calls(config):
        if toolkit.understood(call):
            calls.append(call)
        elif log is not None:
            log.debug(f"hook left to run as written: {' '.join(call.hook.get('args') or [call.hook.get('path', '')])}"
                      " (not one whose work this runtime does, or options it does not know)")
    mounts = [m for m in config.get("mounts") or () if isinstance(m, dict)]
    # (A source that is not a regular file is the plan's to skip, with its reason: it opens
    # every one anyway, and a resident worker's kept plan checks their identities.)
    libraries = {m["destination"]: m["source"] for m in mounts
                 if isinstance(m.get("destination"), str) and isinstance(m.get("source"), str)
                 and _is_library(m["destination"])}
    return calls, mounts, libraries


def needs_step(config):
    """Whether the linker step has anything to do for CONFIG (a decision of config.json alone)."""
    calls, _, libraries = _step_inputs(config)
    return bool(calls or libraries)


def _step(out, bundle, rootfs, calls, mounts, libraries, start, file_binds=True):
    """The linker step itself (prepare_linker, past the memo of whole steps), its file binds
    last, of OUT.original: OUT (stepresult.StepResult) filled, OUT.config the new config."""
    config = _linker_work(out.original, bundle, rootfs, calls, mounts, libraries, out, start)
    make_mount_points(config, rootfs, out)     # (a root reused run after run: mountpoints.py)
    out.config = _bind_files(config, bundle, rootfs, out) if file_binds else config
    return out


def _bind_files(config, bundle, rootfs, out):
    """CONFIG with the library mounts and our bundle files bound by our C hook rather than by
    runc, where that cannot be told apart and pays (filebinds.py)."""
    from . import filebinds, stepmemo
    from ..ldconfig.engine import LdcacheError, Root

    program = our_program("cdi-shim-nshook")
    if not os.access(program, os.X_OK):
        return config
    prefix = os.path.abspath(bundle) + "/"
    ours = {m["source"] for m in config.get("mounts") or () if isinstance(m, dict) and isinstance(m.get("source"), str)
            and m["source"].startswith(prefix) and m["source"][len(prefix):].startswith(stepmemo.OURS_PREFIX)
            and "/" not in m["source"][len(prefix):]}
    folded, params, links = filebinds.folded_hooks(config, program, rootfs)
    try:
        root = Root(rootfs)
    except LdcacheError:
        return config
    with root:
        # bind-params runs anyway; the links alone do not: for a create with --pid-file the
        # front end makes them itself, with no hook (csrc/frontend/after_create.c)
        chosen = filebinds.plan(config, root, ours, _is_library, 1 if params is not None else None)
    if not chosen:
        return config
    out.moved = [config["mounts"][index]["destination"] for index in chosen]
    config, hook = filebinds.hook(config, chosen, rootfs, program, SAFE_HOOK_ENV, params, links)
    folded += filebinds.replaced(config, program, rootfs, hook)     # (a bundle run again: filebinds.replaced)
    config = out.put_first(config, "createContainer", hook, folded)
    out.log.debug(f"{len(chosen)} file mounts bound by {program} binds in the container's mount namespace, not by runc")
    return config


class _Work:
    """One step's linker work in progress (_linker_work): the config as it stands, the hooks whose
    work is done (DROP: their (stage, index)) and why others were left to run (REASONS), the
    links made once the cache is planned (DEFERRED)."""

    def __init__(self, config, bundle, rootfs, calls, out):
        self.config = self.original = config
        self.bundle, self.rootfs, self.calls, self.out = bundle, rootfs, calls, out
        self.updates = [call for call in calls if call.command == "update-ldcache"]
        self.symlinks = [call for call in calls if call.command == "create-symlinks"]
        self.drop, self.reasons, self.deferred = set(), {}, []
        self.compat, self.compat_calls, self.alone = [], [], []

    def alone_dropin(self, config):
        """CONFIG with enable-cuda-compat's drop-in that no cache of ours reads written."""
        if not self.alone:
            return config
        return compat_alone(config, self.bundle, self.rootfs, [f for _, f in self.alone], self.out)

    def give_up(self, config, why):
        """The cache's hooks run as written, and an enable-cuda-compat after them (so its
        drop-in comes after their ldconfig, unread): the reasons, for _finish."""
        for call in self.updates + self.compat_calls + ([c for c, _ in self.alone] if self.updates else []):
            self.reasons[call.at] = why
            self.drop.discard(call.at)
        return self.finish(config if self.updates else self.alone_dropin(config))

    def finish(self, config):
        return _finish(config, self.drop, self.rootfs, self.deferred, self.out, self.calls, self.reasons)


def _linker_work(config, bundle, rootfs, calls, mounts, libraries, out, start):
    """The cache, the links and the toolkit hooks' work (_step)."""
    work = _Work(config, bundle, rootfs, calls, out)
    work.config, work.compat, work.compat_calls, work.alone = _toolkit_hooks(config, bundle, rootfs, calls, mounts,
                                                                             work.drop, out)
    _make_links(work, mounts, libraries)
    if work.updates or libraries or work.compat:
        return _cache_work(work, mounts, libraries, start)
    return work.finish(work.alone_dropin(work.config))


def _make_links(work, mounts, libraries):
    """create-symlinks' links, made now, or (leading nowhere yet: their target neither in the
    image nor mounted) once the cache is planned: the cache would not list them either way, and
    a directory changed now would be scanned again in full rather than taken from the image's
    cache."""
    rootfs, out = work.rootfs, work.out
    links_made = {link for call in work.symlinks for _, link in call_links(call)}
    with MountPlaces(rootfs, [m.get("destination", "") for m in mounts], libraries) as places:
        for call in work.symlinks:
            links = list(call_links(call))
            pending = [(target, link) for target, link in links if not places.at_a_mount(link)]
            if any(places.under_a_mount(link) for _, link in pending):
                # (the toolkit's /dev/dri/by-path links: /dev is runc's mount) made in the
                # container's mount namespace by the hook: expected, so not a warning
                out.log.debug("keeping a create-symlinks hook: a link lies under a mounted directory")
                work.reasons[call.at] = UNDER_A_MOUNT
                continue
            later = []
            if work.updates or libraries or work.compat:
                pending, later = dangling_later(rootfs, pending, libraries, links_made, places)
            if not made_links(rootfs, call, pending, out, work.reasons):
                continue
            if later:
                work.deferred.append((call, later))
            else:
                work.drop.add(call.at)


def _cache_work(work, mounts, libraries, start):
    """The linker cache planned and put in place: into the root (or a read-only root's /etc
    overlay) as the hook's ldconfig leaves it, or bound from the bundle (_bind_cache)."""
    from . import toolkit_hooks as toolkit
    from ..ldconfig.ldcache import LINKER_TIME_LIMIT, Deadline, LdcacheError, LdcacheLimitError, memo_stats, plan
    from ..ldconfig.mounted import directory_mounts

    rootfs, out, config = work.rootfs, work.out, work.config
    unfit = _no_place_for(rootfs, "/etc/ld.so.cache")
    if unfit and work.updates:
        # the spec needs a cache (the toolkit's hook would fail on this image too): say why
        raise NoPlaceForCache(
            f"the spec's update-ldcache hook needs a linker cache at /etc/ld.so.cache, but {unfit}: "
            "runc cannot mount one there (nor could the hook write one), and without it the injected "
            "libraries cannot be found by soname; the image needs an /etc directory")
    if unfit and work.compat:
        raise toolkit.HookFailure("enable-cuda-compat", f"the image's CUDA compat libraries need a linker "
                                  f"cache at /etc/ld.so.cache, but {unfit}")
    if unfit:
        # our own idea (no hook asked for it): run as the toolkit would, without a cache
        out.warn(f"linker cache not mounted for {rootfs}: {unfit}; the injected libraries are found "
                 "only in the linker's default directories")
        return work.finish(work.alone_dropin(config))
    folders = _update_folders(work.updates, libraries)
    # The soname links the hook's ldconfig makes beside the mounted libraries, after its scan:
    # planned as the mounted file at that name (the cache names the link, as ldconfig's does),
    # made once the cache is planned (a create-symlinks link to one of them dangled during
    # ldconfig's scan, and is not listed: dangling_later)
    sonames = soname_links_to_make(rootfs, folders, work.updates, libraries, work.compat, out.log, start)
    counting = getattr(out.log, "debug_enabled", True)  # the memo's counts are for the debug line only
    counts = memo_stats()[:2] if counting else (0, 0)
    # (a folder a directory mount provides is read through its source: mounted.py)
    others = directory_mounts(m for m in mounts if m.get("destination") not in libraries)
    try:
        result = plan(rootfs, folders, extra=dict(libraries, **{link: source for _, link, source in sonames}),
                      deadline=Deadline(LINKER_TIME_LIMIT, start), compat=work.compat, mounts=others)
    except LdcacheLimitError as err:
        raise LinkerLimitError(f"the linker cache of {rootfs} is refused: {err}; the container is not "
                               "created rather than its update-ldcache hook left to repeat this "
                               "inside runc") from None
    except (LdcacheError, OSError) as err:
        out.warn(f"linker cache not prepared for {rootfs} ({err}); the spec's hooks run as written")
        return work.give_up(config, f"linker cache not prepared: {err}")
    except Exception as err:  # noqa: BLE001 - a bug here must not fail a container the hooks can serve
        out.fail(f"linker cache: unexpected {type(err).__name__}: {err}; the spec's hooks run as written")
        return work.give_up(config, f"linker cache: unexpected {type(err).__name__}: {err}")
    if result.covered:
        # The key has a mount's source only where it names a library (a pod's own mounts differ
        # pod to pod): a replay checks these sources as well as the host folders' identities
        # (the plan's looked).
        out.sources_of(work.original, result.providers)
    out.plans.append(result.looked)
    for warning in result.warnings:
        out.log.debug(f"linker cache: {warning}")
    if work.updates:
        # As the hook's ldconfig leaves it: a later ldconfig in the container works, and the
        # drop-ins keep the folders (a bind over /etc/ld.so.cache could not be renamed over).
        # A read-only root gets them in an overlay of its /etc instead (etcfiles.overlay_etc).
        after = compat_files([f for _, f in work.alone])
        readonly = readonly_root(config)
        overlaid = overlay_etc(config, work.bundle, rootfs, result, sonames, out, after) if readonly else None
        # (runc's mount points made first in a reused root: the cache stays newer than its folders)
        points = lambda: make_mount_points(work.original, rootfs, out)  # noqa: E731
        if overlaid is not None or not readonly and write_etc_in_root(rootfs, result, sonames, out, after, points):
            work.drop.update(call.at for call in work.updates + work.compat_calls)
            _memo_line(out.log, counting, result, *counts, work.compat, memo_stats)
            return work.finish(overlaid or config)
    return _bind_cache(work, result, sonames, lambda: _memo_line(out.log, counting, result, *counts, work.compat,
                                                                  memo_stats))


def _bind_cache(work, result, sonames, memo_line):
    """The step finished with the planned cache (and musl's path files) written into the bundle
    and bound, the soname links made; or, when they cannot be written, with the hooks left to do
    it, as for any other linker error."""
    from ..ldconfig.ldcache import LdcacheError, write_cache

    rootfs, bundle, out, config = work.rootfs, work.bundle, work.out, work.config
    files = [("/etc/ld.so.cache", CACHE_FILE, result.cache)]
    files += [(path, f"cdi-shim.musl-{index}.path", data)
              for index, (path, data) in enumerate(sorted(result.musl.items()))]
    written = []
    try:
        for destination, name, data in files:
            unfit = destination != "/etc/ld.so.cache" and _no_place_for(rootfs, destination)
            if unfit:
                out.warn(f"musl library path file not mounted for {rootfs}: {unfit}")
                continue
            source = os.path.abspath(os.path.join(bundle, name))
            write_cache(source, data)  # temp file + rename, mode 0644
            written.append((destination, source))
            out.wrote(source, data, 0o644)
    except (LdcacheError, OSError) as err:
        # (A temp file of a worker killed mid-write is removed by the next write of config.json
        # in this bundle: shim.bundle.)
        for _, source in written:
            try:
                os.unlink(source)
            except OSError:
                pass
        out.warn(f"linker cache not written into the bundle ({err}); the spec's hooks run as written")
        return work.give_up(config, f"linker cache not written into the bundle: {err}")
    for destination, source in written:
        config = _bind(config, destination, source, out)
    if sonames:
        make_soname_links(rootfs, [(target, link) for target, link, _ in sonames], out)
    work.drop.update(call.at for call in work.updates + work.compat_calls)
    memo_line()
    return work.finish(work.alone_dropin(config))


def _memo_line(log, counting, result, hits, misses, compat, memo_stats):
    if compat:
        log.debug(f"enable-cuda-compat: {', '.join(compat)} first in the linker cache")
    if counting:
        remembered, read = (now - then for now, then in zip(memo_stats()[:2], (hits, misses)))
        memo = f"; {remembered} files or listings remembered, {read} read" if remembered or read else ""
        kept = ", the plan of an earlier container of these files" if result.remembered else ""
        log.debug(f"linker cache: {result.entries} entries ({result.mode}, {result.scanned} directories "
                  f"scanned{': ' + result.reason if result.reason else ''}{kept}){memo}")


def _update_folders(updates, libraries):
    """The folders of update-ldcache's 00-nvcr drop-in: its --folder options (none given, none:
    the hook adds no folder). Without such a hook, the mounted libraries' folders (our cache)."""
    if updates:
        return list(dict.fromkeys(folder for call in updates for folder in call.options.get("folder", ())))
    return list(dict.fromkeys(posixpath.dirname(dest) for dest in libraries))


def _become_nshook(call, out, program, *args):
    """The hook becomes our C one (cdi-shim-nshook ARGS, csrc/hooks/nshook.c) at its place."""
    out.replaced[call.at] = {"path": program, "args": ["cdi-shim-nshook", *args], "env": list(SAFE_HOOK_ENV)}


def _finish(config, drop, rootfs, deferred, out, calls, reasons):
    """Make the links left for after planning, then drop the hooks whose work is done. A hook
    whose work we could not do stays for runc to run; when its program is not on this host
    either, the create fails here with the reason (runc would only say the program is missing)."""
    from .toolkit_hooks import HookFailure

    for call, links in deferred:
        if made_links(rootfs, call, links, out, reasons):
            drop.add(call.at)
    nshook = None
    for call in calls:
        if call.at in drop or call.at not in reasons:
            continue
        path = call.hook.get("path", "")
        if reasons[call.at] == UNDER_A_MOUNT:
            nshook = nshook or our_program("cdi-shim-nshook")
            if os.access(nshook, os.X_OK):
                # Links under a mount (the toolkit's /dev/dri/by-path ones, in runc's /dev) can only
                # be made in the container's mount namespace: our C program does it,
                # whatever program the spec named (its own start would cost more).
                links = [arg for target, link in call_links(call) for arg in ("--link", f"{target}::{link}")]
                _become_nshook(call, out, nshook, "symlinks", "--rootfs", rootfs, *links)
                out.log.debug(f"create-symlinks: links under a mount made by {nshook} in the container's mount "
                              "namespace")
                continue
        if not os.access(path, os.X_OK):
            raise HookFailure(call.command, f"{reasons[call.at]}; and its program {path} is not on this host")
        out.refuse("a hook is left to its program")
    if drop or out.replaced:
        return out.change_hooks(config, drop)
    return config


def _toolkit_hooks(config, bundle, rootfs, calls, mounts, drop, out):
    """The native work of the toolkit's hooks other than update-ldcache and create-symlinks
    (toolkit_hooks.py). Returns (config, compat folders, the enable-cuda-compat calls whose
    folders the cache must take: dropped once the cache is in place, [(call, folder)] of those whose drop-in no
    update-ldcache hook reads: dropped, the drop-in written all the same)."""
    from . import toolkit_hooks as toolkit

    compat, compat_calls, destinations, alone = [], [], [m.get("destination", "") for m in mounts], []
    for call in calls:
        if call.command == "enable-cuda-compat":
            # its drop-in counts only for an update-ldcache hook run after it (the hooks run in order)
            later = any(c.command == "update-ldcache" for c in calls[calls.index(call) + 1:])
            folder = toolkit.cuda_compat_folder(rootfs, call)
            if folder and later:
                compat.append(folder)
                compat_calls.append(call)
            else:
                if folder:
                    alone.append((call, folder))
                drop.add(call.at)
                out.log.debug("enable-cuda-compat: the compat libraries are not to be used"
                          + ("" if later else " (no update-ldcache hook after it)"))
        elif call.command == "chmod":
            out.refuse("chmod")     # (rare: its modes and device fields are not replayed)
            with MountPlaces(rootfs, destinations, [m.get("destination") for m in mounts
                                                    if _is_library(m.get("destination") or "")]) as places:
                config, mode, later = toolkit.chmod(config, rootfs, call, places)
            if not later:
                drop.add(call.at)
                continue
            program = our_program("cdi-shim-nshook")
            if not os.access(program, os.X_OK):
                raise toolkit.HookFailure(call.command, f"our hook program {program} is missing (paths under "
                                          f"a mount runc makes: {', '.join(later)})")
            # Under runc's mounts (the toolkit's /dev/dri): our C hook, after them, in place of the spec's
            _become_nshook(call, out, program, "chmod", "--rootfs", rootfs, "--mode", mode,
                           *[arg for path in later for arg in ("--path", path)])
            out.log.debug(f"chmod: {', '.join(later)} under a mount, changed by {program} after runc's mounts")
        elif call.command == "update-application-profile":
            data = toolkit.application_profile(config)
            if data is not None:
                source = _write_bundle_file(bundle, toolkit.PROFILE_FILE, data, 0o444, call.command, out)
                config = _bind(config, toolkit.PROFILE_PATH, source, out)
            drop.add(call.at)
        elif call.command == "disable-device-node-modification":
            data = toolkit.params_contents()
            if data is None:
                drop.add(call.at)
                continue
            source = _write_bundle_file(bundle, toolkit.PARAMS_FILE, data, 0o444, call.command, out)
            program = our_program("cdi-shim-nshook")
            if not os.access(program, os.X_OK):
                raise toolkit.HookFailure(call.command, f"our hook program {program} is missing (runc refuses "
                                          "mounts under /proc from config.json, so a hook makes this one)")
            # runc refuses config.json mounts under /proc: our own hook (C) binds the
            # file in the container's mount namespace, in place of the spec's.
            _become_nshook(call, out, program, "bind-params", "--rootfs", rootfs, "--source", source)
            out.log.debug(f"disable-device-node-modification: {source} bound over {toolkit.PARAMS_PATH} by {program}")
    return config, list(dict.fromkeys(compat)), compat_calls, alone


def our_program(name):
    """One of our installed programs: beside the interpreter (a venv, the build's scripts),
    else on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), name)
    if os.access(beside, os.X_OK):
        return beside
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        if os.path.isabs(candidate) and os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return beside


def _write_bundle_file(bundle, name, data, mode, command, out):
    from . import toolkit_hooks as toolkit

    source = os.path.abspath(os.path.join(bundle, name))
    try:
        _write_file(source, data, mode)
    except OSError as err:
        raise toolkit.HookFailure(command, f"cannot write {source}: {err}") from None
    out.wrote(source, data, mode)
    return source


def _write_file(path, data, mode):
    """A bundle file, written whole (temp file + rename) with MODE; OSError on failure."""
    from ..ldconfig.ldcache import LdcacheError, write_cache

    try:
        write_cache(path, data, mode=mode)
    except LdcacheError as err:
        raise OSError(str(err)) from None


SAFE_HOOK_ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)


def isolate_hooks(config):
    """Give every hook without an env an explicit one.

    runc runs a hook whose env is absent with the environment of `runc init`, which by then is
    the container's: an image setting LD_PRELOAD (CVE-2025-23266) or PATH would steer a hook
    running with the host's privileges. An explicit env is all runc passes.
    """
    hooks = config.get("hooks")
    if not isinstance(hooks, dict) or not any(
            isinstance(h, dict) and not h.get("env") for entries in hooks.values() if isinstance(entries, list)
            for h in entries):
        return config
    fixed = {stage: [dict(h, env=list(SAFE_HOOK_ENV)) if isinstance(h, dict) and not h.get("env") else h
                     for h in entries] if isinstance(entries, list) else entries
             for stage, entries in hooks.items()}
    return dict(config, hooks=fixed)

