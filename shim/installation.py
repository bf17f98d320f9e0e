"""Where this cdi-shim is installed, and the paths to write into files that outlive a release.

On a node cdi-shim lives under one prefix (DEFAULT_PREFIX): each release a folder
`releases/<release>` (a Python, the package, the native programs in its `bin/`), and `current`, a
link to one of them switched by rename. The native programs start the Python beside them with
links resolved, so a running process sees `<prefix>/releases/<release>/bin`; what outlives the
process (containerd's BinaryName, the resident unit's ExecStart, the hook a CDI spec names) must
name `<prefix>/current/bin/...` instead, or the next release would leave it pointing at a release
that is gone. Anything else (a venv, a checkout's .venv) is a development install: its own paths
are all there is, and `doctor` says so.
"""
import os
import sys

DEFAULT_PREFIX = "/opt/cdi-shim"


def bin_dir():
    """The folder of this install's programs: the one of the interpreter they start."""
    return os.path.dirname(os.path.abspath(sys.executable))


def node_prefix():
    """The node prefix this install is a release of (`<prefix>/releases/R` or `<prefix>/current`),
    or None for a development install."""
    tree = os.path.dirname(bin_dir())
    parent = os.path.dirname(tree)
    if os.path.basename(parent) == "releases":
        return os.path.dirname(parent)
    if os.path.basename(tree) == "current":
        return parent
    return None


def stable_program(name):
    """The path of program NAME to write into configs, units and specs."""
    prefix = node_prefix()
    if prefix is None:
        return os.path.join(bin_dir(), name)
    return os.path.join(prefix, "current", "bin", name)

