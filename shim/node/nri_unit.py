"""`cdi-shim install --node --nri`: the NRI plugin's systemd unit (docs/nri.md) in place of the
runtime handler's steps.

With --nri the install leaves containerd's config alone (no runtime entry, no restart) and
installs no resident process (the runtime handler's): it writes cdi-shim-nri.service, whose
ExecStart is this install's cdi-shim (the prefix's stable path), enables and starts it, and
restarts it when its text changed. The plugin reconnects by itself whenever containerd
restarts, and systemd restarts it if it fails (Restart=always): containerd is never restarted
for it. containerd 1.7 ships with NRI off: when the installed containerd says its config has it
off, a note gives the lines that turn it on (a change of containerd's config is the admin's,
with the one restart it needs).
"""
import os
import subprocess

NRI_UNIT_NAME = "cdi-shim-nri.service"
NRI_PLUGIN = "io.containerd.nri.v1.nri"

NRI_UNIT_TEXT = """\
# The NRI plugin of cdi-shim (docs/nri.md): CDI devices for pods on containerd's own runc, from
# their annotations, with no RuntimeClass and no containerd config edit. It reconnects by itself
# when containerd restarts; systemd restarts it if it fails.
# Install: `cdi-shim install --node --nri` (or adjust ExecStart to where cdi-shim is installed,
# copy to /etc/systemd/system/, then systemctl daemon-reload && systemctl enable --now cdi-shim-nri)
[Unit]
Description=cdi-shim NRI plugin (CDI devices for containerd pods through NRI)
After=containerd.service

[Service]
ExecStart=@CDI_SHIM@ nri
Restart=always
RestartSec=1

[Install]
WantedBy=multi-user.target
"""

NRI_ON = f"""[plugins."{NRI_PLUGIN}"] disable = false"""


def nri_unit_text(cdi_shim):
    """The NRI plugin's unit, running CDI_SHIM (contrib/cdi-shim-nri.service is this with
    units.NODE_CDI_SHIM, the node prefix's)."""
    return NRI_UNIT_TEXT.replace("@CDI_SHIM@", cdi_shim)


def nri_unit(installer):
    """The install step: the unit written, enabled and running (installer: shim/node/install.py)."""
    from .install import InstallError
    from .systemd_unit import install_unit

    if not installer.cdi_shim:
        raise InstallError("cdi-shim is not installed beside this interpreter: name it with --cdi-shim-binary")
    step = install_unit(installer, "nri", NRI_UNIT_NAME, nri_unit_text(installer.cdi_shim))
    step.notes += nri_off_notes(installer)
    return step


def nri_off_notes(installer):
    """A note when the installed containerd reads NRI as off from the node's config (1.7's
    default); nothing when it cannot tell (no containerd, no config, a config it refuses)."""
    from .containerd import ContainerdConfigError
    from .containerd_toml import parse_toml
    from .install import CONTAINERD_CONFIG

    try:
        config = installer.path(CONTAINERD_CONFIG)
    except Exception:           # noqa: BLE001 -- an unsafe path is the containerd step's to report
        return []
    command = [installer.containerd] + (["--config", config] if os.path.exists(config) else []) + ["config", "dump"]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=60)
        dump = parse_toml("containerd config dump", out.stdout) if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ContainerdConfigError):
        return []
    section = ((dump or {}).get("plugins") or {}).get(NRI_PLUGIN)
    if section is None or not section.get("disable"):
        return []
    socket = section.get("socket_path") or "/var/run/nri/nri.sock"
    return [f"warning: NRI is off in containerd's config ({CONTAINERD_CONFIG}; containerd 1.7's default): the "
            f"plugin waits for {socket} until it is on: add `{NRI_ON}` and restart containerd once"]
