"""The native programs the wheel installs as scripts: their sources and how they are compiled.

One table for setup.py, which builds them, and for the tests, which build sanitized copies.
Paths are relative to the source tree's root.
"""
import os
import shlex
import subprocess
import sysconfig

LAUNCHER = ["csrc/launcher/pylaunch.c"]
FRONTEND = ["runtime_main", "settings", "cmdline", "request_scan", "passthrough", "runlog", "resident_client",
            "after_create"]
# the engine's parts it links
FRONTEND_ENGINE = ["recipe", "replay", "replay_etc", "request", "ociconf", "inroot", "filememo", "devlinks"]
PROGRAMS = {
    # the runtime front end: runc's command line, passthrough without Python
    "cdi-shim-runtime": ([f"csrc/frontend/{name}.c" for name in FRONTEND]
                         + [f"csrc/engine/{name}.c" for name in FRONTEND_ENGINE] + LAUNCHER, []),
    # the Python programs, started isolated from the caller's environment
    "cdi-shim": (["csrc/launcher/launcher.c"] + LAUNCHER, ['-DCDS_MODULE="shim.cli.main"']),
    "cdi-shim-hook": (["csrc/launcher/launcher.c"] + LAUNCHER, ['-DCDS_MODULE="shim.cli.hook_main"']),
    # the hooks the runtime leaves to runc (work under /proc and runc's /dev, the library binds)
    "cdi-shim-nshook": (["csrc/hooks/nshook.c", "csrc/hooks/nrihook.c", "csrc/hooks/rootfs_ops.c",
                         "csrc/hooks/ocistate.c", "csrc/engine/ociconf.c", "csrc/engine/inroot.c",
                         "csrc/engine/devlinks.c"], []),
    # Docker's --gpus: dockerd offers the flag only with this name on its PATH; it fails when run,
    # saying to select the cdi-shim runtime (which drops it: shim/runtime/requests.py LEGACY_HOOK)
    "nvidia-container-runtime-hook": (["csrc/hooks/legacy_hook.c"], []),
}
# Static when the C library allows it: no dynamic loading on every exec probe. Stripped, with
# unused sections dropped: fewer pages to fault in on every exec.
STATIC = ["-static", "-s", "-ffunction-sections", "-fdata-sections", "-Wl,--gc-sections"]


def command(name, root, output, version, extra=()):
    """The compiler's command line for program NAME from the tree at ROOT into OUTPUT."""
    sources, defines = PROGRAMS[name]
    compiler = shlex.split(sysconfig.get_config_var("CC") or "cc")[:1] or ["cc"]
    return compiler + ["-std=gnu11", "-Wall", "-Wextra", f'-DCDS_VERSION="{version}"', *defines, *extra,
                       "-o", output] + [os.path.join(root, source) for source in sources]


def build(name, root, output, version):
    """Build program NAME, static where the C library allows it."""
    base = command(name, root, output, version, ["-O2", "-g0"])
    if subprocess.run(base + STATIC, stderr=subprocess.DEVNULL).returncode != 0:
        subprocess.run(base, check=True)
