"""One systemd unit of an install (the resident process, the spec refresh, the NRI plugin):
written where its text differs, enabled and started, restarted when its text changed."""
import os

UNIT_DIR = "/etc/systemd/system"


def install_unit(installer, step, name, wanted):
    """Unit NAME with text WANTED in /etc/systemd/system: written when it differs, enabled and
    started (systemctl where the installer may run it, else the WantedBy link `systemctl enable`
    makes, and a note), restarted when its text changed. A Step named STEP."""
    from .install import Step, _loose_mode, _write

    path = installer.path(os.path.join(UNIT_DIR, name))
    try:
        with open(path) as stream:
            written = stream.read() != wanted
    except FileNotFoundError:
        written = True
    changed, done, notes = written, [], _loose_mode(path, kept=not written)
    if written:
        path = installer.target(os.path.join(UNIT_DIR, name))
        _write(path, wanted)
        done.append(f"wrote {path}")
    if installer.systemctl is None:
        link = installer.entry(os.path.join(UNIT_DIR, "multi-user.target.wants", name))
        target = os.path.join(UNIT_DIR, name)
        if not (os.path.islink(link) and os.readlink(link) == target):
            if os.path.lexists(link):
                os.unlink(link)
            os.symlink(target, link)
            changed = True
            done.append(f"enabled it ({link})")
        notes.append(f"systemctl not run ({installer.no_systemctl}): on the node, `systemctl daemon-reload && "
                     f"systemctl enable --now {name}` (its next boot starts it)")
    else:
        run = installer._systemctl
        if written:
            run("daemon-reload")
        if run("is-enabled", "--quiet", name, check=False) != 0:
            run("enable", name)
            changed = True
            done.append("enabled it")
        if run("is-active", "--quiet", name, check=False) != 0:
            run("start", name)
            changed = True
            done.append("started it")
        elif written:
            run("restart", name)
            done.append("restarted it (its unit changed)")
    message = "; ".join(done) if done else f"{path} as configured" + (
        ", enabled and running" if installer.systemctl else ", enabled")
    return Step(step, changed, message, notes=notes)
