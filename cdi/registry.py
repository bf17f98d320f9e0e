"""The registry: every device of the spec directories, resolved and injected on request.

Loading rules are the reference cache's: a broken file is skipped with its error kept under its
path; a device defined again in a higher-priority directory replaces the lower one; a device
defined twice at the same priority is an error for both files and the name is deleted after
the scan (even if a higher-priority directory also defines it, as the reference does).

Speed: parsing hundreds of YAML files on every container create is too slow, so the parsed
result is kept in a cache file (see `RegistryCache`). Every use re-stats every spec file and
compares (device, inode, size, mtime, ctime) with what the cache recorded; any difference, or a
file added or removed, re-parses just the changed files. A file modified so recently that its
mtime cannot be trusted to have ticked is also verified by content hash ("racy" entries).
"""
import hashlib
import json
import marshal
import os
import tempfile
import time

from . import __version__, parser
from .container_edits import apply_edits, merge_edits
from .errors import CDIError, EditError, SpecError, UnresolvableDevicesError
from .spec import Spec, parse_spec, read_spec_bytes
from .spec_dirs import DEFAULT_SPEC_DIRS, scan_spec_dirs

CACHE_FORMAT = 1
# An mtime within this many ns of the moment the cache was built may not have ticked yet.
RACY_WINDOW_NS = 2_000_000_000
CACHE_DIR_ENV = "CDI_SHIM_CACHE_DIR"
DEFAULT_CACHE_DIR = "/run/cdi-shim/cache"


def _validator(info):
    if info is None:
        return None
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _digest(data):
    return hashlib.blake2b(data, digest_size=16).digest()


def _kind_hint(data):
    """The `kind` of a spec that failed to decode, best effort, for error context."""
    for line in data.decode("utf-8", "replace").splitlines():
        key, sep, value = line.strip().partition(":")
        if sep and key.strip("\"' ").lower() == "kind":
            return value.strip().strip(",").strip("\"' ")
    return ""


def load_file_entry(path, priority):
    """Read and parse one spec file into a cacheable entry.

    Entry: (validator, digest, ok, payload, kind, names) where payload is the spec document as
    JSON text when ok, else the error text.
    """
    try:
        data, info = read_spec_bytes(path)
    except SpecError as err:
        return (None, None, False, str(err), "", ())
    validator, digest = _validator(info), _digest(data)
    try:
        spec = parse_spec(data, path, priority)
    except SpecError as err:
        kind = _kind_hint(data)
        return (validator, digest, False, str(err), kind, ())
    return (validator, digest, True, json.dumps(spec.doc, separators=(",", ":")), spec.kind,
            tuple(spec.devices))


class RegistryCache:
    """A file holding the parsed spec files of one list of spec directories.

    Written atomically (temp file + rename), so concurrent refreshes by several processes are
    safe: each writes a complete, self-validating snapshot and the last rename wins. It is only
    trusted when owned by us and not writable by anyone else, because it steers what goes into
    containers.
    """

    def __init__(self, spec_dirs, cache_dir):
        self.cache_dir = cache_dir
        key = hashlib.sha1("\0".join(spec_dirs).encode()).hexdigest()[:16]
        self.path = os.path.join(cache_dir, f"registry-{key}.bin") if cache_dir else None
        self.spec_dirs = tuple(spec_dirs)

    def load(self):
        if not self.path:
            return None
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            info = os.fstat(fd)
            if info.st_uid != os.geteuid() or info.st_mode & 0o022 or (info.st_mode & 0o170000) != 0o100000:
                return None
            with os.fdopen(os.dup(fd), "rb") as stream:
                data = stream.read()
        finally:
            os.close(fd)
        try:
            state = marshal.loads(data)
        except (EOFError, ValueError, TypeError):
            return None
        if not isinstance(state, dict) or state.get("format") != CACHE_FORMAT \
                or state.get("version") != __version__ \
                or state.get("dirs") != self.spec_dirs:
            return None
        return state

    def store(self, state):
        if not self.path:
            return
        try:
            os.makedirs(self.cache_dir, mode=0o700, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".registry.", dir=self.cache_dir)
        except OSError:
            return  # a read-only or foreign cache dir only costs speed
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(marshal.dumps(state))
            os.rename(tmp, self.path)
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def default_cache_dir():
    configured = os.environ.get(CACHE_DIR_ENV)
    if configured is not None:
        return configured or None  # "" turns the persistent cache off
    if os.geteuid() == 0:
        return DEFAULT_CACHE_DIR
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR")
    return os.path.join(runtime_dir, "cdi-shim", "cache") if runtime_dir else None


class Registry:
    """Devices of a list of spec directories (rising priority)."""

    def __init__(self, spec_dirs=DEFAULT_SPEC_DIRS, cache_dir=False):
        self.spec_dirs = tuple(spec_dirs)
        if cache_dir is False:
            cache_dir = default_cache_dir()
        self._cache = RegistryCache(self.spec_dirs, cache_dir)
        self._state = None
        self.reparsed = 0  # files parsed by the last refresh (observability, tests)

    # --- loading --------------------------------------------------------------------------

    def refresh(self):
        """Bring the registry up to date with the spec directories; returns self."""
        files, dir_errors = scan_spec_dirs(self.spec_dirs)
        cached = self._state or self._cache.load()
        previous, racy = {}, ()
        if cached:
            previous = {path: entry for path, entry in zip(cached["paths"], cached["entries"])}
            racy = frozenset(cached["racy"])
            if self._unchanged(cached, files, dir_errors, previous):
                self._state, self.reparsed = cached, 0
                if racy and self._settled(files):
                    # Every racy file has now aged past the window: trust stats from here on.
                    self._state = dict(cached, racy=[])
                    self._cache.store(self._state)
                return self
        self._state = self._rebuild(files, dir_errors, previous, racy)
        self._cache.store(self._state)
        return self

    @staticmethod
    def _entry_current(entry, info, racy_paths, path):
        if entry is None or entry[0] is None or entry[0] != _validator(info):
            return False
        if path in racy_paths:
            try:
                data, _ = read_spec_bytes(path)
            except SpecError:
                return False
            return _digest(data) == entry[1]
        return True

    def _unchanged(self, cached, files, dir_errors, previous):
        if cached["dir_errors"] != dir_errors or len(cached["paths"]) != len(files):
            return False
        racy = set(cached["racy"])
        for (priority, path, info), cached_path, cached_priority in zip(files, cached["paths"], cached["priorities"]):
            if path != cached_path or priority != cached_priority:
                return False
            if not self._entry_current(previous[path], info, racy, path):
                return False
        return True

    @staticmethod
    def _settled(files):
        now = time.time_ns()
        return all(info is not None and now - info.st_mtime_ns >= RACY_WINDOW_NS
                   and now - info.st_ctime_ns >= RACY_WINDOW_NS for _, _, info in files)

    def _rebuild(self, files, dir_errors, previous, previous_racy):
        now = time.time_ns()
        paths, priorities, entries, racy = [], [], [], []
        self.reparsed = 0
        for priority, path, info in files:
            entry = previous.get(path)
            # A previous entry is reused only when its stat matches and it was not racy
            # (a racy entry's stat proves nothing, so it is parsed again).
            if entry is None or entry[0] is None or entry[0] != _validator(info) or path in previous_racy:
                entry = load_file_entry(path, priority)
                self.reparsed += 1
            paths.append(path)
            priorities.append(priority)
            entries.append(entry)
            if entry[0] is None or now - entry[0][3] < RACY_WINDOW_NS or now - entry[0][4] < RACY_WINDOW_NS:
                racy.append(path)
        devices, errors = self._index(paths, priorities, entries)
        return {"format": CACHE_FORMAT, "version": __version__, "dirs": self.spec_dirs, "paths": paths, "priorities": priorities,
                "entries": entries, "racy": racy, "dir_errors": dir_errors, "devices": devices,
                "errors": errors}

    @staticmethod
    def _index(paths, priorities, entries):
        devices, errors, conflicts = {}, {}, set()
        for index, (path, priority, entry) in enumerate(zip(paths, priorities, entries)):
            if not entry[2]:
                errors.setdefault(path, []).append("failed to load CDI Spec " + entry[3])
                continue
            vendor, cls = parser.parse_qualifier(entry[4])
            for name in entry[5]:
                qualified = parser.qualified_name(vendor, cls, name)
                old = devices.get(qualified)
                if old is not None:
                    old_path, old_priority = paths[old], priorities[old]
                    if priority < old_priority:
                        continue
                    if priority == old_priority:
                        message = f'conflicting device "{qualified}" (specs "{path}", "{old_path}")'
                        errors.setdefault(path, []).append(message)
                        errors.setdefault(old_path, []).append(message)
                        conflicts.add(qualified)
                        continue
                devices[qualified] = index
        for qualified in conflicts:
            devices.pop(qualified, None)
        return devices, errors

    def _loaded(self):
        if self._state is None:
            self.refresh()
        return self._state

    # --- queries --------------------------------------------------------------------------

    def errors(self):
        """{path or directory: [error text]} from the last refresh."""
        state = self._loaded()
        result = {path: list(messages) for path, messages in state["errors"].items()}
        for directory, message in state["dir_errors"].items():
            result.setdefault(directory, []).append(message)
        return result

    def device_names(self):
        """Every resolvable qualified device name, sorted."""
        return sorted(self._loaded()["devices"])

    def spec_paths(self):
        state = self._loaded()
        return [path for path, entry in zip(state["paths"], state["entries"]) if entry[2]]

    def get_spec(self, path):
        """The Spec loaded from `path` (None if it did not load)."""
        state = self._loaded()
        try:
            index = state["paths"].index(path)
        except ValueError:
            return None
        return self._spec_at(index)

    def _spec_at(self, index):
        state = self._state
        entry = state["entries"][index]
        if not entry[2]:
            return None
        return Spec(json.loads(entry[3]), state["paths"][index], state["priorities"][index])

    def vendors(self):
        """{vendor: [spec path, ...]} of the specs that loaded (per-vendor grouping)."""
        state = self._loaded()
        grouped = {}
        for path, entry in zip(state["paths"], state["entries"]):
            if entry[2]:
                vendor, _ = parser.parse_qualifier(entry[4])
                grouped.setdefault(vendor, []).append(path)
        return grouped

    def lookup(self, qualified):
        """(Spec, device dict) for a qualified name looked up verbatim, or None."""
        state = self._loaded()
        index = state["devices"].get(qualified)
        if index is None:
            return None
        spec = self._spec_at(index)
        return spec, spec.devices[parser.parse_device(qualified)[2]]

    # --- injection ------------------------------------------------------------------------

    def resolve(self, names):
        """The edit blocks for the requested devices, in the reference's order.

        Spec-level edits come once per spec, just before its first requested device. Raises
        UnresolvableDevicesError listing every name not found (and why, where we can tell).
        """
        self._loaded()
        specs_seen, blocks, unresolved, origins = {}, [], [], []
        for name in names:
            index = self._state["devices"].get(name)
            if index is None:
                unresolved.append(name)
                continue
            spec = specs_seen.get(index)
            if spec is None:
                spec = specs_seen[index] = self._spec_at(index)
                blocks.append(spec.edits)
            blocks.append(spec.devices[parser.parse_device(name)[2]].get("containerEdits") or {})
            origins.append((name, spec.path))
        if unresolved:
            raise UnresolvableDevicesError(unresolved, self.explain_unresolved(unresolved))
        return blocks, origins

    def inject(self, config, names):
        """Return a new OCI config with the named devices injected; `config` is not modified."""
        if config is None:
            raise CDIError("can't inject devices, nil OCI Spec")
        blocks, _ = self.resolve(names)
        try:
            return apply_edits(config, merge_edits(blocks))
        except EditError as err:
            raise EditError(f"failed to inject devices: {err}") from None

    def explain_unresolved(self, names, limit=8):
        """Why names did not resolve: what exists of that kind, where we looked, load errors."""
        state = self._state
        parts = []
        for name in names:
            vendor, cls, device = parser.parse_device(name)
            if not vendor:
                try:
                    parser.parse_qualified_name(name)
                except CDIError as err:
                    parts.append(str(err))
                continue
            prefix = f"{vendor}/{cls}="
            known = sorted(q[len(prefix):] for q in state["devices"] if q.startswith(prefix))
            if known:
                shown = ", ".join(f'"{d}"' for d in known[:limit])
                more = f" and {len(known) - limit} more" if len(known) > limit else ""
                parts.append(f"{vendor}/{cls} has only {shown}{more}")
            else:
                parts.append(f"no spec defines devices of kind {vendor}/{cls}")
            for path, entry in zip(state["paths"], state["entries"]):
                if not entry[2] and parser.parse_qualifier(entry[4])[0] == vendor:
                    parts.append(entry[3])
            for path, messages in state["errors"].items():
                for message in messages:
                    if message.startswith("conflicting device") and f'"{name}"' in message:
                        parts.append(message)
        parts.append("searched " + ", ".join(self.spec_dirs))
        unique = list(dict.fromkeys(parts))
        return "; ".join(unique)
