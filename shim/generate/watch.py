"""`cdi-shim cdi generate --watch`: keep the node's spec fresh across driver installs, upgrades
and MIG changes.

Every --interval seconds a cheap poll (no NVML): the loaded module's version (one small read
of /proc/driver/nvidia/version), and the stat of the driver root's /etc/ld.so.cache, of its
libnvidia-ml.so.1 (and the link's target), of /proc/driver/nvidia-caps/mig-minors and of the
spec itself. When that fingerprint changes, and every --nvml-interval seconds anyway (MIG
devices are created and destroyed without any file changing), a spec is generated in a
forked child (a hung or crashing NVML cannot take the watcher down, and every generation loads
the library that is there now) and compared with the spec on disk; it replaces it only if it
differs, and only after:

* readiness: the libraries' version (what the new spec records) is the loaded module's
  version; during an upgrade the module (or the libraries) comes first, and a spec made from
  the other half would be wrong. Until both agree: "waiting" and a retry;
* validation: the text decodes and validates as any CDI reader would, and every mount source
  and device node it names exists.

Failures are retried with back-off (--interval doubling up to --max-backoff); a change of the
fingerprint retries at the next poll. A write that fails (a full or read-only /run: ENOSPC,
EROFS, EACCES) is such a failure. The output folder must be one only root (or we) can write,
as the runtime's own folders (cdi.safeio.private_dir_problem); the spec is read without
following a link at its path or blocking on a FIFO there. The watcher never exits on a failure (so a systemd unit
running it never enters a failed state); it logs one line per event on stderr. A spec that
cannot be validated is an "error:" line each attempt and is never written.

`--once` makes one attempt and exits: 0 written or up to date, 75 (EX_TEMPFAIL) not ready
(NVML failing, the libraries not yet those of the module), 1 the spec does not validate.
"""
import json
import os
import select
import signal
import sys
import time

from ..driver_version import host_driver_version, recorded_driver_version, version_file
from . import GenerateError

NOT_READY = 75
INVALID = 1
CHILD_TIMEOUT = 300.0


class Failure(Exception):
    """A failed attempt: TRANSIENT (wait and retry) or not (the spec does not validate)."""

    def __init__(self, message, transient=True):
        super().__init__(message)
        self.transient = transient


def _stat(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size


def _read(path, limit=65536, follow_links=True):
    """PATH's bytes, or None when it is not a regular file of at most LIMIT bytes (a FIFO
    planted there does not block us: cdi.safeio)."""
    from cdi.safeio import UnsafeFile, read_regular_file

    try:
        return read_regular_file(path, limit, follow_links=follow_links)[0]
    except (OSError, UnsafeFile):
        return None


def generate_in_child(options, timeout=CHILD_TIMEOUT):
    """generate(OPTIONS) in a forked child: {"text", "doc", "warnings", "version", "library",
    "gpus"} or {"error"}."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        status = 0
        try:
            os.close(read_end)
            from .spec import generate

            try:
                result = generate(options)
                payload = {"text": result.text, "doc": result.doc, "warnings": result.warnings,
                           "version": result.nvml.driver_version, "library": result.nvml.library,
                           "gpus": len(result.nvml.gpus), "host_dir": result.host_dir}
            except GenerateError as err:
                payload = {"error": str(err)}
            except Exception as err:  # noqa: BLE001 - said in the parent's log line
                payload = {"error": f"internal error: {type(err).__name__}: {err}"}
            data = json.dumps(payload).encode()
            while data:
                data = data[os.write(write_end, data):]
        except BaseException:  # noqa: BLE001
            status = 1
        finally:
            os._exit(status)
    os.close(write_end)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_end], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return {"error": f"generation did not finish in {timeout:.0f} s (NVML hung?); killed"}
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
    _, status = os.waitpid(pid, 0)
    try:
        return json.loads(b"".join(chunks))
    except ValueError:
        return {"error": f"the generating process died (wait status {status})"}


def validate_text(text, path):
    """Raise Failure(transient=False) unless TEXT is a valid spec whose files all exist."""
    from cdi.errors import CDIError
    from cdi.spec import parse_spec

    try:
        spec = parse_spec(text.encode(), path)
    except CDIError as err:
        raise Failure(f"the generated spec does not validate: {err}", transient=False) from None
    missing = []
    blocks = [spec.edits] + [d.get("containerEdits") or {} for d in spec.devices.values()]
    for edits in blocks:
        for mount in edits.get("mounts") or ():
            missing.append(mount.get("hostPath", ""))
        for node in edits.get("deviceNodes") or ():
            missing.append(node.get("hostPath") or node.get("path", ""))
    missing = [p for p in dict.fromkeys(missing) if p and not os.path.exists(p)]
    if missing:
        raise Failure(f"the generated spec names {len(missing)} path(s) that do not exist, e.g. {missing[0]} "
                      "(the driver changed while it was made?)", transient=False)


class Watcher:
    def __init__(self, options, interval=5.0, nvml_interval=60.0, max_backoff=300.0, log=None,
                 clock=time.monotonic, sleep=time.sleep):
        self.options = options
        self.interval = interval
        self.nvml_interval = nvml_interval
        self.max_backoff = max(max_backoff, interval)
        self.log = log or (lambda line: (sys.stderr.write(line + "\n"), sys.stderr.flush()))
        self.clock, self.sleep = clock, sleep
        self.version_path = version_file(options.proc)
        self.library = None          # the driver root's NVML library, as the last generation found it
        self.failures = 0
        self.last_message = None

    def say(self, text):
        self.log(f"cdi-shim cdi generate --watch: {text}")

    def fingerprint(self):
        """What the cheap poll looks at: {what: its state}."""
        root = self.options.driver_root.rstrip("/")
        parts = {"version": _read(self.version_path), "ld.so.cache": _stat(f"{root}/etc/ld.so.cache"),
                 "mig-minors": _stat(f"{self.options.proc}/driver/nvidia-caps/mig-minors"),
                 "spec": _stat(self.options.output)}
        if self.library:
            link = os.path.join(os.path.dirname(self.library), "libnvidia-ml.so.1")
            parts["nvml"] = (os.path.realpath(link), _stat(link))
        return parts

    def attempt(self, reason):
        """One generation; returns "written", "current", or raises Failure."""
        got = generate_in_child(self.options)
        if "error" in got:
            raise Failure(f"cannot generate: {got['error']}")
        self.library = got["library"]
        host = host_driver_version(self.version_path)
        made_for = recorded_driver_version(got["doc"]) or got["version"]
        if host and host not in (made_for, got["version"]) or made_for != got["version"]:
            raise Failure(f"waiting for the user-space libraries of driver {host or got['version']} (the loaded "
                          f"kernel module): the driver root's NVML ({got['library']}) reports {got['version']}, "
                          f"its files are {made_for}")
        # The spec as it is (a link or a FIFO there is no spec of ours: replaced by the rename).
        old = _read(self.options.output, 64 << 20, follow_links=False)
        if old == got["text"].encode():
            self.collect(got)
            return "current", got
        validate_text(got["text"], self.options.output)
        from cdi.safeio import private_dir_problem

        from .spec import Result, write

        # As the runtime's own folders: one that others can write to is not ours to fill.
        problem = private_dir_problem(os.path.dirname(os.path.abspath(self.options.output)), must_exist=False)
        if problem:
            raise Failure(f"will not write {self.options.output}: {problem}", transient=False)
        try:
            write(Result(got["doc"], got["text"], self.options.output, got["warnings"], None, {}))
        except OSError as err:   # ENOSPC, EROFS, EACCES...: retried with back-off, never fatal
            raise Failure(f"cannot write {self.options.output}: {err.strerror or err}") from None
        except GenerateError as err:     # a link on the way that root must not follow
            raise Failure(str(err), transient=False) from None
        for warning in got["warnings"]:
            self.say(f"warning: {warning}")
        self.collect(got)
        was = recorded_driver_version(_doc_of(old)) if old else None
        if was and was != made_for:
            change = f"driver {was} -> {made_for}"
        else:
            change = f"{'new spec' if old is None else 'devices changed'}; driver {made_for}"
        self.say(f"wrote {self.options.output} ({change}, {got['gpus']} GPU(s), "
                 f"{len(got['doc']['devices'])} devices; {reason})")
        return "written", got

    def collect(self, got):
        """The one-mount layout: remove the host directories no spec names and no container uses."""
        if not got.get("host_dir"):
            return
        from .spec import collect_host_dirs

        try:
            removed = collect_host_dirs(got["host_dir"], os.path.dirname(os.path.abspath(self.options.output)))
        except OSError as err:
            self.say(f"warning: cannot collect old host directories beside {got['host_dir']}: {err}")
            return
        if removed:
            self.say(f"removed unused host directories {', '.join(removed)} beside {got['host_dir']}")

    def once(self):
        try:
            self.attempt("--once")
        except Failure as err:
            self.say(("" if err.transient else "error: ") + str(err))
            return NOT_READY if err.transient else INVALID
        return 0

    def run(self, stop=lambda: False):
        now = self.clock()
        next_try, next_nvml, reason = now, now + self.nvml_interval, "start"
        seen = self.fingerprint()
        first = True
        while not stop():
            now = self.clock()
            current = self.fingerprint()
            if current != seen:
                seen = current
                reason = "driver files changed"
                next_try = min(next_try, now)
            if now >= next_nvml:
                next_nvml = now + self.nvml_interval
                if next_try > now and not self.failures:
                    next_try, reason = now, "periodic NVML check"
            if now >= next_try:
                try:
                    outcome, got = self.attempt(reason)
                except Failure as err:
                    self.failures += 1
                    delay = min(self.max_backoff, self.interval * 2 ** min(self.failures, 16))
                    message = ("" if err.transient else "error: ") + str(err)
                    if message == self.last_message:     # the whole text once; then a short line
                        message = f"{message[:60]}... again ({self.failures} attempts)"
                    else:
                        self.last_message = message
                    self.say(f"{message}; retry in {delay:.3g} s")
                    next_try = self.clock() + delay
                else:
                    if self.failures or first:
                        if outcome == "current":
                            self.say(f"{self.options.output} is up to date (driver "
                                     f"{recorded_driver_version(got['doc']) or got['version']})")
                    self.failures, first, self.last_message = 0, False, None
                    next_try = float("inf")
                    next_nvml = self.clock() + self.nvml_interval
                # What changed during the attempt may not be in the spec it made: only our own
                # write (the spec) and what the attempt first learnt (NVML's path) are taken as seen.
                after = self.fingerprint()
                seen = dict(after, **{k: v for k, v in current.items() if k != "spec"})
                reason = "retry"
            self.sleep(max(0.0, min(self.interval, next_try - self.clock(), next_nvml - self.clock())))


def _doc_of(data):
    try:
        from cdi.decode import decode_spec

        return decode_spec(data)
    except Exception:  # noqa: BLE001 - an unreadable old spec is replaced all the same
        return {}
