"""Issue 31, item 7: a host file a spec needs (a mount source, a device node whose numbers come
from the host) is deleted while the spec still matches the driver, or records no driver at all.
`cdi validate` reported 0 errors and the create failed inside runc (`error mounting ... no such
file or directory`), naming neither the spec nor the device. Now both name the spec, the device
and the file, with real runc, per-create interpreter and resident process alike; a create of the
same device before the deletion (the resident worker's registry and step memos warm) does not
hide it."""
import os
import subprocess

import pytest

import runtime_helpers as rh
from tests.helpers import cdi_shim_cli

pytestmark = pytest.mark.runtime_e2e
RESIDENT_TOO = True


def create(world, device):
    bundle = world.bundle(args=("true",))
    done = world.shim("--device", device, "create", "--bundle", bundle.path, bundle.id)
    if done.returncode == 0:
        world.shim("delete", "--force", bundle.id)
    return done, bundle


def validate(world):
    return subprocess.run([cdi_shim_cli(), "cdi", "validate"], capture_output=True, text=True, env=world.env(),
                          timeout=60)


def test_missing_mount_source_named_by_validate_and_create(world):
    spec = os.path.join(world.spec_dir, "nvidia-gpu.yaml")
    done, _ = create(world, "nvidia.com/gpu=0")
    assert done.returncode == 0, done.stderr
    assert validate(world).returncode == 0

    os.unlink(world.host_file)   # the spec-wide mount of every device
    said = f"the CDI spec {spec} names host files that do not exist: {world.host_file} (mount source of " \
           "nvidia.com/gpu=0)"
    checked = validate(world)
    assert checked.returncode == 1, checked.stdout
    assert f"the CDI spec {spec} names host files that do not exist: {world.host_file} (mount source)" \
        in checked.stdout, checked.stdout
    done, bundle = create(world, "nvidia.com/gpu=0")
    assert done.returncode == 1
    assert said in done.stderr and "cannot inject nvidia.com/gpu=0" in done.stderr, done.stderr
    assert "error mounting" not in done.stderr
    assert bundle.unchanged()


def test_missing_device_node_named_with_its_device(world):
    spec = os.path.join(world.spec_dir, "nvidia-gpu.yaml")
    os.unlink(world.node(1))
    checked = validate(world)
    assert checked.returncode == 1
    for device in ("nvidia.com/gpu=1", f"nvidia.com/gpu={rh.GPU_UUIDS[1]}"):
        assert f"{world.node(1)} (device node of {device})" in checked.stdout, checked.stdout
    done, bundle = create(world, "nvidia.com/gpu=1")
    assert done.returncode == 1
    assert f"cannot inject nvidia.com/gpu=1: the CDI spec {spec} names host files that do not exist: " \
        f"{world.node(1)} (device node of nvidia.com/gpu=1)" in done.stderr, done.stderr
    assert bundle.unchanged()
    done, _ = create(world, "nvidia.com/gpu=0")   # a device that needs only files that are there
    assert done.returncode == 0, done.stderr


def test_a_node_the_spec_describes_whole_is_not_needed(world):
    """type and major given: runc makes the node itself (the CDI library allows it); not an error."""
    spec = world.write_spec("whole.yaml", 'cdiVersion: "0.5.0"\nkind: example.com/dev\ndevices:\n'
                            "  - name: a\n    containerEdits:\n      deviceNodes:\n"
                            f"        - path: /dev/example-a\n          hostPath: {world.base}/absent-node\n"
                            "          type: c\n          major: 1\n          minor: 3\n")
    assert validate(world).returncode == 0
    done, _ = create(world, "example.com/dev=a")
    assert done.returncode == 0, (spec, done.stderr)
