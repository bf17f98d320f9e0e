"""containerd's registration of the runtime: config version, ignored sections, the runtime entry,
CDI settings, cgroup driver, default runtime."""
import fnmatch
import os
import re
import subprocess

from cdi.safeio import UnsafeFile

from ..containerd import MIGRATE_BY_HAND
from .base import (CRI_RUNTIME, FAIL, KUBELET_CONFIG, NEW_CRI_PLUGINS, OLD_CRI, RUNC_V2, RUNTIME_EXECUTABLE,
                   V3_OLD_CRI_KEYS, WARN, Check, _ok)


def _toml(text):
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomlkit

        return tomlkit.parse(text).unwrap()
    return tomllib.loads(text)


def _get(table, *keys):
    for key in keys:
        if not isinstance(table, dict):
            return None
        table = table.get(key)
    return table


def _merge(base, extra):
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def parse_containerd_version(text):
    """(major, minor) from `containerd --version` output."""
    words = text.split()
    for word in words[2:3] + words:
        match = re.match(r"^v?(\d+)\.(\d+)", word)
        if match:
            return int(match.group(1)), int(match.group(2))
    return None


class ContainerdView:
    """containerd's config on the node (with its imports) and the installed containerd."""

    def __init__(self):
        self.path = self.error = self.version = None
        self.files = []          # [(node path, parsed dict)]
        self.doc = {}            # the merged view
        self.installed = None    # (major, minor) or None
        self.installed_text = ""
        self.binary = None       # host path of the containerd asked
        self.binaries = []       # [(node path, host path)] on PATH
        self.node = None
        self._dump = False       # Dump, or None when it cannot be asked; False: not asked yet

    @classmethod
    def load(cls, ctx):
        view, node, options = cls(), ctx.node, ctx.options
        view.node = node
        view.path = options.containerd_config
        view.binaries = node.which_all("containerd")
        if options.containerd_binary:
            view.binary = options.containerd_binary
        elif view.binaries:
            view.binary = view.binaries[0][1]
        if view.binary:
            try:
                out = subprocess.run([view.binary, "--version"], capture_output=True, text=True, timeout=30)
                view.installed_text = out.stdout.strip()
                view.installed = parse_containerd_version(view.installed_text)
            except (OSError, subprocess.TimeoutExpired) as err:
                view.installed_text = str(err)
        try:
            data = node.read_checked(view.path)
        except UnsafeFile as err:
            view.error = f"unreadable: {err}" + (" (run doctor as root)" if "permission" in str(err) else "")
            return view
        if data is None:
            view.error = "missing"
            return view
        text = data.decode("utf-8", "replace")
        try:
            doc = _toml(text)
        except Exception as err:  # noqa: BLE001 - tomllib's and tomlkit's errors
            view.error = f"not valid TOML: {err}"
            return view
        version = doc.get("version", 1)
        view.version = version if isinstance(version, int) and not isinstance(version, bool) else None
        view.files.append((view.path, doc))
        merged = doc
        for pattern in doc.get("imports") or ():
            if not isinstance(pattern, str):
                continue
            full = pattern if pattern.startswith("/") else os.path.join(os.path.dirname(view.path), pattern)
            directory, name = os.path.split(full)
            names = [n for n in node.listdir(directory) or [] if fnmatch.fnmatchcase(n, name)]
            for one in names:
                one_path = os.path.join(directory, one)
                one_text = node.read_text(one_path)
                if one_text is None:
                    continue
                try:
                    one_doc = _toml(one_text)
                except Exception:  # noqa: BLE001
                    continue
                view.files.append((one_path, one_doc))
                if view.major == 1:  # containerd 1.x: an imported plugin section replaces the earlier one
                    merged = dict(merged)
                    plugins = dict(merged.get("plugins") or {})
                    plugins.update(one_doc.get("plugins") or {})
                    merged["plugins"] = plugins
                    merged.update({k: v for k, v in one_doc.items() if k != "plugins"})
                else:
                    merged = _merge(merged, one_doc)
        view.doc = merged
        return view

    @property
    def minor(self):
        return self.installed[1] if self.installed else None

    @property
    def refuses_version(self):
        """containerd 1.7 refuses a file of version 3 or more (measured: "unsupported config version
        `3`", exit 1); 1.6 reads it as version 2; 2.0-2.2 refuse 4 and above."""
        if not self.installed or self.version is None:
            return False
        major, minor = self.installed
        if major == 1:
            return minor >= 7 and self.version > 2
        return self.version > (4 if (major, minor) >= (2, 3) else 3)

    def dump(self):
        """The installed containerd's `containerd --config F config dump` (a Dump), or None when it
        cannot be asked: no binary, the file not loaded here, or imports that under --root name
        the host's files rather than ROOT's."""
        if self._dump is not False:
            return self._dump
        self._dump = None
        if self.error or not self.binary or not self.installed:
            return None
        if self.node.root != "/" and self.doc.get("imports"):
            return None
        try:
            out = subprocess.run([self.binary, "--config", self.node.host(self.path), "config", "dump"],
                                 capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as err:
            self._dump = Dump(None, "", str(err))
        else:
            self._dump = Dump(out.returncode, out.stdout, out.stderr)
        return self._dump

    def effective_cri(self):
        """The CRI runtime plugin's section as the installed containerd loaded it (its `config
        dump`: defaults filled in, a version-2 file migrated by 2.x), or None."""
        dump = self.dump()
        if dump is None or dump.doc is None:
            return None
        version = dump.doc.get("version", 1)
        section = _get(dump.doc, "plugins", CRI_RUNTIME.get(version, OLD_CRI))
        return section if isinstance(section, dict) else None

    @property
    def major(self):
        """containerd's major version: the installed one, else what the file's version implies."""
        if self.installed:
            return self.installed[0]
        return {2: 1, 3: 2}.get(self.version)

    @property
    def read_as(self):
        """The config version containerd reads the file as: containerd 1.6 reads any version above
        2 as 2 (measured: 1.6's `config dump` of a version-3 file says version = 2); 1.7 refuses
        such a file (`refuses_version`)."""
        if self.major == 1 and self.version and self.version > 2 and not (self.minor is not None and self.minor >= 7):
            return 2
        return self.version

    @property
    def cri(self):
        return _get(self.doc, "plugins", CRI_RUNTIME.get(self.read_as, OLD_CRI)) or {}

    @property
    def runtimes(self):
        return _get(self.cri, "containerd", "runtimes") or {}

    @property
    def default_runtime(self):
        return _get(self.cri, "containerd", "default_runtime_name") or "runc"

    @property
    def cdi_spec_dirs(self):
        dirs = self.cri.get("cdi_spec_dirs") if self.version else None
        return dirs if isinstance(dirs, list) else None

    def shim_runtimes(self, names=()):
        """{name: entry} of the runtimes that run cdi-shim-runtime (and NAMES)."""
        found = {}
        for name, entry in self.runtimes.items():
            binary = _get(entry, "options", "BinaryName")
            if name in names or (isinstance(binary, str) and os.path.basename(binary) == RUNTIME_EXECUTABLE):
                found[name] = entry if isinstance(entry, dict) else {}
        return found

    def where(self):
        version = self.read_as
        return f"[plugins.{_quote(version)}{CRI_RUNTIME.get(version, OLD_CRI)}{_quote(version)}]"


class Dump:
    """What `containerd --config F config dump` said: its exit status, the loaded config (parsed)
    and the keys containerd 2.x reported ignoring."""

    IGNORED = "Ignoring unknown key in TOML for plugin"

    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr
        self.doc = None
        if returncode == 0:
            try:
                self.doc = _toml(stdout)
            except Exception:  # noqa: BLE001
                self.doc = None

    @property
    def error(self):
        if self.returncode == 0:
            return None
        lines = [line for line in (self.stderr or self.stdout).splitlines() if line.strip()]
        return lines[-1] if lines else f"exit status {self.returncode}"

    def ignored(self):
        """[(plugin, "a.b.c")] of the keys containerd says it ignores (containerd 2.x warns
        `msg="Ignoring unknown key in TOML for plugin" key="containerd runtimes nvidia"
        plugin=io.containerd.grpc.v1.cri` for each table it does not know, and for the tables
        around it or not, as it happens), the innermost only: the tables the file names."""
        found = []
        for line in self.stderr.splitlines():
            fields = {k: (v[1:-1].replace('\\"', '"') if v.startswith('"') else v)
                      for k, v in re.findall(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)', line)}
            if fields.get("msg") == self.IGNORED and fields.get("key"):
                found.append((fields.get("plugin", "?"), tuple(fields["key"].split())))
        inner = [(p, k) for p, k in found if not any(p == q and j[:len(k)] == k and k != j for q, j in found)]
        seen, out = set(), []
        for plugin, key in inner:
            if (plugin, key) not in seen:
                seen.add((plugin, key))
                out.append((plugin, ".".join(key)))
        return out


def _quote(version):
    return '"' if version == 2 else "'"


DEFAULT_RUNTIME_NAME = "nvidia"


def configure_fix(ctx, name=None, *extra):
    """`cdi-shim runtime configure ...` with the values doctor knows (the runtime's name, the
    config it read), to paste: a placeholder would be one more thing to get wrong. NAME: the
    runtime; default the one registered (or the RuntimeClass's handler), else "nvidia"."""
    import shlex

    if name is None:
        names = sorted(ctx.containerd.shim_runtimes()) or sorted(_handlers(ctx))
        name = names[0] if len(names) == 1 else DEFAULT_RUNTIME_NAME
    words = ["cdi-shim", "runtime", "configure", "--runtime=containerd"]
    if name != DEFAULT_RUNTIME_NAME:
        words += ["--runtime-name", name]
    path, root = ctx.containerd.path, ctx.node.root
    words += ["--config", path if root == "/" else os.path.join(root, path.lstrip("/"))]
    return f"`{shlex.join(words + list(extra))}`"


def _handlers(ctx):
    """The handlers of the RuntimeClass files doctor was given (best effort; the runtimeclass
    check reports what is wrong with them)."""
    import yaml

    from cdi.safeio import read_config_file

    found = set()
    for path in ctx.options.runtimeclasses:
        try:
            docs = list(yaml.safe_load_all(read_config_file(path, 1 << 20) or b""))
        except (UnsafeFile, yaml.YAMLError):
            continue
        found |= {d.get("handler") for d in docs if isinstance(d, dict) and isinstance(d.get("handler"), str)}
    return found


def check_containerd_binaries(ctx):
    view = ctx.containerd
    found = view.binaries
    answer = view.installed_text.splitlines()[0] if view.installed_text else "no version"
    if len(found) > 1:
        return Check("containerd", "binaries", WARN,
                     "several containerd executables on PATH: " + ", ".join(p for p, _ in found)
                     + f"; {view.binary} answers {answer}",
                     "remove the ones the service does not run (`systemctl cat containerd` shows ExecStart), so "
                     "version checks and `ctr` talk about the same containerd")
    if not found and not ctx.options.containerd_binary:
        return Check("containerd", "binaries", WARN, "no containerd on PATH; the version rules below use the config "
                     "file's version", "install containerd, or name it with --containerd-binary")
    return _ok("containerd", "binaries", f"{view.binary}: {answer}")


def check_containerd_version(ctx):
    view = ctx.containerd
    if view.error == "missing":
        return Check("containerd", "config", FAIL, f"{view.path} does not exist: containerd runs with built-in "
                     "defaults, which know no cdi-shim runtime", f"create it: {configure_fix(ctx)}")
    if view.error:
        return Check("containerd", "config", FAIL, f"{view.path} is {view.error}; containerd will not start",
                     f"make {view.path} a valid regular file (`containerd config default` shows one)")
    version, installed = view.version, view.installed
    who = f"containerd {installed[0]}.{installed[1]}" if installed else "containerd (not found; assumed from the file)"
    saw = f"{view.path}: version = {version}; {who}"
    if version is None:
        return Check("containerd", "config", FAIL, f'{view.path}: "version" is not an integer',
                     "set version = 2 (containerd 1.x) or 3 (containerd 2.x)")
    if installed is None:
        return _ok("containerd", "config", saw)
    major, minor = installed
    migrate = MIGRATE_BY_HAND
    if major < 2:
        if version >= 3 and view.refuses_version:
            return Check("containerd", "config", FAIL, f"{saw}: containerd {major}.{minor} knows versions 1 and 2 "
                         f"only and refuses a version {version} file: it will not start",
                         "write a version 2 config (`containerd config default`), then " + configure_fix(ctx))
        if version >= 3:
            return Check("containerd", "config", FAIL, f"{saw}: containerd {major}.{minor} knows versions 1 and 2 "
                         "only and reads this file as version 2, ignoring every section of the version-3 plugins",
                         "write a version 2 config (`containerd config default`), then " + configure_fix(ctx))
        if version == 1:
            return Check("containerd", "config", WARN, f"{saw}: version 1 is deprecated", migrate)
        return _ok("containerd", "config", saw)
    newest = 4 if (major, minor) >= (2, 3) else 3
    if version == 1:
        return Check("containerd", "config", FAIL, f"{saw}: containerd 2.x no longer migrates version 1: it "
                     "starts, but ignores the CRI plugin's sections, the runtimes among them", migrate)
    if version > newest:
        return Check("containerd", "config", FAIL, f"{saw}: containerd {major}.{minor} reads at most version "
                     f"{newest}", f"write a version {newest} config, or upgrade containerd")
    if version < newest:
        return Check("containerd", "config", WARN, f"{saw}: migrated to version {newest} in memory at every start",
                     f"{migrate}; or {configure_fix(ctx, None, '--migrate')}, which runs it and registers "
                     "the runtime in the result")
    return _ok("containerd", "config", saw)


def check_ignored_sections(ctx):
    """Sections containerd will not read: old CRI headers in a version-3 file (containerd 2.x
    ignores them silently: measured), the cri.v1 plugins' sections under containerd 1.x (it knows
    no such plugins; measured: 1.6's `config dump` drops them without a word)."""
    view = ctx.containerd
    if view.error or view.version is None or view.refuses_version:
        return None  # a file containerd refuses is the config check's failure, not a silent one
    ignored, old_reader = [], view.major == 1
    for path, doc in view.files:
        version = doc.get("version", view.version)
        plugins = doc.get("plugins") if isinstance(doc.get("plugins"), dict) else {}
        if not old_reader and isinstance(version, int) and version >= 3 and isinstance(plugins.get(OLD_CRI), dict):
            keys = sorted(k for k in plugins[OLD_CRI] if k not in V3_OLD_CRI_KEYS)
            if keys:
                ignored.append(f'{path}: [plugins."{OLD_CRI}"] {", ".join(keys)} (a version {version} file: '
                               f"containerd 2.x reads these under 'io.containerd.cri.v1.runtime' / "
                               f"'io.containerd.cri.v1.images')")
        if old_reader:
            for name in NEW_CRI_PLUGINS:
                if name in plugins:
                    ignored.append(f"{path}: [plugins.'{name}'] (containerd 1.x has no such plugin)")
    dump = view.dump()
    said = dump.ignored() if dump is not None and dump.returncode == 0 else []
    if said:
        # containerd 2.x names what it drops, as warnings of `config dump` (and of every start)
        installed = f"{view.installed[0]}.{view.installed[1]}"
        ignored.append(f"containerd {installed}'s `config dump` warns it ignores "
                       + ", ".join(f"{key} of plugin {plugin}" for plugin, key in said))
    if ignored:
        return Check("containerd", "ignored-sections", FAIL, "containerd ignores, silently: " + "; ".join(ignored),
                     "move the settings under the headers of the file's version (version 3: "
                     "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.NAME], version 2: "
                     f'[plugins."{OLD_CRI}".containerd.runtimes.NAME]), or rewrite the entry with {configure_fix(ctx)}')
    return _ok("containerd", "ignored-sections", "every CRI section is one containerd reads")


def check_containerd_loads(ctx):
    """The installed containerd loads the file (`containerd --config F config dump`)."""
    view = ctx.containerd
    dump = view.dump()
    if dump is None:
        return None
    if dump.returncode is None:
        return Check("containerd", "loads", WARN, f"cannot run {view.binary}: {dump.stderr}", "")
    if dump.returncode != 0:
        return Check("containerd", "loads", FAIL, f"{view.binary} refuses {view.path}: {dump.error}",
                     "fix the file; `containerd config dump` shows the error")
    return _ok("containerd", "loads", f"`containerd --config {view.path} config dump` succeeds")


def _annotation_patterns(ctx):
    return [p + "*" for p in ctx.options.settings.annotation_prefixes]


def check_runtime_entry(ctx):
    view, node = ctx.containerd, ctx.node
    if view.error or view.version is None:
        return None
    entries = view.shim_runtimes()
    if not entries:
        names = ", ".join(sorted(view.runtimes)) or "none"
        return Check("containerd", "runtime", FAIL, f"no runtime in {view.where()} runs {RUNTIME_EXECUTABLE} "
                     f"(runtimes: {names})", f"register it: {configure_fix(ctx)}")
    problems, seen, broken, deferred = [], [], [], []
    for name, entry in sorted(entries.items()):
        before = len(problems)
        kind = entry.get("runtime_type")
        binary = _get(entry, "options", "BinaryName")
        if kind != RUNC_V2:
            problems.append(f'"{name}": runtime_type is {kind!r}, not "{RUNC_V2}"')
        if not isinstance(binary, str) or not binary.startswith("/"):
            problems.append(f'"{name}": BinaryName {binary!r} is not an absolute path (containerd-shim-runc-v2 '
                            "looks it up on its own PATH, which need not hold it)")
        elif not node.is_executable(binary):
            (deferred if ctx.deferred(binary) else problems).append(f'"{name}": BinaryName {binary} is not an '
                                                                    "executable file")
        allowed = entry.get("container_annotations") or []
        missing = [p for p in _annotation_patterns(ctx) if p not in allowed]
        if missing:
            problems.append(f'"{name}": container_annotations lacks {", ".join(missing)} (containerd drops the '
                            "device plugin's CDI annotations before the runtime sees them)")
        if entry.get("pod_annotations"):
            problems.append(f'"{name}": pod_annotations {entry["pod_annotations"]} lets any pod request any '
                            "device past the device plugin")
        seen.append(f'"{name}" -> {binary}')
        if len(problems) > before:
            broken.append(name)
    if problems:
        return Check("containerd", "runtime", FAIL, "; ".join(problems),
                     f"rewrite the entry: {configure_fix(ctx, broken[0])}"
                     + (f" (and so for {', '.join(broken[1:])})" if broken[1:] else "")
                     + " (it sets runtime_type, the absolute BinaryName and the annotation allow-list)")
    if deferred:    # the release link is the one fix (runtime.release); rewriting the entry changes nothing
        return Check("containerd", "runtime", WARN, "; ".join(deferred) + " (see runtime.release)")
    return _ok("containerd", "runtime", ", ".join(seen))


def check_cri_cdi(ctx):
    view = ctx.containerd
    if view.error or view.version is None:
        return None
    major, minor = view.major, view.minor
    enabled = view.cri.get("enable_cdi")
    dirs = view.cdi_spec_dirs
    ours = list(ctx.options.spec_dirs)
    where = view.where()
    if major == 1 and minor is not None and minor < 7:
        return _ok("containerd", "cdi", f"containerd 1.{minor} has no CDI support of its own; CDI annotations "
                   f"reach {RUNTIME_EXECUTABLE} through container_annotations")
    default = major is not None and major >= 2  # containerd 1.7 ships enable_cdi off, 2.x on
    effective = default if enabled is None else bool(enabled)
    source = "the file" if enabled is not None else f"containerd {major}.x's default"
    loaded = view.effective_cri()
    if loaded is not None and isinstance(loaded.get("enable_cdi"), bool):
        # what the installed containerd made of the file: its defaults, migration, ignored sections
        effective, source = loaded["enable_cdi"], "`containerd config dump`"
        if isinstance(loaded.get("cdi_spec_dirs"), list):
            dirs = loaded["cdi_spec_dirs"]
    if not effective:
        if major is not None and major >= 2:
            return Check("containerd", "cdi", FAIL, f"enable_cdi = false in {where} ({source}): containerd 2.x then "
                         "drops the CDI devices the device plugin asks for (the CRI CDIDevices field), silently",
                         f"set enable_cdi = true in {where} (the default in 2.x) and restart containerd")
        return Check("containerd", "cdi", WARN, f"enable_cdi is off in {where} ({source}): CDI devices in the "
                     f"CRI CDIDevices field are dropped; only annotations reach {RUNTIME_EXECUTABLE}",
                     f"set enable_cdi = true and cdi_spec_dirs = {ours} in {where}")
    effective_dirs = dirs if dirs is not None else ["/etc/cdi", "/var/run/cdi"]
    if [ctx.node.host(d) for d in effective_dirs] != [ctx.node.host(d) for d in ours]:
        return Check("containerd", "cdi", FAIL, f"containerd resolves CDI devices from {effective_dirs}, "
                     f"cdi-shim from {ours}: the same request gets other edits, or fails in one of them",
                     f"set cdi_spec_dirs = {ours} in {where} (or spec-dirs in /etc/cdi-shim/config.toml)")
    return _ok("containerd", "cdi", f"enable_cdi on, cdi_spec_dirs = {effective_dirs} ({source})")


def _init_is_systemd(node):
    """True / False / None (cannot tell) for the node's init."""
    comm = node.read_text("/proc/1/comm")
    if comm is not None:
        return comm.strip() == "systemd", f'PID 1 is "{comm.strip()}"'
    try:
        init = node.host("/sbin/init")
    except OSError:
        return None, "no /proc/1/comm"
    if os.path.exists(init):
        name = os.path.basename(init)
        return name == "systemd", f"/sbin/init is {name}"
    return None, "neither /proc/1/comm nor /sbin/init"


def check_cgroup_driver(ctx):
    import yaml

    view, node = ctx.containerd, ctx.node
    if view.error or view.version is None:
        return None
    entries = view.shim_runtimes()
    if not entries:
        return None
    systemd, init = _init_is_systemd(node)
    wanted = {}
    if systemd is not None:
        wanted["the host's init"] = (systemd, init)
    text = node.read_text(KUBELET_CONFIG)
    if text is not None:
        try:
            kubelet = yaml.safe_load(text) or {}
            driver = kubelet.get("cgroupDriver", "cgroupfs") if isinstance(kubelet, dict) else None
        except yaml.YAMLError:
            driver = None
        if driver in ("systemd", "cgroupfs"):
            wanted["the kubelet"] = (driver == "systemd", f"{KUBELET_CONFIG} cgroupDriver: {driver}")
    runc = view.runtimes.get("runc")
    runc_value = _get(runc, "options", "SystemdCgroup") if isinstance(runc, dict) else None
    problems, seen = [], []
    for name, entry in sorted(entries.items()):
        value = bool(_get(entry, "options", "SystemdCgroup"))
        seen.append(f'"{name}" SystemdCgroup = {str(value).lower()}')
        for who, (expected, why) in wanted.items():
            if value != expected:
                problems.append(f'"{name}" has SystemdCgroup = {str(value).lower()} but {why}')
        if isinstance(runc_value, bool) and runc_value != value:
            problems.append(f'"{name}" has SystemdCgroup = {str(value).lower()}, the "runc" runtime '
                            f"{str(runc_value).lower()}")
    host, kubelet = wanted.get("the host's init"), wanted.get("the kubelet")
    if host and kubelet and host[0] != kubelet[0]:
        problems.append(f"{host[1]} but {kubelet[1]}")
    if problems:
        target = next(iter(wanted.values()))[0] if wanted else True
        return Check("containerd", "cgroup", FAIL, "; ".join(problems),
                     f"set SystemdCgroup = {str(target).lower()} in every runtime's options (and cgroupDriver: "
                     f"{'systemd' if target else 'cgroupfs'} in the kubelet config), then restart containerd and the "
                     "kubelet")
    return _ok("containerd", "cgroup", "; ".join(seen + [why for _, why in wanted.values()]))


def check_dev_char(ctx):
    """With the systemd cgroup driver, each device node of the specs needs its /dev/char link
    (shim/node/devchar.py says why); the link is what systemd stats, so it is stat()ed here too."""
    import stat

    from ..devchar import link_name, spec_device_nodes

    view, node = ctx.containerd, ctx.node
    if view.error or view.version is None or not ctx.specs:
        return None
    systemd = sorted(name for name, entry in view.shim_runtimes().items()
                     if _get(entry, "options", "SystemdCgroup") is True)
    if not systemd:
        return None   # cgroupfs: runc writes the device rules itself, no daemon-reload re-applies them
    missing, linked = [], 0
    for path in spec_device_nodes(ctx.specs):
        info = node.stat(path)
        if info is None or not stat.S_ISCHR(info.st_mode):
            continue  # a missing node is cdi.paths' and kernel.devices' to report
        name = link_name(info.st_rdev)
        there = node.stat(name)
        if there is None or not stat.S_ISCHR(there.st_mode) or there.st_rdev != info.st_rdev:
            missing.append(f"{name} ({path})")
        else:
            linked += 1
    runtimes = ", ".join(f'"{n}"' for n in systemd)
    if missing:
        return Check("containerd", "dev-char", WARN,
                     f"{runtimes} use(s) the systemd cgroup driver and these device nodes have no /dev/char link: "
                     f"{', '.join(missing)}; a `systemctl daemon-reload` drops them from running containers "
                     '("Failed to initialize NVML: Unknown Error")',
                     "run `cdi-shim install --node` (it makes the links and a udev rule for nodes made later)")
    return _ok("containerd", "dev-char", f"all {linked} device nodes have their /dev/char link (systemd cgroup "
               f"driver: {runtimes})")


def check_default_runtime(ctx):
    view = ctx.containerd
    if view.error or view.version is None:
        return None
    default = view.default_runtime
    if default not in view.runtimes and view.runtimes:
        return Check("containerd", "default-runtime", FAIL, f'default_runtime_name = "{default}" names no '
                     f"configured runtime ({', '.join(sorted(view.runtimes))}): the CRI plugin will not start",
                     'set default_runtime_name = "runc"')
    if default in view.shim_runtimes():
        if ctx.options.shim_as_default:
            return _ok("containerd", "default-runtime", f'default_runtime_name = "{default}" (intended: '
                       "--shim-as-default)")
        return Check("containerd", "default-runtime", FAIL, f'default_runtime_name = "{default}": every pod '
                     f"without a RuntimeClass goes through {RUNTIME_EXECUTABLE}",
                     f'set default_runtime_name = "runc" in {view.where()} and select the shim with a RuntimeClass '
                     "(or pass --shim-as-default if this is intended)")
    return _ok("containerd", "default-runtime", f'default_runtime_name = "{default}"')


# --- who writes config.toml: k3s / rke2 templates, kubespray --------------------------------------

# k3s and rke2 render their containerd's config.toml at every start, from config.toml.tmpl
# (config-v3.toml.tmpl with their containerd 2.x) when one is there, else from their built-in
# template; the rendered file starts "# File generated by k3s. DO NOT EDIT. Use config.toml.tmpl instead."
DISTRIBUTION_DIRS = (("k3s", "/var/lib/rancher/k3s/agent/etc/containerd", "k3s (or k3s-agent)"),
                     ("rke2", "/var/lib/rancher/rke2/agent/etc/containerd", "rke2-server (or rke2-agent)"))
INSTALL = "`cdi-shim install --node`"


def _generated_by(text):
    match = re.match(r"\s*# File generated by (\S+?)\.? DO NOT EDIT", text or "")
    return match.group(1) if match else None


def _kubespray_rendered(text):
    """kubespray's config.toml.j2 starts version, root, state, oom_score in that order (containerd's
    own `config default` writes keys sorted, version last)."""
    lines = [line for line in (text or "").splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return (len(lines) >= 4 and lines[0].replace(" ", "") == "version=2" and lines[1].startswith("root = ")
            and lines[2].startswith("state = ") and lines[3].startswith("oom_score = "))


def _runs_shim(text):
    return RUNTIME_EXECUTABLE in (text or "")


def check_config_owner(ctx):
    """Whether a hand edit of config.toml would last: k3s/rke2 regenerate theirs from a template at
    every start, kubespray rewrites it on every playbook run, managed node images at boot."""
    node, view = ctx.node, ctx.containerd
    for name, directory, service in DISTRIBUTION_DIRS:
        generated = f"{directory}/config.toml"
        text = node.read_text(generated)
        if text is None and not node.exists(directory):
            continue
        templates = [t for t in ("config-v3.toml.tmpl", "config.toml.tmpl") if node.exists(f"{directory}/{t}")]
        version = None
        try:
            version = _toml(text).get("version") if text else None
        except Exception:  # noqa: BLE001
            pass
        wanted = f"{directory}/{'config-v3.toml.tmpl' if version == 3 else 'config.toml.tmpl'}"
        template = f"{directory}/{templates[0]}" if templates else None
        template_text = node.read_text(template) if template else None
        if template and _runs_shim(template_text):
            if text is not None and not _runs_shim(text):
                return Check("containerd", "config-owner", WARN, f"{name}: {template} registers {RUNTIME_EXECUTABLE} "
                             f"but {generated} does not yet: {name} renders it at its next start",
                             f"restart {service}")
            return _ok("containerd", "config-owner", f"{name} renders {generated} from {template}, which registers "
                       f"{RUNTIME_EXECUTABLE}")
        if template:
            return Check("containerd", "config-owner", FAIL, f"{name} renders {generated} from {template}, which "
                         f"registers no runtime running {RUNTIME_EXECUTABLE}",
                         f"edit {template}, not config.toml: {name} regenerates config.toml at every start. "
                         f"{INSTALL} prints the lines to add; then restart {service}")
        if _runs_shim(text):
            return Check("containerd", "config-owner", FAIL, f"{generated} registers {RUNTIME_EXECUTABLE}, but "
                         f"{name} regenerates it at every start and no {os.path.basename(wanted)} carries the "
                         "runtime: the next restart of the node loses it",
                         f"edit {os.path.basename(wanted)}, not config.toml: {INSTALL} writes {wanted} extending "
                         f'{name}\'s base template ({{{{ template "base" . }}}}); then restart {service}')
        return Check("containerd", "config-owner", FAIL, f"{name} node: its containerd reads {generated}, rendered "
                     f"at every start from its built-in template, which knows no {RUNTIME_EXECUTABLE}"
                     + ("" if view.path == generated else f" (doctor read {view.path}: pass --config {generated})"),
                     f"{INSTALL} writes {wanted} extending {name}'s base template; then restart {service}")
    if view.error:
        return None
    text = node.read_text(view.path)
    owner = _generated_by(text)
    if owner:
        return Check("containerd", "config-owner", WARN, f"{view.path} says it is generated by {owner}: a hand edit "
                     "is lost when it is generated again",
                     f"register the runtime where {owner} takes its configuration from (its template or drop-in), "
                     f"or rerun {INSTALL} at every start of the node (deploy/)")
    if _kubespray_rendered(text):
        if view.shim_runtimes():
            how = ("registers the runtime, but the next playbook run rewrites the file without it unless the "
                   "inventory has it")
        else:
            how = f"registers no runtime running {RUNTIME_EXECUTABLE}"
        return Check("containerd", "config-owner", WARN, f"{view.path} looks rendered by kubespray's config.toml.j2 "
                     f"(version, root, state, oom_score first): {how}",
                     "edit the kubespray inventory, not config.toml (every playbook run rewrites it): add the runtime "
                     'to containerd_additional_runtimes (type "io.containerd.runc.v2", options.BinaryName the '
                     "absolute path of cdi-shim-runtime), and, since kubespray's template writes no "
                     f"container_annotations, rerun {INSTALL} --drop-in after each playbook run")
    return None
