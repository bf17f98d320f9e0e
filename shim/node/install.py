"""`cdi-shim install --node`: everything a GPU node needs, idempotently, as one step a node's
boot (a DaemonSet, cloud-init user data) can rerun.

A hand fix on one node is a diagnosis, not a deployment: managed node groups regenerate
containerd's config.toml when a node boots, and a replaced node has none of it. So the install
is a command that changes nothing when run again, and is run again at each node start.

The steps, each returning a `Step` that says what it changed:

1. `cdi_shim_config`: /etc/cdi-shim/config.toml with the defaults, when it is missing (an
   existing file is the admin's, kept as it is); on a Kubernetes node (shim/node/kubernetes.py)
   with `accept-env-unprivileged = false`: the device plugin, not the image, picks the GPUs.
2. `register_runtime`: the runtime entry in containerd's config through `runtime configure`'s
   own plan (the lock, the check by `containerd config dump`, the atomic rename); with
   `drop_in`, in /etc/containerd/conf.d/99-cdi-shim.toml imported by the main file. On k3s and
   rke2, whose config.toml is rendered from a template at every start, the template
   (`config.toml.tmpl`, or `config-v3.toml.tmpl` for their containerd 2.x), extending the
   distribution's base template (`{{ template "base" . }}`); a template someone else wrote is
   refused with the lines to add to it.
3. `resident_unit`: the resident process's systemd unit (contrib/cdi-shim-resident.service,
   ExecStart naming this cdi-shim), enabled and started.
2b. `register_docker`, where the node has dockerd or a daemon.json: runtimes.cdi-shim through
   `runtime configure --runtime=docker`'s plan (CDI on from Docker 25), and a link to cdi-shim's
   nvidia-container-runtime-hook in /usr/local/bin when no program of that name is on PATH (what
   makes dockerd offer --gpus).
2c. `register_podman`, where the node has podman or /etc/containers/containers.conf: [engine.runtimes]
   cdi-shim through `runtime configure --runtime=podman`'s plan (podman injects --device itself and
   reads the file at each run: nothing to restart).
4. `cdi_spec`: /var/run/cdi/nvidia.yaml from NVML when a GPU is present (/dev/nvidiactl).
4b. the spec refresh (shim/node/refresh_unit.py): `cdi generate --watch` as cdi-shim-generate.service,
   enabled and started, unless told not to (--no-spec-refresh).
5. `dev_char`: /dev/char/MAJOR:MINOR links for the specs' device nodes and the udev rule that
   makes them for nodes made later (shim/node/devchar.py: why the systemd cgroup driver needs them).

Every path is resolved inside ROOT (a node image's tree, the tests) by the in-root walk of
shim/inroot.py: an absolute link in the tree means the tree's own file, never the host's. Files
root's programs read as config or execute are written 0644 (a rewritten file that was group- or
world-writable too, and its backup); one found so is a warning. A step that fails is one line
naming the file; every file is replaced whole (a temp file renamed) or not at all. systemctl is run only when
ROOT is / and PID 1 is systemd, or when a systemctl command is given (a DaemonSet entering the
host's namespaces); otherwise the unit is enabled the way `systemctl enable` does it offline (the
WantedBy link) and the rest is a note. containerd is restarted only when asked and only when its
configuration changed.
"""
import os
import shlex
import shutil
import subprocess

from .containerd import ContainerdConfigError, pid1_init
from .containerd_toml import CRI_PLUGIN, RUNC_V2, file_version, parse_toml, read_text

CDI_SHIM_CONFIG = "/etc/cdi-shim/config.toml"
CONTAINERD_CONFIG = "/etc/containerd/config.toml"
CONTAINERD_DROP_IN_DIR = "/etc/containerd/conf.d"
UNIT_NAME = "cdi-shim-resident.service"
UNIT_DIR = "/etc/systemd/system"
SPEC_PATH = "/var/run/cdi/nvidia.yaml"
# where dockerd and podman are looked for (dockerd's PATH)
DOCKER_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
# k3s and rke2 render config.toml from these at every start (the base template since Sept. 2023
# releases: v1.24.17+k3s1, v1.25.13+k3s1, v1.26.8+k3s1, v1.27.5+k3s1, v1.28.1+k3s1 and later)
DISTRIBUTIONS = (
    ("k3s", "/var/lib/rancher/k3s/agent/etc/containerd", ("k3s", "k3s-agent")),
    ("rke2", "/var/lib/rancher/rke2/agent/etc/containerd", ("rke2-server", "rke2-agent")),
)
TEMPLATE_FOR = {2: "config.toml.tmpl", 3: "config-v3.toml.tmpl"}
TEMPLATE_MARKER = "# Written by `cdi-shim install --node`"
# k3s and rke2 add their own "nvidia" runtime when they find one of these on the node
TOOLKIT_RUNTIMES = ("/usr/bin/nvidia-container-runtime", "/usr/local/nvidia/toolkit/nvidia-container-runtime",
                    "/usr/local/bin/nvidia-container-runtime")

KUBERNETES_WHY = """\
# A Kubernetes node (install --node found its kubelet): the device plugin allocates the GPUs and
# passes them as CDI annotations, the CRI CDI field or volume mounts, so an unprivileged
# container's own NVIDIA_VISIBLE_DEVICES (set by its image) requests nothing:
# accept-env-unprivileged = false.
"""

UNIT_TEXT = """\
# The resident process of cdi-shim-runtime: a create that requests devices is prepared by one of
# its long-lived worker processes (2, pre-forked and already warm; --workers N), not by a fresh
# interpreter: a create pays no interpreter start (the figures are in docs/fast.md).
# Optional: without it cdi-shim-runtime does the same work itself, only slower.
# Install: `cdi-shim install --node` (or adjust ExecStart to where cdi-shim is installed, copy to
# /etc/systemd/system/, then systemctl daemon-reload && systemctl enable --now cdi-shim-resident)
[Unit]
Description=cdi-shim resident process (prepares CDI devices for cdi-shim-runtime)
Before=containerd.service

[Service]
ExecStart=@CDI_SHIM@ runtime serve
Restart=always
RestartSec=1
# The socket lives in /run/cdi-shim (mode 0700); the work needs root as runc does.
RuntimeDirectory=cdi-shim
RuntimeDirectoryMode=0700
RuntimeDirectoryPreserve=yes

[Install]
WantedBy=multi-user.target
"""


class InstallError(Exception):
    """A step cannot be done; the message is one line for the user and says what to do."""


def unit_text(cdi_shim):
    """The resident unit, running CDI_SHIM (contrib/cdi-shim-resident.service is this with
    units.NODE_CDI_SHIM, the node prefix's)."""
    return UNIT_TEXT.replace("@CDI_SHIM@", cdi_shim)


class Step:
    """What one step did: changed or not, what it says, whether containerd must reload its config."""

    def __init__(self, name, changed, message, restart=None, notes=()):
        self.name, self.changed, self.message = name, changed, message
        self.restart = restart  # the services to restart for it to apply, or None
        self.notes = list(notes)

    def __repr__(self):
        return f"Step({self.name}, changed={self.changed}, {self.message!r})"


class Installer:
    """The node's facts and the options; each step a method."""

    def __init__(self, root="/", drop_in=False, runtime_name="nvidia", runtime_binary=None, cdi_shim=None,
                 containerd="containerd", systemctl=None, driver_root=None, dev_root=None, hook_program=None,
                 layout="files", spec_refresh=True):
        self.root = os.path.abspath(root)
        self.drop_in = drop_in
        self.runtime_name = runtime_name
        self.runtime_binary = runtime_binary
        self.cdi_shim = cdi_shim or _beside_interpreter("cdi-shim")
        self.containerd = containerd
        systemd, init = pid1_init()
        if systemctl:
            self.systemctl, self.no_systemctl = shlex.split(systemctl), None
        elif self.root != "/":
            self.systemctl, self.no_systemctl = None, f"the root is {self.root}, not /"
        elif not systemd:
            self.systemctl, self.no_systemctl = None, f'PID 1 is "{init}", not systemd'
        else:
            self.systemctl, self.no_systemctl = ["systemctl"], None
        self.given_driver_root, self.given_dev_root = driver_root, dev_root   # (the refresh unit's options)
        self.spec_refresh = spec_refresh   # 4b: cdi generate --watch as a unit (shim/node/refresh_unit.py)
        self.driver_root = driver_root or self.root  # as `cdi generate`: the dev root defaults to it
        self.dev_root = dev_root or self.driver_root
        self.hook_program = hook_program
        self.layout = layout            # the spec's layout (shim/generate/hostdir.py, docs/one-mount.md)
        self._tree = None

    # --- paths ---------------------------------------------------------------------------------

    def tree(self):
        if self._tree is None:
            from ..inroot import Tree, TreeError

            try:
                self._tree = Tree(self.root, "node root")
            except TreeError as err:
                raise InstallError(str(err)) from None
        return self._tree

    def trusted(self, node_path, follow_last=True):
        """NODE_PATH checked before anything is read or written there: each link on it (in ROOT)
        one root may follow (cdi.safeio.resolve_trusted: owned by root or us, in folders nobody
        else can write); InstallError naming the link and its owner otherwise."""
        from cdi.safeio import UnsafePath, resolve_trusted

        try:
            resolve_trusted(node_path, root=self.root, follow_last=follow_last)
        except UnsafePath as err:
            raise InstallError(f"{node_path}: {err}") from None

    def path(self, node_path):
        """The host path to read NODE_PATH at: resolved inside ROOT (nothing made)."""
        self.trusted(node_path)
        if self.root == "/":
            return node_path
        return self.tree().locate(node_path)

    def target(self, node_path):
        """The host path to write NODE_PATH at: its folders resolved, and made, inside ROOT."""
        self.trusted(node_path)
        if self.root == "/":
            os.makedirs(os.path.dirname(node_path), mode=0o755, exist_ok=True)
            return node_path
        return self.tree().writable_path(node_path)

    def entry(self, node_path):
        """The host path of the entry NODE_PATH itself (a link there stays a link), its folders
        made inside ROOT."""
        self.trusted(node_path, follow_last=False)
        if self.root == "/":
            os.makedirs(os.path.dirname(node_path), mode=0o755, exist_ok=True)
            return node_path
        return self.tree().entry_path(node_path)

    # --- 1. cdi-shim's config --------------------------------------------------------------------

    def cdi_shim_config(self):
        from ..config import Config, default_config_text
        from .kubernetes import PLUGIN_STRATEGIES, kubernetes_marker, other_ways

        path = self.path(CDI_SHIM_CONFIG)
        marker = kubernetes_marker(lambda p: os.path.lexists(self.path(p)))
        ways = other_ways(Config())  # the defaults this file starts with
        if os.path.lexists(path):
            settings = self.settings()
            notes = [f"warning: a Kubernetes node ({marker}) and accept-env-unprivileged is true in {path}: an image "
                     "can pick GPUs past the device plugin; set it to false (`cdi-shim doctor` says so too)"] \
                if marker and settings.accept_env_unprivileged and settings.device_env else []
            return Step("config", False, f"{path} exists (kept as it is)",
                        notes=notes + list(_loose_mode(path, kept=True)))
        path = self.target(CDI_SHIM_CONFIG)
        if marker and ways:
            # the image must not pick GPUs past the device plugin, which has other ways in
            _write(path, default_config_text({"accept-env-unprivileged": False}, why=KUBERNETES_WHY))
            return Step("config", True, f"wrote {path} (the defaults; a Kubernetes node, {marker}: "
                        "accept-env-unprivileged = false)",
                        notes=[f"env requests ({Config().device_env}) of unprivileged containers are ignored; the "
                               f"device plugin's devices reach containers by {', '.join(ways)}: use its "
                               f"{PLUGIN_STRATEGIES}, not envvar"])
        _write(path, default_config_text())
        return Step("config", True, f"wrote {path} (the defaults)")

    def settings(self):
        from ..config import ConfigError, load_config

        try:
            return load_config(self.path(CDI_SHIM_CONFIG))
        except ConfigError as err:
            raise InstallError(str(err)) from None

    # --- 2. containerd ----------------------------------------------------------------------------

    def distribution(self):
        """(name, containerd dir, services) of k3s / rke2 when ROOT is such a node, else None."""
        for name, directory, services in DISTRIBUTIONS:
            if os.path.isdir(self.path(directory)):
                return name, directory, services
        return None

    def register_runtime(self):
        distribution = self.distribution()
        if distribution:
            return self._register_in_template(*distribution)
        return self._register_in_containerd()

    def _binary(self):
        from .containerd_config import runtime_binary

        try:
            return runtime_binary(self.runtime_binary, root=self.root)
        except ContainerdConfigError as err:
            raise InstallError(str(err)) from None

    def _register_in_containerd(self):
        from . import containerd_config as cc

        config = self.path(CONTAINERD_CONFIG)
        drop_in = self.path(CONTAINERD_DROP_IN_DIR) if self.drop_in else None
        # relative to the main file: right on the node and in a tree mounted elsewhere
        import_as = os.path.join(os.path.relpath(CONTAINERD_DROP_IN_DIR, os.path.dirname(CONTAINERD_CONFIG)),
                                 cc.DROP_IN_NAME) if self.drop_in else None
        settings = self.settings()
        try:
            with cc.configure_lock(config):
                # containerd 1.7+'s own CDI resolves devices from cdi_spec_dirs: the node's spec-dirs
                plan = cc.plan_configure(config, runtime_name=self.runtime_name, binary=self._binary(),
                                         annotation_prefixes=settings.annotation_prefixes,
                                         spec_dirs=settings.spec_dirs, drop_in=drop_in,
                                         containerd=self.containerd, import_as=import_as, binary_root=self.root,
                                         migrate="auto")
                where = f"{plan.drop_in} (imported by {config})" if plan.drop_in else config
                loose = [n for f in (config, plan.drop_in) if f for n in _loose_mode(f, kept=not plan.changed)]
                if not plan.changed:
                    return Step("containerd", False, f'{where} has runtime "{self.runtime_name}" as configured',
                                notes=loose)
                written, backups, checked = cc.write_plan(plan, containerd=self.containerd)
        except (ContainerdConfigError, OSError) as err:
            message = str(err)
            if "pass --config-version" in message:     # runtime configure's option; install has none
                message = (f"{config} is missing and containerd is not installed, so the config version cannot "
                           "be told: install containerd on the node first, or name its binary with "
                           "--containerd-binary")
            raise InstallError(message) from None
        notes = loose + [f"backup: {b}" for b in backups] + plan.warnings
        if plan.migrated_from is not None:   # what containerd 2.x does in memory at every start, made lasting
            notes.append(f"migrated {config} from version {plan.migrated_from} to {plan.version} with the installed "
                         "containerd's `config migrate` (the runtime entry goes where containerd reads it)")
        how = "loaded and checked by the installed containerd" if checked else \
            "not checked: containerd is not installed here"
        return Step("containerd", True, f'registered runtime "{self.runtime_name}": wrote {", ".join(written)} ({how})',
                    restart=("containerd",), notes=notes)

    def _register_in_template(self, name, directory, services):
        generated = self.path(os.path.join(directory, "config.toml"))
        text = read_text(generated)
        if text is None:
            raise InstallError(f"{name}: {generated} does not exist yet, so the containerd config version {name} "
                               f"renders cannot be told: start {name} once, then rerun this command")
        try:
            version = file_version(parse_toml(generated, text), generated) or 2
        except ContainerdConfigError as err:
            raise InstallError(f"{name}: {err}") from None
        if version not in TEMPLATE_FOR:
            raise InstallError(f"{name}: {generated} is a version {version} config; cdi-shim writes templates for "
                               "versions 2 and 3")
        if self.runtime_name == "nvidia":
            toolkit = [p for p in TOOLKIT_RUNTIMES if os.path.exists(self.path(p))]
            if toolkit:
                raise InstallError(f'{name} adds its own "nvidia" runtime for {toolkit[0]}, and a second "nvidia" '
                                   f"table would stop containerd: pass --runtime-name cdi-shim (and use that "
                                   f"handler in the RuntimeClass)")
        template = self.path(os.path.join(directory, TEMPLATE_FOR[version]))
        wanted = self.template_text(version, name)
        old = read_text(template)
        if old == wanted:
            return Step("containerd", False, f'{template} has runtime "{self.runtime_name}" as configured')
        notes = _loose_mode(template, kept=old == wanted)
        if old is not None and TEMPLATE_MARKER not in old:
            raise InstallError(
                f"{template} exists and was not written by cdi-shim; {name} renders config.toml from it at every "
                f"start, so edit the template, not config.toml. Add these lines at its end (it must extend the "
                f'base template, {{{{ template "base" . }}}}), then restart {name}:\n' + self.entry_text(version))
        template = self.target(os.path.join(directory, TEMPLATE_FOR[version]))
        _write(template, wanted)
        if self.drop_in:
            notes.append(f"--drop-in does not apply: {name}'s containerd reads only what {name} renders")
        return Step("containerd", True, f'registered runtime "{self.runtime_name}": wrote {template} ({name} renders '
                    f"{generated} from it at its next start)", restart=services, notes=notes)

    def entry_text(self, version):
        """The runtime's tables for a k3s/rke2 template (SystemdCgroup as the distribution sets it for runc)."""
        plugin = CRI_PLUGIN[version]
        quote = '"' if version == 2 else "'"
        header = f'plugins.{quote}{plugin}{quote}.containerd.runtimes.{_toml_key(self.runtime_name)}'
        patterns = ", ".join(_toml_string(p + "*") for p in self.settings().annotation_prefixes)
        return (f"[{header}]\n"
                f"  runtime_type = {_toml_string(RUNC_V2)}\n"
                f"  container_annotations = [{patterns}]\n"
                f"[{header}.options]\n"
                f"  BinaryName = {_toml_string(self._binary())}\n"
                "  SystemdCgroup = {{ .SystemdCgroup }}\n")

    def template_text(self, version, name):
        return (f"{TEMPLATE_MARKER} (rerunning it rewrites this file; delete this line to own it).\n"
                f"# {name} renders config.toml from this template at every start: edit this file, not config.toml.\n"
                '{{ template "base" . }}\n\n' + self.entry_text(version))

    # --- 2b. Docker, when the node has it --------------------------------------------------------

    def register_docker(self):
        """runtimes.cdi-shim in daemon.json (runtime configure --runtime=docker's plan and lock), with
        dockerd's CDI on from Docker 25; and the --gpus program on dockerd's PATH unless one is there."""
        from . import docker_config as dc
        from .containerd_config import configure_lock

        dockerd = next((self.path(os.path.join(d, "dockerd")) for d in DOCKER_PATH
                        if os.access(self.path(os.path.join(d, "dockerd")), os.X_OK)), None)
        config = self.path(dc.DEFAULT_DOCKER_CONFIG)
        if dockerd is None and not os.path.exists(config):
            return Step("docker", False, "no Docker here (no dockerd, no daemon.json)")
        version = dc.docker_version(dockerd) if dockerd and self.root == "/" else None
        cdi = version is not None and version[:2] >= dc.CDI_FROM
        try:
            with configure_lock(config):
                plan = dc.plan_configure(config, binary=self._binary(), cdi=cdi, spec_dirs=self.settings().spec_dirs,
                                         dockerd=dockerd or "dockerd", binary_root=self.root)
                written = dc.write_plan(plan, dockerd=dockerd or "dockerd")[0] if plan.changed else []
        except (dc.DockerConfigError, ContainerdConfigError, OSError) as err:
            raise InstallError(str(err)) from None
        changed, done, notes = bool(written), [], []
        done.append(f'registered runtime "cdi-shim" in {config}' + (" with dockerd's CDI on" if cdi else "")
                    if written else f'{config} has runtime "cdi-shim" as configured')
        hook = dc.LEGACY_HOOK_PROGRAM
        # the entries themselves: the link names a node path, which need not lead anywhere in ROOT
        if not any(os.path.lexists(self.entry(os.path.join(d, hook))) for d in DOCKER_PATH):
            link = self.entry(os.path.join("/usr/local/bin", hook))
            os.symlink(os.path.join(os.path.dirname(self._binary()), hook), link)
            changed = True
            done.append(f"linked {link} (docker run --gpus; dockerd finds it at its next start)")
        if written:
            notes.append("dockerd must " + ("restart" if plan.needs_restart else "reload") +
                         " to apply it: systemctl " + ("restart" if plan.needs_restart else "reload") + " docker")
        return Step("docker", changed, "; ".join(done), notes=notes)

    # --- 2c. podman, when the node has it ---------------------------------------------------------

    def register_podman(self):
        """[engine.runtimes] cdi-shim in root's containers.conf (runtime configure --runtime=podman's
        plan and lock); the installed podman loads the new file where ROOT is this host."""
        from . import podman_config as pc
        from .containerd_config import configure_lock

        podman = next((self.path(os.path.join(d, "podman")) for d in DOCKER_PATH
                       if os.access(self.path(os.path.join(d, "podman")), os.X_OK)), None)
        config = self.path(pc.SYSTEM_CONFIG)
        if podman is None and not os.path.exists(config):
            return Step("podman", False, f"no podman here (no podman, no {pc.SYSTEM_CONFIG})")
        # a node tree's podman is not run here: the file is then written unchecked
        podman = podman if podman and self.root == "/" else "/nonexistent/podman"
        try:
            with configure_lock(config):
                plan = pc.plan_configure(config, binary=self._binary(), podman=podman, binary_root=self.root)
                written = pc.write_plan(plan, podman=podman)[0] if plan.changed else []
        except (pc.PodmanConfigError, ContainerdConfigError, OSError) as err:
            raise InstallError(str(err)) from None
        if not written:
            return Step("podman", False, f'{config} has runtime "cdi-shim" as configured')
        return Step("podman", True, f'registered runtime "cdi-shim" in {config} (podman run --runtime cdi-shim; '
                    "podman reads it at its next run)")

    # --- 3. the resident unit -----------------------------------------------------------------------

    def resident_unit(self):
        path = self.path(os.path.join(UNIT_DIR, UNIT_NAME))
        if not self.settings().resident_socket:
            return Step("resident", False, f'resident-socket is "" in {self.path(CDI_SHIM_CONFIG)}: no resident '
                        f"process (each create starts the interpreter); {path} not installed")
        if not self.cdi_shim:
            raise InstallError("cdi-shim is not installed beside this interpreter: name it with --cdi-shim-binary")
        from .systemd_unit import install_unit

        return install_unit(self, "resident", UNIT_NAME, unit_text(self.cdi_shim))

    def _systemctl(self, *args, check=True):
        command = self.systemctl + list(args)
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise InstallError(f"{shlex.join(command)}: {err}") from None
        if check and out.returncode != 0:
            raise InstallError(f"{shlex.join(command)} failed: {(out.stderr or out.stdout).strip()}")
        return out.returncode

    # --- 4. the CDI spec ----------------------------------------------------------------------------

    def gpu_present(self):
        import stat

        from ..inroot import Tree, TreeError

        try:   # resolved inside the dev root, as `cdi generate` finds it
            with Tree(self.dev_root, "dev root") as tree:
                return tree.resolve("/dev/nvidiactl", stat.S_IFCHR) is not None
        except TreeError:
            return False

    def _control_node(self):
        return os.path.join(self.dev_root, "dev/nvidiactl")

    def cdi_spec(self, proc="/proc", sysfs="/sys"):
        output = self.path(SPEC_PATH)
        if not self.gpu_present():
            return Step("cdi-spec", False, f"no GPU here (no {self._control_node()}): "
                        "no CDI spec generated")
        from ..generate import GenerateError, Options, generate

        from ..generate import hostdir

        driver_dir = hostdir.BASE if self.root == "/" else os.path.join(self.root, hostdir.BASE.lstrip("/"))
        options = Options(output=output, driver_root=self.driver_root, dev_root=self.dev_root,
                          hook_program=self.hook_program, proc=proc, sysfs=sysfs, layout=self.layout,
                          driver_dir=driver_dir)
        try:
            result = generate(options)
        except GenerateError as err:
            raise InstallError(f"cannot generate the CDI spec: {err}") from None
        notes = [f"warning: {w}" for w in result.warnings]
        if result.host_dir:
            notes.append(f"the driver's files are in {result.host_dir} (--layout one-mount)")
        what = (f"{len(result.doc['devices'])} devices ({len(result.nvml.gpus)} GPU(s), driver "
                f"{result.nvml.driver_version})")
        notes += _loose_mode(output, kept=read_text(output) == result.text)
        if read_text(output) == result.text:
            notes += self._collect(result, output)
            return Step("cdi-spec", False, f"{output} is current: {what}", notes=notes)
        output = self.target(SPEC_PATH)
        _write(output, result.text)
        notes += self._collect(result, output)
        return Step("cdi-spec", True, f"wrote {output}: {what}", notes=notes)

    def _collect(self, result, output):
        """The one-mount layout: old host directories no spec names and no container binds go."""
        if not result.host_dir:
            return []
        from ..generate.spec import collect_host_dirs

        try:
            removed = collect_host_dirs(result.host_dir, os.path.dirname(output))
        except OSError as err:
            return [f"warning: cannot collect old host directories beside {result.host_dir}: {err}"]
        return [f"removed unused host directories {', '.join(removed)}"] if removed else []

    # --- 5. /dev/char links ---------------------------------------------------------------------------

    def dev_char(self, rule=True):
        from . import devchar

        specs, notes = devchar.load_node_specs(self, self.settings().spec_dirs)
        made, more, kept = devchar.make_links(self, specs)
        notes += more
        done = [f"linked {', '.join(made)}"] if made else []
        if rule:  # --dev-char-only (the rule's own run) leaves the rule as it is
            if not self.cdi_shim:
                raise InstallError("cdi-shim is not installed beside this interpreter: name it with --cdi-shim-binary")
            wanted = devchar.rule_text(self.cdi_shim)
            if read_text(self.path(devchar.UDEV_RULE)) != wanted:
                path = self.target(devchar.UDEV_RULE)
                _write(path, wanted)
                done.append(f"wrote {path}")
        if done:
            return Step("dev-char", True, "; ".join(done), notes=notes)
        return Step("dev-char", False, f"{kept} /dev/char link(s) in place" +
                    (f", {self.path(devchar.UDEV_RULE)} current" if rule else ""), notes=notes)

    # --- containerd's restart -------------------------------------------------------------------------

    def restart(self, services):
        """Restart SERVICES; returns a message, raises when this host cannot."""
        if self.systemctl is None:
            raise InstallError(f"cannot restart {' / '.join(services)}: systemctl not run ({self.no_systemctl})")
        if len(services) == 1:
            self._systemctl("restart", services[0])
            return f"restarted {services[0]}"
        for service in services:  # k3s or k3s-agent: the one that runs here
            if self._systemctl("is-active", "--quiet", service, check=False) == 0:
                self._systemctl("restart", service)
                return f"restarted {service}"
        raise InstallError(f"none of {', '.join(services)} is running here: start it")


def install_node(installer, restart=False, report=print, dev_char_only=False, nri=False):
    """Run every step; REPORT gets each line. Returns the steps. NRI: the NRI plugin's unit
    (shim/node/nri_unit.py) in place of the containerd registration and the resident unit.

    A step that fails does not stop the others (a driver whose NVML fails must not keep the runtime
    registration from taking effect): the restart, when one is due and asked for, still happens,
    and then InstallError names every failure."""
    from .refresh_unit import refresh_unit

    steps, failed = [], []
    plan = (("config", installer.cdi_shim_config), ("containerd", installer.register_runtime),
            ("docker", installer.register_docker), ("podman", installer.register_podman),
            ("resident", installer.resident_unit), ("cdi-spec", installer.cdi_spec),
            ("spec-refresh", lambda: refresh_unit(installer)), ("dev-char", installer.dev_char))
    if nri:             # containerd's config untouched, no restart
        from .nri_unit import nri_unit

        plan = tuple(("nri", lambda: nri_unit(installer)) if name == "containerd" else (name, step)
                     for name, step in plan if name != "resident")
    if dev_char_only:   # what the udev rule runs when a driver module loads
        plan = (("dev-char", lambda: installer.dev_char(rule=False)),)
    for name, step in plan:
        try:
            done = step()
        except (InstallError, ContainerdConfigError) as err:  # e.g. a file it must read is a FIFO
            failed.append(f"{name}: {err}")
            report(f"{name}: failed: {err}")
            continue
        except OSError as err:   # one line naming the file, never a traceback
            failed.append(f"{name}: {_os_error(err)}")
            report(f"{name}: failed: {_os_error(err)}")
            continue
        steps.append(done)
        report(f"{done.name}: {'changed' if done.changed else 'unchanged'}: {done.message}")
        for note in done.notes:
            report(f"{done.name}: {note}")
    changed = [s.name for s in steps if s.changed]
    services = next((s.restart for s in steps if s.changed and s.restart), None)
    if not changed:
        report("nothing changed")
    elif services is None:
        report(f"changed: {', '.join(changed)}; containerd need not be restarted")
    elif restart:
        report(f"changed: {', '.join(changed)}; {installer.restart(services)}")
    else:
        report(f"changed: {', '.join(changed)}; {' / '.join(services)} must be restarted to load the runtime "
               "(rerun with --restart)")
    if failed:
        raise InstallError(f"{len(failed)} step(s) failed: " + "; ".join(failed))
    return steps


# --- helpers ---------------------------------------------------------------------------------------

def _beside_interpreter(name):
    """NAME of this install, by its stable path (the node prefix's `current` for a release)."""
    from ..installation import bin_dir, stable_program

    if os.access(os.path.join(bin_dir(), name), os.X_OK):
        return stable_program(name)
    found = shutil.which(name)
    return os.path.abspath(found) if found else None


def _write(path, text, mode=0o644):
    """PATH (its folder already made, resolved inside the root) replaced whole by TEXT."""
    from cdi.safeio import write_file_atomic

    write_file_atomic(path, text.encode(), mode, prefix=f".{os.path.basename(path)}.", sync=True)


def _loose_mode(path, kept):
    """A warning (in a list) when the file at PATH is writable by group or others: whoever can
    write it can change what root's programs run or read. KEPT: we leave it as it is (else it is
    rewritten 0644)."""
    import stat

    try:
        info = os.lstat(path)
    except OSError:
        return []
    if not stat.S_ISREG(info.st_mode) or not info.st_mode & 0o022:
        return []
    fix = f"fix it: chmod go-w {path}" if kept else "rewritten 0644"
    return [f"warning: {path} is writable by group or others (mode {stat.S_IMODE(info.st_mode):o}); {fix}"]


def _os_error(err):
    if err.filename and err.strerror:
        return f"{err.filename}: {err.strerror}"
    return str(err)


def _toml_string(value):
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _toml_key(name):
    import re

    return name if re.match(r"^[A-Za-z0-9_-]+$", name) else _toml_string(name)


__all__ = ["InstallError", "Installer", "Step", "install_node", "unit_text"]
