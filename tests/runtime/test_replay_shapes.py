"""Every create-symlinks shape `nvidia-ctk cdi generate` writes (shim/generate/discover.py,
graphics.py, hostdir.py) and every link ldconfig makes is replayed by the front end (issue 28):
each shape's container is made by the worker's Python step (which keeps it as a recipe) and by
the front end's C replay of that recipe (its log says phase=replay and no request reaches the
worker), through real runc, and both give the same config.json, bundle files, links and program
output."""
import json
import os

import pytest

import runtime_helpers as rh
from cdi_shim_lab.images import build_driver_libraries

from test_front_end_replay import Image, each_way, result
from test_runtime_toolkit_hooks import LIBDIR, VERSION, _hook

RESIDENT_TOO = True

SHAPES = {
    # libX.so -> SONAME (the toolkit's libcuda.so, and its dev links)
    "dev-link": [f"libcuda.so.1::{LIBDIR}/libcuda.so", f"libnvidia-ml.so.1::{LIBDIR}/libnvidia-ml.so"],
    # SONAME -> the versioned file: the link ldconfig makes too (issue 28's known miss)
    "soname-link": [f"libnvidia-ml.so.{VERSION}::{LIBDIR}/libnvidia-ml.so.1",
                    f"libcuda.so.{VERSION}::{LIBDIR}/libcuda.so.1", f"libcuda.so.1::{LIBDIR}/libcuda.so"],
    # another name for the versioned file (libGLX_indirect.so.0, libnvidia-vulkan-producer.so)
    "other-name": [f"libcuda.so.{VERSION}::{LIBDIR}/libGLX_indirect.so.0"],
    # a folder the image lacks, the target up one (gbm/nvidia-drm_gbm.so, xorg's module)
    "subfolder": [f"../libcuda.so.1::{LIBDIR}/gbm/nvidia-drm_gbm.so",
                  f"libcuda.so.{VERSION}::{LIBDIR}/nvidia/xorg/libglxserver_nvidia.so"],
    # an absolute target (the one-mount layout's links left to the hook: hostdir.py)
    "absolute": [f"{LIBDIR}/libcuda.so.{VERSION}::/usr/local/lib/libcuda.so"],
    # no create-symlinks: ldconfig's own soname links beside the mounted files
    "ldconfig-only": [],
}


def _links(rootfs):
    """Every link in the rootfs's library folders (and below them): path -> text."""
    found = {}
    for top in (LIBDIR, "/usr/local/lib"):
        for directory, _, names in os.walk(rootfs + top):
            for name in names:
                path = os.path.join(directory, name)
                if os.path.islink(path):
                    found[path[len(rootfs):]] = os.readlink(path)
    return found


@pytest.mark.parametrize("binds", [False, True], ids=["runc-binds", "binds-hook"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_each_link_shape_is_replayed_by_the_front_end(world, driver, tmp_path, shape, binds):
    """BINDS: a toolkit-sized driver (sixteen libraries), whose mounts go to our binds hook."""
    hooks = "".join(_hook("create-symlinks", *[a for link in SHAPES[shape] for a in ("--link", link)])
                    for _ in SHAPES[shape][:1])
    more = build_driver_libraries(str(tmp_path / "more"), 14, rh.need("gcc", "gcc"), VERSION) if binds else ()
    made = Image(world, driver, tmp_path, extra_hooks=hooks, more_libraries=more)
    try:
        seen = []

        def check(how, bundle):
            seen.append(_links(bundle.rootfs))
            if how == "front end":
                with open(made.log) as log:
                    replays = [line for line in log if "phase=replay" in line]
                assert len(replays) == 1, f"{shape}: the second create was not replayed by the front end"
            return True

        results = each_way(world, made, check)
        assert all(later == results[0] for later in results[1:]), shape
        assert all(links == seen[0] for links in seen[1:]), (shape, seen)
        for link in SHAPES[shape]:
            target, _, path = link.partition("::")
            assert seen[1][path] == target, (shape, path, seen[1])
        # ldconfig's soname links beside the mounted files, whoever made them
        assert seen[1][f"{LIBDIR}/libnvidia-ml.so.1"] == f"libnvidia-ml.so.{VERSION}", seen[1]
    finally:
        made.close()


def test_a_folder_mounted_whole_is_replayed_and_its_change_is_not(world, driver, tmp_path):
    """The one-mount layout (`cdi generate --layout one-mount`: one bind of a host folder at
    /usr/local/nvidia/lib64, update-ldcache --folder there): the step reads the folder through
    the mount's host source; the front end replays it for the next container. A changed file in
    the host folder, or another host folder at that mount, makes a fresh step (the worker's),
    whose cache and program see the new library."""
    from test_folder_mounts import FOLDER, _host_folder, _spec

    host = _host_folder(tmp_path, driver)
    # (an image's /usr/local, as every distribution's has: a folder missing up to the root would
    # be looked up at /, whose identity is the container's own new upper folder: never kept)
    made = Image(world, driver, tmp_path, spec=_spec(world, host), layer_dirs=["/usr/local"])
    try:
        def replays():
            with open(made.log) as log:
                return sum("phase=replay" in line for line in log)

        outputs = []
        for n in range(2):
            bundle = made.container()
            run = world.shim("run", "--bundle", bundle.path, bundle.id, env=made.env())
            assert run.returncode == 0, run.stderr
            outputs.append((run.stdout, result(bundle)))
            assert (made.served(), replays()) == (1, n), f"container {n}: served, replayed"
        assert outputs[0] == outputs[1] and outputs[0][0].startswith("linked=42")
        assert "nvidia-cdi-hook" not in json.dumps(outputs[1][1][0])

        # the host folder's library rewritten (another answer): not replayed, the new one seen
        rh.library(host / f"libnvidia-ml.so.{VERSION}", "libnvidia-ml.so.1", "int cdi_shim_fake(void) { return 43; }\n")
        bundle = made.container()
        run = world.shim("run", "--bundle", bundle.path, bundle.id, env=made.env())
        assert run.returncode == 0 and run.stdout.startswith("linked=43"), run.stderr
        assert (made.served(), replays()) == (2, 1)

        # another host folder at the same mount (same names; the worker trusts files however new)
        (tmp_path / "other").mkdir()
        other = _host_folder(tmp_path / "other", driver, answer=44)
        world.write_spec("nvidia-gpu.yaml", _spec(world, other))
        bundle = made.container()
        run = world.shim("run", "--bundle", bundle.path, bundle.id, env=made.env())
        assert run.returncode == 0 and run.stdout.startswith("linked=44"), run.stderr
        assert (made.served(), replays()) == (3, 1)
        assert f"{FOLDER}/libnvidia-ml.so.1" in open(bundle.rootfs + "/etc/ld.so.cache", "rb").read().decode("latin-1")
    finally:
        made.close()
