"""Differential testing against Debian's podman 4.3.1 (which bundles CDI library v0.5.2).

See shared/reference/podman-peer.md. Podman reads CDI specs only from ``/etc/cdi`` and
``/var/run/cdi`` (rising priority), so a scenario installs its spec files there while holding a
host-wide lock (other test runs wait), after setting aside whatever was there; everything is put
back afterwards, also after a crash of an earlier run (found by its left-over backup).

For each scenario we capture two OCI configs from podman, through a runtime wrapper that copies
``config.json`` on ``create`` and then execs runc:

* a baseline (same flags, no ``--device``), cached per flag set, and
* the config podman generates with ``--device NAME ...``;

then feed the baseline to ``cdi-shim cdi inject`` with the same devices and spec dirs and compare.

Comparison (podman-peer.md §6): the container ID and the creation-time annotation are replaced;
env is compared as an ordered dict "first position, last value" with podman's own variables
(whose order is Go map order, random per run) sorted; mounts are compared per depth level as
multisets. The documented v0.5.2 differences are NOT normalised away silently: ``fileMode``
values that only we fill in are checked against the host before they are dropped (and reported),
and the other differences have helpers that assert both behaviours.
"""
import contextlib
import errno
import fcntl
import json
import os
import posixpath
import re
import resource
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict

import yaml

from cdi_shim_lab.hosttools import static_busybox

INSTALL_HINT = "apt-get install podman busybox-static runc"
# podman 4.3.1 (CDI v0.5.2) only reads these, in rising priority.
SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
LOCK_PATH = "/run/cdi-shim-podman-test.lock"
BACKUP_SUFFIX = ".cdi-shim-podman-test-backup"
LOCK_TIMEOUT_S = 600
PODMAN_TIMEOUT_S = 120
CREATED_ANNOTATION = "io.kubernetes.cri-o.Created"
HOSTFILE_TEXT = "hello from host file\n"
# What the documented differences look like on podman's side.
PODMAN_CDI_ERROR_PREFIX = "setting up CDI devices: "

# Runtime timings, for the report (what, seconds).
TIMINGS = []


class PeerUnavailable(Exception):
    """A tool the differential test needs is missing (the test must fail, not skip)."""


# --- host tools ---------------------------------------------------------------------------

def find_tools():
    """(podman, runc, static busybox) paths; raises PeerUnavailable naming what is missing."""
    problems = []
    podman = shutil.which("podman")
    if not podman:
        problems.append("podman not found in PATH")
    runc = shutil.which("runc") or next(
        (p for p in ("/usr/sbin/runc", "/usr/bin/runc") if os.access(p, os.X_OK)), None)
    if not runc:
        problems.append("runc not found")
    busybox = static_busybox()
    if not busybox:
        problems.append("no statically linked busybox (/bin/busybox)")
    if os.geteuid() != 0:
        problems.append("must run as root (podman --root, /etc/cdi)")
    if problems:
        raise PeerUnavailable(
            "podman differential test cannot run: " + "; ".join(problems)
            + f". Install the peer with: {INSTALL_HINT}")
    return podman, runc, busybox


def cdi_shim_command():
    """The `cdi-shim` executable of this venv (or PATH)."""
    here = os.path.join(os.path.dirname(sys.executable), "cdi-shim")
    if os.access(here, os.X_OK):
        return here
    found = shutil.which("cdi-shim")
    if not found:
        raise PeerUnavailable("cdi-shim executable not found (pip install -e . in the venv)")
    return found


def _ulimit_flags():
    """nofile/nproc at or below the hard limits: raising them needs CAP_SYS_RESOURCE."""
    def capped(limit, wanted):
        hard = resource.getrlimit(limit)[1]
        return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    nofile = capped(resource.RLIMIT_NOFILE, 20000)
    nproc = capped(resource.RLIMIT_NPROC, 32768)
    return ("--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}")


# --- rootfs -------------------------------------------------------------------------------

BUSYBOX_APPLETS = ("sh", "ls", "cat", "env", "id", "stat", "true", "test")


def build_rootfs(root, busybox):
    """A minimal busybox rootfs at `root` (absolute path); returns it."""
    for sub in ("bin", "dev", "proc", "sys", "etc", "tmp"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    shutil.copy2(busybox, os.path.join(root, "bin", "busybox"))
    # With these present podman never writes its own passwd/group entries into the rootfs, so
    # the first `--user` run produces the same config (HOME=/) as later ones.
    for name, text in (("passwd", "root:x:0:0:root:/:/bin/sh\npeer:x:1000:2000:peer:/:/bin/sh\n"),
                       ("group", "root:x:0:\npeer:x:2000:\n")):
        with open(os.path.join(root, "etc", name), "w") as out:
            out.write(text)
    for applet in BUSYBOX_APPLETS:
        link = os.path.join(root, "bin", applet)
        if not os.path.lexists(link):
            os.symlink("busybox", link)
    return root


# --- /etc/cdi and /var/run/cdi ------------------------------------------------------------

@contextlib.contextmanager
def host_lock(path=LOCK_PATH, timeout=LOCK_TIMEOUT_S):
    """Exclusive fcntl lock shared by every run of these tests on this host."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"another podman peer test held {path} for {timeout}s") from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _empty_dir(path):
    for name in os.listdir(path):
        entry = os.path.join(path, name)
        if os.path.isdir(entry) and not os.path.islink(entry):
            shutil.rmtree(entry)
        else:
            os.unlink(entry)


def _remove(path):
    """Remove a file, link or tree; a busy mount point is only emptied."""
    if not os.path.lexists(path):
        return
    if os.path.islink(path) or not os.path.isdir(path):
        os.unlink(path)
        return
    _empty_dir(path)
    try:
        os.rmdir(path)
    except OSError as err:
        if err.errno not in (errno.EBUSY, errno.EPERM):
            raise


def _restore(path, backup):
    """Put `backup` back at `path`, discarding what the tests left there."""
    _remove(path)
    if not os.path.lexists(path):
        os.rename(backup, path)
        return
    # `path` is a mount point (could not be removed): copy the saved contents back in.
    for name in os.listdir(backup):
        src, dst = os.path.join(backup, name), os.path.join(path, name)
        if os.path.isdir(src) and not os.path.islink(src):
            shutil.copytree(src, dst, symlinks=True)
        else:
            shutil.copy2(src, dst, follow_symlinks=False)
    shutil.rmtree(backup)


def _set_aside(path):
    """Move an existing spec dir out of the way; returns the backup path or None."""
    backup = path + BACKUP_SUFFIX
    if os.path.lexists(backup):
        # Left by a run that died while holding the lock: what is at `path` is its test data.
        _restore(path, backup)
    if not os.path.lexists(path):
        return None
    try:
        os.rename(path, backup)
    except OSError as err:
        if err.errno not in (errno.EBUSY, errno.EXDEV, errno.EPERM):
            raise
        shutil.copytree(path, backup, symlinks=True)  # a mount point: copy, then empty
        _empty_dir(path)
    return backup


@contextlib.contextmanager
def installed_specs(files):
    """Install spec files (absolute path -> text) under the host lock; restore on exit.

    Every path must lie in /etc/cdi or /var/run/cdi (sub-directories allowed). Both dirs are
    empty (or absent when no file goes there) while the block runs.
    """
    for path in files:
        if not any(path.startswith(d + "/") for d in SPEC_DIRS):
            raise ValueError(f"spec file outside {SPEC_DIRS}: {path}")
    with host_lock():
        backups = {}
        try:
            for directory in SPEC_DIRS:
                backups[directory] = _set_aside(directory)
            for path, text in files.items():
                os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
                with open(path, "w") as out:
                    out.write(text)
            yield
        finally:
            for directory in SPEC_DIRS:
                backup = backups.get(directory)
                if backup:
                    _restore(directory, backup)
                else:
                    _remove(directory)


# --- running podman and our side ----------------------------------------------------------

class Run:
    """One process run: argv, rc, stdout, stderr, and the OCI config it produced (or None)."""

    def __init__(self, argv, rc, stdout, stderr, config, seconds):
        self.argv, self.rc, self.stdout, self.stderr = argv, rc, stdout, stderr
        self.config, self.seconds = config, seconds

    def __repr__(self):
        return (f"Run(rc={self.rc}, {self.seconds:.2f}s, argv={' '.join(self.argv)!r},\n"
                f"    stderr={self.stderr[-2000:]!r})")


class PodmanRun(Run):
    @property
    def error(self):
        """podman's `Error: ...` text, without the `setting up CDI devices: ` wrapper."""
        lines = [line for line in self.stderr.splitlines() if line.startswith("Error: ")]
        if not lines:
            return None
        text = lines[-1][len("Error: "):]
        return text[len(PODMAN_CDI_ERROR_PREFIX):] if text.startswith(PODMAN_CDI_ERROR_PREFIX) else text

    def debug_lines(self, needle):
        return [line for line in self.stderr.splitlines() if needle in line]


WRAPPER = r"""#!/bin/sh
# OCI runtime wrapper for podman: on `create`, keep a copy of the bundle's config.json and,
# when the inject script exists (it runs `cdi-shim cdi inject ... CONFIG`), replace the config
# with its output first. Then exec runc.
CAPTURE=%(capture)s
INJECT=%(inject)s
if [ "$1" = create ]; then
  prev=""
  for arg in "$@"; do
    if [ "$prev" = "--bundle" ]; then
      if [ -x "$INJECT" ]; then
        "$INJECT" "$arg/config.json" > "$arg/config.json.cdi" \
          && mv "$arg/config.json.cdi" "$arg/config.json" || exit 1
      fi
      cp "$arg/config.json" "$CAPTURE"
    fi
    prev="$arg"
  done
fi
exec %(runc)s "$@"
"""


def _sh_quote(text):
    return "'" + text.replace("'", "'\\''") + "'"


class PodmanPeer:
    """A private podman store, rootfs and capture wrapper under `workdir`."""

    def __init__(self, workdir):
        self.podman, self.runc, self.busybox = find_tools()
        self.workdir = os.path.abspath(str(workdir))
        self.rootfs = build_rootfs(os.path.join(self.workdir, "rootfs"), self.busybox)
        # podman refuses a runroot longer than 50 characters: keep the store path short.
        self.store = tempfile.mkdtemp(prefix="cdi-shim-podman-", dir="/tmp")
        self.capture = os.path.join(self.workdir, "captured.json")
        self.inject_request = os.path.join(self.workdir, "inject-request")
        self.hostfile = os.path.join(self.workdir, "hostfile.txt")
        self.hostdir = os.path.join(self.workdir, "hostdir")
        with open(self.hostfile, "w") as out:
            out.write(HOSTFILE_TEXT)
        os.makedirs(self.hostdir, exist_ok=True)
        with open(os.path.join(self.hostdir, "inside.txt"), "w") as out:
            out.write("inside host dir\n")
        self.wrapper = os.path.join(self.workdir, "oci-capture.sh")
        with open(self.wrapper, "w") as out:
            out.write(WRAPPER % {"capture": _sh_quote(self.capture), "inject": _sh_quote(self.inject_request),
                                 "runc": _sh_quote(self.runc)})
        os.chmod(self.wrapper, 0o755)
        self.ulimits = _ulimit_flags()
        self._baselines = {}

    # podman --------------------------------------------------------------------------------

    def podman_argv(self, *args, debug=False):
        return [self.podman,
                "--root", os.path.join(self.store, "root"),
                "--runroot", os.path.join(self.store, "run"),
                "--tmpdir", os.path.join(self.store, "tmp"),
                "--storage-driver", "vfs", "--cgroup-manager", "cgroupfs",
                "--events-backend", "file", "--runtime", self.wrapper,
                *(("--log-level", "debug") if debug else ()), *args]

    def run_podman(self, devices=(), flags=(), command=("/bin/true",), debug=False):
        """`podman run --rm` with `--device` for each name; returns a PodmanRun.

        Flags go before `--rootfs PATH` (podman's --rootfs is boolean: what follows is the command).
        """
        argv = self.podman_argv("run", "--rm", "--network", "none", "--hostname", "peer",
                                *self.ulimits, *flags,
                                *[arg for dev in devices for arg in ("--device", dev)],
                                "--rootfs", self.rootfs, *command, debug=debug)
        for leftover in (self.capture,):
            if os.path.exists(leftover):
                os.unlink(leftover)
        started = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=PODMAN_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
        seconds = time.monotonic() - started
        TIMINGS.append(("podman run", seconds))
        config = None
        if os.path.exists(self.capture):
            with open(self.capture) as f:
                config = json.load(f)
            os.unlink(self.capture)
        return PodmanRun(argv, proc.returncode, proc.stdout, proc.stderr, config, seconds)

    def baseline(self, flags=()):
        """podman's config for `flags` without devices (cached per flag tuple)."""
        key = tuple(flags)
        if key not in self._baselines:
            run = self.run_podman(flags=flags)
            if run.rc != 0 or run.config is None:
                raise AssertionError(f"podman baseline run failed: {run!r}")
            self._baselines[key] = run.config
        return json.loads(json.dumps(self._baselines[key]))

    def run_with_our_injection(self, devices, command, spec_dirs=SPEC_DIRS):
        """podman run WITHOUT --device; the wrapper has cdi-shim inject `devices` at create."""
        argv = [cdi_shim_command(), "cdi", "inject", *[a for dev in devices for a in ("--device", dev)],
                *[a for d in spec_dirs for a in ("--spec-dir", d)]]
        with open(self.inject_request, "w") as out:
            out.write("#!/bin/sh\nexec " + " ".join(_sh_quote(a) for a in argv) + ' "$1"\n')
        os.chmod(self.inject_request, 0o755)
        try:
            return self.run_podman(command=command)
        finally:
            os.unlink(self.inject_request)

    def close(self):
        with contextlib.suppress(Exception):
            subprocess.run(self.podman_argv("rm", "--all", "--force"), capture_output=True, timeout=60)
        shutil.rmtree(self.store, ignore_errors=True)

    # our side ----------------------------------------------------------------------------

    def run_ours(self, config, devices, spec_dirs=SPEC_DIRS):
        """`cdi-shim cdi inject` on `config`; returns a Run (config parsed from stdout on rc 0)."""
        path = os.path.join(self.workdir, "ours-input.json")
        text = json.dumps(config, indent=2)
        with open(path, "w") as out:
            out.write(text)
        argv = [cdi_shim_command(), "cdi", "inject",
                *[a for dev in devices for a in ("--device", dev)],
                *[a for d in spec_dirs for a in ("--spec-dir", d)], path]
        started = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        seconds = time.monotonic() - started
        TIMINGS.append(("cdi-shim inject", seconds))
        with open(path) as f:
            if f.read() != text:
                raise AssertionError("cdi-shim cdi inject modified its input file")
        result = None
        if proc.returncode == 0:
            try:
                result = json.loads(proc.stdout)
            except ValueError as err:
                raise AssertionError(f"cdi-shim cdi inject printed no JSON ({err}): {proc.stdout[:500]!r}")
        return Run(argv, proc.returncode, proc.stdout, proc.stderr, result, seconds)

    # one scenario ------------------------------------------------------------------------

    def refresh_log(self):
        """podman's debug report of the spec files its CDI registry rejected (unescaped text).

        Uses a request for a device that no spec defines: podman logs the refresh errors and
        fails right away. (A debug-level run that starts a container is slow: conmon then logs
        to syslog and podman waits 20 s for it.)
        """
        run = self.run_podman(devices=["cdi-shim.test/probe=none"], debug=True)
        lines = run.debug_lines("refreshing the CDI registry")
        return "\n".join(json.loads('"' + line.split('msg="', 1)[1].rsplit('"', 1)[0] + '"')
                         for line in lines)

    def differential(self, files, devices, flags=(), refresh_log=False):
        """Install `files`, run podman with `--device`s and ours on the baseline; a Scenario.

        With refresh_log, the scenario also gets podman's report of rejected spec files.
        """
        baseline = self.baseline(flags)
        with installed_specs(files):
            podman = self.run_podman(devices=devices, flags=flags)
            ours = self.run_ours(baseline, devices)
            log = self.refresh_log() if refresh_log else None
        scenario = Scenario(files, devices, baseline, podman, ours)
        scenario.refresh_log = log
        return scenario


class Scenario:
    def __init__(self, files, devices, baseline, podman, ours):
        self.files, self.devices = files, list(devices)
        self.baseline, self.podman, self.ours = baseline, podman, ours

    def __repr__(self):
        return (f"Scenario(devices={self.devices}, files={sorted(self.files)},\n podman={self.podman!r},\n "
                f"ours={self.ours!r})")


# --- normalisation ------------------------------------------------------------------------

def container_id(config):
    match = re.search(r"libpod-([0-9a-f]{64})", (config.get("linux") or {}).get("cgroupsPath", ""))
    if not match:
        raise AssertionError("no container ID in linux.cgroupsPath")
    return match.group(1)


def mount_depth(destination):
    """Number of `/` in filepath.Clean(destination) (the CDI library's mount sort key)."""
    cleaned = posixpath.normpath(destination) if destination else "."
    if cleaned.startswith("//"):
        cleaned = "/" + cleaned.lstrip("/")
    return cleaned.count("/")


def env_first_position_last_value(env):
    result = OrderedDict()
    for entry in env:
        key, _, value = entry.partition("=")
        result[key] = value  # an existing key keeps its position and takes the new value
    return result


def normalise_env(env, base_keys):
    """Env as "first position, last value", with podman's own variables sorted.

    The base variables (those of the baseline, in Go map order, random per run) must form a
    prefix; a document where they do not is returned with a marker so the comparison fails.
    """
    ordered = env_first_position_last_value(env)
    keys = list(ordered)
    prefix = keys[:len(base_keys)]
    if set(prefix) != set(base_keys):
        return ["!!! baseline variables are not a prefix"] + list(env)
    return [f"{key}={ordered[key]}" for key in sorted(prefix) + keys[len(base_keys):]]


def _canon(value):
    return json.dumps(value, sort_keys=True)


def mounts_by_depth(mounts):
    """Mounts as {depth: sorted multiset}; order inside a depth level is not compared."""
    levels = {}
    for mount in mounts:
        levels.setdefault(mount_depth(mount.get("destination", "")), []).append(mount)
    return {f"depth {depth}": sorted(levels[depth], key=_canon) for depth in sorted(levels)}


def normalise(config, baseline):
    """A copy of `config` comparable across runs (see the module docstring)."""
    text = json.dumps(config).replace(container_id(config), "<ID>")
    doc = json.loads(text)
    (doc.get("annotations") or {}).pop(CREATED_ANNOTATION, None)
    base_keys = list(env_first_position_last_value(baseline["process"].get("env") or ()))
    process = doc.get("process") or {}
    if "env" in process:
        process["env"] = normalise_env(process["env"], base_keys)
    if "mounts" in doc:
        doc["mounts"] = mounts_by_depth(doc["mounts"])
    return doc


def spec_host_paths(files):
    """{container device path: set of host paths} over all device nodes of the given specs."""
    result = {}

    def lower(d):
        return {str(k).lower(): v for k, v in d.items()} if isinstance(d, dict) else {}

    def walk(node):
        if isinstance(node, dict):
            low = lower(node)
            for item in low.get("devicenodes") or ():
                item = lower(item)
                if item.get("path"):
                    result.setdefault(item["path"], set()).add(item.get("hostpath") or item["path"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for text in files.values():
        with contextlib.suppress(yaml.YAMLError):
            walk(yaml.safe_load(text))
    return result


def strip_host_file_modes(ours, podman, host_paths):
    """Documented difference 1: podman (v0.5.2) never fills fileMode from the host; head does.

    For each of our devices with a fileMode where podman's device of the same path has none,
    check it equals the host node's permission bits (lstat of a host path of that device) and
    remove it. Returns {path: fileMode} of what was removed. Mutates `ours`.
    """
    podman_devices = {d.get("path"): d for d in (podman.get("linux") or {}).get("devices") or ()}
    stripped = {}
    for device in (ours.get("linux") or {}).get("devices") or ():
        path = device.get("path")
        peer = podman_devices.get(path)
        if "fileMode" not in device or (peer is not None and "fileMode" in peer):
            continue
        modes = set()
        for host in host_paths.get(path, ()):
            with contextlib.suppress(OSError):
                modes.add(stat.S_IMODE(os.lstat(host).st_mode))
        assert device["fileMode"] in modes, (
            f"our fileMode {device['fileMode']:#o} for {path} is not the host's "
            f"({sorted(oct(m) for m in modes)} from {sorted(host_paths.get(path, ()))})")
        stripped[path] = device.pop("fileMode")
    return stripped


def diff(ours, theirs, where=""):
    """Readable list of differences between two JSON documents."""
    out = []
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for key in list(ours) + [k for k in theirs if k not in ours]:
            sub = f"{where}.{key}" if where else str(key)
            if key not in theirs:
                out.append(f"{sub}: only ours = {json.dumps(ours[key])}")
            elif key not in ours:
                out.append(f"{sub}: only podman = {json.dumps(theirs[key])}")
            else:
                out.extend(diff(ours[key], theirs[key], sub))
    elif isinstance(ours, list) and isinstance(theirs, list) and len(ours) == len(theirs):
        for index, (a, b) in enumerate(zip(ours, theirs)):
            out.extend(diff(a, b, f"{where}[{index}]"))
    elif ours != theirs:
        out.append(f"{where}:\n      ours   = {json.dumps(ours)}\n      podman = {json.dumps(theirs)}")
    return out


# --- assertions -----------------------------------------------------------------------------

def assert_podman_ok(scenario):
    run = scenario.podman
    assert run.rc == 0 and run.config is not None, f"podman failed: {run!r}"


def assert_ours_ok(scenario):
    run = scenario.ours
    assert run.rc == 0 and run.config is not None, f"cdi-shim cdi inject failed: {run!r}"


def podman_sorted_mounts(mounts):
    """What v0.5.2's sort.Sort (depth, then destination) gives."""
    return sorted(mounts, key=lambda m: (mount_depth(m["destination"]), m["destination"]))


def assert_head_mount_order(baseline, ours, cdi_mounts):
    """Documented difference 3, our side: head's stable sort by depth only.

    Without CDI mounts the list is untouched. With them it is non-decreasing in depth and, inside
    a depth level, the surviving baseline mounts keep their baseline order and come first.
    """
    base = baseline.get("mounts") or []
    mine = ours.get("mounts") or []
    if not cdi_mounts:
        assert mine == base, "mounts changed although no CDI mount was requested"
        return
    depths = [mount_depth(m["destination"]) for m in mine]
    assert depths == sorted(depths), f"our mounts are not sorted by depth: {[m['destination'] for m in mine]}"
    base_canon = [_canon(m) for m in base]
    for depth in set(depths):
        level = [_canon(m) for m in mine if mount_depth(m["destination"]) == depth]
        from_base = [m for m in level if m in base_canon]
        assert level[:len(from_base)] == from_base, f"depth {depth}: CDI mounts placed before existing ones"
        assert from_base == [m for m in base_canon if m in from_base], \
            f"depth {depth}: existing mounts reordered (not a stable sort)"


def assert_podman_mount_order(podman, cdi_mounts):
    """Documented difference 3, podman's side: all mounts sorted by depth then destination."""
    mounts = podman.get("mounts") or []
    if cdi_mounts:
        assert mounts == podman_sorted_mounts(mounts), \
            f"podman's mounts not in (depth, destination) order: {[m['destination'] for m in mounts]}"


def compare(scenario, cdi_mounts=None):
    """Assert our config equals podman's up to the documented differences.

    Returns {path: fileMode} of the fileModes only we filled from the host (difference 1).
    `cdi_mounts`: whether the request adds CDI mounts (default: podman's set of mounts differs
    from the baseline's).
    """
    assert_podman_ok(scenario)
    assert_ours_ok(scenario)
    ours = json.loads(json.dumps(scenario.ours.config))
    podman = scenario.podman.config
    stripped = strip_host_file_modes(ours, podman, spec_host_paths(scenario.files))
    if cdi_mounts is None:  # podman's own mount order varies between runs: compare as sets
        def mount_set(config):
            text = json.dumps(config.get("mounts") or []).replace(container_id(config), "<ID>")
            return sorted(_canon(m) for m in json.loads(text))
        cdi_mounts = mount_set(podman) != mount_set(scenario.baseline)
    assert_head_mount_order(scenario.baseline, scenario.ours.config, cdi_mounts)
    assert_podman_mount_order(podman, cdi_mounts)
    differences = diff(normalise(ours, scenario.baseline), normalise(podman, scenario.baseline))
    assert not differences, (
        f"our inject differs from podman for --device {' --device '.join(scenario.devices)}:\n  "
        + "\n  ".join(differences))
    return stripped


def assert_same_failure(scenario, expected=None):
    """Both sides refuse the request; podman's reason appears verbatim in our stderr."""
    podman, ours = scenario.podman, scenario.ours
    assert podman.rc != 0 and podman.config is None, f"podman did not fail: {podman!r}"
    reason = podman.error
    assert reason, f"no `Error:` line from podman: {podman!r}"
    if expected is not None:
        assert reason == expected, f"podman's reason changed: {reason!r} != {expected!r}"
    assert ours.rc != 0, f"cdi-shim cdi inject succeeded where podman failed with {reason!r}"
    assert not ours.stdout.strip(), f"cdi-shim printed a config although it failed: {ours.stdout[:300]!r}"
    assert reason in ours.stderr, f"reasons differ:\n  podman: {reason!r}\n  ours:   {ours.stderr.strip()!r}"
    return reason
