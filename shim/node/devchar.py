"""/dev/char/MAJOR:MINOR links for the device nodes of the node's CDI specs (issue 30, item 3).

With the systemd cgroup driver, runc hands systemd the container's device rules as
DeviceAllow=/dev/char/MAJOR:MINOR, leaving out a path that does not exist (and has no /sys/dev
entry), while writing every rule into the cgroup itself. When systemd applies the scope's
properties again (a `systemctl daemon-reload`), a device without its link is dropped from the
running container: "Failed to initialize NVML: Unknown Error" some time after start. So the
link must be there when the container is created. udev makes these links for the devices it
knows; nvidia-modprobe makes /dev/nvidia* outside udev, so they have none (the toolkit's
`nvidia-ctk system create-dev-char-symlinks`).

Links are written as udev writes them: relative to /dev/char (`../nvidia0`). Every path is
resolved inside the node root (shim/inroot.py): a link planted there never leads out of it.
"""
import os
import posixpath
import stat

DEV_CHAR = "/dev/char"
UDEV_RULE = "/etc/udev/rules.d/71-cdi-shim-dev-char.rules"

# nvidia.ko registers no class devices (no uevent per node): the driver's bind and the modules'
# load are the events there are. The modules' uevent comes after their init (Linux >= 4.15).
UDEV_RULE_TEXT = """\
# Written by `cdi-shim install --node` (rerunning it rewrites this file).
# /dev/char/MAJOR:MINOR links for the NVIDIA device nodes, which nvidia-modprobe makes outside
# udev: without them, with the systemd cgroup driver, a `systemctl daemon-reload` drops the
# devices from running containers ("Failed to initialize NVML: Unknown Error").
ACTION=="add", DEVPATH=="/bus/pci/drivers/nvidia", RUN+="@CDI_SHIM@ install --node --dev-char-only"
ACTION=="add", SUBSYSTEM=="module", KERNEL=="nvidia|nvidia_uvm|nvidia_modeset", RUN+="@CDI_SHIM@ install --node --dev-char-only"
"""  # noqa: E501 (udev rules are one line each)


def rule_text(cdi_shim):
    return UDEV_RULE_TEXT.replace("@CDI_SHIM@", cdi_shim)


def link_name(rdev):
    """The /dev/char entry of a character device numbered RDEV."""
    return f"{DEV_CHAR}/{os.major(rdev)}:{os.minor(rdev)}"


def link_text(node_path):
    """The link's text for the device node at NODE_PATH, as udev writes it: ../nvidia0."""
    return posixpath.relpath(node_path, DEV_CHAR)


def spec_device_nodes(specs):
    """The host paths of every device node SPECS name, once each, in order."""
    from cdi.host_files import DEVICE_NODE, host_files

    paths = []
    for spec in specs:
        for edits in [spec.edits] + [(d.get("containerEdits") or {}) for d in spec.devices.values()]:
            for what, path, _ in host_files(edits):
                if what == DEVICE_NODE and path not in paths:
                    paths.append(path)
    return paths


def load_node_specs(installer, spec_dirs):
    """(specs, problems) of SPEC_DIRS in the node root, every path resolved inside it."""
    from cdi.errors import SpecError
    from cdi.safeio import UnsafeFile, read_config_file
    from cdi.spec import MAX_SPEC_BYTES, parse_spec
    from cdi.spec_dirs import is_spec_file_name

    specs, problems = [], []
    for priority, directory in enumerate(spec_dirs):
        try:
            names = sorted(os.listdir(installer.path(directory)))
        except OSError:
            continue  # a spec dir that is not there holds no spec
        for name in filter(is_spec_file_name, names):
            try:
                path = installer.path(posixpath.join(directory, name))
                data = read_config_file(path, MAX_SPEC_BYTES, follow_links=False)
                if data is not None:
                    specs.append(parse_spec(data, path, priority))
            except (OSError, UnsafeFile, SpecError) as err:
                problems.append(f"warning: {posixpath.join(directory, name)} left out: {err}")
    return specs, problems


def make_links(installer, specs):
    """Link every device node of SPECS that exists in the node root. Returns (made, notes)."""
    tree = installer.tree()
    made, notes, kept = [], [], 0
    for path in spec_device_nodes(specs):
        found = tree.lookup(path)
        if found is None or not stat.S_ISCHR(found[1].st_mode):
            why = next((w for w in tree.warnings if w.startswith(tree.host(path) + " ")), None)
            notes.append(f"warning: {why}" if why else
                         f"{tree.host(path)} is not a character device here: no link (the udev rule makes it "
                         "when the driver makes the node)")
            continue
        node, info = found
        name, text = link_name(info.st_rdev), link_text(node)
        current = tree.readlink(name)
        if current == text:
            kept += 1
            continue
        there = tree.lookup(name) if current is not None else None
        if there and stat.S_ISCHR(there[1].st_mode) and there[1].st_rdev == info.st_rdev:
            kept += 1  # another writer's link (nvidia-ctk's absolute one) that leads to this node
            continue
        host = installer.entry(name)
        if current is None and os.path.lexists(host):
            notes.append(f"warning: {host} exists and is not a link: left as it is; remove it and rerun")
            continue
        temp = os.path.join(os.path.dirname(host), f".{os.path.basename(host)}.cdi-shim")
        if os.path.lexists(temp):
            os.unlink(temp)
        os.symlink(text, temp)
        os.replace(temp, host)  # a wrong link is replaced whole: never a moment without one
        made.append(f"{host} -> {text}" + (f" (was -> {current})" if current is not None else ""))
    return made, notes, kept
