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
