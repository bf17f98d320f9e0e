"""Spec directories: which files in them are specs, in priority order."""
import errno
import os
import stat
from .errors import q

DEFAULT_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")  # rising priority
SPEC_EXTENSIONS = (".json", ".yaml")


def is_spec_file_name(name):
    """The reference's rule: the extension is exactly .json or .yaml (case-sensitive).

    Temporary files of writers (``*.tmp``) never match.
    """
    return name.endswith(SPEC_EXTENSIONS)  # Go's filepath.Ext: ".yaml" alone counts too


def placement_problem(path, spec_dirs):
    """Why a file at `path` would be ignored by a registry over `spec_dirs`, or None."""
    name = os.path.basename(path)
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.splitext(name)[1] == ".yml":
        return f'{q(path)} has the extension .yml; only .json and .yaml files are read'
    if not is_spec_file_name(name):
        return f'{q(path)} does not end in .json or .yaml; it is not read as a spec'
    dirs = [os.path.abspath(d) for d in spec_dirs]
    if directory in dirs:
        return None
    for spec_dir in dirs:
        if directory.startswith(spec_dir.rstrip("/") + "/"):
            return f'{q(path)} is in a sub-directory of {spec_dir}; sub-directories are not scanned'
    return f'{q(path)} is outside the spec directories ({", ".join(spec_dirs)}); it will not be loaded'


def scan_spec_dirs(spec_dirs):
    """List the spec files of each directory: ([(priority, path, stat_result)], {dir: error}).

    Priority is the index of the directory in `spec_dirs` (later wins). Files of one directory
    come sorted by name; missing directories are skipped quietly; sub-directories are not
    scanned. stat follows symlinks (a symlinked spec is read, as the reference does); a
    dangling link gets None and reports its error when read.
    Unlike the reference, an unreadable directory does not stop the scan of the next ones:
    its error is returned instead of being dropped.

    This runs on every container create, so it does one stat per file and nothing more.
    """
    files, dir_errors = [], {}
    for priority, directory in enumerate(spec_dirs):
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as err:
            if err.errno != errno.ENOENT:
                dir_errors[directory] = f'failed to read CDI spec directory {q(directory)}: {os.strerror(err.errno)}'
            continue
        try:
            names = sorted(name for name in os.listdir(fd) if name.endswith(SPEC_EXTENSIONS))
            prefix = directory if directory.endswith("/") else directory + "/"
            for name in names:
                try:
                    info = os.stat(name, dir_fd=fd)
                except OSError:
                    info = None
                if info is not None and (info.st_mode & 0o170000) == stat.S_IFDIR \
                        and not stat.S_ISLNK(os.lstat(name, dir_fd=fd).st_mode):
                    continue  # a real sub-directory (a link to one is read, and fails, as in Go)
                files.append((priority, prefix + name, info))
        except OSError as err:
            dir_errors[directory] = f'failed to read CDI spec directory {q(directory)}: {os.strerror(err.errno)}'
        finally:
            os.close(fd)
    return files, dir_errors
