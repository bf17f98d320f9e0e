"""A device asked for by request (an annotation, the device env var: the legacy path, containerd
1.x or native CDI off) is injected by the front end alone from the second container on
(csrc/engine/request.c and replay.c; the recipe: shim/runtime/requestmemo.py).

The first container's create goes to the worker, which resolves the request, checks the spec's
files, applies the edits and does the step; it records the injection and the step. The next
container with the same request, settings, spec files, host files and image is injected and
stepped by the front end: no request reaches the worker, and the result -- config.json, the
bundle files, the links, the linker files in the root -- is the one the worker gives and the one
the Python step alone gives; the program links and runs. Each thing the resolution depends on,
changed, sends the create back to the worker, which says what it says without a recipe (a
missing file, an unprivileged env request), and whose injection is recorded anew."""
import json
import os

import pytest

from test_front_end_replay import Image, result
from test_runtime_resident import served_lines
from test_runtime_toolkit_hooks import VERSION

FRONT_END = "replayed by the front end"
WORKER_STEP = "replayed from its recipe"


def _count(image, text):
    with open(image.log) as f:
        return sum(text in line for line in f)


def _run(image, bundle):
    run = image.world.shim("run", "--bundle", bundle.path, bundle.id, env=image.env())
    assert run.returncode == 0 and run.stdout.startswith("linked=42"), run.stderr
    return run


@pytest.fixture
def image(world, driver, tmp_path):
    made = Image(world, driver, tmp_path)
    yield made
    made.close()


def _python_alone(image):
    world = image.world
    world.resident_socket = os.path.join(world.base, "no-resident.sock")
    world.write_config(log_level="debug", log_file=image.log)


def test_a_request_is_injected_by_the_front_end_from_the_second_container_on(image):
    first = image.container(asking=True)
    _run(image, first)
    assert image.served() == 1
    assert sum(name.startswith("q") for name in os.listdir(image.steps)) == 1, os.listdir(image.steps)

    second = image.container(asking=True)
    _run(image, second)
    assert image.served() == 1, "the worker was asked: the front end did not replay the request"
    assert _count(image, FRONT_END) == 1
    with open(image.log) as f:
        said = [json.loads(line) for line in f if second.id in line and "injected" in line]
    assert [(line["level"], line["msg"]) for line in said if "replayed" not in line["msg"]] == [
        ("info", f"cdi-shim: container {second.id}: injected nvidia.com/gpu=0")]

    third = image.container(asking=True)
    _python_alone(image)
    _run(image, third)
    assert result(second) == result(first) == result(third)
    config = result(second)[0]
    assert "/dev/nvidia0" in [node["path"] for node in config["linux"]["devices"]]
    assert "NVIDIA_VISIBLE_DEVICES=void" in config["process"]["env"]
    assert not any("nvidia-cdi-hook" in str(hook) for hook in config.get("hooks", {}).values())


def _hookless_spec(world, driver, libraries):
    mounts = "".join(f"    - {{hostPath: {driver}/{name}, containerPath: /usr/lib/fake-driver/{name}, "
                     "options: [ro, nosuid, nodev, bind]}\n" for name in libraries)
    return ('cdiVersion: "0.5.0"\nkind: nvidia.com/gpu\ndevices:\n  - name: "0"\n    containerEdits:\n'
            f"      deviceNodes: [{{path: /dev/nvidia0, hostPath: {world.node(0)}}}]\n      env: [GPU_INDEX=0]\n"
            + ("containerEdits:\n  mounts:\n" + mounts if mounts else ""))


@pytest.mark.parametrize("libraries", [(), (f"libnvidia-ml.so.{VERSION}", f"libcuda.so.{VERSION}")],
                         ids=["no-step", "libraries-without-hooks"])
def test_a_request_of_a_spec_without_hooks_is_the_front_end_s_too(world, driver, tmp_path, libraries):
    """No hook in the spec. Without libraries the step has nothing to do: the recipe holds the
    config.json the create ends with, and the front end writes it. With libraries mounted there
    is a step, for a config that has no hooks member: the front end replays it all the same."""
    made = Image(world, driver, tmp_path, spec=_hookless_spec(world, driver, libraries))
    try:
        bundles = [made.container(asking=True) for _ in range(3)]
        for n, bundle in enumerate(bundles):
            if n == 2:
                _python_alone(made)
            create = world.shim("create", "--bundle", bundle.path, bundle.id, env=made.env())
            assert create.returncode == 0, create.stderr
            world.runc_cmd("delete", "--force", bundle.id)
            if n == 1:
                assert made.served() == 1 and _count(made, FRONT_END) == 1
        results = [result(bundle) for bundle in bundles]
        assert results[0] == results[1] == results[2]
        config = results[1][0]
        assert "GPU_INDEX=0" in config["process"]["env"] and "/dev/nvidia0" in json.dumps(config)
        steps = [name for name in os.listdir(made.steps) if not name.startswith("q")]
        assert len(steps) == (1 if libraries else 0), steps      # (a step's recipe, or no step)
    finally:
        made.close()


# (global options, create's options) for a device D; the front end's reading of the values
# (csrc/frontend/cmdline.c device_values) must give the worker's (runc_args.py), or no replay.
DEVICE_OPTIONS = {
    "global": (lambda d: [f"--device={d}"], lambda d: []),
    "global-spaced": (lambda d: ["--device", d], lambda d: []),
    "global-single-dash": (lambda d: ["-device", d], lambda d: []),
    "create": (lambda d: [], lambda d: ["--device", d]),
    "create-equals": (lambda d: [], lambda d: [f"--device={d}"]),
    "both": (lambda d: ["--device", d], lambda d: [f"--device={d}"]),
}


@pytest.mark.parametrize("where", sorted(DEVICE_OPTIONS))
def test_a_device_option_request_is_the_front_end_s_from_the_second_on(image, where):
    """`cdi-shim-runtime --device nvidia.com/gpu=0 create ...` (the option in any place and
    spelling runc_args.py takes): the option's values are part of the key, read by the front end
    as the worker reads them; runc never sees the option; another device's option is another
    key, resolved by the worker (and failing as it says: no such device)."""
    world = image.world

    def create(device):
        bundle = image.container(asking=True)
        with open(bundle.config_path) as f:
            config = json.load(f)
        config.pop("annotations")           # (the option alone asks)
        with open(bundle.config_path, "w") as out:
            json.dump(config, out)
        before, after = (make(device) for make in DEVICE_OPTIONS[where])
        return bundle, world.shim(*before, "create", *after, "--bundle", bundle.path, bundle.id, env=image.env())

    for n in range(2):
        bundle, run = create("nvidia.com/gpu=0")
        assert run.returncode == 0, run.stderr
        assert "/dev/nvidia0" in open(bundle.config_path).read()
        assert world.state(bundle.id)["status"] == "created"
        world.runc_cmd("delete", "--force", bundle.id)
    assert image.served() == 1 and _count(image, FRONT_END) == 1
    bundle, run = create("nvidia.com/gpu=1")
    assert run.returncode != 0 and "nvidia.com/gpu=1" in run.stderr, run.stderr
    assert image.served() == 2


def test_a_request_whose_spec_lost_a_file_fails_though_a_recipe_is_kept(image, driver):
    """A library the spec mounts, gone from the host: the front end's check of the host files
    fails, the worker's freshness check names the spec and the file; config.json is as it was."""
    world = image.world
    _run(image, image.container(asking=True))
    victim = sorted(os.path.join(driver, name) for name in os.listdir(driver) if name.startswith("libcuda.so."))[0]
    os.rename(victim, victim + ".away")
    try:
        bundle = image.container(asking=True)
        before = open(bundle.config_path, "rb").read()
        create = world.shim("create", "--bundle", bundle.path, bundle.id, env=image.env())
        assert create.returncode != 0
        assert os.path.basename(victim) in create.stderr and "nvidia-gpu.yaml" in create.stderr, create.stderr
        assert image.served() == 2 and _count(image, FRONT_END) == 0
        assert open(bundle.config_path, "rb").read() == before, "config.json was changed by a failed create"
    finally:
        os.rename(victim + ".away", victim)


def test_a_changed_spec_is_resolved_again_and_recorded_anew(image):
    """The spec gains an env edit: its file's identity changed, so the front end leaves the
    create to the worker; the step reads no env, so the worker replays the step's recipe; the
    new injection is recorded, and the next container is the front end's, with the new edit."""
    _run(image, image.container(asking=True))
    _edit_spec(image.world, "=void]", "=void, CDI_SHIM_TEST_EDIT=1]")
    changed = image.container(asking=True)
    _run(image, changed)
    assert image.served() == 2 and _count(image, WORKER_STEP) == 1
    assert "CDI_SHIM_TEST_EDIT=1" in result(changed)[0]["process"]["env"]
    again = image.container(asking=True)
    _run(image, again)
    assert image.served() == 2 and _count(image, FRONT_END) == 1
    assert result(again) == result(changed)


def test_a_spec_change_the_step_reads_gets_a_step_of_its_own(image):
    """A library's mount gets other options: the injected config's mounts differ, so does the
    step's key; the worker does the step and records both anew, and the next container is the
    front end's."""
    _run(image, image.container(asking=True))
    _edit_spec(image.world, "rbind, rprivate]", "rbind, rslave]")
    changed = image.container(asking=True)
    _run(image, changed)
    assert image.served() == 2 and _count(image, WORKER_STEP) == 0 and _count(image, FRONT_END) == 0
    again = image.container(asking=True)
    _run(image, again)
    assert image.served() == 2 and _count(image, FRONT_END) == 1
    assert result(again) == result(changed)
    assert "rslave" in json.dumps(result(again)[0])


def test_a_new_spec_file_sends_the_request_to_the_worker(image):
    """Another spec file in a spec directory could name the same device (a conflict, or a
    higher-priority directory's override): the directory's identity changed, the worker resolves."""
    world = image.world
    _run(image, image.container(asking=True))
    world.write_spec("other.yaml", 'cdiVersion: "0.5.0"\nkind: example.com/thing\ndevices:\n'
                     '  - name: "0"\n    containerEdits:\n      env: [THING=0]\n')
    _run(image, image.container(asking=True))
    assert image.served() == 2 and _count(image, FRONT_END) == 0
    _run(image, image.container(asking=True))
    assert image.served() == 2 and _count(image, FRONT_END) == 1


def test_the_driver_version_file_is_part_of_the_recipe(image, tmp_path):
    version = tmp_path / "version"
    version.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 2024\n")
    image.env = lambda env=image.env: dict(env(), CDI_SHIM_DRIVER_VERSION_FILE=str(version))
    _run(image, image.container(asking=True))
    _run(image, image.container(asking=True))
    assert image.served() == 1
    version.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  555.42.06  Tue Mar  5 2024\n")
    _run(image, image.container(asking=True))
    assert image.served() == 2, "the front end replayed a request of another driver"


def test_an_unprivileged_env_request_stays_the_worker_s(image):
    """accept-env-unprivileged = false: a container without CAP_SYS_ADMIN asking by
    NVIDIA_VISIBLE_DEVICES gets no device and a warning, each time (a warned create keeps no
    recipe); a privileged one's recipe does not serve it (the capabilities are in the key)."""
    world = image.world
    world.write_config(log_level="debug", log_file=image.log, accept_env_unprivileged=False)

    def asking_by_env(privileged):
        def change(config):
            config["process"]["env"].append("NVIDIA_VISIBLE_DEVICES=0")
            caps = config["process"].setdefault("capabilities", {})
            caps["bounding"] = ["CAP_CHOWN", "CAP_SYS_ADMIN"] if privileged else ["CAP_CHOWN"]
        bundle = image.container(asking=True)
        with open(bundle.config_path) as f:
            config = json.load(f)
        config.pop("annotations")
        change(config)
        with open(bundle.config_path, "w") as out:
            json.dump(config, out)
        return bundle

    for privileged in (True, True):
        bundle = asking_by_env(privileged)
        create = world.shim("create", "--bundle", bundle.path, bundle.id, env=image.env())
        assert create.returncode == 0, create.stderr
        world.runc_cmd("delete", "--force", bundle.id)
    assert image.served() == 1 and _count(image, FRONT_END) == 1
    for n in range(2):
        bundle = asking_by_env(False)
        create = world.shim("create", "--bundle", bundle.path, bundle.id, env=image.env())
        assert create.returncode == 0, create.stderr
        assert "lacks CAP_SYS_ADMIN" in create.stderr, create.stderr
        assert "/dev/nvidia0" not in open(bundle.config_path).read()
        world.runc_cmd("delete", "--force", bundle.id)
        assert image.served() == 2 + n
    assert " in resident process " in served_lines(image.log)[-1]


def _edit_spec(world, old, new):
    path = os.path.join(world.spec_dir, "nvidia-gpu.yaml")
    text = open(path).read()
    assert old in text
    with open(path, "w") as out:
        out.write(text.replace(old, new))


def go_escaped(bundle):
    """Rewrite BUNDLE's config.json as containerd's Go encoder writes it: <, > and & as \\u escapes."""
    with open(bundle.config_path) as f:
        text = f.read()
    with open(bundle.config_path, "w") as out:
        out.write(text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e"))


def test_a_go_escaped_config_is_replayed_too(image):
    """A pod whose env holds &, < or > reaches the runtime with them as \\u escapes (Go's JSON
    encoder): the front end still replays its request, and the value is kept as written."""
    value = "QUERY=https://example.com/?a=1&b=<2>"
    bundles = []
    for _ in range(2):
        bundle = image.container(asking=True)
        with open(bundle.config_path) as f:
            config = json.load(f)
        config["process"]["env"].append(value)
        with open(bundle.config_path, "w") as out:
            json.dump(config, out)
        go_escaped(bundle)
        bundles.append(bundle)
    for bundle in bundles:
        _run(image, bundle)
    assert image.served() == 1, "the worker was asked: the front end did not replay the escaped config"
    assert _count(image, FRONT_END) == 1
    assert result(bundles[0]) == result(bundles[1])
    with open(bundles[1].config_path) as f:
        text = f.read()
    assert "\\u0026b=\\u003c2\\u003e" in text and value in json.loads(text)["process"]["env"]


def test_an_escaped_device_env_name_is_never_replayed(image):
    """NVIDIA_VISIBLE_DEVICES spelled with a \\u escape in its name: the front end cannot tell which
    variable it is, so the worker resolves every such create (and injects the device)."""
    bundles = []
    for _ in range(2):
        bundle = image.container(asking=True)
        with open(bundle.config_path) as f:
            config = json.load(f)
        config.pop("annotations")
        config["process"]["env"].append("NVIDIA_VISIBLE_DEVICES=0")
        with open(bundle.config_path, "w") as out:
            json.dump(config, out)
        with open(bundle.config_path) as f:
            text = f.read()
        with open(bundle.config_path, "w") as out:
            out.write(text.replace('"NVIDIA_VISIBLE_DEVICES=0"', '"NVIDIA\\u005fVISIBLE_DEVICES=0"'))
        bundles.append(bundle)
    for bundle in bundles:
        _run(image, bundle)
    assert image.served() == 2 and _count(image, FRONT_END) == 0


# Issue 43, findings 2 and 3: the key of a request covers what apply_edits reads of the pod's
# config (test_request_key.py checks the list of fields against the code). Each create below
# asks for the same device, so before the key held the user and the namespaces the front end
# replayed the first pod's injection for the second.

def _asking_as(image, change):
    bundle = image.container(asking=True)
    with open(bundle.config_path) as f:
        config = json.load(f)
    change(config)
    with open(bundle.config_path, "w") as out:
        json.dump(config, out)
    return bundle


def _user(uid):
    def change(config):
        config["process"]["user"] = {"uid": uid, "gid": uid}
    return change


def _owner_spec(world, driver, libraries):
    """A node with a mode and no owner (apply_edits gives it the container's user), with or without
    libraries (a step, or none)."""
    return _hookless_spec(world, driver, libraries).replace(
        f"hostPath: {world.node(0)}}}", f"hostPath: {world.node(0)}, fileMode: 384}}")


def _stop_resident(image):
    """The resident process gone, the recipes left: the front end still replays them alone."""
    image.server.terminate()
    image.server.wait(timeout=30)


@pytest.mark.parametrize("resident", ["resident", "no-resident"])
@pytest.mark.parametrize("libraries", [(), (f"libnvidia-ml.so.{VERSION}", f"libcuda.so.{VERSION}")],
                         ids=["no-step", "step"])
def test_a_device_node_is_the_pod_s_own_user_s_not_the_first_pod_s(world, driver, tmp_path, libraries, resident):
    """Finding 2: a pod as uid 1000 first, then a pod as uid 2000 asking for the same device. The
    node runc makes is the second pod's user's, as Python alone gives it; the second pod's
    request is another key, so the first's recipe is not replayed for it (with the resident process
    running, or gone and its recipes left to the front end); a third pod as uid 2000 is replayed."""
    made = Image(world, driver, tmp_path, spec=_owner_spec(world, driver, libraries))
    try:
        def create(bundle):
            run = world.shim("create", "--bundle", bundle.path, bundle.id, env=made.env())
            assert run.returncode == 0, run.stderr
            node = os.stat(f"/proc/{world.state(bundle.id)['pid']}/root/dev/nvidia0")
            world.runc_cmd("delete", "--force", bundle.id)
            return node.st_uid, node.st_gid, node.st_mode & 0o777

        assert create(_asking_as(made, _user(1000))) == (1000, 1000, 0o600)
        assert made.served() == 1 and any(name.startswith("q") for name in os.listdir(made.steps))
        if resident == "no-resident":
            _stop_resident(made)
        second = _asking_as(made, _user(2000))
        assert create(second) == (2000, 2000, 0o600), "the first pod's user owns the second pod's device"
        assert _count(made, FRONT_END) == 0
        third = _asking_as(made, _user(2000))
        assert create(third) == (2000, 2000, 0o600)
        if resident == "resident":
            assert made.served() == 2 and _count(made, FRONT_END) == 1, "uid 2000's own recipe was not replayed"
        alone = _asking_as(made, _user(2000))
        _python_alone(made)
        assert create(alone) == (2000, 2000, 0o600)
        assert result(second) == result(third) == result(alone)
        assert {"path": "/dev/nvidia0", "uid": 2000, "gid": 2000, "fileMode": 384}.items() <= next(
            node for node in result(second)[0]["linux"]["devices"] if node["path"] == "/dev/nvidia0").items()
    finally:
        made.close()


def _mount_spec(world):
    """No node, no library: a file bind-mounted and an env var (a recipe with no step)."""
    return ('cdiVersion: "0.5.0"\nkind: nvidia.com/gpu\ndevices:\n  - name: "0"\n    containerEdits:\n'
            "      env: [GPU_INDEX=0]\n"
            f"      mounts: [{{hostPath: {world.host_file}, containerPath: /mounted/file, "
            "options: [ro, nosuid, nodev, bind]}]\n")


def _user_namespace(config):
    config["linux"]["namespaces"].append({"type": "user"})
    for name in ("uidMappings", "gidMappings"):
        config["linux"][name] = [{"containerID": 0, "hostID": 0, "size": 65536}]


@pytest.mark.parametrize("resident", ["resident", "no-resident"])
def test_a_user_namespaced_pod_gets_id_mapped_mounts_after_one_without(world, driver, tmp_path, resident):
    """Finding 3: a pod without a user namespace first (its recipe has no step), then one with:
    the second's bind mount is id-mapped as Python alone gives it, not the first pod's mount
    replayed (with the resident process running, or gone and its recipes left)."""
    made = Image(world, driver, tmp_path, spec=_mount_spec(world))
    try:
        def create(bundle):
            run = world.shim("create", "--bundle", bundle.path, bundle.id, env=made.env())
            assert run.returncode == 0, run.stderr
            world.runc_cmd("delete", "--force", bundle.id)
            return next(m for m in result(bundle)[0]["mounts"] if m["destination"] == "/mounted/file")

        assert "idmap" not in create(_asking_as(made, lambda config: None))["options"]
        assert made.served() == 1 and [name[0] for name in os.listdir(made.steps)] == ["q"]    # (no step)
        if resident == "no-resident":
            _stop_resident(made)
        second = _asking_as(made, _user_namespace)
        assert create(second)["options"][-1] == "idmap", "the pod without a user namespace's mounts were replayed"
        assert _count(made, FRONT_END) == 0
        alone = _asking_as(made, _user_namespace)
        _python_alone(made)
        create(alone)
        assert result(second) == result(alone)
    finally:
        made.close()
