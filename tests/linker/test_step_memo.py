"""The memo of whole linker steps (shim.linker.stepmemo), which the runtime's resident workers
use: the first container's step is kept as a recipe file (written by C, csrc/engine/recipe.c),
and a container of an image and spec seen before gets it applied by the C replay
(csrc/engine/replay.c) -- its links, bundle and root files, mounts and hooks -- once every path
the step looked at is found unchanged in its own root; the result must be what the Python step
itself gives (a third container, no memo). Any change the step depends on (a path in the root,
a host file, the params file, the devices) makes the whole step run again. Containers are
overlay mounts of one layer, as containerd makes them."""
import json
import os
import subprocess
import time

import pytest

from ldcache_helpers import build_library, fake_driver, roots
from shim.ldconfig import ldcache
from shim.linker import container, stepmemo
from tests.helpers import file_memo
from shim.linker.toolkit_hooks import PARAMS_ENV
from test_file_memo import overlay_mounts
from test_plan_memo import _replace_cache

LIBDIR = "/usr/lib/x86_64-linux-gnu"
HOOK = "/usr/bin/nvidia-cdi-hook"
PARAMS = "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\nDeviceFileMode: 438\n"
REPLAYED = "linker step: the one of an earlier container of these files and spec, replayed by C"


class Log:
    debug_enabled = True

    def __init__(self):
        self.lines = []

    def debug(self, message):
        self.lines.append(("debug", message))

    def warning(self, message):
        self.lines.append(("warning", message))

    def error(self, message):
        self.lines.append(("error", message))

    def replayed(self):
        return any(REPLAYED in message for _, message in self.lines)


@pytest.fixture
def steps(scratch):
    """A worker's memo of steps (its recipes in a private folder), a plan memo in use (the plans
    say what they looked at), the file memo off, files trusted however new (the settle rule is
    the plan memo's, tested there)."""
    with file_memo(False), ldcache.PlanMemo().using():
        folder = os.path.join(scratch, "run")
        os.makedirs(folder, mode=0o700)
        yield stepmemo.StepMemo(os.path.join(folder, "steps"))


def recipes(memo):
    return sorted(name for name in os.listdir(memo.directory) if not name.startswith(".")) \
        if os.path.isdir(memo.directory) else []


@pytest.fixture
def world(host_tree, scratch, monkeypatch):
    """An image layer, a fake driver on the host, and a params file the step must rewrite."""
    lower = roots.copy_tree(host_tree, os.path.join(scratch, "layer"))
    made = fake_driver(os.path.join(scratch, "driver"), names=("cuda", "nvidia-ml"))
    params = os.path.join(scratch, "params")
    with open(params, "w") as out:
        out.write(PARAMS)
    monkeypatch.setenv(PARAMS_ENV, params)
    return {"lower": lower, "driver": made, "params": params, "scratch": scratch}


def _hook(*args):
    return {"path": HOOK, "args": [os.path.basename(HOOK), *args], "env": ["NVIDIA_CTK_DEBUG=false"]}


def config_for(world, rootfs, minor=0):
    """A config as containerd's own CDI writes it for a toolkit-generated spec: the driver
    mounts, /dev/nvidiaMINOR and the six hooks."""
    mounts = [{"destination": "/proc", "type": "proc", "source": "proc"},
              {"destination": "/etc/hosts", "type": "bind", "source": "/etc/hosts", "options": ["rbind", "ro"]}]
    mounts += [{"destination": f"{LIBDIR}/{os.path.basename(path)}", "type": "bind", "source": path,
                "options": ["ro", "nosuid", "nodev", "bind"]} for path in world["driver"].values()]
    return {"ociVersion": "1.0.2", "root": {"path": rootfs},
            "mounts": mounts,
            "hooks": {"prestart": [{"path": "/usr/bin/true"}],
                      "createContainer": [_hook("create-symlinks", "--link", f"libcuda.so.1::{LIBDIR}/libcuda.so"),
                                          _hook("enable-cuda-compat", "--host-driver-version=550.54.15"),
                                          _hook("update-ldcache", "--folder", LIBDIR),
                                          _hook("disable-device-node-modification"),
                                          _hook("update-application-profile")]},
            "linux": {"devices": [{"path": f"/dev/nvidia{minor}", "type": "c", "major": 195, "minor": minor}]}}


def step(world, rootfs, bundle, memo=None, minor=0, config=None):
    """(the new config, its bundle files, the links and linker files in the rootfs, the log) of one
    container: the C replay of MEMO's recipe when one holds, else the Python step (kept by MEMO
    when given; none: no memo); paths of this container written as ROOTFS and BUNDLE, so that two
    containers compare."""
    os.makedirs(bundle, exist_ok=True)
    log = Log()
    config = config or config_for(world, rootfs, minor)
    raw = json.dumps(config).encode()
    with open(os.path.join(bundle, "config.json"), "wb") as out:
        out.write(raw)
    if memo is not None and memo.replay(raw, bundle, 0o600):
        log.debug(REPLAYED)
        with open(os.path.join(bundle, "config.json")) as f:
            out = json.load(f)
    else:
        out = container.isolate_hooks(container.prepare_linker(config, bundle, log, raw=raw, memo=memo))
    text = json.dumps(out, sort_keys=True).replace(rootfs, "ROOTFS").replace(os.path.abspath(bundle), "BUNDLE")
    files = {name: (open(os.path.join(bundle, name), "rb").read(), oct(os.stat(os.path.join(bundle, name)).st_mode))
             for name in sorted(os.listdir(bundle)) if name != "config.json"}
    link = os.path.join(rootfs, LIBDIR.lstrip("/"), "libcuda.so")
    links = {f"{LIBDIR}/libcuda.so": os.readlink(link)} if os.path.islink(link) else {}
    return json.loads(text), files, dict(links, **linker_files(rootfs)), log


def linker_files(rootfs):
    """{path: (bytes, mode)} of the linker files under the root's /etc (the cache, ld.so.conf,
    the drop-ins): the step writes them there, as the toolkit's update-ldcache leaves them."""
    etc = os.path.join(rootfs, "etc")
    names = ["ld.so.cache", "ld.so.conf"]
    if os.path.isdir(etc + "/ld.so.conf.d"):
        names += [f"ld.so.conf.d/{n}" for n in sorted(os.listdir(etc + "/ld.so.conf.d"))]
    return {f"/etc/{name}": (open(f"{etc}/{name}", "rb").read(), os.stat(f"{etc}/{name}").st_mode)
            for name in names if os.path.isfile(f"{etc}/{name}")}


def test_a_second_container_replays_the_first_ones_step(world, steps):
    with overlay_mounts(world["lower"], world["scratch"], 3) as (first, second, third):
        scratch = world["scratch"]
        one = step(world, first, f"{scratch}/b1", steps)
        assert not one[3].replayed() and not [line for line in one[3].lines if line[0] != "debug"]
        two = step(world, second, f"{scratch}/b2", steps)
        assert two[3].replayed()
        fresh = step(world, third, f"{scratch}/b3")
        assert not fresh[3].replayed()
        assert two[:3] == fresh[:3] == one[:3]
        new, files, links, _ = two
        # what the step does, all there: hooks dropped (ours binds the params file), the
        # profile bound from the bundle, the link made in the rootfs, the cache and the
        # drop-ins written in the root as the hook's ldconfig leaves them (no cache bound)
        assert [hook["args"][:2] for hook in new["hooks"]["createContainer"]] == [["cdi-shim-nshook", "bind-params"]]
        assert [hook["path"] for hook in new["hooks"]["prestart"]] == ["/usr/bin/true"]
        assert new["mounts"][-1]["destination"] == "/etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf"
        assert "/etc/ld.so.cache" not in [m["destination"] for m in new["mounts"]]
        assert not [name for name in files if name.startswith("cdi-shim.ld")]
        assert b"ModifyDeviceFiles: 0" in files["cdi-shim.nvidia-params"][0]
        assert links.pop(f"{LIBDIR}/libcuda.so") == "libcuda.so.1"
        assert links["/etc/ld.so.cache"][0] != open(os.path.join(world["lower"], "etc/ld.so.cache"), "rb").read()
        assert links["/etc/ld.so.conf.d/zz-nvcr-cdi-shim.conf"][1] == 0o100644


def _compat_libraries(rootfs):
    os.makedirs(os.path.join(rootfs, "usr/local/cuda/compat"))
    build_library(os.path.join(rootfs, "usr/local/cuda/compat/libcuda.so.560.28.03"), "libcuda.so.1")


def _link_target_appears(rootfs):
    build_library(os.path.join(rootfs, LIBDIR.lstrip("/"), "libcuda.so.1"), "libcuda.so.1")


def _cache_place_taken(rootfs):
    os.unlink(os.path.join(rootfs, "etc/ld.so.cache"))
    os.mkdir(os.path.join(rootfs, "etc/ld.so.cache"))


IN_ROOT = {"compat-libraries-appear": _compat_libraries, "a-link-target-appears": _link_target_appears,
           "the-image-cache-replaced": _replace_cache, "the-cache-place-a-directory": _cache_place_taken}


@pytest.mark.parametrize("change", sorted(IN_ROOT))
def test_a_changed_root_runs_the_whole_step(world, steps, change):
    with overlay_mounts(world["lower"], world["scratch"], 3) as (first, second, third):
        scratch = world["scratch"]
        step(world, first, f"{scratch}/b1", steps)
        time.sleep(0.01)
        for rootfs in (second, third):
            IN_ROOT[change](rootfs)
        if change == "the-cache-place-a-directory":
            with pytest.raises(container.NoPlaceForCache):
                step(world, second, f"{scratch}/b2", steps)
            return
        two = step(world, second, f"{scratch}/b2", steps)
        assert not two[3].replayed()
        assert two[:3] == step(world, third, f"{scratch}/b3")[:3]


def _driver_file_replaced(world):
    path = world["driver"]["libcuda.so.1"]
    build_library(path + ".new", "libcuda.so.7")
    os.rename(path + ".new", path)


def _params_already_safe(world):
    with open(world["params"], "w") as out:
        out.write(PARAMS.replace("ModifyDeviceFiles: 1", "ModifyDeviceFiles: 0"))


ON_THE_HOST = {"a-driver-file-replaced": _driver_file_replaced, "the-params-file-changed": _params_already_safe}


@pytest.mark.parametrize("change", sorted(ON_THE_HOST))
def test_a_changed_host_runs_the_whole_step(world, steps, change):
    with overlay_mounts(world["lower"], world["scratch"], 3) as (first, second, third):
        scratch = world["scratch"]
        one = step(world, first, f"{scratch}/b1", steps)
        time.sleep(0.01)
        ON_THE_HOST[change](world)
        two = step(world, second, f"{scratch}/b2", steps)
        assert not two[3].replayed()
        assert two[:3] == step(world, third, f"{scratch}/b3")[:3]
        assert two[:3] != one[:3]     # (the params file, or the cache in the root)


def test_other_devices_are_another_step(world, steps):
    with overlay_mounts(world["lower"], world["scratch"], 2) as (first, second):
        scratch = world["scratch"]
        one = step(world, first, f"{scratch}/b1", steps, minor=0)
        two = step(world, second, f"{scratch}/b2", steps, minor=3)
        assert not two[3].replayed()
        assert one[1]["cdi-shim.application-profile.conf"] != two[1]["cdi-shim.application-profile.conf"]


def test_a_step_that_warned_or_ran_chmod_is_not_kept(world, steps):
    with overlay_mounts(world["lower"], world["scratch"], 2) as (first, second):
        os.makedirs(os.path.join(first, "dev/dri"))
        config = config_for(world, first)
        config["hooks"]["createContainer"].append(_hook("chmod", "--mode", "755", "--path", "/dev/dri"))
        os.makedirs(os.path.join(world["scratch"], "b1"))
        container.prepare_linker(config, os.path.join(world["scratch"], "b1"), Log(), memo=steps)
        assert recipes(steps) == [] and steps.why
        # a read-only root whose cache cannot be written into the bundle (a directory in its
        # place, a read-only mount where the /etc overlay's folder goes): the step warns and
        # keeps the update-ldcache hook, whose program (here) is on the host
        config = config_for(world, second)
        config["root"]["readonly"] = True
        config["hooks"]["createContainer"] = [dict(_hook("update-ldcache", "--folder", LIBDIR), path="/bin/true")]
        bundle = os.path.join(world["scratch"], "b2")
        os.makedirs(os.path.join(bundle, "cdi-shim.ld.so.cache"))
        in_the_way = os.path.join(bundle, "cdi-shim.etc")
        os.makedirs(in_the_way)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", in_the_way], check=True)
        try:
            log = Log()
            out = container.prepare_linker(config, bundle, log, memo=steps)
        finally:
            subprocess.run(["umount", in_the_way], check=True)
        assert [level for level, _ in log.lines if level != "debug"] == ["warning"]
        assert out["hooks"]["createContainer"][0]["path"] == "/bin/true"
        assert recipes(steps) == [] and steps.why == "it warned"


def test_a_kept_step_is_one_private_recipe_file(world, steps):
    """The recipe goes into a folder of ours (0700) as a file of ours (0600), named by the config's
    key; without a memo (a process that is no worker) nothing is kept."""
    with overlay_mounts(world["lower"], world["scratch"], 2) as (first, second):
        step(world, first, f"{world['scratch']}/b1")
        assert not os.path.exists(steps.directory)
        step(world, second, f"{world['scratch']}/b2", steps)
        (name,) = recipes(steps)
        raw = json.dumps(config_for(world, second)).encode()
        assert name == f"{stepmemo.lib.cds_fnv1a(stepmemo.step_key_of(raw), len(stepmemo.step_key_of(raw))):016x}"
        assert os.stat(steps.directory).st_mode & 0o777 == 0o700
        assert os.stat(os.path.join(steps.directory, name)).st_mode & 0o777 == 0o600


def test_two_images_of_one_config_alternate_on_one_recipe(world, steps):
    """One config key, two images (the key holds no root): each image's step is a variant of the
    one recipe file, the newest first, up to four; a container of either image is replayed,
    and gives what the Python step gives."""
    scratch = world["scratch"]
    other = roots.copy_tree(world["lower"], os.path.join(scratch, "layer-b"))    # (other files: other inodes)
    with overlay_mounts(world["lower"], scratch + "/a", 4) as a, overlay_mounts(other, scratch + "/b", 4) as b:
        made = [step(world, rootfs, f"{scratch}/b{n}", steps) for n, rootfs in enumerate([a[0], b[0], a[1], b[1]])]
        assert [m[3].replayed() for m in made] == [False, False, True, True]
        assert len(recipes(steps)) == 1
        assert made[2][:3] == made[0][:3] and made[3][:3] == made[1][:3]
        fresh = [step(world, rootfs, f"{scratch}/f{n}") for n, rootfs in enumerate([a[2], b[2]])]
        assert fresh[0][:3] == made[0][:3] and fresh[1][:3] == made[1][:3]
        # (a root of neither image: a third variant, first; the two others still replayed after it)
        os.makedirs(os.path.join(a[3], "usr/local/cuda/compat"))
        assert not step(world, a[3], f"{scratch}/b4", steps)[3].replayed()
        assert step(world, b[3], f"{scratch}/b5", steps)[3].replayed()
    with overlay_mounts(world["lower"], scratch + "/c", 1) as (again,):
        assert step(world, again, f"{scratch}/b6", steps)[3].replayed()


# ---- the front end's key of a step (csrc/engine/ociconf.c), through the worker's binding ----

CONFIG = {"ociVersion": "1.0.2", "root": {"path": "rootfs"}, "annotations": {"a": "b"},
          "process": {"env": ["PATH=/bin"]},
          "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
                     {"destination": f"{LIBDIR}/libcuda.so.550", "source": "/host/libcuda.so.550", "type": "bind"}],
          "hooks": {"createContainer": [{"path": HOOK, "args": ["nvidia-cdi-hook", "update-ldcache"]}]},
          "linux": {"devices": [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}]}}


def key_of(config=CONFIG, text=None):
    text = text or json.dumps(config)
    return stepmemo.step_key_of(text if isinstance(text, bytes) else text.encode())


def test_the_key_holds_what_the_step_reads_and_nothing_else():
    key = key_of()
    # (not "proc": no library there)
    assert key and b"update-ldcache" in key and b"/host/libcuda.so.550" in key and b'"source": 0' in key
    same = json.loads(json.dumps(CONFIG))
    same["annotations"]["other"] = "x"
    same["process"]["env"].append("HOME=/")
    same["mounts"][0]["source"] = "elsewhere"          # not a library: its source is not read
    same["root"]["path"] = "/other/rootfs"
    assert key_of(same) == key
    for change in (lambda c: c["mounts"][1].update(source="/host/other.so.1"),
                   lambda c: c["mounts"][0].update(destination="/proc2"),
                   lambda c: c["mounts"].append({"destination": "/x", "source": "/y"}),
                   lambda c: c["hooks"]["createContainer"][0]["args"].append("--folder=/x"),
                   lambda c: c["linux"]["devices"][0].update(minor=1),
                   # each mount whole (issue 31): a library mount's options and type, any mount's options
                   lambda c: c["mounts"][1].update(options=["ro", "rbind"]),
                   lambda c: c["mounts"][1].update(type="none"),
                   lambda c: c["mounts"][0].update(options=["nosuid"]),
                   # a source that names one of the step's own bundle files (it may move it)
                   lambda c: c["mounts"][0].update(source="/b/cdi-shim.ld.so.cache"),
                   # the user and mount namespaces, the id mappings
                   lambda c: c["linux"].update(namespaces=[{"type": "user"}]),
                   lambda c: c["linux"].update(namespaces=[{"type": "mount"}]),
                   lambda c: c["linux"].update(uidMappings=[{"containerID": 0, "hostID": 1000, "size": 1}]),
                   lambda c: c["linux"].update(gidMappings=[{"containerID": 0, "hostID": 1000, "size": 1}])):
        other = json.loads(json.dumps(CONFIG))
        change(other)
        assert key_of(other) not in (None, key)


@pytest.mark.parametrize("text", [
    '{"hooks": {}, "mounts": [], "x": "\\u0000"}',                  # a \u escape of NUL
    '{"hooks": {}, "mounts": [], "x": "\\ud800"}',                  # a lone surrogate
    '{"hooks": {}, "mounts": [], "x": "\\u12"}',                    # a short one
    '{"hooks": {}, "mounts": [], "root": {"path": "r\\u006fotfs"}}',  # a \u escape in root.path
    '{"hooks": {}, "mounts": [], "linux": {"namespaces": [{"type": "\\u006dount"}]}}',
    '{"hooks": {}, "mounts": [{"destination": "/a\\u0026b"}]}',      # or in a mount's strings
    '{"hooks": {}, "mounts": [], "x": "a\\/b"}',                    # a \/ escape
    '{"hooks": {}, "mounts": [], "h\\tooks": 1}',                    # an escape in a key
    '{"hooks": {}, "hooks": {}, "mounts": []}',                       # a key twice
    '{"hooks": {}, "mounts": [], "root": {"path": "a"}, "root": {}}',
    '{"hooks": {}, "mounts": [{"destination": "/a\\tb"}]}',          # an escape in a mount's strings
    '{"hooks": {}, "mounts": [null]}',                                # a mount that is no object
    '{"hooks": {}, "mounts": [{"destination": 7}]}',
    '{"hooks": [], "mounts": []}',                                    # hooks not an object
    '{"hooks": {}, "mounts": []} x',                                  # text after it
    '{"hooks": {}, "mounts": [], "x": 01}',                           # not JSON
    '{"hooks": {}, "mounts": [], "x": "\x01"}',                       # a raw control character
    b'{"hooks": {}, "mounts": [], "x": "\xff"}',                      # not UTF-8
    '{"hooks": {}, "mounts": [], "x": ' + "[" * 600 + "]" * 600 + "}",  # too deep (CDS_OCI_MAX_DEPTH 512)
])
def test_the_key_refuses_what_it_is_not_sure_of(text):
    assert key_of(text=text) is None


def test_the_key_takes_go_escapes_as_written():
    """containerd's Go encoder writes <, > and & as \\u escapes: a config holding them elsewhere
    (a pod's command, its env) is taken; where the key holds a string, it holds it as written."""
    plain = '{"hooks": {"prestart": [{"path": "/h", "args": ["a&b"]}]}, "mounts": [], "process": {"args": ["%s"]}}'
    assert key_of(text=plain % "x && y") == key_of(text=plain % "x \\u0026\\u0026 y") is not None
    hooked = plain.replace("a&b", "a\\u0026b")
    assert key_of(text=hooked % "x") not in (None, key_of(text=plain % "x"))
    assert key_of(text='{"hooks": {}, "mounts": [], "x": "\\ud83d\\ude00 \\u2028"}')


def test_the_key_takes_plain_json():
    assert key_of(text='{"hooks": {"prestart": []}, "mounts": [], "x": [1, -2.5e3, true, false, null, "\\n\\"\\\\"]}')


def test_what_the_key_reader_takes_is_json_python_reads_alike():
    """Random edits of a config's text (bytes dropped, doubled, changed): whatever the C reader
    takes must be JSON that Python reads, with the same hooks, mounts and devices; the rest it
    refuses. (Under ASan/UBSan too: test_sanitized.py runs this directory.)"""
    import random

    draw = random.Random(11)
    text = json.dumps(CONFIG).encode()
    taken = 0
    for _ in range(3000):
        data = bytearray(text)
        for _ in range(draw.randint(1, 3)):
            at = draw.randrange(len(data))
            what = draw.randrange(3)
            if what == 0:
                del data[at]
            elif what == 1:
                data.insert(at, data[at])
            else:
                data[at] = draw.choice(b'{}[]",:\\ 0aeE.-+\x00\x1f\xc3\xff')
        key = stepmemo.step_key_of(bytes(data))
        if key is None:
            continue
        taken += 1
        parsed = json.loads(bytes(data))         # must not raise
        assert isinstance(parsed, dict) and isinstance(parsed.get("mounts", []), list)
        hooks = key[1:key.index(b"\0")]           # the key: H<hooks>\0, M<the mount>\0 a mount, ...
        assert (json.loads(hooks) if hooks else None) == parsed.get("hooks")
        assert key.count(b"\0M") == len(parsed.get("mounts", []))
    assert taken > 100


POD_NAMESPACES = [{"type": "pid"}, {"type": "ipc", "path": "/proc/4242/ns/ipc"},
                  {"type": "uts", "path": "/proc/4242/ns/uts"}, {"type": "mount"},
                  {"type": "network", "path": "/var/run/netns/cni-1"}]


def test_the_key_reads_of_a_namespace_its_type_and_only_a_user_or_mount_one_s_path():
    """A pod's container joins its sandbox's network, IPC and UTS namespaces by path: those paths
    differ pod to pod and the step reads none of them, so they must not keep the next pod's
    create from a kept step; the types, and the user and mount namespaces' paths, do count."""
    def key(namespaces):
        config = json.loads(json.dumps(CONFIG))
        config["linux"]["namespaces"] = namespaces
        return key_of(config)

    base = key(POD_NAMESPACES)
    assert base is not None
    another_pod = json.loads(json.dumps(POD_NAMESPACES).replace("4242", "777").replace("cni-1", "cni-2"))
    assert key(another_pod) == base
    for change in ([*POD_NAMESPACES, {"type": "user"}],
                   [*POD_NAMESPACES[:3], {"type": "mount", "path": "/proc/1/ns/mnt"}, POD_NAMESPACES[4]],
                   [*POD_NAMESPACES, {"type": "user", "path": "/proc/1/ns/user"}],
                   POD_NAMESPACES[:4]):
        assert key(change) not in (None, base), change
    assert key([*POD_NAMESPACES, {"type": "user", "path": "/proc/1/ns/user"}]) != \
        key([*POD_NAMESPACES, {"type": "user", "path": "/proc/2/ns/user"}])


def test_the_step_returns_all_it_did_and_leaves_its_config_alone(world, steps):
    """Recording is explicit (issue 28): the step returns what it did (stepresult.StepResult) --
    the links, the bundle and root files, the binds, the hooks -- and that is all its recipe is
    written from; the config it was given is not changed in place."""
    import copy

    from shim.linker.stepresult import StepResult

    rootfs = roots.copy_tree(world["lower"], os.path.join(world["scratch"], "root"))
    bundle = os.path.join(world["scratch"], "bundle")
    os.makedirs(bundle)
    config = config_for(world, rootfs)
    given = copy.deepcopy(config)
    calls = [call for _, call in container._hook_calls(config)]
    mounts = config["mounts"]
    libraries = {m["destination"]: m["source"] for m in mounts if container._is_library(m["destination"])}
    image_files = linker_files(rootfs)
    with StepResult(Log(), config, observe=True) as out:
        container._step(out, bundle, rootfs, calls, mounts, libraries, time.monotonic())
    assert config == given, "the step changed the config it was given"
    assert not out.warnings and not out.refused
    assert ("libcuda.so.1", f"{LIBDIR}/libcuda.so") in out.links
    assert all(os.path.islink(rootfs + link) and os.readlink(rootfs + link) == target for target, link in out.links)
    assert sorted(out.files) == sorted(os.path.join(os.path.abspath(bundle), name) for name in os.listdir(bundle))
    now = linker_files(rootfs)
    assert {path for path, value in now.items() if image_files.get(path) != value} <= {p for p, _, _ in out.root_files}
    assert all(now[path][0] == data for path, data, _ in out.root_files) and out.root_files
    assert [destination for destination, _ in out.binds] == \
        [m["destination"] for m in out.config["mounts"] if m.get("source", "").startswith(os.path.abspath(bundle))]
    # the hooks: the prestart hook kept as it was, each toolkit hook dropped or replaced by ours
    hooks = out.config["hooks"]
    assert hooks["prestart"] == config["hooks"]["prestart"]
    assert not any("nvidia-cdi-hook" in json.dumps(hook) for hook in hooks.get("createContainer", ()))
    assert steps.keep(b"key", out, rootfs, bundle, False, container.isolate_hooks(out.config)) == ""
    assert len(recipes(steps)) == 1


def test_one_key_for_the_worker_and_the_front_end():
    """The worker keeps a step under the front end's key of the config's bytes (cds_step_key,
    computed once), whether it was given the bytes or only the parsed config (written out):
    the two cannot drift. And which mount's source the key holds (a library destination) is
    the step's own rule of what a library is (container._is_library, ociconf.c library_named)."""
    from shim import fastjson

    assert stepmemo.step_key_of(fastjson.dumpb(CONFIG)) is not None
    for name in ("libcuda.so", "libcuda.so.1", "libnvidia-ml.so.550.54.15", "libGLX_indirect.so.0", "lib.so",
                 "libx.so.", "libso", "libcuda.sox", "cuda.so.1", "libcuda.so1", "libc.so.6.bak", "ld-linux.so.2",
                 "nvidia_icd.json", "libcuda.so.1/", "libx.soso.1", "libnvidia-egl-gbm.so.1.1.2"):
        config = {"hooks": {}, "mounts": [{"destination": f"{LIBDIR}/{name}", "source": "/host/marker"}]}
        held = b"/host/marker" in stepmemo.step_key_of(json.dumps(config).encode())
        assert held == container._is_library(f"{LIBDIR}/{name}"), name


def test_our_own_young_write_is_trusted_under_another_spelling(tmp_path):
    """A file our step wrote is young for the settle window; it is trusted while it shows the
    identity the step left (stepleft.trusted), under any spelling of its place: the note names
    it as the mount does (/usr/lib/x86_64-linux-gnu/...), the planner reads it through merged
    /usr's link (/lib/x86_64-linux-gnu/...). A file another writer changed is not trusted, and
    stays too new."""
    from shim._native import ffi, lib
    from shim.linker.stepleft import identify

    root = str(tmp_path / "root")
    os.makedirs(root + "/usr/lib/x86_64-linux-gnu")
    os.symlink("usr/lib", root + "/lib")
    ours = root + "/usr/lib/x86_64-linux-gnu/libx.so.1"
    os.symlink("libx.so.550", ours)
    noted, read = b"n/usr/lib/x86_64-linux-gnu/libx.so.1", b"n/lib/x86_64-linux-gnu/libx.so.1"
    with file_memo(True, settle=60):     # (everything made just now is young)
        started = lib.cds_memo_clock_ns()
        left = identify(root, [noted])
        trusted = {noted: bytes(ffi.buffer(left, ffi.sizeof("struct cds_identity")))}
        assert identify(root, [read], started) is None                    # young, and not known as ours
        assert identify(root, [read], started, trusted) is not None       # ours, under the other spelling
        os.unlink(ours)
        os.symlink("libx.so.551", ours)                                   # another writer's, as young
        assert identify(root, [read], started, trusted) is None
