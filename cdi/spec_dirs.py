"""Spec directories: which files in them are specs, in priority order."""
import errno
import os

DEFAULT_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")  # rising priority
SPEC_EXTENSIONS = (".json", ".yaml")


def is_spec_file_name(name):
    """The reference's rule: the extension is exactly .json or .yaml (case-sensitive).

    Temporary files of writers (``*.tmp``) never match.
    """
    return os.path.splitext(name)[1] in SPEC_EXTENSIONS


def placement_problem(path, spec_dirs):
    """Why a file at `path` would be ignored by a registry over `spec_dirs`, or None."""
    name = os.path.basename(path)
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.splitext(name)[1] == ".yml":
        return f'"{path}" has the extension .yml; only .json and .yaml files are read'
    if not is_spec_file_name(name):
        return f'"{path}" does not end in .json or .yaml; it is not read as a spec'
    dirs = [os.path.abspath(d) for d in spec_dirs]
    if directory in dirs:
        return None
    for spec_dir in dirs:
        if directory.startswith(spec_dir.rstrip("/") + "/"):
            return f'"{path}" is in a sub-directory of {spec_dir}; sub-directories are not scanned'
    return f'"{path}" is outside the spec directories ({", ".join(spec_dirs)}); it will not be loaded'


def scan_spec_dirs(spec_dirs):
    """List the spec files of each directory: ([(priority, path, stat_result)], {dir: error}).

    Priority is the index of the directory in `spec_dirs` (later wins). Files of one directory
    come sorted by name; missing directories are skipped quietly; sub-directories are not
    scanned. stat follows symlinks (a symlinked spec is read, as the reference does).
    Unlike the reference, an unreadable directory does not stop the scan of the next ones:
    its error is returned instead of being dropped.
    """
    files, dir_errors = [], {}
    for priority, directory in enumerate(spec_dirs):
        try:
            with os.scandir(directory) as entries:
                names = sorted(entry.name for entry in entries
                               if is_spec_file_name(entry.name) and not entry.is_dir(follow_symlinks=False))
        except OSError as err:
            if err.errno != errno.ENOENT:
                dir_errors[directory] = f'failed to read CDI spec directory "{directory}": {os.strerror(err.errno)}'
            continue
        for name in names:
            path = os.path.join(directory, name)
            try:
                info = os.stat(path)
            except OSError:
                info = None  # a dangling link: reading it reports the error
            files.append((priority, path, info))
    return files, dir_errors
