"""Build glue: the cffi extension (shim._native) and the native programs installed as scripts
(csrc/programs.py: cdi-shim, cdi-shim-runtime, cdi-shim-hook, cdi-shim-nshook).

pyproject.toml holds the metadata. No program has a path of the build machine compiled in: they
find their interpreter and packages relative to where they are installed
(csrc/launcher/pylaunch.h), so a wheel built here works installed anywhere. Everything is built
under a fresh temporary build folder: a build never writes into the source tree, and a stale
build/lib cannot leak removed modules into a later wheel.
"""
import atexit
import os
import shutil
import sys
import tempfile

from setuptools import setup
from setuptools.command.build import build
from setuptools.command.egg_info import egg_info
from distutils.command.build_scripts import build_scripts  # setuptools ships this distutils

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "csrc"))
import programs  # noqa: E402 - the table of native programs, beside their sources


def version():
    """The one version (cdi/__init__.py), also what pyproject.toml's dynamic version reads."""
    with open(os.path.join(HERE, "cdi", "__init__.py")) as source:
        for line in source:
            if line.startswith("__version__"):
                return line.split("=")[1].strip().strip("\"'")
    raise RuntimeError("cdi/__init__.py has no __version__")


class FreshBuildFolder(build):
    """setuptools' build folder in a new temporary folder, removed at exit."""

    def initialize_options(self):
        super().initialize_options()
        self.build_base = tempfile.mkdtemp(prefix="cdi-shim-build-")
        atexit.register(shutil.rmtree, self.build_base, True)


class MetadataOutsideTheTree(egg_info):
    """The .egg-info folder in a temporary folder too, unless a build front end named one."""

    def initialize_options(self):
        super().initialize_options()
        self.egg_base = tempfile.mkdtemp(prefix="cdi-shim-egg-info-")
        atexit.register(shutil.rmtree, self.egg_base, True)


class NativePrograms(build_scripts):
    """The scripts are the native programs, compiled here into the build folder."""

    def get_source_files(self):
        return sorted({source for sources, _ in programs.PROGRAMS.values() for source in sources})

    def copy_scripts(self):
        self.mkpath(self.build_dir)
        outfiles = []
        for name in programs.PROGRAMS:
            target = os.path.join(self.build_dir, name)
            programs.build(name, HERE, target, version())
            os.chmod(target, 0o755)
            outfiles.append(target)
        return outfiles, outfiles


setup(
    cffi_modules=["csrc/engine/build_native.py:ffibuilder"],
    scripts=list(programs.PROGRAMS),           # names: NativePrograms builds them
    cmdclass={"build": FreshBuildFolder, "egg_info": MetadataOutsideTheTree, "build_scripts": NativePrograms},
)
