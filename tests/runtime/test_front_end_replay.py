"""The front end replays a linker step a resident worker kept (csrc/engine/replay.c; the
recipe: written by csrc/engine/recipe.c from the step's result, shim/linker/stepmemo.py).

Containers of one image -- overlay mounts of one layer, as containerd makes them -- each get a
config.json as containerd's own CDI writes it for a toolkit-generated spec (the six hooks,
program absent). The first goes through the worker, which does the step, keeps it and writes
its recipe beside its socket; the next is done by the front end alone (no request reaches the
worker), and its result -- config.json, the bundle files, the links -- is the one the Python
step gives a third container; its program links and runs. A recipe that is not surely ours, or
a root or host that changed, leaves the work to the worker."""
import json
import os
import shutil
import subprocess

import pytest

import runtime_helpers as rh
from cdi_shim_lab.images import build_driver_libraries
from tests.helpers import native_programs, python_prefix
from test_runtime_resident import debug_world, served_lines, start_server
from test_runtime_toolkit_hooks import LIBDIR, PARAMS, _image, preinject, toolkit_spec


class Image:
    """A world with a one-worker resident server, the toolkit's spec and an image layer."""

    def __init__(self, world, driver, tmp_path, params=None, more_libraries=(), extra_hooks="", spec=None,
                 layer_dirs=()):
        self.world, self.tmp_path, self.mounts = world, tmp_path, []
        self.socket = os.path.join(world.base, "run", "runtime.sock")
        self.steps = os.path.join(world.base, "run", "steps")
        self.params = params
        self.server = start_server(world, self.socket, workers=1, settle=0)    # files trusted however new
        world.resident_socket = self.socket
        self.log = debug_world(world)
        # (EXTRA_HOOKS first, where the toolkit writes its create-symlinks hooks)
        spec = spec or toolkit_spec(world, driver).replace("  hooks:\n", "  hooks:\n" + extra_hooks, 1)
        world.write_spec("nvidia-gpu.yaml", spec + "".join(
            f"    - hostPath: {path}\n      containerPath: {LIBDIR}/{os.path.basename(path)}\n"
            "      options: [ro, nosuid, nodev, rbind, rprivate]\n" for path in more_libraries))
        image = world.bundle(tag="image")
        _image(image, driver, str(tmp_path), compat=False)
        self.layer = image.rootfs
        for path in layer_dirs:
            os.makedirs(self.layer + path, exist_ok=True)

    def env(self):
        return self.world.env(CDI_SHIM_NVIDIA_PARAMS=self.params or str(self.tmp_path / "no-such-params"))

    def container(self, args=("/prog",), change=None, asking=False):
        """A new container of the image: its bundle, its config pre-injected (then CHANGE(config)),
        or ASKING for the device by annotation instead."""
        n = len(self.mounts)
        upper, work, merged = (str(self.tmp_path / f"c{n}" / d) for d in ("upper", "work", "rootfs"))
        for d in (upper, work, merged):
            os.makedirs(d)
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir={self.layer},upperdir={upper},workdir={work}", merged], check=True)
        self.mounts.append(merged)
        bundle = self.world.bundle(args=list(args), edit=lambda config: config["root"].update(path=merged),
                                   annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=0"} if asking else None)
        bundle.rootfs = merged
        if asking:
            return bundle
        config = preinject(self.world, bundle)
        if change is not None:
            change(config)
            with open(bundle.config_path, "w") as out:
                json.dump(config, out)
        return bundle

    def served(self):
        return len(served_lines(self.log))

    def close(self):
        self.server.terminate()
        self.server.wait(timeout=30)
        for merged in self.mounts:
            subprocess.run(["umount", merged], check=False)


@pytest.fixture
def image(world, driver, tmp_path):
    made = Image(world, driver, tmp_path)
    yield made
    made.close()


def result(bundle):
    """config.json (parsed, this container's paths written as ROOTFS and BUNDLE), the files
    the runtime wrote into the bundle, the spec's links in the rootfs, and the linker files in
    the rootfs's /etc (bytes and mode: the cache and the drop-ins, as the hook leaves them)."""
    with open(bundle.config_path) as f:
        text = f.read()
    config = json.loads(text.replace(bundle.rootfs, "ROOTFS").replace(bundle.path, "BUNDLE"))
    files = {name: (open(os.path.join(bundle.path, name), "rb").read(),
                    os.stat(os.path.join(bundle.path, name)).st_mode)
             for name in sorted(os.listdir(bundle.path))
             if name.startswith("cdi-shim.") and os.path.isfile(os.path.join(bundle.path, name))}
    links = {name: os.readlink(os.path.join(bundle.rootfs + LIBDIR, name))
             for name in ("libcuda.so", "libnvidia-ml.so")
             if os.path.islink(os.path.join(bundle.rootfs + LIBDIR, name))}
    etc = bundle.rootfs + "/etc"
    names = ["ld.so.cache", "ld.so.conf"] + [f"ld.so.conf.d/{n}" for n in sorted(os.listdir(etc + "/ld.so.conf.d"))]
    linker = {name: (open(f"{etc}/{name}", "rb").read(), os.stat(f"{etc}/{name}").st_mode)
              for name in names if os.path.exists(f"{etc}/{name}")}
    return config, files, links, linker


def each_way(world, made, check=None, replayed=True):
    """The result of one container of MADE's image made by the Python step (the worker's, which
    keeps it as a recipe), then of one made by the C replay of that recipe (the front end's, no
    request reaching the worker): the one claim to hold, the step and the replay of its recipe
    give the same container. CHECK(how, bundle) must hold for each. REPLAYED false: the front end
    may leave it to the worker."""
    results = []
    for how in ("worker", "front end"):
        bundle = made.container()
        run = world.shim("run", "--bundle", bundle.path, bundle.id, env=made.env())
        assert run.returncode == 0 and run.stdout.startswith("linked=42"), (how, run.stderr)
        if replayed:
            assert made.served() == 1, how
        results.append(result(bundle))
        assert check is None or check(how, bundle), how
    return results


def test_a_kept_step_is_replayed_by_the_front_end(image):
    world = image.world
    first = image.container()
    run = world.shim("run", "--bundle", first.path, first.id, env=image.env())
    assert run.returncode == 0 and run.stdout.startswith("linked=42"), run.stderr
    assert image.served() == 1 and len(os.listdir(image.steps)) == 1
    assert os.stat(image.steps).st_mode & 0o777 == 0o700

    second = image.container()
    run = world.shim("run", "--bundle", second.path, second.id, env=image.env())
    assert run.returncode == 0 and run.stdout.startswith("linked=42"), run.stderr
    assert image.served() == 1, "the worker was asked: the front end did not replay the step"
    replayed = result(second)
    assert not any("nvidia-cdi-hook" in json.dumps(hook) for hook in replayed[0].get("hooks", {}).values())
    assert "/etc/ld.so.cache" not in [m["destination"] for m in replayed[0]["mounts"]]
    assert replayed[2] == {"libcuda.so": "libcuda.so.1", "libnvidia-ml.so": "libnvidia-ml.so.550.54.15"}
    # the cache and the drop-ins written in the root (the replay's write_root_files), as the hook leaves them
    assert replayed[3]["ld.so.cache"] != open(image.layer + "/etc/ld.so.cache", "rb").read()
    assert replayed[3]["ld.so.conf.d/00-nvcr-cdi-shim.conf"] == (b"/usr/lib/x86_64-linux-gnu/vdpau\n", 0o100644)
    assert "ld.so.conf.d/zz-nvcr-cdi-shim.conf" in replayed[3]
    assert not any(name.startswith("cdi-shim.ld") for name in replayed[1])

    # the same container made by the Python step alone (no resident process)
    third = image.container()
    world.resident_socket = os.path.join(world.base, "no-resident.sock")
    world.write_config(log_level="debug", log_file=image.log)
    create = world.shim("create", "--bundle", third.path, third.id, env=image.env())
    assert create.returncode == 0, create.stderr
    assert result(third) == replayed
    world.runc_cmd("delete", "--force", third.id)


def test_a_step_with_the_binds_hook_is_replayed_alike(world, driver, tmp_path):
    """With a toolkit-sized driver (sixteen libraries) the step moves the library mounts into
    our binds hook (shim/linker/filebinds.py): the worker's step and the front end's replay of
    its recipe give the same config.json, bundle files and links."""
    more = build_driver_libraries(str(tmp_path / "more"), 14, rh.need("gcc", "gcc"), "550.54.15")
    made = Image(world, driver, tmp_path, more_libraries=more)
    try:
        results = each_way(world, made)
        assert all(later == results[0] for later in results[1:])
        config = results[0][0]
        binds = config["hooks"]["createContainer"][0]["args"]
        assert binds[:4] == ["cdi-shim-nshook", "binds", "--rootfs", "ROOTFS"] and binds.count("--bind") == 17
        assert "BUNDLE/cdi-shim.ld.so.cache" not in binds and "ld.so.conf.d/00-nvcr-cdi-shim.conf" in results[0][3]
        assert not any(m["destination"].startswith(LIBDIR) for m in config["mounts"])
    finally:
        made.close()


def test_a_changed_hook_is_replayed_with_its_paths(world, driver, tmp_path):
    """On a GPU host the params hook becomes ours (cdi-shim-nshook bind-params --rootfs R
    --source B/..., folded into the binds hook as --params B/...): the replay writes this
    container's paths into it. (Here no container runs: this host has no /proc/driver/nvidia for
    the bind to cover.)"""
    params = tmp_path / "params"
    params.write_text(PARAMS)
    made = Image(world, driver, tmp_path, params=str(params))
    try:
        bundles = [made.container() for _ in range(3)]
        for n, bundle in enumerate(bundles):
            if n == 2:      # the Python step alone
                world.resident_socket = os.path.join(world.base, "no-resident.sock")
                world.write_config(log_level="debug", log_file=made.log)
            world.shim("create", "--bundle", bundle.path, bundle.id, env=made.env())  # (fails in the hook)
            if n == 1:
                assert made.served() == 1, "the front end did not replay the step"
        replayed, python = result(bundles[1]), result(bundles[2])
        assert replayed == python
        hooks = replayed[0]["hooks"]["createContainer"]     # (the params bind folded into our binds hook)
        assert [h["args"][:4] + h["args"][-2:] for h in hooks] == [["cdi-shim-nshook", "binds", "--rootfs", "ROOTFS",
                                                                    "--params", "BUNDLE/cdi-shim.nvidia-params"]]
        assert replayed[1]["cdi-shim.nvidia-params"][0] == PARAMS.replace("ModifyDeviceFiles: 1",
                                                                          "ModifyDeviceFiles: 0").encode()
        # the host's file changes: the recipe no longer holds; the worker does the step
        params.write_text(PARAMS + "DeviceFileGID: 0\n")
        fourth = made.container()
        world.resident_socket = made.socket
        world.write_config(log_level="debug", log_file=made.log)
        world.shim("create", "--bundle", fourth.path, fourth.id, env=made.env())
        assert made.served() == 3 and " in resident process " in served_lines(made.log)[-1]
        assert b"DeviceFileGID" in result(fourth)[1]["cdi-shim.nvidia-params"][0]
    finally:
        made.close()


def _recipe(image):
    (name,) = os.listdir(image.steps)
    return os.path.join(image.steps, name)


def _loose_file(image):
    os.chmod(_recipe(image), 0o666)


def _loose_directory(image):
    os.chmod(image.steps, 0o777)


def _other_owner(image):
    os.chown(_recipe(image), 12345, 12345)


def _a_link(image):
    path = _recipe(image)
    os.rename(path, path + ".real")
    os.symlink(os.path.basename(path) + ".real", path)


def _other_key(image):
    path = _recipe(image)
    data = bytearray(open(path, "rb").read())
    data[data.index(b"libcuda.so.1")] ^= 0x20      # a letter of the key, in case
    with open(path, "wb") as out:
        out.write(data)


def _other_version(image):
    path = _recipe(image)
    data = open(path, "rb").read()
    from cdi import __version__

    with open(path, "wb") as out:
        out.write(data.replace(__version__.encode(), b"9" * len(__version__), 1))


def _truncated(image):
    path = _recipe(image)
    data = open(path, "rb").read()
    with open(path, "wb") as out:
        out.write(data[:len(data) // 2])


def _root_changed(image):
    """The next container's library directory gains a file (its identity changes)."""
    image.next_root_change = lambda rootfs: open(rootfs + LIBDIR + "/libnew.so.1", "w").close()


def _untouched(image):
    pass


def _library_directory_out_of_the_root(image):
    """The next container's library directory is a link out of its root, to a host directory
    that must stay empty (the worker resolves it inside the root: a dangling link there)."""
    outside = image.tmp_path / "outside"
    outside.mkdir()
    image.outside = outside

    def change(rootfs):
        subprocess.run(["rm", "-rf", rootfs + LIBDIR], check=True)
        os.symlink(str(outside), rootfs + LIBDIR)
    image.next_root_change = change


REFUSED = {"untouched (the control)": _untouched, "a-link-out-of-the-root": _library_directory_out_of_the_root,
           "group-and-others-may-write-it": _loose_file, "its-directory-open-to-others": _loose_directory,
           "another-owner": _other_owner, "a-link": _a_link, "another-key": _other_key,
           "another-version": _other_version, "truncated": _truncated, "a-changed-root": _root_changed}


@pytest.mark.parametrize("how", sorted(REFUSED))
def test_a_recipe_not_surely_ours_leaves_the_step_to_the_worker(image, how):
    world = image.world
    first = image.container()
    assert world.shim("create", "--bundle", first.path, first.id, env=image.env()).returncode == 0
    assert image.served() == 1
    image.next_root_change = None
    REFUSED[how](image)
    second = image.container()
    if image.next_root_change:
        image.next_root_change(second.rootfs)
    create = world.shim("create", "--bundle", second.path, second.id, env=image.env())
    if how == "a-link-out-of-the-root":
        assert os.listdir(image.outside) == []
        assert image.served() == 2, "the front end replayed a recipe it should have refused"
        return      # (the worker's own answer to such an image: tests/runtime/test_runtime_toolkit_hooks.py)
    assert create.returncode == 0, create.stderr
    if how == "untouched (the control)":
        assert image.served() == 1, "the front end did not replay the step"
    else:
        assert image.served() == 2, "the front end replayed a recipe it should have refused"
    config = second.config()
    assert not any("nvidia-cdi-hook" in json.dumps(hook) for hook in config.get("hooks", {}).values())


def test_replay_under_asan_and_ubsan(image):
    """The front end built with gcc's sanitizers replays an intact recipe, and refuses recipes
    with bytes changed or cut (seeded), with no sanitizer report; each create still succeeds
    (the worker does what the front end refused)."""
    import random

    from cdi import __version__

    rh.need("gcc", "gcc")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # in a prefix of its own: the front end starts the python3 beside it when it falls back
    binary = os.path.join(python_prefix(image.tmp_path / "asan"), "cdi-shim-runtime-asan")
    command = native_programs().command("cdi-shim-runtime", repo, binary, __version__,
                                        ["-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"])
    build = subprocess.run(command + ["-lpthread"], capture_output=True, text=True, timeout=180)
    assert build.returncode == 0, build.stderr + "\n(gcc's sanitizer runtimes: apt-get install libasan8 libubsan1)"
    world = image.world
    env = dict(image.env(), ASAN_OPTIONS="detect_leaks=1")

    def create(bundle):
        run = rh.run_captured([str(binary), "--root", world.runc_root, "create", "--bundle", bundle.path, bundle.id],
                              env=env)      # (temp files: the created container holds its stdio open)
        assert "Sanitizer" not in run.stderr and "runtime error" not in run.stderr, run.stderr[-3000:]
        assert run.returncode == 0, run.stderr[-2000:]
        world.runc_cmd("delete", "--force", bundle.id)

    create(image.container())                       # the worker keeps the step, writes the recipe
    served = image.served()
    create(image.container())
    assert image.served() == served, "the sanitized front end did not replay the step"
    path = _recipe(image)
    intact = open(path, "rb").read()
    draw = random.Random(5)
    for n in range(12):
        data = bytearray(intact)
        if n % 3 == 2:
            data = data[:draw.randrange(len(data))]
        else:
            for _ in range(draw.randint(1, 4)):
                data[draw.randrange(len(data))] = draw.randrange(256)
        with open(path, "wb") as out:
            out.write(bytes(data))
        create(image.container())
        with open(path, "wb") as out:
            out.write(intact)


def test_file_binds_runc_leaves_every_mount_to_runc(world, driver, tmp_path):
    """`file-binds = "runc"` (for `runc checkpoint`, which tells CRIU only of config.json's
    mounts): the toolkit-sized driver's library mounts stay in config.json, no
    binds hook; the front end replays nothing and the worker writes no recipe, so every create
    reaches the worker, which keeps no step. Set back to "hook", the next container gets the
    hook."""
    more = build_driver_libraries(str(tmp_path / "more"), 14, rh.need("gcc", "gcc"), "550.54.15")
    made = Image(world, driver, tmp_path, more_libraries=more)
    try:
        world.write_config(log_level="debug", log_file=made.log, file_binds="runc")
        results = []
        for served in (1, 2):
            bundle = made.container()
            run = world.shim("run", "--bundle", bundle.path, bundle.id, env=made.env())
            assert run.returncode == 0 and run.stdout.startswith("linked=42"), run.stderr
            assert made.served() == served, "the front end replayed a step while runc binds the files"
            results.append(result(bundle))
        assert results[1] == results[0]
        assert not os.path.exists(made.steps) or os.listdir(made.steps) == []
        config = results[0][0]
        assert "createContainer" not in config.get("hooks", {}), config.get("hooks")
        destinations = [m["destination"] for m in config["mounts"]]
        assert sum(d.startswith(LIBDIR + "/") for d in destinations) == 16 and "/etc/ld.so.cache" not in destinations

        world.write_config(log_level="debug", log_file=made.log, file_binds="hook")
        bundle = made.container()
        run = world.shim("run", "--bundle", bundle.path, bundle.id, env=made.env())
        assert run.returncode == 0 and run.stdout.startswith("linked=42"), run.stderr
        assert made.served() == 3
        binds = result(bundle)[0]["hooks"]["createContainer"][0]["args"]
        assert binds[:2] == ["cdi-shim-nshook", "binds"] and binds.count("--bind") == 17
    finally:
        made.close()


def test_a_file_binds_value_we_do_not_know_fails_the_create_naming_it(world, tmp_path):
    world.write_config(file_binds="kernel")
    bundle = world.bundle()
    create = world.shim("create", "--bundle", bundle.path, bundle.id)
    assert create.returncode != 0
    assert f'{world.config_toml}: "file-binds" must be one of "hook", "runc", not "kernel"' in create.stderr
    assert bundle.unchanged()


def _writable_libraries(config):
    for mount in config["mounts"]:
        if mount["destination"].startswith(LIBDIR):
            mount["options"] = [o for o in mount["options"] if o != "ro"]


def _identity_user_namespace(config):
    config["linux"]["namespaces"].append({"type": "user"})
    for name in ("uidMappings", "gidMappings"):
        config["linux"][name] = [{"containerID": 0, "hostID": 0, "size": 65536}]


MOUNTINFO = ("/prog; grep -E ' " + LIBDIR + "/lib[a-z0-9-]+[.]so[.]550' /proc/self/mountinfo | "
             "while read a b c d where opts rest; do echo \"$where ${opts%%,*}\"; done")


@pytest.mark.parametrize("field, change", [("a library mount's options", _writable_libraries),
                                           ("the user namespace", _identity_user_namespace)])
def test_a_recipe_is_not_replayed_for_another_mount_or_namespace(world, driver, tmp_path, field, change):
    """Issue 31: a step kept for one config is not replayed for a config that differs in a field
    the step reads (here each library mount's options, or a user namespace): the worker does
    the step, and the container sees the new value -- its library mounts read-write in its
    mountinfo, or (user namespace) runc's own mounts, never our binds hook (filebinds.py)."""
    more = build_driver_libraries(str(tmp_path / "more"), 14, rh.need("gcc", "gcc"), "550.54.15")
    made = Image(world, driver, tmp_path, more_libraries=more)
    try:
        first = made.container(args=["sh", "-c", MOUNTINFO])
        run = world.shim("run", "--bundle", first.path, first.id, env=made.env())
        assert run.returncode == 0 and run.stdout.startswith("linked=42"), run.stderr
        assert made.served() == 1 and len(os.listdir(made.steps)) == 1
        lines = run.stdout.splitlines()[1:]
        assert len(lines) == 16 and all(line.endswith(" ro") for line in lines), lines
        assert result(first)[0]["hooks"]["createContainer"][0]["args"][1] == "binds"

        second = made.container(args=["sh", "-c", MOUNTINFO], change=change)
        if change is _identity_user_namespace:
            # (runc binds device nodes in a user namespace, which this overlay root refuses for
            # /dev/nvidiactl: the config.json the step wrote is what tells)
            world.shim("create", "--bundle", second.path, second.id, env=made.env())
            assert made.served() == 2, f"the recipe was replayed for another {field}"
            config = result(second)[0]
            assert not any("binds" in h.get("args", []) for h in config.get("hooks", {}).get("createContainer", []))
            assert sum(m["destination"].startswith(LIBDIR) for m in config["mounts"]) == 16
            return
        run = world.shim("run", "--bundle", second.path, second.id, env=made.env())
        assert run.returncode == 0 and run.stdout.startswith("linked=42"), run.stderr
        assert made.served() == 2, f"the recipe was replayed for another {field}"
        lines = run.stdout.splitlines()[1:]
        assert len(lines) == 16 and all(line.endswith(" rw") for line in lines), lines
    finally:
        made.close()


@pytest.mark.parametrize("image_link", [False, True], ids=["stub-alone", "stub-with-a-soname-link-to-it"])
def test_a_replaced_link_is_replayed_alike(world, driver, tmp_path, image_link):
    """The image holds a file where the spec's create-symlinks puts libcuda.so (issue 32: the
    hook replaces it): the worker's step and the front end's replay of its recipe each replace it
    with the link, and give the same config and files."""
    made = Image(world, driver, tmp_path)
    try:
        with open(made.layer + f"{LIBDIR}/libcuda.so", "w") as out:
            out.write("the image's stub\n")
        if image_link:      # (the spec's libcuda.so -> libcuda.so.1 then loops until the soname link is made)
            os.symlink("libcuda.so", made.layer + f"{LIBDIR}/libcuda.so.1")
        # (with the image's soname link replaced too, the front end leaves the step to the worker)
        results = each_way(world, made, lambda how, bundle: not [
            n for n in os.listdir(bundle.rootfs + LIBDIR) if "cdi-shim" in n], replayed=not image_link)
        assert all(later == results[0] for later in results[1:])
        assert results[0][2]["libcuda.so"] == "libcuda.so.1"
    finally:
        made.close()


def test_a_compat_decision_by_the_elf_note_is_replayed_alike(world, driver, tmp_path):
    """The image's CUDA compat libcuda (550.90.07: a newer minor of the host's 550) carries a
    fwd_compatibility note listing 550, so the spec's enable-cuda-compat puts the compat folder
    first (issue 32 item 3): the worker's step and the front end's replay of its recipe give the
    same config and files, the cache naming the compat library first."""
    import ldcache_helpers as lh
    from test_hook_fidelity import COMPAT_MARK, _note, note_source
    from test_runtime_toolkit_hooks import COMPAT

    made = Image(world, driver, tmp_path)
    try:
        os.makedirs(made.layer + COMPAT)
        rh.library(made.layer + f"{COMPAT}/libcuda.so.550.90.07", "libcuda.so.1",
                 f"int fake_cuda_major(void) {{ return {COMPAT_MARK}; }}\n" + note_source(_note([535, 550])))
        os.symlink("libcuda.so.550.90.07", made.layer + f"{COMPAT}/libcuda.so.1")
        results = each_way(world, made)
        assert all(later == results[0] for later in results[1:])
        listed = lh.listing(results[0][3]["ld.so.cache"][0]).decode().splitlines()
        cuda = [line for line in listed if line.strip().startswith("libcuda.so.1 ")]
        assert cuda[0].endswith(f"=> {COMPAT}/libcuda.so.1"), listed
    finally:
        made.close()


LATER_LDCONFIG = ("/prog; md5sum /etc/ld.so.cache /etc/ld.so.conf.d/*; /sbin/ldconfig; echo ldconfig=$?; /prog; "
                  "/sbin/ldconfig -p | grep -c -e 'libnvidia-ml.so.1 (' -e 'libcuda.so.1 ('; ls /etc/ld.so.conf.d")


def _linker_after(bundle, readonly):
    """The linker files the container's /etc ended with (the rootfs's, or a read-only root's
    overlay layer in the bundle), the image's /etc listing, config.json."""
    etc = os.path.join(bundle.path, "cdi-shim.etc", "files") if readonly else bundle.rootfs + "/etc"
    names = ["ld.so.cache", "ld.so.conf"] + [f"ld.so.conf.d/{n}" for n in sorted(os.listdir(etc + "/ld.so.conf.d"))]
    files = {name: (open(f"{etc}/{name}", "rb").read(), os.stat(f"{etc}/{name}").st_mode)
             for name in names if os.path.exists(f"{etc}/{name}")}
    image = sorted(os.listdir(bundle.rootfs + "/etc/ld.so.conf.d"))
    return files, image, result(bundle)[0]


@pytest.mark.parametrize("readonly", [False, True], ids=["rw-rootfs", "readonly-rootfs"])
def test_a_later_ldconfig_after_a_replayed_step(world, driver, tmp_path, readonly):
    """Issue 32, 6: an entrypoint that loads the driver libraries by soname, prints the sums of
    the linker files as the step left them, runs ldconfig, then loads them again -- in
    containers of one image and spec made by the worker's step and by the front end's replay of
    its recipe: ldconfig exits 0, its cache keeps the driver
    libraries (the drop-ins name the folders), and every way gives the same output, the same
    files in /etc and the same config.json. A read-only root's /etc is a read-only overlay with
    our layer from the bundle (the image's /etc not written), replayed alike: there ldconfig
    fails, as after the toolkit's hook (issue 43)."""
    made = Image(world, driver, tmp_path)
    try:
        os.makedirs(made.layer + "/sbin", exist_ok=True)
        shutil.copy2(rh.need("ldconfig", "libc-bin"), made.layer + "/sbin/ldconfig")     # (static)
        outputs, after = [], []
        for how in ("worker", "front end"):
            bundle = made.container(args=("sh", "-c", LATER_LDCONFIG),
                                    change=lambda config: config["root"].update(readonly=readonly))
            run = world.shim("run", "--bundle", bundle.path, bundle.id, env=made.env())
            assert run.returncode == 0, (how, run.stderr)
            assert made.served() == 1, how
            outputs.append(run.stdout)
            after.append(_linker_after(bundle, readonly))
        lines = outputs[0].splitlines()
        summed = [line.split()[1] for line in lines[1:] if line.split()[-1].startswith("/etc/")]
        rest = lines[1 + len(summed):]
        assert lines[0] == "linked=42 cuda=550" and summed[0] == "/etc/ld.so.cache", outputs[0]
        assert {"/etc/ld.so.conf.d/00-nvcr-cdi-shim.conf", "/etc/ld.so.conf.d/zz-nvcr-cdi-shim.conf"} <= set(summed)
        # both driver libraries cached (a read-only root: by the step's cache, ldconfig failing)
        assert rest[:3] == [f"ldconfig={int(readonly)}", "linked=42 cuda=550", "2"], outputs[0]
        assert rest[3:] == [name.split("/")[-1] for name in summed[1:]], outputs[0]
        assert all(output == outputs[0] for output in outputs[1:]), outputs
        assert all(later == after[0] for later in after[1:])
        files, image, config = after[0]
        assert files["ld.so.conf.d/zz-nvcr-cdi-shim.conf"][1] == 0o100644
        assert "/etc/ld.so.cache" not in [m["destination"] for m in config["mounts"]]
        overlays = [m for m in config["mounts"] if m["destination"] == "/etc"]
        if readonly:
            assert "zz-nvcr-cdi-shim.conf" not in image, "a read-only root's image /etc was written"
            assert overlays == [{"destination": "/etc", "type": "overlay", "source": "overlay", "options": [
                "ro", "lowerdir=BUNDLE/cdi-shim.etc/files:ROOTFS/etc"]}]
        else:
            assert "zz-nvcr-cdi-shim.conf" in image and not overlays
    finally:
        made.close()


def test_a_compat_drop_in_no_cache_reads_is_replayed_alike(world, driver, tmp_path):
    """A spec without update-ldcache whose enable-cuda-compat uses the image's compat libcuda
    (570 over the host's 550, no note): the hook's 00-compat drop-in is written into the root
    all the same (issue 32; test_hook_fidelity), by the worker's step and by the front end's
    replay of its recipe, with the same config and files."""
    from test_hook_fidelity import COMPAT_MARK
    from test_runtime_toolkit_hooks import COMPAT, _hook

    made = Image(world, driver, tmp_path)
    try:
        spec = toolkit_spec(world, driver).replace(
            _hook("update-ldcache", "--folder", LIBDIR, "--folder", f"{LIBDIR}/vdpau"), "")
        assert "update-ldcache" not in spec
        world.write_spec("nvidia-gpu.yaml", spec)
        os.makedirs(made.layer + COMPAT)
        rh.library(made.layer + f"{COMPAT}/libcuda.so.570.86.10", "libcuda.so.1",
                 f"int fake_cuda_major(void) {{ return {COMPAT_MARK}; }}\n")
        os.symlink("libcuda.so.570.86.10", made.layer + f"{COMPAT}/libcuda.so.1")
        results = each_way(world, made)
        assert all(later == results[0] for later in results[1:])
        assert results[0][3]["ld.so.conf.d/00-compat-cdi-shim.conf"] == (f"{COMPAT}\n".encode(), 0o100644)
    finally:
        made.close()
