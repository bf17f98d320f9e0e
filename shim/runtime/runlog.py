"""Where the runtime's messages go: stderr, runc's --log file (in runc's format), and the
optional cdi-shim log file (bounded in size).

containerd shows the last error of runc's log file in pod events, so failures are written
there the way runc writes them: with --log-format json one object a line with level, msg and
time; with text, logrus's key=value line.
"""
import os
import sys
import time

from ..fastjson import dumps

MAX_LOG_BYTES = 4 << 20  # the cdi-shim log file is rotated once past this (one old copy kept)


def _timestamp():
    """RFC 3339 with nanoseconds in UTC, as runc's logrus writes it."""
    now = time.time_ns()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now // 1_000_000_000)) + ".%09dZ" % (now % 1_000_000_000)


def format_line(level, message, log_format):
    stamp = _timestamp()
    if log_format == "json":
        return dumps({"level": level, "msg": message, "time": stamp}) + "\n"
    return f"time={dumps(stamp)} level={level} msg={dumps(message)}\n"


def _append(path, line):
    # O_APPEND keeps concurrent writers' lines whole; never follow a planted link.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, line.encode("utf-8", "replace"))
    finally:
        os.close(fd)


def engine_prefix(ppid=None, proc="/proc"):
    """What our messages start with: "cdi-shim: ", except under conmon (podman, CRI-O), whose
    engine puts the runtime's name before what the runtime says ("cdi-shim: cdi-shim: …" else)."""
    try:
        with open(f"{proc}/{ppid or os.getppid()}/comm") as stream:
            parent = stream.read().strip()
    except OSError:
        parent = ""
    return "" if parent == "conmon" else "cdi-shim: "


class RunLog:
    """Errors and warnings go to stderr and the log files; info and debug lines to the log files,
    and debug lines to stderr too with `debug_to_stderr` (runc's --debug: whoever passes it wants
    to see them, --log or not; log-level = "debug" alone keeps them in the files)."""

    def __init__(self, runc_log="", runc_log_format="text", own_log="", debug=False, debug_to_stderr=False,
                 prefix=None):
        self.prefix = prefix   # None: told at the first message (engine_prefix)
        self.runc_log = runc_log
        self.runc_log_format = runc_log_format if runc_log_format in ("json", "text") else "text"
        self.own_log = own_log
        self.debug_enabled = debug or debug_to_stderr
        self.debug_to_stderr = debug_to_stderr
        self.warnings = 0   # how many were said (a create that warned keeps no recipe)

    def _write(self, level, message, to_stderr):
        if self.prefix is None:
            self.prefix = engine_prefix()
        text = self.prefix + message
        if to_stderr:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()
        if self.runc_log:
            try:
                _append(self.runc_log, format_line(level, text, self.runc_log_format))
            except OSError as err:
                sys.stderr.write(f"cdi-shim: cannot write runc log {self.runc_log}: {err.strerror}\n")
        if self.own_log:
            try:
                self._rotate()
                _append(self.own_log, format_line(level, text, "json"))
            except OSError as err:
                sys.stderr.write(f"cdi-shim: cannot write log file {self.own_log}: {err.strerror}\n")

    def _rotate(self):
        try:
            if os.stat(self.own_log).st_size > MAX_LOG_BYTES:
                os.replace(self.own_log, self.own_log + ".1")
        except FileNotFoundError:
            pass

    def error(self, message):
        self._write("error", message, to_stderr=True)

    def warning(self, message):
        self.warnings += 1
        self._write("warning", message, to_stderr=True)

    def info(self, message):
        self._write("info", message, to_stderr=False)

    def debug(self, message):
        if self.debug_enabled:
            self._write("debug", message, to_stderr=self.debug_to_stderr)
