"""What the interpreter path of a create imports (no resident process): every module is paid
for on each GPU container start, so the create path stays off the heavy standard modules.

`re` alone (with enum, functools, collections) costs ~12 ms here: an `import re` at the top of
a module on the path (it happened: shim.linker.toolkit_hooks) made every create that much
slower. The child is the installed front end, starting the interpreter beside it with
`-X importtime` added.
"""
import os

import runtime_helpers as rh
from tests.helpers import python_prefix

# Never on a create whose specs are in the registry cache (a cold cache parses YAML: yaml imports re).
HEAVY = ("re", "enum", "json", "tempfile", "shutil", "click", "yaml", "tomlkit", "subprocess", "logging",
         "functools", "ctypes", "datetime")


def _imported(world, bundle, tmp_path):
    # the installed front end, copied into a prefix whose python3 adds -X importtime: what it
    # starts for a create is exactly what runs on a node
    front_end = os.path.join(python_prefix(tmp_path / bundle.id, [rh.RUNTIME_NAME], ["-X", "importtime"]),
                             rh.RUNTIME_NAME)
    run = rh.run_captured([front_end, "--root", world.runc_root, "create", "--bundle", bundle.path, bundle.id],
                          env=world.env(), timeout=60)
    world.created.append(bundle.id)
    assert run.returncode == 0, run.stderr
    return {line.split("|")[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")}


def test_a_create_with_devices_and_toolkit_hooks_imports_no_heavy_module(world, tmp_path):
    """One device by annotation, plus a known toolkit hook (so the linker and toolkit-hook
    modules load), with the registry cache warm (a create before it)."""
    hook = {"path": "/usr/bin/nvidia-cdi-hook", "args": ["nvidia-cdi-hook", "enable-cuda-compat",
                                                         "--host-driver-version=550.54.15"]}

    def edit(config):
        config["hooks"] = {"createContainer": [hook]}

    annotations = {"cdi.k8s.io/test": "nvidia.com/gpu=0"}
    _imported(world, world.bundle(annotations=annotations, edit=edit), tmp_path)   # warms the registry cache
    modules = _imported(world, world.bundle(annotations=annotations, edit=edit), tmp_path)
    assert "shim.linker.toolkit_hooks" in modules and "cdi.registry" in modules, sorted(modules)
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))
