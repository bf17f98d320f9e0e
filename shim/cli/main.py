"""`cdi-shim`: the management command line. Each command group lives in a module of its own."""
import click

from cdi import __version__

from .bench import bench
from .doctor import doctor
from .hook import hook
from .install import install
from .ldcache import ldcache
from .nri import nri
from .runtime import runtime
from .runtimeclass import runtimeclass
from .specs import cdi


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="cdi-shim")
def main():
    """Manage CDI devices for containers: specs, runtime registration, diagnosis.

    The configuration is read from /etc/cdi-shim/config.toml, or from the file named by
    $CDI_SHIM_CONFIG.
    """


for _group in (cdi, ldcache, hook, runtime, runtimeclass, bench, doctor, install, nri):
    main.add_command(_group)

if __name__ == "__main__":  # pragma: no cover
    main()
