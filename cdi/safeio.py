"""Reading a file we do not trust: no blocking on FIFOs, no trusting its size."""
import errno
import os
import stat


# A file changed within this many ns of now may change again without its mtime or ctime
# ticking: its identity (file_identity) is trusted only once it is older. The one settle
# window: the spec cache, the settings memo and (through csrc/engine/memo_rules.h, made by
# shim/native_headers.py) the engine's file, plan and step memos. Two seconds covers the
# coarsest timestamps a node's filesystems keep (FAT's), with the kernel's coarse clock to spare.
RACY_WINDOW_NS = 2_000_000_000


def file_identity(info):
    """What a stat result says of a file and its content: any change to either changes it."""
    return (info.st_mode, info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


class UnsafeFile(Exception):
    """The file is there but must not be read (not regular, or too large)."""


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def file_kind(mode):
    """"a FIFO", "a directory", ... for a stat mode that is not a regular file's."""
    return next((name for test, name in _KINDS if test(mode)), "of another type")


def read_regular_file(path, limit, follow_links=True):
    """(bytes, stat_result) of a regular file of at most `limit` bytes.

    Raises OSError when it cannot be opened, UnsafeFile when it is not a regular file or
    holds (or grows to) more than `limit` bytes. O_NONBLOCK keeps a FIFO from blocking us.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    fd = os.open(path, flags if follow_links else flags | os.O_NOFOLLOW)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeFile(f"{file_kind(info.st_mode)}, not a regular file")
        if info.st_size > limit:
            raise UnsafeFile(f"{info.st_size} bytes, more than the {limit} accepted")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            total += len(chunk)
            if total > limit:
                raise UnsafeFile(f"grew past the {limit} bytes accepted while being read")
            chunks.append(chunk)
        return b"".join(chunks), info
    finally:
        os.close(fd)


def open_problem(err):
    """The reason an OSError of open() gives, as a message's tail ("a link loop ...")."""
    if err.errno == errno.ELOOP:
        return "a link loop (too many levels of symbolic links)"
    return (err.strerror or str(err))[:1].lower() + (err.strerror or str(err))[1:]


def read_config_file(path, limit, follow_links=True):
    """The bytes of a config or spec file we are told to read, or None when it does not exist.

    The one rule of the runtime's config, doctor, configure and install: opened without
    blocking (a FIFO there must not wedge every create), and refused unless a regular file of
    at most LIMIT bytes. Any other reason raises UnsafeFile with the reason ("a FIFO, not a
    regular file", "a link loop (...)", "permission denied"), for the caller to name PATH.
    """
    try:
        return read_regular_file(path, limit, follow_links)[0]
    except FileNotFoundError:
        return None
    except OSError as err:
        raise UnsafeFile(open_problem(err)) from None


def write_file_atomic(path, data, mode=0o644, prefix=".tmp.", sync=False, temp_name=None):
    """Replace PATH with DATA: a temp file beside it (never a partial file at PATH), renamed over it.

    Concurrent writers each leave a whole file; the last rename wins. SYNC fsyncs before the
    rename. TEMP_NAME names the temp file, for callers that must recognise a killed writer's
    leftover later (it must not exist; it is never followed if it is a link); otherwise the
    name is random, starting with PREFIX. On failure the temp file is removed and the error
    raised.
    """
    directory = os.path.dirname(os.path.abspath(path))
    if temp_name is None:
        import tempfile

        fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=directory)
    else:
        tmp = os.path.join(directory, temp_name)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, mode & 0o7777)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, mode & 0o7777)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def private_dir_problem(path, must_exist=True):
    """Why PATH cannot be trusted as a directory only we (and root) write to; None when it can.

    The rule of the resident server's socket directory and of the registry cache: PATH is a
    directory owned by us or root and not writable by group or others, and so is every
    directory above it, on the path as written and on the path its links lead to (a directory
    above may be writable by others when it is sticky, like /tmp: they cannot rename our
    entries). Otherwise whoever can write one of them can replace what we read or write there.
    With MUST_EXIST false, a missing PATH (or missing directories at its end) is fine: the
    directories above what exists are checked.
    """
    path = os.path.abspath(path)
    uid = os.geteuid()
    chains = [path]
    real = os.path.realpath(path)
    if real != path:
        chains.append(real)
    for chain in chains:
        parts = chain.split("/")
        for depth in range(1, len(parts) + 1):
            current = "/".join(parts[:depth]) or "/"
            try:
                info = os.lstat(current)
            except FileNotFoundError:
                if must_exist:
                    return f"{current} does not exist"
                break
            except OSError as err:
                return f"cannot inspect {current}: {err.strerror}"
            if info.st_uid not in (0, uid):
                return f"{current} is owned by uid {info.st_uid}, not by uid {uid} or root"
            if stat.S_ISLNK(info.st_mode):
                continue  # its directory is checked; where it leads is the other chain
            if not stat.S_ISDIR(info.st_mode):
                return f"{current} is not a directory"
            last = depth == len(parts)
            if info.st_mode & 0o022 and (last or not info.st_mode & stat.S_ISVTX):
                return (f"{current} is writable by group or others (mode {info.st_mode & 0o7777:o}); "
                        "it must not be")
    return None


# --- links root follows -------------------------------------------------------------------------

MAX_LINKS = 40   # as the kernel's walk


class UnsafePath(Exception):
    """A link on a path that root must not follow (planted by, or replaceable by, another user)."""


def _who(uid):
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _trusted_owners(uid):
    return "root" if uid == 0 else f"root or {_who(uid)}"


def _folders_problem(folder, uid):
    """Why the folders from / to FOLDER (a path with no links on it) are not ones only root and
    UID can write: each owned by one of them and not writable by group or others (one above
    FOLDER may be when sticky, like /tmp: others cannot rename what is ours there)."""
    parts = folder.split("/")
    for depth in range(1, len(parts) + 1):
        current = "/".join(parts[:depth]) or "/"
        if depth > 1 and not parts[depth - 1]:
            continue
        try:
            info = os.lstat(current)
        except OSError as err:
            return f"cannot inspect {current}: {err.strerror}"
        if info.st_uid not in (0, uid):
            return f"{current} is owned by {_who(info.st_uid)}, not by {_trusted_owners(uid)}"
        if info.st_mode & 0o022 and (depth == len(parts) or not info.st_mode & stat.S_ISVTX):
            return f"{current} is writable by group or others (mode {info.st_mode & 0o7777:o})"
    return None


def resolve_trusted(path, root="/", follow_last=True):
    """PATH with its links resolved, inside ROOT (a chroot's reading: an absolute link leads to
    ROOT's own file, ".." stops at ROOT), each followed only when it is trusted; the host path.

    The one rule of what root follows when it writes (runtime configure, cdi generate --output,
    install): a link is followed only when it is owned by root or the caller, and every folder
    on the way to it is owned by root or the caller and not writable by group or others (a
    sticky one above the link's own folder may be, like /tmp). Otherwise whoever owns it, or can
    replace it, chooses which file root rewrites. The folders on the way being ours, nobody can
    change the answer between this check and the write. A missing part ends the walk (what
    follows is appended as written: a file or folders to be made). With FOLLOW_LAST false, a
    link at the end is not followed (it is replaced, not written through). Raises UnsafePath
    naming the link and its owner, or the folder and why.
    """
    uid = os.geteuid()
    top = "/" if root in ("/", "") else resolve_trusted(os.path.abspath(root))
    path = os.fsdecode(path)
    if top == "/":
        path = os.path.join(os.getcwd(), path)    # (not normalized: "link/.." is the kernel's to read)
    pending = path.split("/")[::-1]
    current, links = top, 0
    while pending:
        part = pending.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if current != top:
                current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, part)
        last = not any(p not in ("", ".") for p in pending)
        try:
            info = os.lstat(candidate)
        except OSError:
            rest = [p for p in reversed(pending) if p]
            return os.path.normpath(os.path.join(candidate, *rest))
        if not stat.S_ISLNK(info.st_mode) or (last and not follow_last):
            current = candidate
            continue
        if info.st_uid not in (0, uid):
            raise UnsafePath(f"will not follow the link {candidate}: it is owned by {_who(info.st_uid)}, not by "
                             f"{_trusted_owners(uid)}")
        problem = _folders_problem(current, uid)
        if problem:
            raise UnsafePath(f"will not follow the link {candidate}: {problem}")
        links += 1
        if links > MAX_LINKS:    # each one trusted: the kernel's walk stops here too (ELOOP), for
            return os.path.join(top, path.lstrip("/"))     # the caller's open to say so
        target = os.readlink(candidate)
        if target.startswith("/"):
            current = top
        pending.extend(reversed(target.split("/")))
    return current
