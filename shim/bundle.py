"""The bundle's config.json: read it carefully, replace it atomically."""
import os

from . import fastjson

MAX_CONFIG_BYTES = 64 << 20


class BundleError(Exception):
    pass


def config_path(bundle):
    return os.path.join(bundle, "config.json")


def read_config(bundle):
    """(parsed config dict, raw bytes, stat) of BUNDLE/config.json; BundleError if unusable."""
    path = config_path(bundle)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        raise BundleError(f"cannot open {path}: {err.strerror}") from None
    try:
        info = os.fstat(fd)
        if (info.st_mode & 0o170000) != 0o100000:
            raise BundleError(f"{path} is not a regular file")
        if info.st_size > MAX_CONFIG_BYTES:
            raise BundleError(f"{path} is {info.st_size} bytes, more than the {MAX_CONFIG_BYTES} we accept")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            total += len(chunk)
            if total > MAX_CONFIG_BYTES:
                raise BundleError(f"{path} grew past {MAX_CONFIG_BYTES} bytes while being read")
            chunks.append(chunk)
    finally:
        os.close(fd)
    raw = b"".join(chunks)
    try:
        config = fastjson.loads(raw)
    except ValueError as err:
        raise BundleError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(config, dict):
        raise BundleError(f"{path}: the document is not a JSON object")
    return config, raw, info


def write_config(bundle, config, mode):
    """Replace BUNDLE/config.json atomically: temp file in the bundle, fsync, rename."""
    path = config_path(bundle)
    data = fastjson.dumps(config).encode()
    tmp = os.path.join(bundle, f".config.json.cdi-shim.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, mode & 0o7777)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, mode & 0o7777)
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
