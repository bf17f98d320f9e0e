"""The systemd units of the spec refresh, as files of the package (so the wheel and the node
tree carry them): `@CDI_SHIM@` stands for the cdi-shim they run and `@ARGS@` for the generate
options of the node (`--driver-root`, `--layout`, ...). `install --node` renders and installs
cdi-shim-generate.service (shim/node/refresh_unit.py); contrib/ holds them rendered for the node
prefix, NODE_CDI_SHIM (with the resident's and the NRI plugin's units, rendered alike: a test
compares each with what the install writes)."""
import os

NODE_CDI_SHIM = "/opt/cdi-shim/current/bin/cdi-shim"    # the node prefix's cdi-shim (docs/install.md)

NAMES = ("cdi-shim-generate.service", "cdi-shim-generate-once.service", "cdi-shim-generate.timer")


def template(name):
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), name)) as stream:
        return stream.read()


def render(name, cdi_shim, args=()):
    """Unit NAME running CDI_SHIM with the generate options ARGS (words, shell-quoted as systemd reads them)."""
    import shlex

    extra = "".join(" " + shlex.quote(arg) for arg in args)
    return template(name).replace("@CDI_SHIM@", cdi_shim).replace(" @ARGS@", extra)
