"""Planning a container's ld.so.cache: the directory list scanned by the C engine, or the
image's own cache kept as a memo per directory and only what changed scanned again."""
import os
import posixpath
import stat
from contextvars import ContextVar
from errno import ENOENT

from .._native import ffi, lib
from .cachefile import ParsedCache
from .engine import (CACHE_PATH, FORMATS, GENERATOR, LINKS, MAX_CACHE_SIZE, MAX_CONF_SIZE,
                     O_DIRECTORY, LdcacheError, Root, decode_cstr, os_error)
from .globbing import join_path
from .ldconf import ConfDir, Extras, LdConfig, child_ident, machine_name
from . import mounted
from .reused import extras_own

_MUSL_ARCH = {"x86_64": ("x86_64", "i386"), "aarch64": ("aarch64", "armhf")}
_MUSL_DEFAULT_PATH = ["/lib", "/usr/local/lib", "/usr/lib"]


class Plan:
    """What plan() computed."""

    __slots__ = ("cache", "mode", "reason", "entries", "musl", "warnings", "skipped", "dirs", "scanned",
                 "remembered", "looked", "covered", "providers", "conf_files")

    def __init__(self):
        self.cache = b""
        self.mode = ""
        self.reason = ""
        self.entries = 0
        self.musl = {}
        self.warnings = []
        self.skipped = []
        self.dirs = []
        self.scanned = 0  # directories listed and read (not taken from the image's cache)
        self.remembered = False  # a copy of an earlier plan for the same files (PlanMemo)
        self.looked = None  # with the memo on: the paths it depends on (memo entries), or None past _MAX_PATHS
        self.covered = []   # configured folders a directory mount provides (mounted.py)
        self.providers = ()  # ((folder, mount destination, host source)) of those (mounted.coverage; None: unknown)
        self.conf_files = []  # [(path, bytes)] the toolkit's hooks write into the root (LdConfig.conf_files)

    def copy(self):
        other = Plan()
        for name in self.__slots__:
            value = getattr(self, name)
            setattr(other, name, value.copy() if isinstance(value, (list, dict)) else value)
        return other

    @property
    def files(self):
        files = {CACHE_PATH: self.cache}
        files.update(self.musl)
        return files


class _Builder:
    def __init__(self, target):
        self.keep = None
        self.ptr = ffi.gc(lib.cds_builder_new(target), lib.cds_builder_free)
        if self.ptr == ffi.NULL:
            raise MemoryError("cds_builder_new")

    def build(self, fmt, generator):
        out = ffi.new("uint8_t **")
        size = ffi.new("size_t *")
        gen = os.fsencode(generator) if generator is not None else ffi.NULL
        if lib.cds_builder_build(self.ptr, fmt, gen, out, size) != 0:
            raise os_error("cannot lay out the cache")
        try:
            return ffi.buffer(out[0], size[0])[:]
        finally:
            lib.cds_free(out[0])


class _Scanner:
    """Runs the C directory scan over LdConfig's list, appending legacy subdirectories."""

    def __init__(self, root, config, builder, links, plan, deadline=None):
        self.root = root
        self.deadline = deadline
        self.config = config
        self.builder = builder
        self.links = links
        self.plan = plan
        self.opts = ffi.new("struct cds_scan_opts *")
        self.opts.target = config.target
        self.opts.links = links
        self.listed = []    # [(path, in a glibc-hwcaps directory)] of the directories read

    def scan(self, index, extras_only=False):
        """Scan directory INDEX (with its extras) and add its libraries; with EXTRAS_ONLY,
        read just the extras and return the scan without adding it (see add())."""
        config = self.config
        d = config.dirs[index]
        if self.deadline is not None:
            self.deadline.check("scanning ", d.path)
        if not extras_only:
            self.plan.scanned += 1
            self.listed.append((d.path, d.hwcaps is not None))
        packed, count = config.extras.packed(d.ident)
        dirfd = -1
        if d.real:
            dirfd = self.root.open(d.path, os.O_RDONLY | O_DIRECTORY)
            if dirfd < 0 and not count:
                return None
        opts = self.opts
        opts.in_hwcaps = 1 if d.hwcaps is not None else 0
        opts.dir_flag = d.flag
        opts.extras_only = 1 if extras_only else 0
        scan = _scan_dir(self.root, d.path, dirfd, packed, count, opts)
        if extras_only:
            return scan
        self.add(index, scan)
        if d.hwcaps is None:
            name = ffi.new("const char **")
            dev = ffi.new("uint64_t *")
            ino = ffi.new("uint64_t *")
            for i in range(lib.cds_scan_subdir_count(scan)):
                lib.cds_scan_subdir(scan, i, name, dev, ino)
                config.add_single(ConfDir(d.path + "/" + decode_cstr(name[0]), d.flag,
                                        ("d", dev[0], ino[0])))
            self.add_virtual_subdirs(index)
        return scan

    def add(self, index, scan):
        """Add a scan's libraries as directory INDEX's."""
        config = self.config
        d = config.dirs[index]
        path = os.fsencode(d.path)
        hwcap = 0 if d.hwcaps is not None else lib.cds_path_hwcap(config.target, path)
        hwcaps = os.fsencode(d.hwcaps) if d.hwcaps is not None else ffi.NULL
        if lib.cds_builder_add_scan(self.builder.ptr, scan, path, index, hwcaps, hwcap,
                                    self.links) != 0:
            raise os_error("cannot add entries")
        skip = ffi.new("struct cds_skip *")
        for i in range(lib.cds_scan_skip_count(scan)):
            lib.cds_scan_skip(scan, i, skip)
            status = skip.status
            why = (os.strerror(-status) if status < 0
                   else ffi.string(lib.cds_elf_status_text(status)).decode())
            self.plan.skipped.append((join_path(d.path, decode_cstr(skip.name)), why))

    def add_virtual_subdirs(self, index):
        """Legacy hwcap subdirectories of directory INDEX that only the extras will create."""
        config = self.config
        d = config.dirs[index]
        for child in sorted(config.extras.children.get(d.ident, ())):
            if lib.cds_is_hwcap_subdir(config.target, os.fsencode(child)):
                sub = child_ident(d.ident, child)
                if sub not in config.by_ident and self.root.stat(d.path + "/" + child) is None:
                    config.add_single(ConfDir(d.path + "/" + child, d.flag, sub, real=False))


def _scan_dir(root, path, dirfd, packed, count, opts):
    """The engine's scan of the directory PATH in ROOT (open at DIRFD, which is closed here; -1:
    none) with the host files PACKED (COUNT of them) added, freed with it; raises OSError."""
    out = ffi.new("struct cds_scan **")
    try:
        rc = lib.cds_scan_dir(root.fd, os.fsencode(path), dirfd, packed, len(packed), count, opts, out)
    finally:
        if dirfd >= 0:
            os.close(dirfd)
    if rc != 0:
        raise os_error(f"cannot read {path}")
    return ffi.gc(out[0], lib.cds_scan_free)


def _read_image_cache(root):
    """(parsed, mtime_ns) of ROOT's /etc/ld.so.cache, or (None, reason)."""
    fd = root.open(CACHE_PATH, os.O_RDONLY)
    if fd < 0:
        return None, f"{CACHE_PATH}: {os.strerror(root.errno)}"
    try:
        return ParsedCache.from_fd(fd, CACHE_PATH, MAX_CACHE_SIZE)
    except LdcacheError as err:
        return None, str(err)
    finally:
        os.close(fd)


def _is_musl(root, machine):
    native = _MUSL_ARCH[machine][0]
    for path in (f"/lib/ld-musl-{native}.so.1", "/etc/alpine-release"):
        st = root.stat(path)
        if st is not None and not stat.S_ISDIR(st[0]):
            return True
    return False


def _plan_musl(root, machine, folders, extras):
    native, compat32 = _MUSL_ARCH[machine]
    path = f"/etc/ld-musl-{native}.path"
    try:
        data, _ = root.read(path, MAX_CONF_SIZE)
        existing = [p for p in os.fsdecode(data).replace("\n", ":").split(":") if p]
    except OSError as err:
        if err.errno != ENOENT:
            raise LdcacheError(f"{path}: {err.strerror}") from None
        existing = list(_MUSL_DEFAULT_PATH)
    dirs = [f for f in folders if f not in existing]
    dirs = list(dict.fromkeys(dirs))
    return {path: ("\n".join(dirs + existing) + "\n").encode()}


def plan(root, folders=(), extra=None, *, machine=None, mode="auto", links="existing",
         format="new", generator=None, deadline=None, compat=(), mounts=()):
    """The cache ROOT would have after the toolkit's update-ldcache with FOLDERS (and EXTRA
    files mounted). See the module docstring. DEADLINE (engine.Deadline) bounds the time.
    MOUNTS: config.json's other mounts, mounted.directory_mounts(): a configured folder one of
    them provides is read through its host source, the image's content there hidden
    (mounted.UnknownFolder where it cannot be known).
    COMPAT: the folders of enable-cuda-compat's 00-compat-*.conf drop-in (read before the
    update-ldcache drop-in, whether the image configures them or not); the scan is full.
    With a PlanMemo in use (PlanMemo.using), a plan of the same files is taken from it."""
    machine = machine_name(machine)
    _check_options(mode, links, format)
    folders = [os.fspath(f) for f in folders]
    mounts = list(mounts)
    memo = _in_use.get()
    arguments = None if memo is None else (
        machine, mode, links, format, generator, tuple(folders), tuple(compat),
        tuple((os.fspath(k), os.fspath(v)) for k, v in (extra or {}).items()))
    result = Plan()
    # (not observed by a step memo: a step takes the plan's paths from the plan memo's record)
    with Root(root, observed=False) as tree:
        # (a mount lands where its destination leads in the tree: compared by place)
        placed = [(tree.place(dest), source) for dest, source in mounts]
        written = {mount: dest for mount, (dest, _) in zip(placed, mounts)}   # (as config.json says it)
        mounts = placed
        if arguments is not None:
            kept = memo.recall(tree, arguments, mounts)
            if kept is not None:
                return kept
            started = lib.cds_memo_clock_ns()
            tree.seen = {}
        extras, config, hidden, hosts = _configure(tree, result, machine, folders, extra, deadline, compat, mounts,
                                                   written)
        target = config.target
        result.warnings = config.warnings
        builder, scanner = _fill(tree, config, result, mode, LINKS[links], folders, extras, hidden,
                                 compat, deadline)
        for name in sorted(config.hwcaps_names):
            lib.cds_builder_intern(builder.ptr, os.fsencode(name))
        result.entries = lib.cds_builder_count(builder.ptr)
        result.cache = builder.build(FORMATS[format],
                                     GENERATOR if generator is None else generator)
        result.dirs = [d.path for d in config.dirs]
        result.conf_files = config.conf_files()
        if _is_musl(tree, machine):
            result.musl = _plan_musl(tree, machine, folders, extras)
        if arguments is not None:
            result.looked = _looked(tree, arguments, _files_read(tree, target, scanner.listed), hosts)
            folders_seen = _candidates(config, tree)
            memo.keep(arguments, started, tree, result, (target, folders_seen),
                      mounted.coverage(mounts, folders_seen, target))
    return result


def _check_options(mode, links, format):
    if mode not in ("auto", "full", "incremental"):
        raise ValueError(f"mode must be auto, full or incremental, not {mode!r}")
    if links not in LINKS:
        raise ValueError(f"links must be one of {', '.join(LINKS)}, not {links!r}")
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {format!r}")


def _configure(tree, result, machine, folders, extra, deadline, compat, mounts, written):
    """(extras, config, hidden, hosts): the EXTRA files and the configuration of TREE with
    FOLDERS; with MOUNTS (placed; WRITTEN: their destinations as config.json says them), the
    folders they provide read through their host sources (HIDDEN, mounted.folders) and the host
    paths a kept plan is checked against (HOSTS), RESULT's covered and providers set."""
    extras = Extras(tree, extra)
    config = LdConfig(tree, machine, folders, extras, deadline, compat).build()
    hidden, hosts = {}, []
    if mounts:
        hidden, brought, linked, sources = mounted.folders(mounts, _candidates(config, tree), config.target)
        # (a kept plan is checked against the host folders and what they showed: an entry
        # added, removed or renamed changes its folder's mtime, a file rewritten its own)
        hosts = sources + sorted(set(brought.values()))
        if hidden:
            # again, with the mounted folders' libraries (a folder only a mount makes is
            # configured only where something is to be mounted into it)
            files = {os.fspath(k): os.fspath(v) for k, v in (extra or {}).items()}
            extras = Extras(tree, {**brought, **files},   # (file mounts go on top)
                            links={p for p in linked if p not in files})
            config = LdConfig(tree, machine, folders, extras, deadline, compat).build()
            mounted.hide(config, hidden, tree.place)
            result.covered = sorted(hidden)
            providers = mounted.coverage(mounts, result.covered, config.target)
            result.providers = providers and tuple((folder, written[(dest, source)], source)
                                                   for folder, dest, source in providers)
    return extras, config, hidden, hosts


def _fill(tree, config, result, mode, links, folders, extras, hidden, compat, deadline):
    """(builder, scanner): a builder holding CONFIG's libraries, from the image's cache and
    rescans (_incremental) or from a full scan, as MODE says (COMPAT: full); RESULT's mode,
    reason and skipped set. LINKS: the engine's value for plan()'s links."""
    builder = _Builder(config.target)
    scanner = _Scanner(tree, config, builder, links, result, deadline)
    reason = ""
    if compat and mode == "auto":
        mode = "full"
    if mode != "full":
        reason = _incremental(tree, config, builder, scanner, folders, extras, hidden)
        if reason and mode == "incremental":
            raise LdcacheError(f"incremental update impossible: {reason}")
    if mode == "full" or reason:
        builder = _Builder(config.target)
        scanner.builder = builder
        result.skipped = []
        i = 0
        while i < len(config.dirs):
            scanner.scan(i)
            i += 1
        result.mode = "full"
        result.reason = reason or "full scan requested"
    else:
        result.mode = "incremental"
    return builder, scanner


def soname_links(root, folders=(), extra=None, *, machine=None, deadline=None, compat=()):
    """The soname links the toolkit's update-ldcache makes in the directories EXTRA files are
    mounted into (its ldconfig runs without -N): [(link path, file name, file path)] for each
    library ldconfig keeps there under a soname that is not its name (glibc's search_dir: a
    file preferred to a link, then the newest version), in the directories it scans with
    FOLDERS (not in glibc-hwcaps ones: their entries name the file). Both paths are spelled as
    EXTRA spells the file: ldconfig may reach its directory by another spelling first (merged
    /usr: /lib/x86_64-linux-gnu for the mount's /usr/lib/x86_64-linux-gnu), and directories
    are matched by identity, never by text. Only the mounted files are read (the directory is
    asked about names only: reading its every library costs a full scan on each create), so an
    image file of the same soname in that directory is not weighed against them. What is at
    the link path decides whether ldconfig makes it (the caller)."""
    machine = machine_name(machine)
    wanted = []
    with Root(root, observed=False) as tree:
        extras = Extras(tree, extra)
        config = LdConfig(tree, machine, folders, extras, deadline, compat).build()
        opts = ffi.new("struct cds_scan_opts *")
        opts.target = config.target
        opts.links = LINKS["existing"]
        opts.extras_only = 1
        lib_ = ffi.new("struct cds_dlib *")
        seen = set()
        for d in config.dirs:
            if d.hwcaps is not None or d.ident not in extras.by_dir or d.ident in seen:
                continue
            seen.add(d.ident)
            packed, count = extras.packed(d.ident)
            dirfd = tree.open(d.path, os.O_RDONLY | O_DIRECTORY) if d.real else -1
            opts.dir_flag = d.flag
            scan = _scan_dir(tree, d.path, dirfd, packed, count, opts)
            for i in range(lib.cds_scan_count(scan)):
                lib.cds_scan_lib(scan, i, lib_)
                name, soname = decode_cstr(lib_.name), decode_cstr(lib_.soname)
                if not lib_.is_link and name != soname and "/" not in soname and soname not in (".", ".."):
                    file = extras.spelled.get((d.ident, name))
                    if file is not None:
                        wanted.append((posixpath.join(posixpath.dirname(file), soname), name, file))
    return wanted


# ---- the memo of whole plans -----------------------------------------------------------
#
# A node starts containers of the same few images with the same driver files, and each start
# plans the same cache again (~1.2 ms in the runtime's resident worker). A plan is kept with
# the identity of every path it looked at in the tree -- configuration files, the image's
# cache, directories (their identity stands for their listing) and the files it read in the
# directories it scanned -- and of the host files it added; a later plan with the same
# arguments whose paths all have the same identities in its own tree (one C call, a stat
# each) gets a copy. The identity is the file memo's (csrc/engine/filememo.h): inode, size,
# mtime and ctime, and the device unless the tree is on overlayfs, where every container's
# root is a new mount over the same layer files. A plan that looked at a file changed within
# the settle time is not kept, nor one that looked at more than _MAX_PATHS paths (see there).
# A false hit would need files of another tree with the same inodes, sizes, mtimes and
# ctimes, and would still only give that container a cache of paths to be resolved in its
# own root.

_MAX_PLANS = 64         # a node's images times its driver versions
_PER_ARGUMENTS = 4      # trees tried for one set of arguments (each try stats every path)
# Past this many paths, checking them all costs what a new plan costs with the file memo (a
# full scan of ~900 remembered files ~1.2 ms; a path checked here ~5 us).
_MAX_PATHS = 256
# The PlanMemo plan() consults, for the length of a PlanMemo.using() block (its holder's: a
# long-lived process's ldcache.Memos), or None: plans are kept nowhere. A context variable, not
# state: the memo lives in its holder, and each thread (the NRI hook server's) sees its own.
_in_use = ContextVar("cdi_shim_plan_memo", default=None)


class _Kept:
    __slots__ = ("paths", "count", "identities", "plan", "folders", "coverage")

    def __init__(self, paths, count, identities, plan, folders, coverage):
        self.paths, self.count, self.identities, self.plan = paths, count, identities, plan
        self.folders = folders      # (target, configured folders)
        self.coverage = coverage    # mounted.coverage() of those folders by the plan's mounts


class PlanMemo:
    """Whole plans kept (see above) and given to later plans of the same files: held by one
    object, a long-lived process's (the resident worker's, the NRI hook server's: their
    ldcache.Memos), dropped with it. plan() consults the memo in use (using()); two
    memos share nothing."""

    def __init__(self):
        self.kept = {}          # {arguments: [_Kept, newest first]}

    def using(self):
        """A context in which plan() keeps and recalls plans here (the one in use before it
        again after it); PlanMemo.using(None): in none."""
        return _Using(self)

    def recall(self, tree, arguments, mounts):
        """A copy of the plan kept for ARGUMENTS whose paths are unchanged in TREE (the host
        folders mounts provided to it among them) and whose folders MOUNTS provide as they
        were provided to it (the same folders, mount destinations and sources; other mounts, a
        pod's own, do not matter), or None."""
        candidates = self.kept.get(arguments, ())
        for at, kept in enumerate(candidates):
            if kept.coverage is None or \
                    mounted.coverage(mounts, kept.folders[1], kept.folders[0]) != kept.coverage:
                continue
            if lib.cds_memo_same(tree.fd, kept.paths, len(kept.paths), kept.count, kept.identities) == 1:
                if at:
                    candidates.insert(0, candidates.pop(at))
                copy = kept.plan.copy()
                copy.remembered, copy.looked = True, kept.paths
                return copy
        return None

    def keep(self, arguments, started, tree, result, folders, coverage):
        """Keep RESULT with the identities of the paths it looked at (result.looked) and how
        its mounts provided FOLDERS (COVERAGE; None: not known, not kept)."""
        paths = result.looked
        if paths is None or coverage is None:
            return
        count = paths.count(b"\0")
        identities = ffi.new("struct cds_identity[]", count)
        if lib.cds_memo_identify(tree.fd, paths, len(paths), count, started, identities) != 0:
            return      # changed too recently to be trusted (or the list was refused)
        if sum(len(kept) for kept in self.kept.values()) >= _MAX_PLANS:
            self.kept.clear()
        candidates = self.kept.setdefault(arguments, [])
        candidates.insert(0, _Kept(paths, count, identities, result.copy(), folders, coverage))
        del candidates[_PER_ARGUMENTS:]


class _Using:
    __slots__ = ("memo", "token")

    def __init__(self, memo):
        self.memo, self.token = memo, None

    def __enter__(self):
        self.token = _in_use.set(self.memo)
        return self.memo

    def __exit__(self, *exc):
        _in_use.reset(self.token)
        self.token = None


def _candidates(config, tree):
    """Where the folders the configuration names lead in TREE, found there or not
    (mounted.folders: compared with the mounts' places)."""
    return [tree.place(path) for path in [d.path for d in config.dirs] + config.absent]


def _files_read(tree, target, listed):
    """The paths of the files a scan of the directories LISTED looked at: each name its
    first filter takes (a library's name, a legacy hwcap subdirectory), a link followed to
    what it names (whose identity then stands for what was read)."""
    paths = []
    for directory, in_hwcaps in listed:
        for name, _ in tree.listdir(directory) or ():
            encoded = os.fsencode(name)
            if lib.cds_is_dso_name(encoded) or (not in_hwcaps and lib.cds_is_hwcap_subdir(target, encoded)):
                paths.append(join_path(directory, name))
                if len(paths) > _MAX_PATHS:
                    return None
    return paths


def _looked(tree, arguments, files, hosts=()):
    """The memo entries (kind byte, path, NUL) of what TREE looked at, the FILES its scans
    read, the host files added and HOSTS (mounted folders and their files, read on the host);
    None past _MAX_PATHS."""
    seen = tree.looked()
    if files is None or len(seen) + len(files) + len(arguments[-1]) + len(hosts) > _MAX_PATHS:
        return None
    entries = [(b"f" if follow else b"n") + os.fsencode(path) for path, follow in seen]
    entries += [b"f" + os.fsencode(path) for path in files]
    entries += [b"h" + os.fsencode(host) for _, host in arguments[-1]]
    entries += [b"h" + os.fsencode(host) for host in hosts]
    if any(b"\0" in entry for entry in entries):
        return None
    return b"\0".join(entries) + b"\0"


def _cache_dirs(ptr):
    """[(directory, entries)] of a parsed cache, in order of first appearance."""
    names = ffi.new("char **")
    counts = ffi.new("uint32_t **")
    size = ffi.new("size_t *")
    n = lib.cds_cache_dirs(ptr, names, counts, size)
    if n < 0:
        raise MemoryError("cds_cache_dirs")
    try:
        raw = ffi.buffer(names[0], size[0])[:].split(b"\0")
        return [(os.fsdecode(raw[i]), counts[0][i]) for i in range(n)]
    finally:
        lib.cds_free(names[0])
        lib.cds_free(counts[0])


def _legacy_parent(config, path):
    """The configured directory PATH is a legacy hwcap subdirectory of (tls, x86_64, ...),
    with the components below it; or (None, None)."""
    best = None
    for d in config.dirs:
        if d.hwcaps is None and path.startswith(d.path + "/") and \
                (best is None or len(d.path) > len(best.path)):
            best = d
    if best is None:
        return None, None
    rest = path[len(best.path) + 1:].split("/")
    if all(part and lib.cds_is_hwcap_subdir(config.target, os.fsencode(part)) for part in rest):
        return best, rest
    return None, None


def _is_dso_name(name):
    """glibc's _dl_is_dso(): lib*.so*, ld-*.so*, ld.so.*, ld64.so.*."""
    return ((name.startswith("lib") or name.startswith("ld-")) and ".so" in name) \
        or name.startswith("ld.so.") or name.startswith("ld64.so.")


def _overlaps(scan, ptr, path, target):
    """Whether a scan of extras has a soname the cache already has in directory PATH."""
    lib_ = ffi.new("struct cds_dlib *")
    directory = os.fsencode(path)
    for i in range(lib.cds_scan_count(scan)):
        lib.cds_scan_lib(scan, i, lib_)
        if lib.cds_cache_has(ptr, lib_.soname, directory, target):
            return True
    return False


def _incremental(tree, config, builder, scanner, folders, extras, hidden):
    """Fill BUILDER from the image's cache plus rescans; '' on success, else why not.

    The image's cache is used when it parses, is in ldconfig's order and is no older than the
    configuration files. It then stands for each configured directory that is no newer than
    it (and, where it lists nothing of a directory, that directory has no libraries); the
    other directories are scanned again where they are in the list, extra files are added
    to the entries of the directory they go to (or it is scanned again when they collide
    with its files), and entries of directories no longer configured are left out."""
    parsed, mtime = _read_image_cache(tree)
    if parsed is None:
        return mtime
    ptr = parsed.ptr
    if lib.cds_cache_format(ptr) == lib.CDS_FORMAT_OLD:
        return f"{CACHE_PATH} is in the old format only"
    at = lib.cds_cache_unsorted_at(ptr, config.target)
    if at >= 0:
        return f"{CACHE_PATH} is not in ldconfig's order (entry {at})"
    if config.conf_mtime > mtime:
        return f"{CACHE_PATH} is older than the configuration"
    counts = _cached_dirs(tree, config, ptr, mtime, hidden)
    _legacy_extras(config, extras)
    rescan, overlays, dropped = _rescans(tree, config, scanner, extras, ptr, mtime, counts)
    dirs = [os.fsencode(d.path) for d in config.dirs]
    c_dirs = [ffi.new("char[]", p) for p in dirs]
    ranks = ffi.new("uint32_t[]", [lib.CDS_RANK_DROP if i in rescan else i
                                   for i in range(len(dirs))] or [0])
    except_ = b"".join(path + b"\0" for path in dropped)
    unknown = lib.cds_builder_add_cache_except(builder.ptr, ptr,
                                               ffi.new("const char *[]", c_dirs or [ffi.NULL]),
                                               ranks, len(dirs), lib.CDS_RANK_DROP,
                                               except_ or ffi.NULL, len(except_), len(dropped))
    if unknown < 0:
        raise os_error("cannot merge the image's cache")
    if unknown > 0:
        # Directories no longer configured (or named otherwise): ldconfig would not list them.
        scanner.plan.warnings.append(
            f"{CACHE_PATH}: {unknown} entries of directories not configured, left out")
    for i, scan in overlays.items():
        scanner.add(i, scan)
        scanner.add_virtual_subdirs(i)
    builder.keep = parsed
    i = 0
    while i < len(config.dirs):
        if i in rescan or i >= len(dirs):
            scanner.scan(i)
        i += 1
    return ""


def _cached_dirs(tree, config, ptr, mtime, hidden):
    """{index in CONFIG's directories: its entries} of the directories the image's cache PTR
    (of MTIME) has entries of. Legacy hwcap subdirectories are found by scanning their parents;
    the ones the cache names (and TREE still has, not HIDDEN by a mount) are taken from it and
    added to CONFIG (ldconfig appends them after every configured directory)."""
    by_path = {d.path: i for i, d in enumerate(config.dirs)}
    counts = {}
    legacy = []
    for path, count in _cache_dirs(ptr):
        at = by_path.get(path)
        if at is not None:
            counts[at] = count
            continue
        parent, rest = _legacy_parent(config, path)
        if parent is not None and not mounted.is_hidden(tree.place(path), hidden):
            legacy.append((len(rest), config.by_ident[parent.ident], path, count, parent))
    for _depth, _rank, path, count, parent in sorted(legacy, key=lambda item: item[:3]):
        st = tree.stat(path)
        if st is None or not stat.S_ISDIR(st[0]):
            continue                  # gone: its entries go with it
        d = ConfDir(path, parent.flag, ("d", st[1], st[2]), mtime=st[3], base=parent.ident)
        if config.add_single(d):
            counts[len(config.dirs) - 1] = count
    return counts


def _legacy_extras(config, extras):
    """Extras under a legacy hwcap subdirectory the cache knows nothing of (an empty tls/),
    added to CONFIG: ldconfig would find it scanning its parent."""
    for ident, where in extras.paths.items():
        if ident not in config.by_ident:
            parent, _rest = _legacy_parent(config, where)
            if parent is not None:
                config.add_single(ConfDir(where, parent.flag, ident, real=ident[0] == "d",
                                        base=parent.ident))


def _rescans(tree, config, scanner, extras, ptr, mtime, counts):
    """(rescan, overlays, dropped): the image's cache PTR (of MTIME; COUNTS: _cached_dirs) as a
    memo per directory, kept where it is fresh (the directory no newer than the cache) and
    complete (a directory it has nothing of has no libraries). RESCAN: the indexes of the
    directories to scan again, in place; OVERLAYS: {index: the scan of the extras to add to
    the cache's entries of that directory}; DROPPED: paths of cache entries the extras make
    again (reused.extras_own)."""
    rescan = set()
    rescanned = set()
    overlays = {}
    dropped = []
    for i, d in enumerate(config.dirs):
        if not d.real or d.base in rescanned or d.mtime > mtime:
            rescan.add(i)
        elif i not in counts:
            listing = tree.listdir(d.path)
            if d.ident in extras.by_dir or (listing and any(_is_dso_name(n) for n, _ in listing)):
                rescan.add(i)
        elif d.ident in extras.by_dir:
            # Files to be mounted into a directory the cache covers: add them to its entries,
            # unless one hides a name of the directory or shares a soname with its libraries
            # (then which file ldconfig would keep depends on files we did not read).
            scan = scanner.scan(i, extras_only=True)
            if lib.cds_scan_shadowing(scan) or _overlaps(scan, ptr, d.path, config.target):
                # (a root our own step left: its cache lists the extras already: reused.py)
                own = extras_own(tree, scan, ptr, d, extras, d.mtime == mtime)
                if own is None:
                    rescan.add(i)
                else:
                    own, links = own
                    if links:
                        extras.by_dir[d.ident] += links
                        scan = scanner.scan(i, extras_only=True)
                    overlays[i] = scan
                    dropped += own
            else:
                overlays[i] = scan
        if i in rescan:
            rescanned.add(d.ident)
    return rescan, overlays, dropped


def plan_cache(root, folders=(), extra=None, **options):
    """The bytes of the cache ROOT would have (see plan())."""
    return plan(root, folders, extra, **options).cache
