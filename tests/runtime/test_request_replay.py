"""A device asked for by request (an annotation: the legacy path, containerd 1.x or native CDI
off) gets the linker step a worker kept, replayed from its recipe by the C replay the front end
runs for pre-injected configs (csrc/engine/replay.c, called from shim/runtime/main.py).

The worker still reads the request, resolves it, checks the spec's files and applies the edits
in Python every time; only the step after that is replayed, for the config it injected. The
result -- config.json, the bundle files, the links, the linker files in the root -- is the one
the full step gives and the one the Python step alone gives; the program links and runs."""
import os

from test_front_end_replay import Image, result
from test_runtime_resident import served_lines

REPLAYED = "replayed from its recipe"


def _replays(image):
    with open(image.log) as f:
        return sum(REPLAYED in line for line in f)


def _run(image, bundle):
    run = image.world.shim("run", "--bundle", bundle.path, bundle.id, env=image.env())
    assert run.returncode == 0 and run.stdout.startswith("linked=42"), run.stderr
    return run


def test_a_requested_device_s_step_is_replayed_from_its_recipe(world, driver, tmp_path):
    image = Image(world, driver, tmp_path)
    try:
        first = image.container(asking=True)
        _run(image, first)
        assert image.served() == 1 and _replays(image) == 0 and len(os.listdir(image.steps)) == 1

        second = image.container(asking=True)
        _run(image, second)
        assert image.served() == 2, "a request is the worker's: the front end does not resolve it"
        assert _replays(image) == 1, "the worker did the whole step again"
        assert " in resident process " in served_lines(image.log)[-1]

        # the same container made by the Python step alone (no resident process)
        third = image.container(asking=True)
        world.resident_socket = os.path.join(world.base, "no-resident.sock")
        world.write_config(log_level="debug", log_file=image.log)
        _run(image, third)
        assert _replays(image) == 1
        replayed, full, python = result(second), result(first), result(third)
        assert replayed == full == python
        config = replayed[0]
        assert "/dev/nvidia0" in [node["path"] for node in config["linux"]["devices"]]
        assert not any("nvidia-cdi-hook" in str(hook) for hook in config.get("hooks", {}).values())
        assert replayed[2] == {"libcuda.so": "libcuda.so.1", "libnvidia-ml.so": "libnvidia-ml.so.550.54.15"}
        assert "ld.so.conf.d/zz-nvcr-cdi-shim.conf" in replayed[3]
    finally:
        image.close()


def test_a_request_whose_spec_lost_a_file_fails_though_a_recipe_is_kept(world, driver, tmp_path):
    """The spec's freshness is checked before the step: a library the spec mounts, gone from the
    host, fails the create naming the spec and the file; the recipe is not replayed."""
    image = Image(world, driver, tmp_path)
    try:
        _run(image, image.container(asking=True))
        victim = sorted(os.path.join(driver, name) for name in os.listdir(driver) if name.startswith("libcuda.so."))[0]
        os.rename(victim, victim + ".away")
        bundle = image.container(asking=True)
        before = open(bundle.config_path, "rb").read()
        create = world.shim("create", "--bundle", bundle.path, bundle.id, env=image.env())
        assert create.returncode != 0
        assert os.path.basename(victim) in create.stderr and "nvidia-gpu.yaml" in create.stderr, create.stderr
        assert _replays(image) == 0
        assert open(bundle.config_path, "rb").read() == before, "config.json was changed by a failed create"
        os.rename(victim + ".away", victim)
    finally:
        image.close()


def test_a_spec_change_the_step_does_not_read_keeps_the_recipe_and_shows(world, driver, tmp_path):
    """The spec gains an env edit: the step reads no env, so its recipe still applies, and the
    replayed config carries the new edit (the replay puts in the step's hooks and mounts, every
    other byte is the injected config's): the same result as the Python step alone."""
    image = Image(world, driver, tmp_path)
    try:
        _run(image, image.container(asking=True))
        _edit_spec(world, "=void]", "=void, CDI_SHIM_TEST_EDIT=1]")
        changed = image.container(asking=True)
        _run(image, changed)
        assert _replays(image) == 1
        assert "CDI_SHIM_TEST_EDIT=1" in result(changed)[0]["process"]["env"]
        world.resident_socket = os.path.join(world.base, "no-resident.sock")
        world.write_config(log_level="debug", log_file=image.log)
        python = image.container(asking=True)
        _run(image, python)
        assert result(python) == result(changed)
    finally:
        image.close()


def test_a_spec_change_the_step_reads_gets_a_step_of_its_own(world, driver, tmp_path):
    """A library's mount gets other options: the injected config's mounts differ, so does the
    step's key; the kept recipe does not apply, the step is done and kept anew, and the next
    container of the new spec is replayed from the new recipe."""
    image = Image(world, driver, tmp_path)
    try:
        _run(image, image.container(asking=True))
        _edit_spec(world, "rbind, rprivate]", "rbind, rslave]")
        changed = image.container(asking=True)
        _run(image, changed)
        assert _replays(image) == 0, "a recipe of the old spec was replayed"
        assert "rslave" in str(result(changed)[0]["mounts"]) + str(result(changed)[0].get("hooks"))
        assert len(os.listdir(image.steps)) == 2
        again = image.container(asking=True)
        _run(image, again)
        assert _replays(image) == 1
        assert result(again) == result(changed)
    finally:
        image.close()


def _edit_spec(world, old, new):
    path = os.path.join(world.spec_dir, "nvidia-gpu.yaml")
    text = open(path).read()
    assert old in text
    with open(path, "w") as out:
        out.write(text.replace(old, new))
