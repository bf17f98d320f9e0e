"""A device's library mounts and our own bundle files, bound by one C hook instead of runc.

runc spends several times the kernel's own cost on each file bind of config.json (the
destination resolved four times over, each through /proc/self/fd and a readlink check, the
propagation and the remount on top), and a toolkit-shaped spec binds 30 or more driver
libraries (the figures: benchmarks/file_binds.py, benchmarks/RESULTS.md). Here such mounts
leave config.json for `cdi-shim-nshook binds` (csrc/hooks/nshook.c), the first createContainer
hook: runc runs it in the container's mount namespace after its own mounts and before
pivot_root, where it makes the same binds, resolved inside the rootfs, with the same flags.

Only mounts whose result cannot tell the difference move:
- a bind of a host regular file (options: bind or rbind, any of ro, nosuid, nodev, noexec,
  and one of private, rprivate, slave, rslave: the toolkit writes "ro, nosuid, nodev, rbind,
  rprivate") whose destination names a library (its source is in the step memo's key, so a
  replayed step binds the same file) or is one of the files this step wrote into the bundle;
- at a destination that appears once, outside /proc, /sys and /dev (runc's own mounts),
  a regular file in the image or missing there under a directory that is there (a link, a
  directory, or a link that leads nowhere above it are left to runc's own resolution), with no
  mount after it at that path or above it (the hook runs after every mount runc makes, so
  those would otherwise end up below it);
- in a container without a user namespace (runc then opens the sources itself, before it
  enters it) and without prestart or createRuntime hooks (they run before createContainer
  hooks and may expect the files in place);
- and only when at least MIN_BINDS qualify: the hook's start must be paid back by the binds
  it saves -- unless our own hook runs anyway (`cdi-shim-nshook bind-params`, a GPU node's
  disable-device-node-modification): its work is then folded into this hook (`--params`), and
  one start serves both. Our `cdi-shim-nshook symlinks` (the /dev/dri/by-path links of a node
  with DRM devices) does not count: for a create with --pid-file the front end makes those
  links itself after runc's create, with no hook (csrc/frontend/after_create.c). Where the
  binds hook runs, the links are folded into it too (`--link`).
"""
import errno
import os
import posixpath
import stat

MIN_BINDS = 16
MAX_BINDS = 256     # per hook (cdi-shim-nshook takes 341); the rest stay with runc
OPTIONS = frozenset(("bind", "rbind", "ro", "nosuid", "nodev", "noexec", "private", "rprivate", "slave", "rslave"))
PROPAGATIONS = frozenset(("private", "rprivate", "slave", "rslave"))
RUNC_TREES = ("/proc", "/sys", "/dev")


def _under(path, top):
    return path == top or path.startswith(top.rstrip("/") + "/")


def _movable(mount, ours, is_library):
    """True when MOUNT (a dict) is a file bind of the kind described above, config-wise."""
    destination, source, options = mount.get("destination"), mount.get("source"), mount.get("options")
    if not (isinstance(destination, str) and isinstance(source, str) and isinstance(options, list)):
        return False
    if not destination.startswith("/") or posixpath.normpath(destination) != destination or destination == "/":
        return False
    if any(_under(destination, top) for top in RUNC_TREES):
        return False
    if mount.get("type") not in (None, "", "bind", "none"):
        return False
    if not all(isinstance(option, str) for option in options) or not set(options) <= OPTIONS \
            or not {"bind", "rbind"} & set(options) or len(PROPAGATIONS & set(options)) > 1:
        return False
    if not (is_library(destination) or source in ours):
        return False
    try:
        return stat.S_ISREG(os.stat(source).st_mode)
    except OSError:
        return False


def _can_make(root, destination):
    """True when the hook can make DESTINATION's missing directories: the nearest one there is a
    directory, not a link that leads nowhere (runc would make its target; the hook refuses)."""
    parent = posixpath.dirname(destination)
    while parent != "/":
        if root.stat(parent, follow=False) is not None:     # there: a directory, or a link to one
            followed = root.stat(parent)
            return followed is not None and stat.S_ISDIR(followed[0])
        if root.errno != errno.ENOENT:
            return False
        parent = posixpath.dirname(parent)
    return True


def plan(config, root, ours, is_library, minimum=None):
    """The indices of CONFIG's mounts the hook can bind (see above), in order; [] when fewer
    than MINIMUM (MIN_BINDS). ROOT: the rootfs (engine.Root); OURS: the bundle files this step bound."""
    linux = config.get("linux")
    namespaces = linux.get("namespaces") if isinstance(linux, dict) else None
    if isinstance(namespaces, list) and any(isinstance(ns, dict) and ns.get("type") == "user" for ns in namespaces):
        return []
    hooks = config.get("hooks")
    if isinstance(hooks, dict) and (hooks.get("prestart") or hooks.get("createRuntime")):
        return []
    mounts = config.get("mounts") or []
    destinations = [m.get("destination") if isinstance(m, dict) else None for m in mounts]
    chosen = []
    for index, mount in enumerate(mounts):
        if not isinstance(mount, dict) or not _movable(mount, ours, is_library):
            continue
        destination = mount["destination"]
        if destinations.count(destination) != 1:
            continue
        later = [d for d in destinations[index + 1:] if not isinstance(d, str) or
                 _under(destination, posixpath.normpath(d) if d.startswith("/") else "/")]
        if later:
            continue
        found = root.stat(destination, follow=False)
        if found is None and (root.errno != errno.ENOENT or not _can_make(root, destination)) \
                or found is not None and not stat.S_ISREG(found[0]):
            continue
        chosen.append(index)
        if len(chosen) == MAX_BINDS:
            break
    return chosen if len(chosen) >= (MIN_BINDS if minimum is None else minimum) else []


def folded_hooks(config, program, rootfs):
    """Our own hooks of PROGRAM this hook can do too (cdi-shim-nshook bind-params and symlinks of
    ROOTFS): [their indices among the createContainer hooks], the params source or None, [the
    --link values]."""
    folded, params, links = [], None, []
    for at, entry in enumerate((config.get("hooks") or {}).get("createContainer") or ()):
        args = entry.get("args") if isinstance(entry, dict) else None
        if entry.get("path") != program or not isinstance(args, list) or args[2:4] != ["--rootfs", rootfs] \
                or not all(isinstance(arg, str) for arg in args):
            continue
        options = list(zip(args[4::2], args[5::2]))
        if args[:2] == ["cdi-shim-nshook", "bind-params"] and params is None and len(args) == 6 \
                and options[0][0] == "--source":
            params = options[0][1]
        elif args[:2] == ["cdi-shim-nshook", "symlinks"] and len(args) % 2 == 0 \
                and all(name == "--link" for name, _ in options):
            links += [value for _, value in options]
        else:
            continue
        folded.append(at)
    return folded, params, links


def replaced(config, program, rootfs, made):
    """[Indices among CONFIG's createContainer hooks] of earlier binds hooks of PROGRAM in ROOTFS
    that MADE (the new binds hook) does all the work of: each of their binds (source,
    destination, options), their --params and --links are MADE's too. A bundle run directly
    keeps the config.json its last run wrote, binds hook and all; the next run's injection
    brings the spec's mounts back and this step binds them again: the old hook goes, so the
    config stays the same run after run (and so its step key: the replay)."""
    def parts(args):        # ({--bind triples}, {(--params|--link, value)}), or None
        binds, rest, at = set(), set(), 4
        while at < len(args):
            width = {"--bind": 3, "--params": 1, "--link": 1}.get(args[at])
            if width is None or at + width >= len(args):
                return None
            (binds if width == 3 else rest).add(tuple(args[at:at + width + 1]))
            at += width + 1
        return binds, rest

    new = parts(made["args"])
    found = []
    for at, entry in enumerate((config.get("hooks") or {}).get("createContainer") or ()):
        args = entry.get("args") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or entry.get("path") != program or not isinstance(args, list) \
                or args[:4] != ["cdi-shim-nshook", "binds", "--rootfs", rootfs] \
                or not all(isinstance(arg, str) for arg in args) or entry.get("env", made["env"]) != made["env"] \
                or set(entry) - {"path", "args", "env"}:
            continue
        old = parts(args)
        if old is not None and new is not None and old[0] <= new[0] and old[1] <= new[1]:
            found.append(at)
    return found


def hook(config, chosen, rootfs, program, env, params=None, links=()):
    """CONFIG without its mounts at CHOSEN, and the hook of PROGRAM (cdi-shim-nshook binds) that
    binds them instead, and does the folded hooks' work too (the bind of PARAMS, the LINKS): the
    caller puts it first among the createContainer hooks, the folded ones taken out."""
    mounts = config.get("mounts") or []
    args = ["cdi-shim-nshook", "binds", "--rootfs", rootfs]
    for index in chosen:
        mount = mounts[index]
        args += ["--bind", mount["source"], mount["destination"], ",".join(mount["options"])]
    if params is not None:
        args += ["--params", params]
    for link in links:
        args += ["--link", link]
    made = {"path": program, "args": args, "env": list(env)}
    skip = set(chosen)
    return dict(config, mounts=[m for at, m in enumerate(mounts) if at not in skip]), made
