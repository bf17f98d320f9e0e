"""The installed containerd and the host's init: which version, what it makes of a config file
(`containerd --config PATH config dump`), and restarting it."""
import os
import re
import shutil
import subprocess

DUMP_TIMEOUT = 30


class ContainerdConfigError(Exception):
    """A problem that stops the edit; the message is one line for the user."""


def containerd_version(binary="containerd"):
    """The installed containerd's (major, minor, text), or None when it is not installed."""
    path = containerd_path(binary)
    if not path:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=DUMP_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = out.stdout.strip()
    # "containerd github.com/containerd/containerd 1.6.20~ds1 ..." or ".../containerd/v2 v2.0.0 ..."
    for word in text.split()[2:3] or text.split():
        match = re.match(r"^v?(\d+)\.(\d+)", word)
        if match:
            return int(match.group(1)), int(match.group(2)), text
    return None


def containerd_path(binary):
    """The containerd executable to ask, or None (binary None: act as if none were installed)."""
    if not binary:
        return None
    if "/" in binary:
        return binary if os.access(binary, os.X_OK) else None
    return shutil.which(binary)


def pid1_init():
    """(is_systemd, name) of the host's init process."""
    try:
        with open("/proc/1/comm") as stream:
            name = stream.read().strip()
    except OSError:
        name = "unknown"
    return name == "systemd", name


def containerd_dump(main_path, containerd="containerd"):
    """`containerd --config PATH config dump`: (ok, text or error); ok is None without containerd."""
    path = containerd_path(containerd)
    if not path:
        return None, "containerd is not installed"
    try:
        out = subprocess.run([path, "--config", main_path, "config", "dump"], capture_output=True, text=True,
                             timeout=DUMP_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as err:
        return False, str(err)
    if out.returncode != 0:
        lines = [line for line in (out.stderr or out.stdout).strip().splitlines() if line.strip()]
        return False, lines[-1] if lines else f"exit status {out.returncode}"
    return True, out.stdout


# doctor's fix and configure's refusal for a file older than the installed containerd writes
MIGRATE_BY_HAND = "`containerd config migrate > NEW` and install NEW as the config"


def containerd_migrate(path, containerd="containerd"):
    """The text of `containerd --config PATH config migrate` (containerd 2.x): the file in the
    newest version that containerd writes, imported files' settings folded in."""
    binary = containerd_path(containerd)
    if not binary:
        raise ContainerdConfigError("containerd is not installed: --migrate runs its `config migrate`")
    try:
        out = subprocess.run([binary, "--config", path, "config", "migrate"], capture_output=True, text=True,
                             timeout=DUMP_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ContainerdConfigError(f"`{binary} --config {path} config migrate` failed: {err}") from None
    if out.returncode != 0:
        lines = [line for line in (out.stderr or out.stdout).strip().splitlines() if line.strip()]
        raise ContainerdConfigError(f"`{binary} --config {path} config migrate` failed: "
                                    f"{lines[-1] if lines else f'exit status {out.returncode}'}; nothing was changed")
    return out.stdout


def restart_unit(unit, daemon, error=None, timeout=120):
    """`systemctl restart UNIT` (DAEMON is what it runs, for messages); returns a message, raises
    ERROR (default ContainerdConfigError) when this host cannot."""
    error = error or ContainerdConfigError
    systemd, init = pid1_init()
    if not systemd:
        raise error(f'cannot restart {daemon}: PID 1 is "{init}", not systemd; restart it the way it was started')
    out = subprocess.run(["systemctl", "restart", unit], capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise error(f"systemctl restart {unit} failed: {out.stderr.strip()}")
    return f"restarted {daemon} (systemctl restart {unit})"


def restart_containerd():
    """Restart containerd through systemd; returns a message, raises when this host cannot."""
    return restart_unit("containerd", "containerd")
