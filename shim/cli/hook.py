"""`cdi-shim hook ...`: OCI hooks (the container state JSON arrives on stdin)."""
import sys

import click


@click.group()
def hook():
    """OCI hooks that replace nvidia-cdi-hook's, safely and without ldconfig.

    Use them as createContainer hooks; each reads the container state from stdin. In a spec,
    name the program cdi-shim-hook (args: cdi-shim-hook update-ldcache --folder DIR ...):
    the same commands with a start-up of a few milliseconds (python -IS, no click).
    """


def _run(command, **values):
    from ..linker.hooks import MAX_STATE, run

    error = run(command, values, sys.stdin.buffer.read(MAX_STATE))
    if error:
        raise click.ClickException(error)


@hook.command(name="update-ldcache")
@click.option("--folder", "folders", multiple=True, metavar="DIR",
              help="A container directory holding injected libraries (repeatable).")
@click.option("--ldconfig-path", hidden=True, help="Accepted for nvidia-cdi-hook compatibility; unused.")
def update_ldcache(folders, ldconfig_path):
    """Update the container's /etc/ld.so.cache for libraries in DIR…, without running ldconfig.

    The cache is computed natively from the image's cache and configuration and written inside
    the rootfs; nothing is followed out of it.
    """
    _run("update-ldcache", folders=list(folders))


@hook.command(name="create-symlinks")
@click.option("--link", "links", multiple=True, metavar="TARGET::LINK",
              help="Create LINK (an absolute container path) pointing at TARGET (repeatable).")
def create_symlinks(links):
    """Create symbolic links inside the container's rootfs (existing links are left alone)."""
    _run("create-symlinks", links=list(links))
