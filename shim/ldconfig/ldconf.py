"""ldconfig's directory list for a root: ld.so.conf and its includes, the toolkit's
drop-ins, glibc-hwcaps subdirectories, the host ldconfig's built-in directories, and where
the files to be mounted (extras) will appear."""
import os
import stat
from errno import ENOENT

from .engine import (CONF_DIR, CONF_PATH, DROPIN_COMPAT, DROPIN_FIRST, DROPIN_LAST, MACHINES, MAX_CONF_FILES,
                     MAX_CONF_SIZE, MAX_GLOB_DIRS, MAX_GLOB_NAMES, MAX_INCLUDE_DEPTH, LdcacheError,
                     LdcacheLimitError)
from .globbing import fnmatch, has_meta, join_path

MINIMAL_CONF = b"include /etc/ld.so.conf.d/*.conf\n"   # the toolkit's ld.so.conf where there is none

_LIB_TYPES = {"libc4": 0x0000, "libc5": 0x0002, "libc6": 0x0003, "glibc2": 0x0003}
_DT_REG, _DT_DIR = 8, 4
_SPACE = " \t\n\v\f\r"

_HOST_MACHINE = os.uname().machine


def machine_name(machine):
    machine = machine or _HOST_MACHINE
    if machine not in MACHINES:
        raise LdcacheError(f"unsupported machine {machine!r} (known: {', '.join(MACHINES)})")
    return machine


def builtin_dirs(machine):
    """The host ldconfig's own directories (Debian's glibc 2.36: multiarch, then plain)."""
    triplet = MACHINES[machine][1]
    return [f"/lib/{triplet}", f"/usr/lib/{triplet}", "/lib", "/usr/lib"]


def _container_system_dirs(root, machine):
    """The toolkit's zz-nvcr directories: by the container's flavour."""
    st = root.stat("/etc/debian_version")
    if st is not None and not stat.S_ISDIR(st[0]):
        return builtin_dirs(machine)
    if machine == "x86_64":
        return ["/lib", "/usr/lib", "/lib64", "/usr/lib64", "/libx32", "/usr/libx32"]
    return ["/lib", "/usr/lib", "/lib64", "/usr/lib64"]


class ConfDir:
    __slots__ = ("path", "flag", "ident", "hwcaps", "real", "mtime", "base")

    def __init__(self, path, flag, ident, hwcaps=None, real=True, mtime=0, base=None):
        self.path = path            # as the configuration spells it (and the cache will)
        self.flag = flag            # "=libc6" type, -1 for none
        self.ident = ident          # see Extras
        self.hwcaps = hwcaps        # glibc-hwcaps subdirectory name
        self.real = real            # exists in the tree (else only through extras)
        self.mtime = mtime
        self.base = base if base is not None else ident   # the directory it belongs to


LINK_MARK = "\x01"   # before a host path in cds_scan_dir's extras: the name is a link (scan.h)


class Extras:
    """Host files to be bind-mounted into the tree: where each will appear.

    Directory identities: ("d", dev, ino) for a directory of the tree, ("v", dev, ino, rest)
    for one that exists only once the mounts are made (REST below the deepest existing one).
    """

    def __init__(self, root, extra, links=()):
        """EXTRA: {container path: host path}; LINKS: those of its container paths that are
        links there (a directory mount's entries; cds_scan_dir)."""
        self.by_dir = {}            # directory identity -> [(name, host path)]
        self.links = set()          # (directory identity, name) of the links
        self.children = {}          # directory identity -> {names of virtual subdirectories}
        self.paths = {}             # directory identity -> its path as the extras name it
        self.spelled = {}           # (directory identity, name) -> the extra's path as given
        self._root = root
        self._located = {}          # driver files come 30 to a directory: locate it once
        for container_path, host_path in (extra or {}).items():
            container_path = os.fspath(container_path)
            host_path = os.fspath(host_path)
            if "\0" in container_path or "\0" in host_path:
                raise LdcacheError(f"extra library path {container_path!r} has a NUL byte")
            directory, _, name = container_path.rpartition("/")
            ident = self._located.get(directory)
            if ident is None or name in ("", ".", ".."):
                ident, name = self._place(container_path)
            self.by_dir.setdefault(ident, []).append((name, host_path))
            self.spelled[(ident, name)] = container_path
            if container_path in links:
                self.links.add((ident, name))

    def _place(self, container_path):
        """(directory identity, name) of an extra's path (normalized, checked), and the
        directory noted with its virtual parents."""
        if not container_path.startswith("/"):
            raise LdcacheError(f"extra library path {container_path!r} is not absolute")
        parts = [p for p in container_path.split("/") if p not in ("", ".")]
        if not parts or ".." in parts:
            raise LdcacheError(f"extra library path {container_path!r} is not a file path")
        ident = _locate(self._root, parts[:-1])
        if container_path.endswith("/" + parts[-1]):
            self._located[container_path[:-len(parts[-1]) - 1]] = ident
        self.paths.setdefault(ident, "/" + "/".join(parts[:-1]))
        child = ident
        while child[0] == "v":
            rest = child[3]
            parent = ("d",) + child[1:3] if len(rest) == 1 else child[:3] + (rest[:-1],)
            self.children.setdefault(parent, set()).add(rest[-1])
            child = parent
        return ident, parts[-1]

    def exists(self, ident):
        return ident in self.by_dir or ident in self.children

    def packed(self, ident):
        """(b"name\\0host\\0...", count) of the files going to directory IDENT."""
        files = self.by_dir.get(ident, ())
        if not files:
            return b"", 0
        mark = {name: LINK_MARK for i, name in self.links if i == ident} if self.links else {}
        text = "\0".join(f"{name}\0{mark.get(name, '')}{host}" for name, host in files) + "\0"
        return os.fsencode(text), len(files)


def _parts(path):
    """Components of PATH, or None when it climbs ("..": not a place a mount creates)."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    return None if ".." in parts else parts


def child_ident(ident, name):
    return ("v",) + ident[1:3] + ((name,) if ident[0] == "d" else ident[3] + (name,),)


def _locate(root, parts):
    """Identity of the directory PARTS (components from /), see Extras."""
    for i in range(len(parts), -1, -1):
        st = root.stat("/" + "/".join(parts[:i]))
        if st is not None and stat.S_ISDIR(st[0]):
            if i == len(parts):
                return ("d", st[1], st[2])
            return ("v", st[1], st[2], tuple(parts[i:]))
    raise LdcacheError("the root is not a directory")


def _dir_text(line):
    """A directory line as ldconfig keeps it: no type, no trailing blanks or slashes."""
    return line.split("=", 1)[0].rstrip(_SPACE).rstrip("/")


class LdConfig:
    """ldconfig's directory list for a root: its conf files with the toolkit's drop-ins,
    then the host ldconfig's built-in directories."""

    def __init__(self, root, machine, folders, extras, deadline=None, compat=()):
        self.root = root
        self.deadline = deadline    # engine.Deadline or None
        self.machine = machine
        self.target = MACHINES[machine][0]
        self.extras = extras
        self.dirs = []
        self.by_ident = {}
        self.hwcaps_names = set()
        self.warnings = []
        self.conf_mtime = 0         # newest configuration file read
        self.absent = []            # configured directories not in the tree (a mount may bring one)
        self._items = []            # ("dir", line) and ("dropin", name), in ldconfig's order
        self._files_read = 0
        # Include globs: their results by pattern (the tree does not change while it is
        # planned for), the work they did (bounded: MAX_GLOB_DIRS, MAX_GLOB_NAMES) and the
        # include line being expanded (for the error a bound gives).
        self._globs = {}
        self._glob_dirs = 0
        self._glob_names = 0
        self._including = ""
        _, conf_d = root.listdir(CONF_DIR, with_stat=True)     # listed again for its includes
        self._conf_d_ident = ("d", conf_d[1], conf_d[2]) if conf_d is not None else None
        self.conf_missing = not self._parse_conf(CONF_PATH, 0)
        if self.conf_missing:
            # The toolkit writes a minimal ld.so.conf where there is none.
            self._parse_lines(MINIMAL_CONF, CONF_PATH, 0)

        # The toolkit's drop-ins: folders not configured yet, and the container's system
        # directories (its "zz" file).
        system = _container_system_dirs(root, machine)
        configured = {_dir_text(line) for kind, line in self._items if kind == "dir"}
        configured.update(system)
        first = []
        for folder in folders:
            if folder not in configured and folder not in first:
                first.append(folder)
        # enable-cuda-compat's drop-in names its folders whether configured or not.
        self.dropins = {DROPIN_COMPAT: list(dict.fromkeys(compat)), DROPIN_FIRST: first, DROPIN_LAST: system}

    def conf_files(self):
        """[(path, bytes)]: what the toolkit's hooks write of this configuration into the root
        (update-ldcache's ensureLdsoconfFile and createLdsoconfdFile, enable-cuda-compat's
        drop-in): ld.so.conf where there is none, each drop-in that names a folder."""
        files = [(CONF_PATH, MINIMAL_CONF)] if self.conf_missing else []
        for name in (DROPIN_COMPAT, DROPIN_FIRST, DROPIN_LAST):
            lines = list(dict.fromkeys(self.dropins[name]))
            if lines:
                files.append((f"{CONF_DIR}/{name}", "".join(line + "\n" for line in lines).encode()))
        return files

    def build(self):
        items = self._items
        if not any(kind == "dropin" for kind, _ in items):
            # The image never reads ld.so.conf.d: the folders go first all the same (a gain),
            # but not the compat folder: unread under the toolkit, it would change which
            # libcuda loads.
            items = [("dropin", DROPIN_FIRST)] + items + [("dropin", DROPIN_LAST)]
        for kind, value in items:
            if kind == "dir":
                self._add_dir(value)
            else:
                for line in self.dropins[value]:
                    self._add_dir(line)
        for d in builtin_dirs(self.machine):
            self._add_dir(d)
        return self

    def _parse_conf(self, filename, depth):
        if depth > MAX_INCLUDE_DEPTH:
            self.warnings.append(
                f"{filename}: includes nested deeper than {MAX_INCLUDE_DEPTH}, ignored")
            return True
        if self._files_read >= MAX_CONF_FILES:
            if self._files_read == MAX_CONF_FILES:     # said once: there may be millions
                self._files_read += 1
                self.warnings.append(
                    f"{filename}: more than {MAX_CONF_FILES} configuration files, ignored")
            return True
        self._files_read += 1
        if self.deadline is not None:
            self.deadline.check("reading ", filename)
        try:
            data, mtime = self.root.read(filename, MAX_CONF_SIZE)
        except OSError as err:
            if err.errno != ENOENT:
                self.warnings.append(f"ignoring configuration file {filename}: {err.strerror}")
                return True
            return False
        except LdcacheError as err:
            self.warnings.append(f"ignoring configuration file {err}")
            return True
        if mtime > self.conf_mtime:
            self.conf_mtime = mtime
        self._parse_lines(data, filename, depth)
        return True

    def _parse_lines(self, data, filename, depth):
        for raw in data.split(b"\n"):
            line = os.fsdecode(raw.split(b"\0", 1)[0].split(b"#", 1)[0])
            cp = line.lstrip(_SPACE)
            if not cp:
                continue
            if cp.startswith("include") and len(cp) > 7 and cp[7] in " \t":
                for word in cp[8:].replace("\t", " ").split(" "):
                    if word:
                        self._include(filename, word, depth)
            elif cp[:5].lower() == "hwcap" and len(cp) > 5 and cp[5] in " \t":
                self.warnings.append(f"{filename}: hwcap directive ignored")
            else:
                self._items.append(("dir", cp))

    def _include(self, config_file, pattern, depth):
        if not pattern.startswith("/") and "/" in config_file:
            pattern = os.path.dirname(config_file) + "/" + pattern
        self._including = f"{config_file}: include {pattern}"
        for path, dropin in self._glob(pattern):
            if dropin:
                self._items.append(("dropin", dropin))
            else:
                self._parse_conf(path, depth + 1)

    def _glob(self, pattern):
        """[(path, drop-in name or None)] matching PATTERN inside the tree, sorted.

        As glibc's glob(3), except that a directory reached by several paths (links to it
        or to a parent) is looked into once, by the first of them in sorted order: over
        self-referencing links (ten links to "." under /g, `include /g/*/*/*/*/*/*/*.conf`)
        glob(3) lists 10**7 paths of one file. ldconfig reads each library directory once
        too (by identity)."""
        found = self._globs.get(pattern)
        if found is None:
            found = self._globs[pattern] = self._expand(pattern)
        return found

    def _visit(self, names):
        """Account for a directory looked into by an include glob, NAMES of it matched."""
        self._glob_dirs += 1
        self._glob_names += names
        if self._glob_dirs > MAX_GLOB_DIRS:
            raise LdcacheLimitError(f"{self._including}: include globs looked into more than "
                                    f"{MAX_GLOB_DIRS} directories (the bound on include globs)")
        if self._glob_names > MAX_GLOB_NAMES:
            raise LdcacheLimitError(f"{self._including}: include globs matched more than "
                                    f"{MAX_GLOB_NAMES} names (the bound on include globs)")
        if self.deadline is not None:
            self.deadline.check(self._including)

    def _expand(self, pattern):
        cut = pattern.rfind("/")
        if cut < 0:
            dirname, fpat = "", pattern
        else:
            dirname, fpat = pattern[:cut] or "/", pattern[cut + 1:]
        if not fpat:
            return []
        if has_meta(dirname):
            dirs = []
            seen = set()
            for d, _ in self._glob(dirname):
                st = self.root.stat(d)
                if st is not None and stat.S_ISDIR(st[0]) and (st[1], st[2]) not in seen:
                    seen.add((st[1], st[2]))
                    dirs.append(d)
        else:
            dirs = [dirname]
        out = []
        for d in dirs:
            names, virtual = self._conf_listing(d)
            self._visit(len(names) if has_meta(fpat) else 0)
            if not has_meta(fpat):
                if fpat in virtual:
                    out.append((join_path(d, fpat), fpat))
                elif self.root.stat(join_path(d, fpat), follow=False) is not None:
                    out.append((join_path(d, fpat), None))
                continue
            for name in names:
                if fnmatch(fpat, name):
                    out.append((join_path(d, name), name if name in virtual else None))
        out.sort(key=lambda item: os.fsencode(item[0]))
        return out

    def _conf_listing(self, directory):
        """Names in DIRECTORY, with the toolkit's drop-ins when it is ld.so.conf.d."""
        listing, st = self.root.listdir(directory or "/", with_stat=True)
        names = [n for n, _ in listing] if listing is not None else []
        if st is None:
            st = self.root.stat(directory or "/")
        if st is not None:
            is_conf_d = ("d", st[1], st[2]) == self._conf_d_ident
        else:
            # The toolkit creates the directory.
            is_conf_d = self._conf_d_ident is None and \
                os.path.normpath("/" + directory.lstrip("/")) == CONF_DIR   # (normpath keeps a leading //)
        if not is_conf_d:
            return names, ()
        virtual = (DROPIN_COMPAT, DROPIN_FIRST, DROPIN_LAST)
        return [n for n in names if n not in virtual] + list(virtual), virtual

    def _add_dir(self, line):
        flag = -1
        if "=" in line:
            line, kind = line.split("=", 1)
            flag = _LIB_TYPES.get(kind, -1)
            if flag == -1:
                self.warnings.append(f"{kind} is not a known library type")
        path = _dir_text(line)
        if not path:
            return
        st = self.root.stat(path)
        if st is not None:
            d = ConfDir(path, flag, ("d", st[1], st[2]), real=stat.S_ISDIR(st[0]),
                     mtime=st[3] if stat.S_ISDIR(st[0]) else 0)
        else:
            self.absent.append(path)
            parts = _parts(path) if self.extras.children else None
            if parts is None:
                return
            ident = _locate(self.root, parts)
            if ident[0] != "v" or not self.extras.exists(ident):
                return
            d = ConfDir(path, flag, ident, real=False)
        if self.add_single(d):
            self._add_hwcaps_subdirs(d)

    def add_single(self, d):
        at = self.by_ident.get(d.ident)
        if at is not None:
            self.dirs[at].flag = d.flag     # "Use the newer information"
            return False
        self.by_ident[d.ident] = len(self.dirs)
        self.dirs.append(d)
        return True

    def _add_hwcaps_subdirs(self, d):
        sub = d.path + "/glibc-hwcaps"
        names = []
        sub_ident = None
        if d.real:
            listing = self.root.listdir(sub)
            if listing is not None:
                names = listing
                st = self.root.stat(sub)
                if st is not None:
                    sub_ident = ("d", st[1], st[2])
                    if st[3] > d.mtime:
                        d.mtime = st[3]     # a new subdirectory there is a change of D
            elif self.extras.children:
                sub_ident = child_ident(d.ident, "glibc-hwcaps")
        else:
            sub_ident = child_ident(d.ident, "glibc-hwcaps")
        if sub_ident is not None and sub_ident in self.extras.children:
            known = {n for n, _ in names}
            names = list(names) + [(c, _DT_DIR) for c in sorted(self.extras.children[sub_ident])
                                   if c not in known]
        for name, dtype in names:
            if name.startswith(".") or dtype == _DT_REG or ":" in name:
                continue
            path = sub + "/" + name
            st = self.root.stat(path)
            if st is not None:
                if not stat.S_ISDIR(st[0]):
                    continue
                ident, real, mtime = ("d", st[1], st[2]), True, st[3]
            else:
                if sub_ident is None:
                    continue
                ident, real, mtime = child_ident(sub_ident, name), False, 0
                if not self.extras.exists(ident):
                    continue
            self.hwcaps_names.add(name)
            self.add_single(ConfDir(d.path + "/glibc-hwcaps/" + name, d.flag, ident, name, real,
                                  mtime, base=d.ident))
