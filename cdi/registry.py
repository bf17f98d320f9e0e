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
import time

from . import __version__, parser
from .errors import CDIError, EditError, SpecError, UnresolvableDevicesError, q
from .spec import Spec, parse_spec, read_spec_bytes
from .safeio import RACY_WINDOW_NS, file_identity, private_dir_problem, write_file_atomic
from .spec_dirs import DEFAULT_SPEC_DIRS, scan_spec_dirs

_MAGIC = b"CDISHIM\x04"  # bump when the layout changes (an old file is then ignored)
# What a cached parse means changes with the package and with the decoding rules (a spec
# read under older rules may mean something else now): both key the cache.
_DECODE_RULES = 2                  # 2: Go's YAML numbers (0o660, 1e3, 1.0 in integer fields)
_CACHE_VERSION = f"{__version__}+decode{_DECODE_RULES}"
_HEADER_SIZE = 16  # magic, then the lengths of the hot and cold sections (u32 LE)
CACHE_DIR_ENV = "CDI_SHIM_CACHE_DIR"
DEFAULT_CACHE_DIR = "/run/cdi-shim/cache"


def _validator(info):
    return None if info is None else file_identity(info)


def _kind_hint(data):
    """The `kind` of a spec that failed to decode, best effort, for error context."""
    for line in data.decode("utf-8", "replace").splitlines():
        key, sep, value = line.strip().partition(":")
        if sep and key.strip("\"' ").lower() == "kind":
            return value.strip().strip(",").strip("\"' ")
    return ""


def _signature(files, dir_errors):
    """One string describing the spec directories' files and stats (and unreadable dirs).

    A string, not tuples: loading and comparing it costs nothing next to the stats it records
    (unmarshalling thousands of tuples cost a warm resolve more than its imports).
    """
    lines = ["%d\0%s\0%x %x %x %x %x %x\n" % ((priority, path) + _validator(info)) if info is not None
             else "%d\0%s\0-\n" % (priority, path) for priority, path, info in files]
    lines += ["E\0%s\0%s\n" % item for item in sorted(dir_errors.items())]
    return "".join(lines)


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
    """What the registry knows.

    `hot` is all a warm resolve needs (directory signature, where each kind's devices lie);
    `cold` (paths, per-file entries, the full device index, errors) loads only when asked
    for; `kind_devices(kind)` and `spec_at(i)` load one kind's index and one spec.
    """

    def __init__(self, hot, cold_loader, spec_at, kind_devices):
        self.hot = hot
        self._cold_loader = cold_loader
        self._cold = None
        self.spec_at = spec_at
        self.kind_devices = kind_devices

    @property
    def cold(self):
        if self._cold is None:
            self._cold = self._cold_loader()
        return self._cold


def _by_kind(devices):
    grouped = {}
    for qualified, index in devices.items():
        grouped.setdefault(qualified.partition("=")[0], {})[qualified] = index
    return grouped


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
        self.problem = None  # why the cache directory is not used (a string), once known
        key = "%016x" % (hash_dirs(spec_dirs))
        self.path = os.path.join(cache_dir, f"registry-{key}.bin") if cache_dir else None
        self.spec_dirs = tuple(spec_dirs)

    def _dir_is_private(self, must_exist=True):
        """The server's rule (cdi.safeio.private_dir_problem): the directory and those above it
        are ours or root's and writable by no one else; else the cache is not used at all."""
        self.problem = private_dir_problem(self.cache_dir, must_exist)
        if self.problem:
            self.problem = (f"registry cache directory {self.cache_dir} not used: it must be owned by uid "
                            f"{os.geteuid()} (or root) and not writable by group or others, as must every "
                            f"directory above it: {self.problem}")
        return self.problem is None

    def load(self):
        if not self.path:
            return None
        if not self._dir_is_private(must_exist=False):
            return None
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            info = os.fstat(fd)
            if info.st_uid != os.geteuid() or info.st_mode & 0o022 or (info.st_mode & 0o170000) != 0o100000:
                os.close(fd)
                return None
            # Read lazily with pread: a warm resolve touches only the header, the hot section
            # and one spec, whatever the number of spec files. The fd stays open for that.
            header = os.pread(fd, _HEADER_SIZE, 0)
            if len(header) != _HEADER_SIZE or header[:8] != _MAGIC:
                os.close(fd)
                return None
            hot_len = int.from_bytes(header[8:12], "little")
            cold_len = int.from_bytes(header[12:16], "little")
            hot = marshal.loads(os.pread(fd, hot_len, _HEADER_SIZE))
            if not _hot_is_sound(hot) or hot["version"] != _CACHE_VERSION or hot["dirs"] != self.spec_dirs:
                os.close(fd)
                return None
        except (OSError, EOFError, ValueError, TypeError):
            os.close(fd)
            return None
        body_start = _HEADER_SIZE + hot_len + cold_len
        stream = os.fdopen(fd, "rb", buffering=0)  # closes the fd when the state is dropped

        def read(offset, length):
            data = os.pread(stream.fileno(), length, offset)
            if len(data) != length:
                raise CDIError(f"registry cache {self.path} is truncated")
            return data

        def rest():
            cold = marshal.loads(read(_HEADER_SIZE + hot_len, cold_len))
            body = read(body_start, os.fstat(stream.fileno()).st_size - body_start)
            entries = []
            spans = [_span(hot["spans"], index) for index in range(len(cold["meta"]))]
            for (validator, data, ok, error, kind, names), (offset, length) in zip(cold["meta"], spans):
                doc = marshal.loads(body[offset:offset + length])[0] if ok else None
                entries.append(_Entry(validator, data, ok, doc, error, kind, names))
            cold["entries"] = entries
            return cold

        def spec_at(index):
            offset, length = _span(hot["spans"], index)
            return Spec(*marshal.loads(read(body_start + offset, length)))

        def kind_devices(kind):
            # "\n<kind>\t<index>\n" lines: one str.find instead of unmarshalling a dict.
            at = hot["kinds"].find("\n" + kind + "\t")
            if at < 0:
                return {}
            start = at + len(kind) + 2
            offset, length = _span(hot["kind_spans"], int(hot["kinds"][start:hot["kinds"].index("\n", start)]))
            return marshal.loads(read(body_start + offset, length))

        return _State(hot, rest, spec_at, kind_devices)

    def store(self, state):
        if not self.path:
            return
        cold = state.cold
        docs, spans, meta, offset = [], [], [], 0
        racy = {path for path, _ in state.hot["racy"]}
        for path, priority, entry in zip(cold["paths"], cold["priorities"], cold["entries"]):
            blob = marshal.dumps((entry.doc, path, priority)) if entry.ok else b""
            spans.append((offset, len(blob)))
            offset += len(blob)
            docs.append(blob)
            # Raw content is kept only for racy files: it is what proves them unchanged.
            meta.append((entry.validator, entry.data if path in racy else None, entry.ok, entry.error,
                         entry.kind, entry.names))
        kinds, kind_spans = ["\n"], []
        for kind, devices in _by_kind(cold["devices"]).items():
            blob = marshal.dumps(devices)
            kinds.append(f"{kind}\t{len(kind_spans)}\n")
            kind_spans.append((offset, len(blob)))
            offset += len(blob)
            docs.append(blob)
        hot = dict(state.hot, spans=_pack_spans(spans), kinds="".join(kinds), kind_spans=_pack_spans(kind_spans))
        cold = {key: value for key, value in cold.items() if key != "entries"}
        cold["meta"] = meta
        hot_bytes, cold_bytes = marshal.dumps(hot), marshal.dumps(cold)
        header = _MAGIC + len(hot_bytes).to_bytes(4, "little") + len(cold_bytes).to_bytes(4, "little")
        if not self._dir_is_private(must_exist=False):
            return
        try:
            os.makedirs(self.cache_dir, mode=0o700, exist_ok=True)
            if not self._dir_is_private():
                return
            write_file_atomic(self.path, b"".join([header, hot_bytes, cold_bytes] + docs), 0o600,
                              prefix=".registry.")
        except OSError:
            pass  # a read-only or foreign cache dir only costs speed


_HOT_TYPES = {"version": str, "dirs": tuple, "signature": str, "racy": list, "spans": bytes,
              "kinds": str, "kind_spans": bytes}


def _hot_is_sound(hot):
    """The hot section has every key with the type this code writes (else: rebuild)."""
    return isinstance(hot, dict) and all(isinstance(hot.get(key), kind) for key, kind in _HOT_TYPES.items())


def _pack_spans(spans):
    """(offset, length) pairs as 16-byte little-endian records: cheap to load, indexable."""
    return b"".join(offset.to_bytes(8, "little") + length.to_bytes(8, "little") for offset, length in spans)


def _span(packed, index):
    record = packed[16 * index:16 * index + 16]
    return int.from_bytes(record[:8], "little"), int.from_bytes(record[8:], "little")


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

    @property
    def cache_problem(self):
        """Why the persistent cache's directory was not used (None: used, or not configured)."""
        return self._cache.problem

    # --- loading --------------------------------------------------------------------------

    def refresh(self):
        """Bring the registry up to date with the spec directories; returns self."""
        files, dir_errors = scan_spec_dirs(self.spec_dirs)
        signature = _signature(files, dir_errors)
        cached = self._state or self._cache.load()
        self.reparsed = 0
        if cached is not None and cached.hot["signature"] == signature and self._racy_unchanged(cached):
            self._state = cached
            if cached.hot["racy"] and self._aged(files):
                # Every racy file has aged past the window: from now on its stat is proof.
                cached.cold  # noqa: B018 - load everything before rewriting the file
                cached.hot["racy"] = []
                self._cache.store(cached)
            return self
        self._state = self._rebuild(files, dir_errors, signature, cached)
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

    def _rebuild(self, files, dir_errors, signature, cached):
        now = time.time_ns()
        previous = {}
        if cached is not None:
            racy = {path for path, _ in cached.hot["racy"]}
            try:
                previous = {path: entry for path, entry in zip(cached.cold["paths"], cached.cold["entries"])
                            if path not in racy}
            except (CDIError, EOFError, ValueError, TypeError, KeyError):
                previous = {}  # a damaged cache only costs a full parse
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
        hot = {"version": _CACHE_VERSION, "dirs": self.spec_dirs, "signature": signature, "racy": racy}
        cold = {"paths": paths, "priorities": priorities, "entries": entries, "errors": errors,
                "devices": devices, "dir_errors": dir_errors}
        kinds = _by_kind(devices)
        state = _State(hot, lambda: cold,
                       lambda index: Spec(entries[index].doc, paths[index], priorities[index]),
                       lambda kind: kinds.get(kind, {}))
        state._cold = cold
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

    def _cold(self):
        self._hot()
        return self._state.cold

    # --- queries --------------------------------------------------------------------------

    def errors(self):
        """{path or directory: [error text]} from the last refresh."""
        result = {path: list(messages) for path, messages in self._cold()["errors"].items()}
        for directory, message in self._cold()["dir_errors"].items():
            result.setdefault(directory, []).append(message)
        return result

    def device_names(self):
        """Every resolvable qualified device name, sorted."""
        return sorted(self._cold()["devices"])

    def spec_paths(self):
        cold = self._cold()
        return [path for path, entry in zip(cold["paths"], cold["entries"]) if entry.ok]

    def _spec_at(self, index):
        return self._state.spec_at(index)

    def get_spec(self, path):
        """The Spec loaded from `path` (None if it did not load)."""
        cold = self._cold()
        if path not in cold["paths"]:
            return None
        index = cold["paths"].index(path)
        return self._spec_at(index) if cold["entries"][index].ok else None

    def vendors(self):
        """{vendor: [spec path, ...]} of the specs that loaded (per-vendor grouping)."""
        cold = self._cold()
        grouped = {}
        for path, entry in zip(cold["paths"], cold["entries"]):
            if entry.ok:
                grouped.setdefault(parser.parse_qualifier(entry.kind)[0], []).append(path)
        return grouped

    def _index_of(self, qualified):
        self._hot()
        return self._state.kind_devices(qualified.partition("=")[0]).get(qualified)

    def lookup(self, qualified):
        """(Spec, device dict) for a qualified name looked up verbatim, or None."""
        index = self._index_of(qualified)
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
        specs_seen, blocks, unresolved, origins = {}, [], [], []
        for name in names:
            index = self._index_of(name)
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
        cold = self._cold()
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
            known = sorted(q[len(prefix):] for q in cold["devices"] if q.startswith(prefix))
            if known:
                shown = ", ".join(f'{q(d)}' for d in known[:limit])
                more = f" and {len(known) - limit} more" if len(known) > limit else ""
                parts.append(f"{vendor}/{cls} has only {shown}{more}")
            else:
                parts.append(f"no spec defines devices of kind {vendor}/{cls}")
            for entry in cold["entries"]:
                if not entry.ok and parser.parse_qualifier(entry.kind)[0] == vendor:
                    parts.append(entry.error)
            for messages in cold["errors"].values():
                parts.extend(m for m in messages if m.startswith("conflicting device") and f'{q(name)}' in m)
        parts.append("searched " + ", ".join(self.spec_dirs))
        return "; ".join(dict.fromkeys(parts))
