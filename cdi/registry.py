"""The registry: every device of the spec directories, resolved and injected on request.

Loading rules are the reference cache's: a broken file is skipped with its error kept under its
path; a device defined again in a higher-priority directory replaces the lower one; a device
defined twice at the same priority is an error for both files and the name is deleted after
the scan (even if a higher-priority directory also defines it, as the reference does).

Speed: parsing hundreds of YAML files on every container create is too slow, so the parsed
result is kept in a cache file (`RegistryCache`). Every use lists the spec directories and
stats every spec file, and compares (mode, device, inode, size, mtime, ctime) of each with
what the cache recorded; any difference, or a file added or removed, re-parses just the
changed files. A file modified so recently that its mtime may not have ticked since is
"racy": its stat proves nothing, so its content is compared byte for byte on every use until
it has aged.
"""
import marshal
import os
import struct
import time

from . import __version__, parser
from .errors import CDIError, EditError, SpecError, UnresolvableDevicesError, q
from .spec import Spec, parse_spec, read_spec_bytes
from .spec_dirs import DEFAULT_SPEC_DIRS, scan_spec_dirs

CACHE_FORMAT = 2
_MAGIC = b"CDISHIM\x02"
_HEADER = struct.Struct("<8sII")
# An mtime within this many ns of the moment the cache was built may not have ticked yet.
RACY_WINDOW_NS = 2_000_000_000
CACHE_DIR_ENV = "CDI_SHIM_CACHE_DIR"
DEFAULT_CACHE_DIR = "/run/cdi-shim/cache"


def _validator(info):
    if info is None:
        return None
    return (info.st_mode, info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _kind_hint(data):
    """The `kind` of a spec that failed to decode, best effort, for error context."""
    for line in data.decode("utf-8", "replace").splitlines():
        key, sep, value = line.strip().partition(":")
        if sep and key.strip("\"' ").lower() == "kind":
            return value.strip().strip(",").strip("\"' ")
    return ""


class _Entry:
    """One spec file as loaded: its stat, and either its document or its error."""

    __slots__ = ("validator", "data", "ok", "doc", "error", "kind", "names")

    def __init__(self, validator, data, ok, doc, error, kind, names):
        self.validator, self.data, self.ok = validator, data, ok
        self.doc, self.error, self.kind, self.names = doc, error, kind, names


def load_entry(path, priority):
    try:
        data, info = read_spec_bytes(path)
    except SpecError as err:
        return _Entry(None, None, False, None, str(err), "", ())
    try:
        spec = parse_spec(data, path, priority)
    except SpecError as err:
        return _Entry(_validator(info), data, False, None, str(err), _kind_hint(data), ())
    return _Entry(_validator(info), data, True, spec.doc, "", spec.kind, tuple(spec.devices))


class _State:
    """What the registry knows. `hot` is all a warm resolve needs; the rest loads lazily."""

    def __init__(self, hot, entries_loader):
        self.hot = hot
        self._entries_loader = entries_loader
        self._entries = None

    @property
    def entries(self):
        if self._entries is None:
            self._entries = self._entries_loader()
        return self._entries


class RegistryCache:
    """The file that keeps a registry's parsed specs between processes.

    Layout: magic, the lengths of two marshal sections, then the sections: "hot" (signature of
    the directories, device index, where each document lies) and "cold" (per-file metadata
    for rebuilds), then the marshalled documents. Written to a temp file and renamed, so
    several processes refreshing at once each leave a complete, self-validating snapshot. It
    is trusted only when owned by us and writable by no one else: it steers what goes into
    containers.
    """

    def __init__(self, spec_dirs, cache_dir):
        self.cache_dir = cache_dir
        key = "%016x" % (hash_dirs(spec_dirs))
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
            chunks = []
            while True:
                chunk = os.read(fd, max(info.st_size, 1 << 16))
                if not chunk:
                    break
                chunks.append(chunk)
            data = b"".join(chunks)
        finally:
            os.close(fd)
        try:
            magic, hot_len, cold_len = _HEADER.unpack_from(data)
            if magic != _MAGIC:
                return None
            start = _HEADER.size
            hot = marshal.loads(data[start:start + hot_len])
            if not isinstance(hot, dict) or hot.get("version") != __version__ or hot.get("dirs") != self.spec_dirs:
                return None
            body = memoryview(data)[start + hot_len + cold_len:]
            cold_bytes = data[start + hot_len:start + hot_len + cold_len]
        except (struct.error, EOFError, ValueError, TypeError):
            return None

        def entries():
            meta = marshal.loads(cold_bytes)
            result = []
            for (validator, data, ok, error, kind, names), (offset, length) in zip(meta, hot["spans"]):
                doc = marshal.loads(body[offset:offset + length]) if ok else None
                result.append(_Entry(validator, data, ok, doc, error, kind, names))
            return result

        hot["doc_at"] = lambda index: marshal.loads(body[hot["spans"][index][0]:sum(hot["spans"][index])])
        return _State(hot, entries)

    def store(self, state):
        if not self.path:
            return
        docs, spans, meta, offset = [], [], [], 0
        for entry in state.entries:
            blob = marshal.dumps(entry.doc) if entry.ok else b""
            spans.append((offset, len(blob)))
            offset += len(blob)
            docs.append(blob)
            # Raw content is kept only for racy files: it is what proves them unchanged.
            keep = entry.data if entry.validator is None or entry.validator[4] in state.hot["racy_mtimes"] else None
            meta.append((entry.validator, keep, entry.ok, entry.error, entry.kind, entry.names))
        hot = {key: value for key, value in state.hot.items() if key != "doc_at"}
        hot["spans"] = spans
        hot_bytes, cold_bytes = marshal.dumps(hot), marshal.dumps(meta)
        try:
            import tempfile

            os.makedirs(self.cache_dir, mode=0o700, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".registry.", dir=self.cache_dir)
        except OSError:
            return  # a read-only or foreign cache dir only costs speed
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(_HEADER.pack(_MAGIC, len(hot_bytes), len(cold_bytes)))
                out.write(hot_bytes)
                out.write(cold_bytes)
                out.write(b"".join(docs))
            os.rename(tmp, self.path)
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def hash_dirs(spec_dirs):
    """A stable 64-bit key for a list of directories (FNV-1a; no hashlib import needed)."""
    value = 0xCBF29CE484222325
    for byte in "\0".join(spec_dirs).encode():
        value = ((value ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return value


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
        signature = ([(path, priority, _validator(info)) for priority, path, info in files], dir_errors)
        cached = self._state or self._cache.load()
        self.reparsed = 0
        if cached is not None and cached.hot["signature"] == signature and self._racy_unchanged(cached):
            self._state = cached
            if cached.hot["racy"] and self._aged(files):
                # Every racy file has aged past the window: from now on its stat is proof.
                cached.hot["racy"], cached.hot["racy_mtimes"] = [], []
                self._cache.store(cached)
            return self
        self._state = self._rebuild(files, signature, cached)
        self._cache.store(self._state)
        return self

    @staticmethod
    def _racy_unchanged(state):
        for path, content in state.hot["racy"]:
            try:
                data, _ = read_spec_bytes(path)
            except SpecError:
                data = None
            if data != content:
                return False
        return True

    @staticmethod
    def _aged(files):
        now = time.time_ns()
        return all(info is not None and now - info.st_mtime_ns >= RACY_WINDOW_NS
                   and now - info.st_ctime_ns >= RACY_WINDOW_NS for _, _, info in files)

    def _rebuild(self, files, signature, cached):
        now = time.time_ns()
        previous = {}
        if cached is not None:
            racy = {path for path, _ in cached.hot["racy"]}
            previous = {path: entry for path, entry in zip(cached.hot["paths"], cached.entries)
                        if path not in racy}
        paths, priorities, entries, racy = [], [], [], []
        for priority, path, info in files:
            entry = previous.get(path)
            if entry is None or entry.validator is None or entry.validator != _validator(info):
                entry = load_entry(path, priority)
                self.reparsed += 1
            paths.append(path)
            priorities.append(priority)
            entries.append(entry)
            if entry.validator is None or now - entry.validator[4] < RACY_WINDOW_NS \
                    or now - entry.validator[5] < RACY_WINDOW_NS:
                racy.append((path, entry.data))
        devices, errors = self._index(paths, priorities, entries)
        hot = {"format": CACHE_FORMAT, "version": __version__, "dirs": self.spec_dirs,
               "signature": signature, "racy": racy,
               "racy_mtimes": [entry.validator[4] for entry in entries if entry.validator
                               and (entry.validator and (now - entry.validator[4] < RACY_WINDOW_NS
                                                         or now - entry.validator[5] < RACY_WINDOW_NS))],
               "paths": paths, "priorities": priorities, "devices": devices, "errors": errors,
               "kinds": [entry.kind for entry in entries], "ok": [entry.ok for entry in entries],
               "load_errors": [entry.error for entry in entries]}
        hot["doc_at"] = lambda index: entries[index].doc
        state = _State(hot, lambda: entries)
        state._entries = entries
        return state

    @staticmethod
    def _index(paths, priorities, entries):
        devices, errors, conflicts = {}, {}, set()
        for index, (path, priority, entry) in enumerate(zip(paths, priorities, entries)):
            if not entry.ok:
                errors.setdefault(path, []).append("failed to load CDI Spec " + entry.error)
                continue
            vendor, cls = parser.parse_qualifier(entry.kind)
            for name in entry.names:
                qualified = parser.qualified_name(vendor, cls, name)
                old = devices.get(qualified)
                if old is not None:
                    old_path, old_priority = paths[old], priorities[old]
                    if priority < old_priority:
                        continue
                    if priority == old_priority:
                        message = f'conflicting device {q(qualified)} (specs {q(path)}, {q(old_path)})'
                        errors.setdefault(path, []).append(message)
                        errors.setdefault(old_path, []).append(message)
                        conflicts.add(qualified)
                        continue
                devices[qualified] = index
        for qualified in conflicts:
            devices.pop(qualified, None)
        return devices, errors

    def _hot(self):
        if self._state is None:
            self.refresh()
        return self._state.hot

    # --- queries --------------------------------------------------------------------------

    def errors(self):
        """{path or directory: [error text]} from the last refresh."""
        hot = self._hot()
        result = {path: list(messages) for path, messages in hot["errors"].items()}
        for directory, message in hot["signature"][1].items():
            result.setdefault(directory, []).append(message)
        return result

    def device_names(self):
        """Every resolvable qualified device name, sorted."""
        return sorted(self._hot()["devices"])

    def spec_paths(self):
        hot = self._hot()
        return [path for path, ok in zip(hot["paths"], hot["ok"]) if ok]

    def _spec_at(self, index):
        hot = self._state.hot
        return Spec(hot["doc_at"](index), hot["paths"][index], hot["priorities"][index])

    def get_spec(self, path):
        """The Spec loaded from `path` (None if it did not load)."""
        hot = self._hot()
        if path not in hot["paths"]:
            return None
        index = hot["paths"].index(path)
        return self._spec_at(index) if hot["ok"][index] else None

    def vendors(self):
        """{vendor: [spec path, ...]} of the specs that loaded (per-vendor grouping)."""
        hot = self._hot()
        grouped = {}
        for path, ok, kind in zip(hot["paths"], hot["ok"], hot["kinds"]):
            if ok:
                grouped.setdefault(parser.parse_qualifier(kind)[0], []).append(path)
        return grouped

    def lookup(self, qualified):
        """(Spec, device dict) for a qualified name looked up verbatim, or None."""
        index = self._hot()["devices"].get(qualified)
        if index is None:
            return None
        spec = self._spec_at(index)
        return spec, spec.devices[parser.parse_device(qualified)[2]]

    # --- injection ------------------------------------------------------------------------

    def resolve(self, names):
        """The edit blocks for the requested devices, in the reference's order.

        Spec-level edits come once per spec, just before its first requested device. Returns
        (blocks, [(name, spec path)]). Raises UnresolvableDevicesError listing every name not
        found, with what we can tell about why.
        """
        devices = self._hot()["devices"]
        specs_seen, blocks, unresolved, origins = {}, [], [], []
        for name in names:
            index = devices.get(name)
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
        from .container_edits import apply_edits, merge_edits

        if config is None:
            raise CDIError("can't inject devices, nil OCI Spec")
        blocks, _ = self.resolve(names)
        try:
            return apply_edits(config, merge_edits(blocks))
        except EditError as err:
            raise EditError(f"failed to inject devices: {err}") from None

    def explain_unresolved(self, names, limit=8):
        """Why names did not resolve: what exists of that kind, where we looked, load errors."""
        hot = self._hot()
        parts = []
        for name in names:
            vendor, cls, _ = parser.parse_device(name)
            if not vendor:
                try:
                    parser.parse_qualified_name(name)
                except CDIError as err:
                    parts.append(str(err))
                continue
            prefix = f"{vendor}/{cls}="
            known = sorted(q[len(prefix):] for q in hot["devices"] if q.startswith(prefix))
            if known:
                shown = ", ".join(f'{q(d)}' for d in known[:limit])
                more = f" and {len(known) - limit} more" if len(known) > limit else ""
                parts.append(f"{vendor}/{cls} has only {shown}{more}")
            else:
                parts.append(f"no spec defines devices of kind {vendor}/{cls}")
            for ok, kind, error in zip(hot["ok"], hot["kinds"], hot["load_errors"]):
                if not ok and parser.parse_qualifier(kind)[0] == vendor:
                    parts.append(error)
            for messages in hot["errors"].values():
                parts.extend(m for m in messages if m.startswith("conflicting device") and f'{q(name)}' in m)
        parts.append("searched " + ", ".join(self.spec_dirs))
        return "; ".join(dict.fromkeys(parts))
