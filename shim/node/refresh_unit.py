"""`cdi-shim install --node`'s spec refresh: `cdi generate --watch` as a systemd unit of this
install (cdi-shim-generate.service, shipped in shim/node/units/), written, enabled and started,
unless the install is told not to (--no-spec-refresh).

The toolkit's counterpart is nvidia-cdi-refresh (a .path unit on the driver's files and a
oneshot `nvidia-ctk cdi generate`): procfs has no inotify and MIG changes touch no file, so
the watcher polls instead (contrib/cdi-shim-generate.service says why). Its ExecStart names the
install's cdi-shim by its stable path (the node prefix's `current`), and the generate options
the install itself was given: --driver-root and --dev-root where named, --layout one-mount.
The unit is restarted when its text changed, so a new release's watcher takes over.
"""
import os

from .systemd_unit import UNIT_DIR, install_unit
from .units import render

REFRESH_UNIT = "cdi-shim-generate.service"


def refresh_args(installer):
    """The generate options of the node: the roots the install was given (not its defaults, which
    are --root's tree, a path of this machine) and the layout."""
    args = []
    for option, value in (("--driver-root", installer.given_driver_root), ("--dev-root", installer.given_dev_root)):
        if value:
            args += [option, os.path.abspath(value)]
    if installer.layout != "files":
        args += ["--layout", installer.layout]
    return args


def refresh_unit(installer):
    """The install step (installer: shim/node/install.py's Installer)."""
    from .install import InstallError, Step

    path = installer.path(os.path.join(UNIT_DIR, REFRESH_UNIT))
    if not installer.spec_refresh:
        kept = " (an earlier install's unit is left as it is: `systemctl disable --now cdi-shim-generate` " \
               "stops it)" if os.path.lexists(path) else ""
        return Step("spec-refresh", False, f"not installed (--no-spec-refresh){kept}")
    if not installer.cdi_shim:
        raise InstallError("cdi-shim is not installed beside this interpreter: name it with --cdi-shim-binary")
    return install_unit(installer, "spec-refresh", REFRESH_UNIT,
                        render(REFRESH_UNIT, installer.cdi_shim, refresh_args(installer)))
