"""The request key covers every field of config.json the injection reads (issue 43, findings 2
and 3: a recipe keyed without process.user or linux.namespaces gave a pod another pod's device
owner, and a user-namespaced container mounts without idmap).

The fields the key covers are listed once, in csrc/engine/request.c (cds_request_key_fields).
Here the injection's Python -- the request's resolution (shim/runtime/requests.py), apply_edits
(cdi/container_edits.py), the trim of what was there before, the choice of a step and, with
none, the hooks' explicit env (shim/runtime/main.py, shim/linker/container.py) -- runs on a
config whose every object, array, string and number records its use, and each field read must
be one the list covers; and each field the list names must change the key when it changes. A
new read of the config in any of them fails here until the key covers it."""
import copy

import pytest

from cdi.container_edits import apply_edits, merge_edits
from shim.config import Config
from shim.linker.container import isolate_hooks, needs_step
from shim.runtime import injected
from shim.runtime.main import once
from shim.runtime.requests import DEVICE_MOUNT_ROOT, collect_requests, drop_legacy_hook

# A config holding each field the injection could read, every list with an element.
CONFIG = {
    "ociVersion": "1.0.2",
    "process": {
        "terminal": False,
        "user": {"uid": 1000, "gid": 1000, "additionalGids": [5, 1000], "umask": 18},
        "args": ["sh", "-c", "true"],
        "env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0", "GPU_INDEX=9"],
        "cwd": "/",
        "capabilities": {"bounding": ["CAP_CHOWN", "CAP_SYS_ADMIN"], "effective": ["CAP_CHOWN"]},
        "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
        "noNewPrivileges": True,
        "apparmorProfile": "unconfined",
        "oomScoreAdj": 5,
    },
    "root": {"path": "rootfs", "readonly": True},
    "hostname": "pod",
    "mounts": [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=755"]},
        {"destination": "/mounted/file", "type": "bind", "source": "/etc/hostname", "options": ["bind", "ro"]},
        {"destination": "/usr/lib/libcuda.so.1", "type": "tmpfs"},
        {"destination": DEVICE_MOUNT_ROOT + "GPU-1", "type": "bind", "source": "/dev/null", "options": ["bind"]},
    ],
    "hooks": {"prestart": [{"path": "/usr/bin/true", "args": ["true"]}],
              "createContainer": [{"path": "/usr/bin/true", "args": ["true", "x"], "timeout": 5}]},
    "annotations": {"cdi.k8s.io/gpu": "nvidia.com/gpu=0", "io.kubernetes.pod.name": "pod"},
    "linux": {
        "uidMappings": [{"containerID": 0, "hostID": 100000, "size": 65536}],
        "gidMappings": [{"containerID": 0, "hostID": 100000, "size": 65536}],
        "namespaces": [{"type": "pid"}, {"type": "network", "path": "/var/run/netns/cni-1"}, {"type": "user"}],
        "devices": [{"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229, "fileMode": 438}],
        "resources": {"devices": [{"allow": False, "access": "rwm"}], "memory": {"limit": 1024}},
        "netDevices": {"eth9": {"name": "eth9"}},
        "maskedPaths": ["/proc/kcore"],
        "readonlyPaths": ["/proc/sys"],
        "seccomp": {"defaultAction": "SCMP_ACT_ALLOW"},
        "cgroupsPath": "/pod",
        "sysctl": {"net.ipv4.ip_forward": "1"},
    },
}

# Edits of every category: a node without owner (the user's is given), one named like the
# config's, a net device, bind mounts (one replacing the config's), hooks, intelRdt, gids.
EDITS = {
    "env": ["NVIDIA_VISIBLE_DEVICES=void", "GPU_INDEX=0"],
    "deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/dev/null", "fileMode": 384},
                    {"path": "/dev/fuse", "hostPath": "/dev/null", "permissions": "rw"}],
    "netDevices": [{"hostInterfaceName": "gpu0", "name": "net0"}],
    "mounts": [{"hostPath": "/etc/hostname", "containerPath": "/usr/lib/libnvidia-ml.so.1", "options": ["ro", "bind"]},
               {"hostPath": "/etc/hostname", "containerPath": "/mounted/file", "options": ["rbind"]}],
    "hooks": [{"hookName": "createContainer", "path": "/usr/bin/cdi-shim-hook", "args": ["x", "update-ldcache"]}],
    "intelRdt": {"closID": "gpu"},
    "additionalGids": [44, 5],
}


def key_field_names():
    """The key's fields as request.c lists them ("process.env[]")."""
    text = injected.ffi.string(injected.lib.cds_request_key_fields()).decode()
    return [line.split(" ", 1)[0] for line in text.splitlines()]


def steps(name):
    """A field's path as a tuple of steps: "process.env[]" is ("process", "env", "[]")."""
    return tuple(name.replace("[]", ".[]").split("."))


def key_fields():
    return [steps(name) for name in key_field_names()]


class Reads:
    def __init__(self):
        self.paths = set()

    def note(self, path):
        self.paths.add(path)


class _Object(dict):
    """An object of the config that notes each member looked up (copied by dict(): not a read)."""

    def __init__(self, items, path, reads):
        super().__init__(items)
        self._path, self._reads = path, reads

    def get(self, key, default=None):
        self._reads.note(self._path + (key,))
        return super().get(key, default)

    def __getitem__(self, key):
        self._reads.note(self._path + (key,))
        return super().__getitem__(key)

    def __contains__(self, key):
        self._reads.note(self._path + (key,))
        return super().__contains__(key)

    def keys(self):
        self._reads.note(self._path + ("*",))
        return super().keys()

    def items(self):
        self._reads.note(self._path + ("*",))
        return super().items()

    def values(self):
        self._reads.note(self._path + ("*",))
        return super().values()


class _Array(list):
    """An array of the config that notes an element looked up or searched for (copied by list()
    or walked: not a read; each element notes its own use)."""

    def __init__(self, items, path, reads):
        super().__init__(items)
        self._path, self._reads = path, reads

    def __getitem__(self, index):
        self._reads.note(self._path + ("[]",))
        return super().__getitem__(index)

    def __contains__(self, value):
        self._reads.note(self._path)
        return super().__contains__(value)

    def index(self, *args):
        self._reads.note(self._path)
        return super().index(*args)

    def count(self, value):
        self._reads.note(self._path)
        return super().count(value)


def _noting(base, names):
    """A subclass of BASE whose methods NAMES note the value's path, then do what BASE does."""
    def method(name):
        inner = getattr(base, name)

        def noted(self, *args, **kwargs):
            self._reads.note(self._path)
            return inner(self, *args, **kwargs)
        return noted

    def new(cls, value, path, reads):
        made = base.__new__(cls, value)
        made._path, made._reads = path, reads
        return made
    return type(f"_Noting{base.__name__}", (base,), {"__new__": new, **{name: method(name) for name in names}})


_COMPARED = ["__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__", "__format__", "__str__"]
_String = _noting(str, _COMPARED + [
    "__len__", "__contains__", "__getitem__", "__iter__", "__add__", "__mod__", "startswith", "endswith",
    "partition", "rpartition", "split", "rsplit", "strip", "lstrip", "rstrip", "find", "rfind", "index", "count",
    "lower", "upper", "replace", "encode", "join", "splitlines", "isdigit"])
_Number = _noting(int, _COMPARED + [
    "__bool__", "__index__", "__int__", "__float__", "__add__", "__radd__", "__sub__", "__rsub__", "__mul__",
    "__and__", "__or__", "__xor__", "__lshift__", "__rshift__", "__mod__", "__floordiv__", "__truediv__"])


def noting(value, reads, path=()):
    """VALUE (a config) made of objects, arrays, strings and numbers that note their use in READS,
    by path: members by name, array elements as "[]"."""
    if isinstance(value, dict):
        return _Object(((k, noting(v, reads, path + (k,))) for k, v in value.items()), path, reads)
    if isinstance(value, list):
        return _Array((noting(v, reads, path + ("[]",)) for v in value), path, reads)
    if isinstance(value, str):
        return _String(value, path, reads)
    if isinstance(value, int) and not isinstance(value, bool):
        return _Number(value, path, reads)
    return value       # (true, false, null: nothing can note their use; no field's whole is one)


def covered(path, fields):
    """Whether a read at PATH is one the key covers: in a field's value, or on the way to one."""
    for field in fields:
        steps = min(len(path), len(field))
        if all(f == p or f == "*" for f, p in zip(field[:steps], path[:steps])):
            return True
    return False


def _settings():
    return Config(text=b"", accept_env_unprivileged=False)


def inject(config, edits):
    """What a create asking for devices reads of CONFIG: the request's resolution, the edits
    applied, the trim of what was there before, the choice of a step and, with none, the hooks'
    explicit env."""
    config, legacy_hook = drop_legacy_hook(config)
    collect_requests(config, _settings(), legacy_hook=legacy_hook)
    edited = once(config, apply_edits(config, merge_edits([edits])))
    # (with no step to do, the config written is this: the step's own key covers the rest)
    return isolate_hooks(edited) if not needs_step(edited) else edited


# Each category alone as well as all together: an object copied for an earlier edit would hide
# a later edit's look-up in it.
CASES = [EDITS] + [{category: value} for category, value in EDITS.items()]


def test_the_injection_reads_only_fields_the_request_key_covers():
    fields = key_fields()
    reads = Reads()
    for edits in CASES:
        config = noting(copy.deepcopy(CONFIG), reads)
        expected = inject(copy.deepcopy(CONFIG), edits)
        made = inject(config, edits)
        seen = set(reads.paths)
        assert made == expected, "the noting config changed what the injection does"
        reads.paths = seen
    # (what finding 2 and 3 read: the noting works)
    assert {("process", "user", "uid"), ("linux", "namespaces", "[]", "type"), ("process", "env", "[]"),
            ("mounts", "[]", "destination"), ("annotations", "cdi.k8s.io/gpu")} <= reads.paths, reads.paths
    missed = sorted(".".join(path) for path in reads.paths if not covered(path, fields))
    assert not missed, (f"the injection reads {', '.join(missed)} of config.json, which the request key does not "
                        "cover: add each to key_fields and to cds_request_key (csrc/engine/request.c)")


def _changed(value):
    """VALUE changed: a string prefixed (an env entry gets another name), a number moved, an
    object with one more member, an array with one more element."""
    if isinstance(value, str):
        return "x" + value
    if isinstance(value, bool) or value is None:
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, dict):
        return dict(value, cdiShimTest=1)
    return list(value) + [copy.deepcopy(value[0]) if value else "x"]


def _places(config, field, at=()):
    """The paths in CONFIG that FIELD's pattern names."""
    if not field:
        yield at
        return
    step, rest = field[0], field[1:]
    if step == "[]" and isinstance(config, list):
        for index, element in enumerate(config):
            yield from _places(element, rest, at + (index,))
    elif step == "*" and isinstance(config, dict):
        for name, member in config.items():
            yield from _places(member, rest, at + (name,))
    elif isinstance(config, dict) and step in config:
        yield from _places(config[step], rest, at + (step,))


def _key(config):
    return injected.key(injected.fastjson.dumpb(config), _settings())


@pytest.mark.parametrize("field", key_field_names())
def test_each_field_the_key_lists_changes_the_key(field):
    """The list is not words only: changing the field (at one place of it, at least) changes the key
    cds_request_key computes (where it holds a field in part -- the requesting annotations, env
    names, sources under the device-plugin folder -- the other places may leave it)."""
    base = _key(CONFIG)
    assert base is not None
    places = list(_places(CONFIG, steps(field)))
    assert places, f"the sample config has no {field}"
    changed = []
    for place in places:
        config = copy.deepcopy(CONFIG)
        parent = config
        for step in place[:-1]:
            parent = parent[step]
        parent[place[-1]] = _changed(parent[place[-1]])
        changed.append(_key(config) != base)
    assert any(changed), f"cds_request_key is the same whatever {field} holds"


def test_the_user_and_the_user_namespace_are_in_the_key():
    """Findings 2 and 3 directly: another uid, a user namespace added, are other keys; a pod's own
    network namespace path is not (each pod has its own: the recipe must still serve them)."""
    base = _key(CONFIG)
    other_user = copy.deepcopy(CONFIG)
    other_user["process"]["user"]["uid"] = 2000
    no_user_namespace = copy.deepcopy(CONFIG)
    del no_user_namespace["linux"]["namespaces"][2]
    another_pod = copy.deepcopy(CONFIG)
    another_pod["linux"]["namespaces"][1]["path"] = "/var/run/netns/cni-2"
    assert _key(other_user) != base and _key(no_user_namespace) != base
    assert _key(another_pod) == base
