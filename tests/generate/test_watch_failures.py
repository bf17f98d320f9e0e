"""`cdi generate --watch` against a hostile or failing output (issue 33 item 4): a full or
read-only file system (real tmpfs mounts), a FIFO planted at the spec's path, an output folder
others can write to or own. The watcher runs in this process (its generations in forked
children, as in production) on the session's fake driver."""
import os
import signal
import stat
import subprocess

import pytest

from shim.generate import Options
from shim.generate.watch import Failure, Watcher


@pytest.fixture
def tmpfs(tmp_path):
    """A 64 KiB tmpfs of the test's own (unmounted after it)."""
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def _options(driver, output):
    return Options(output=str(output), driver_root=driver.root, dev_root=driver.dev_root, sysfs=driver.sysfs,
                   proc=driver.proc)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


@pytest.fixture
def no_hang():
    """A watcher that blocks (a FIFO opened for reading) fails the test instead of hanging it."""
    def expired(*_):
        raise AssertionError("the watcher blocked")
    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("failure", ["ENOSPC", "EROFS"])
def test_a_write_that_fails_is_retried_with_back_off_never_fatal(driver, run, tmpfs, failure):
    """The spec's file system full (ENOSPC) or read-only (EROFS): each attempt says so in the log,
    the retries back off (2, 4, 8 s...), the loop goes on; once the file system is fixed, the spec is
    written."""
    output = tmpfs / "cdi" / "nvidia.yaml"
    output.parent.mkdir()
    if failure == "ENOSPC":
        filler = tmpfs / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError as err:
            assert err.strerror == "No space left on device"
        finally:
            os.close(fd)
        why = "No space left on device"
    else:
        subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
        why = "Read-only file system"
    log, clock = [], Clock()
    watcher = Watcher(_options(driver, output), interval=1, nvml_interval=1000, max_backoff=8, log=log.append,
                      clock=clock, sleep=clock.sleep)
    with pytest.raises(Failure) as caught:
        watcher.attempt("test")
    assert caught.value.transient and str(caught.value) == f"cannot write {output}: {why}"
    attempts = []
    watcher.run(stop=lambda: attempts.append(clock.now) or len(attempts) > 12)
    failed = [line for line in log if "cannot write" in line]
    assert failed and f"cannot write {output}: {why}; retry in 2 s" in failed[0], log
    assert any("retry in 8 s" in line for line in failed), log                    # backed off, capped
    assert not output.exists()
    if failure == "ENOSPC":
        os.unlink(filler)
    else:
        subprocess.run(["mount", "-o", "remount,rw", str(tmpfs)], check=True)
    log.clear()
    attempts.clear()
    watcher.run(stop=lambda: attempts.append(clock.now) or output.exists() or len(attempts) > 40)
    assert output.exists() and any(line.startswith(f"cdi-shim cdi generate --watch: wrote {output}")
                                   for line in log), log
    assert [p for p in os.listdir(output.parent) if p != "nvidia.yaml"] == []      # no temp file left


def test_a_fifo_at_the_spec_s_path_does_not_block_it(driver, run, tmp_path, no_hang):
    """A FIFO planted at the output path: read without blocking, seen as no spec, replaced."""
    output = tmp_path / "cdi" / "nvidia.yaml"
    output.parent.mkdir()
    os.mkfifo(output)
    watcher = Watcher(_options(driver, output), log=[].append)
    assert watcher.attempt("test")[0] == "written"
    assert stat.S_ISREG(os.lstat(output).st_mode)
    assert watcher.attempt("again")[0] == "current"


def test_a_link_at_the_spec_s_path_is_replaced_not_followed(driver, run, tmp_path):
    elsewhere = tmp_path / "elsewhere.yaml"
    elsewhere.write_text("theirs\n")
    output = tmp_path / "cdi" / "nvidia.yaml"
    output.parent.mkdir()
    os.symlink(elsewhere, output)
    Watcher(_options(driver, output), log=[].append).attempt("test")
    assert elsewhere.read_text() == "theirs\n" and not os.path.islink(output)


@pytest.mark.parametrize("problem", ["group-writable", "another-owner", "planted-link"])
def test_an_output_folder_others_can_write_is_refused(driver, run, tmp_path, problem):
    """The folder's owner and mode, as the runtime checks its own folders: one writable by others
    (or owned by another user, or a link planted in a world-writable folder) is not written to;
    the log says why, an error (not retried as "not ready")."""
    output = tmp_path / "cdi" / "nvidia.yaml"
    folder = output.parent
    if problem == "planted-link":
        public = tmp_path / "public"
        public.mkdir()
        os.chmod(public, 0o1777)
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, 1000, 1000)
        os.symlink(theirs, public / "cdi")
        os.lchown(public / "cdi", 1000, 1000)
        output = public / "cdi" / "nvidia.yaml"
        why = f"{public}/cdi is owned by uid 1000"
    else:
        folder.mkdir()
        if problem == "group-writable":
            os.chmod(folder, 0o775)
            why = f"{folder} is writable by group or others (mode 775)"
        else:
            os.chown(folder, 1000, 1000)
            why = f"{folder} is owned by uid 1000"
    log = []
    watcher = Watcher(_options(driver, output), log=log.append)
    with pytest.raises(Failure) as caught:
        watcher.attempt("test")
    assert not caught.value.transient and f"will not write {output}: {why}" in str(caught.value)
    assert not os.path.lexists(output)
    assert watcher.once() == 1 and any("error: will not write" in line for line in log)
