"""Build glue: the cffi extension (shim._native), the native runtime front end, the params
hook and the hook script.

pyproject.toml holds the metadata. The front end `cdi-shim-runtime` is a small C program
installed as a script; it needs to know which interpreter and which import directories run
the Python half, so those are compiled in here. `cdi-shim-nshook` (csrc/hooks), the hooks the
runtime leaves in config.json (work under a mount runc makes: /proc, /dev; the library binds it
takes from runc), is C for the same reason: it starts for every GPU container. `cdi-shim-hook` (the OCI hooks podman or
containerd with plain runc run as processes) is a Python script written here the same way:
`python -IS` in its first line, the import directories in its text.
"""
import os
import shlex
import subprocess
import sys
import sysconfig

from setuptools import setup
from distutils.command.build_scripts import build_scripts  # setuptools ships this distutils

HERE = os.path.dirname(os.path.abspath(__file__))
FRONT_END_SOURCES = [os.path.join("csrc", "frontend", name) for name in ("runtime_main.c", "replay.c")] + [
    os.path.join("csrc", "engine", name) for name in ("ociconf.c", "inroot.c", "filememo.c")]
FRONT_END = os.path.join("build", "native", "cdi-shim-runtime")
HOOK_SCRIPT = os.path.join("build", "native", "cdi-shim-hook")
NS_HOOK_SOURCES = [os.path.join("csrc", "hooks", name) for name in ("nshook.c", "ocistate.c")] + [
    os.path.join("csrc", "engine", "inroot.c")]
NS_HOOK = os.path.join("build", "native", "cdi-shim-nshook")


def _version():
    with open(os.path.join(HERE, "cdi", "__init__.py")) as source:
        for line in source:
            if line.startswith("__version__"):
                return line.split("=")[1].strip().strip("\"'")
    raise RuntimeError("cdi/__init__.py has no __version__")


def _import_dirs():
    # The installed packages first (a normal install), then the source tree (an editable one).
    dirs = []
    for key in ("platlib", "purelib"):
        path = sysconfig.get_path(key)
        if path not in dirs:
            dirs.append(path)
    dirs.append(HERE)
    for path in dirs + [sys.executable]:
        if any(char in path for char in "\"\\'\n"):
            raise RuntimeError(f"cannot compile the path {path!r} into the runtime front end")
    return "[" + ", ".join(f"'{path}'" for path in dirs) + "]"


def build_program(output, sources, defines=()):
    """Compile SOURCES into the program OUTPUT (both relative to this directory)."""
    os.makedirs(os.path.dirname(os.path.join(HERE, output)), exist_ok=True)
    compiler = shlex.split(sysconfig.get_config_var("CC") or "cc")[:1] or ["cc"]
    command = compiler + ["-O2", "-Wall", "-Wextra", "-std=gnu11", *defines, "-o", os.path.join(HERE, output)]
    command += [os.path.join(HERE, source) for source in sources]
    # Static when the C library allows it: no dynamic loading on every exec probe.
    # Stripped, with unused sections dropped: fewer pages to fault in on every exec.
    static = ["-static", "-s", "-ffunction-sections", "-fdata-sections", "-Wl,--gc-sections"]
    if subprocess.run(command + static, stderr=subprocess.DEVNULL).returncode != 0:
        subprocess.run(command, check=True)


def build_front_end():
    build_program(FRONT_END, FRONT_END_SOURCES, [
        f'-DCDS_PYTHON="{sys.executable}"',
        f'-DCDS_PYPATH="{_import_dirs()}"',
        f'-DCDS_VERSION="{_version()}"',
    ])


def write_hook_script():
    shebang = f"#!{sys.executable} -IS"
    if len(shebang) > 250:            # the kernel reads 256 bytes of it
        raise RuntimeError(f"the interpreter path {sys.executable!r} is too long for a script's first line")
    text = (f"{shebang}\n"
            '"""cdi-shim-hook: OCI hooks (see shim/cli/hook_main.py). Written by setup.py."""\n'
            "import sys\n"
            f"sys.path[:0] = {_import_dirs()}\n"
            "from shim.cli.hook_main import main\n"
            "sys.exit(main())\n")
    path = os.path.join(HERE, HOOK_SCRIPT)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as out:
        out.write(text)
    os.chmod(path, 0o755)


class CopyNativeScripts(build_scripts):
    """Our scripts are made for this interpreter already: copy them as they are (no shebang
    rewriting)."""

    def copy_scripts(self):
        self.mkpath(self.build_dir)
        outfiles = []
        for script in self.scripts:
            target = os.path.join(self.build_dir, os.path.basename(script))
            self.copy_file(script, target)
            os.chmod(target, 0o755)
            outfiles.append(target)
        return outfiles, outfiles


build_front_end()
build_program(NS_HOOK, NS_HOOK_SOURCES)
write_hook_script()
setup(
    cffi_modules=["csrc/engine/build_native.py:ffibuilder"],
    scripts=[FRONT_END, NS_HOOK, HOOK_SCRIPT],
    cmdclass={"build_scripts": CopyNativeScripts},
)
