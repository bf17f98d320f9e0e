"""What the interpreter path of a create imports (no resident process): every module is paid
for on each GPU container start, so the create path stays off the heavy standard modules.

`re` alone (with enum, functools, collections) costs ~12 ms here: an `import re` at the top of
a module on the path (it happened: shim.linker.toolkit_hooks) made every create that much
slower. The child runs exactly what the front end runs (python -I -S, the import directories,
shim.runtime.main), with `-X importtime` added.
"""
import os
import sys
import sysconfig

import runtime_helpers as rh

# Never on a create whose specs are in the registry cache (a cold cache parses YAML: yaml imports re).
HEAVY = ("re", "enum", "json", "tempfile", "shutil", "click", "yaml", "tomlkit", "subprocess", "logging",
         "functools", "ctypes", "datetime")


def _imported(world, bundle):
    # the import directories setup.py compiles into the front end: the venv's, then the tree
    tree = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    dirs = list(dict.fromkeys([sysconfig.get_path("platlib"), sysconfig.get_path("purelib"), tree]))
    boot = ("import sys\n"
            f"sys.path[:0] = {dirs!r}\n"
            "from shim.runtime.main import main\n"
            "sys.exit(main())\n")
    run = rh.run_captured([sys.executable, "-I", "-S", "-X", "importtime", "-c", boot,
                           "--root", world.runc_root, "create", "--bundle", bundle.path, bundle.id],
                          env=world.env(), timeout=60)
    world.created.append(bundle.id)
    assert run.returncode == 0, run.stderr
    return {line.split("|")[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")}


def test_a_create_with_devices_and_toolkit_hooks_imports_no_heavy_module(world):
    """One device by annotation, plus a known toolkit hook (so the linker and toolkit-hook
    modules load), with the registry cache warm (a create before it)."""
    hook = {"path": "/usr/bin/nvidia-cdi-hook", "args": ["nvidia-cdi-hook", "enable-cuda-compat",
                                                         "--host-driver-version=550.54.15"]}

    def edit(config):
        config["hooks"] = {"createContainer": [hook]}

    annotations = {"cdi.k8s.io/test": "nvidia.com/gpu=0"}
    _imported(world, world.bundle(annotations=annotations, edit=edit))   # warms the registry cache
    modules = _imported(world, world.bundle(annotations=annotations, edit=edit))
    assert "shim.linker.toolkit_hooks" in modules and "cdi.registry" in modules, sorted(modules)
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))
