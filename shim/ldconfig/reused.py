"""A root our own step left, planned again (issue 47: a plain-folder bundle run directly, again
and again): its cache already lists the mounted libraries, at the paths runc's mount points
and our soname links hold. Those entries are the extras' own: left out and made again from the
extras, the folder is not scanned (plan._incremental), so the plan stays within its path bound
and the step can be kept."""
import os
import posixpath
import re
import stat
from errno import ENOENT

from .._native import ffi, lib
from .engine import O_DIRECTORY

_DT_UNKNOWN, _DT_LNK = 0, 10


def _sameness(soname):
    """SONAME (bytes) as glibc's _dl_cache_libcmp tells sonames apart: runs of digits by value."""
    return re.sub(rb"[0-9]+", lambda m: b"%d" % int(m.group()), soname)


def extras_own(tree, scan, ptr, d, extras, same_tick):
    """(the paths of the cache's entries in directory D that the extras going there (SCAN, of
    the extras only) make again, to be left out of the cache before they are added, [(name,
    host file)] of the soname links to extras there to be planned as those files); or None
    where the extras may change what else the cache says of D (then D is scanned again).

    A root our own step left (a plain folder run again) holds, at the extras' paths, the empty
    mount points runc and that step made and the soname links it made to the mounted files;
    its cache, ours, lists the extras' sonames in D at those paths. The extras are those
    entries' own where every name the extras hide holds nothing ldconfig reads of its own (an
    empty file, or a link to another extra of D), every entry of D at an extra's path has an
    extra's soname and no other entry of D has one (a file of the image sharing it: which one
    ldconfig keeps depends on files we did not read). SAME_TICK: D changed within the clock
    tick the cache was written in, maybe after it (our step makes the links create-symlinks
    defers once the cache is written): then every link of D that leads to an extra there
    must be one of those entries or have its own."""
    hosts = dict(extras.by_dir[d.ident])
    names = set(hosts)
    extra_linked = _ExtraLinked(tree, d.path, names)
    if not _hide_nothing_read(tree, d.path, names, extra_linked):
        return None
    found = _entries_own(tree, ptr, d.path, hosts, _sonames(scan), same_tick, extra_linked)
    if found is None:
        return None
    own, links, listed = found
    if same_tick and not _links_listed(tree, d.path, names | {name for name, _ in links}, listed):
        return None
    return own, links


class _ExtraLinked:
    """Called with a path: the extra (one of NAMES) of the directory PATH in TREE the link there
    leads to, or None. (The directory's own place is resolved once, when first needed.)"""

    def __init__(self, tree, path, names):
        self.tree, self.path, self.names, self.here = tree, path, names, []

    def __call__(self, path):
        if not self.here:
            self.here.append(self.tree.resolved(self.path))
        there = self.tree.resolved(path)
        if there is None or self.here[0] is None or posixpath.dirname(there) != self.here[0]:
            return None
        name = posixpath.basename(there)
        return name if name in self.names else None


def _hide_nothing_read(tree, path, names, extra_linked):
    """Whether each of NAMES in the directory PATH of TREE is absent, an empty file or a link to
    an extra there (EXTRA_LINKED): nothing ldconfig reads of its own."""
    for name in sorted(names):
        at = path + "/" + name
        st = tree.stat(at, follow=False)
        if st is None:
            if tree.errno != ENOENT:
                return False
            continue
        if stat.S_ISLNK(st[0]):
            if extra_linked(at) is None:
                return False
        elif stat.S_ISREG(st[0]):
            fd = tree.open(at, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            if fd < 0:
                return False
            try:
                if os.fstat(fd).st_size != 0:
                    return False
            finally:
                os.close(fd)
        else:
            return False
    return True


def _sonames(scan):
    """The sonames of SCAN's libraries, as _sameness gives them."""
    lib_ = ffi.new("struct cds_dlib *")
    sonames = set()
    for i in range(lib.cds_scan_count(scan)):
        lib.cds_scan_lib(scan, i, lib_)
        sonames.add(_sameness(ffi.string(lib_.soname)))
    return sonames


def _entries_own(tree, ptr, path, hosts, sonames, same_tick, extra_linked):
    """(own, links, listed) of the cache PTR's entries in the directory PATH (see extras_own;
    LISTED: the names they are at, when SAME_TICK), or None when an entry is not the extras'
    own: at an extra's name (of HOSTS) without one of their SONAMES, or with one elsewhere but
    not a link to an extra."""
    prefix = os.fsencode(path) + b"/"
    entry = ffi.new("struct cds_cache_entry *")
    own, links, listed = [], [], set()
    for i in range(lib.cds_cache_count(ptr)):
        lib.cds_cache_entry(ptr, i, entry)
        value = ffi.string(entry.value)
        if not value.startswith(prefix) or b"/" in value[len(prefix):]:
            continue
        ours = _sameness(ffi.string(entry.key)) in sonames
        name = os.fsdecode(value[len(prefix):])
        if same_tick:
            listed.add(name)
        if name in hosts:
            if not ours:
                return None
            own.append(value)
        elif ours:
            # the soname link an earlier step made to an extra (not one now: it is there):
            # planned as that mounted file at its name, as the step plans a link it makes
            at = path + "/" + name
            st = tree.stat(at, follow=False)
            linked = extra_linked(at) if st is not None and stat.S_ISLNK(st[0]) else None
            if linked is None:
                return None
            own.append(value)
            links.append((name, hosts[linked]))
    return own, links, listed


def _links_listed(tree, path, extras, listed):
    """Whether every link in the directory PATH of TREE that leads there (by its text) to one
    of the names EXTRAS is one of those names or in LISTED (the names the cache has entries
    at); False too where it cannot be told."""
    listing = tree.listdir(path)
    if listing is None:
        return False
    texts = {}
    fd = tree.open(path, os.O_RDONLY | O_DIRECTORY)
    if fd < 0:
        return False
    try:
        for name, kind in listing:
            if kind == _DT_UNKNOWN:
                return False
            if kind == _DT_LNK:
                texts[name] = os.readlink(name, dir_fd=fd)
    except OSError:
        return False
    finally:
        os.close(fd)
    for name, text in texts.items():
        if name in extras or name in listed:
            continue
        for _hop in range(16):
            if "/" in text:
                if posixpath.basename(text) in extras or posixpath.basename(text) in texts:
                    return False    # (elsewhere, or here by another spelling: not told apart)
                break
            if text in extras:
                return False
            if text not in texts:
                break
            text = texts[text]
        else:
            return False
    return True
