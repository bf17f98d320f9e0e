"""`cdi-shim ldcache ...`: the native ld.so.cache engine on a directory tree."""
import os
import sys

import click


def _engine():
    from ..ldconfig import ldcache
    return ldcache


def _extra_pairs(values):
    pairs = {}
    for value in values:
        container, sep, host = value.partition("=")
        if not sep or not container.startswith("/") or not host:
            raise click.BadParameter(f"{value!r} is not CONTAINER_PATH=HOST_PATH", param_hint="--extra")
        pairs[container] = host
    return pairs


@click.group()
def ldcache():
    """Read and write glibc linker caches (ld.so.cache) without running ldconfig."""


@ldcache.command()
@click.option("--root", required=True, type=click.Path(file_okay=False), metavar="ROOT",
              help="The container's root filesystem (paths below are resolved inside it).")
@click.option("--folder", "folders", multiple=True, metavar="DIR",
              help="A library directory to add ahead of the image's (repeatable), as the "
                   "toolkit's update-ldcache hook does.")
@click.option("--extra", "extras", multiple=True, metavar="CONTAINER_PATH=HOST_PATH",
              help="A host library that will be bind-mounted at CONTAINER_PATH (repeatable).")
@click.option("--output", type=click.Path(dir_okay=False), metavar="FILE",
              help="Write the cache here (a host path) instead of ROOT/etc/ld.so.cache.")
@click.option("--mode", type=click.Choice(["auto", "full", "incremental"]), default="auto",
              show_default=True, help="Start from the image's cache, scan everything, or decide.")
@click.option("--links", type=click.Choice(["existing", "ldconfig"]), default="existing",
              show_default=True,
              help="existing: name DIR/SONAME only where that name is the library (nothing "
                   "creates links); ldconfig: always DIR/SONAME, as ldconfig (which makes links).")
@click.option("--format", "fmt", type=click.Choice(["new", "compat", "old"]), default="new",
              show_default=True, help="Cache format (glibc 2.32 and later write new).")
@click.option("--machine", type=click.Choice(["x86_64", "aarch64"]), default=None,
              help="The ldconfig to emulate (default: this machine's).")
@click.option("-v", "--verbose", is_flag=True, help="Also say what was skipped and why.")
def update(root, folders, extras, output, mode, links, fmt, machine, verbose):
    """Compute the cache ROOT would have after ldconfig with DIR... added.

    Incremental from ROOT's own cache when it is valid and consistent with ROOT's
    configuration, a full scan otherwise. Nothing outside ROOT is read; without --output
    the cache (and a musl image's .path file) is written inside ROOT, atomically.
    """
    engine = _engine()
    try:
        plan = engine.update(root, folders, _extra_pairs(extras), output=output, mode=mode,
                             links=links, format=fmt, machine=machine)
    except (engine.LdcacheError, OSError, ValueError) as err:
        raise click.ClickException(str(err)) from None
    where = output if output is not None else os.path.join(root, "etc/ld.so.cache")
    how = plan.mode if plan.mode == "incremental" else f"full scan: {plan.reason}"
    click.echo(f"{where}: {plan.entries} libraries ({how})")
    for path in plan.musl:
        click.echo(f"{os.path.join(root, path.lstrip('/'))}: musl search path")
    if verbose:
        for warning in plan.warnings:
            click.echo(f"warning: {warning}", err=True)
        for path, why in plan.skipped:
            click.echo(f"skipped {path}: {why}", err=True)


@ldcache.command(name="list")
@click.option("--cache", "cache_file", type=click.Path(dir_okay=False), metavar="FILE",
              help="A cache file on this host (default: /etc/ld.so.cache).")
@click.option("--root", type=click.Path(file_okay=False), metavar="ROOT",
              help="List ROOT's /etc/ld.so.cache, read inside ROOT.")
def list_(cache_file, root):
    """Print a cache the way `ldconfig -p` does."""
    engine = _engine()
    if cache_file is not None and root is not None:
        raise click.UsageError("--cache and --root are exclusive")
    try:
        if root is not None:
            name = engine.CACHE_PATH
            data = engine.read_root_bytes(root, name)
        else:
            name = cache_file if cache_file is not None else engine.CACHE_PATH
            data = engine.read_host_bytes(name)
        if not data:
            return                    # ldconfig prints nothing for an empty file
        try:
            cache = engine.read_cache(data)
        except engine.LdcacheError as err:
            raise engine.LdcacheError(f"{name}: {err}") from None
        listing = engine.format_listing(cache, name)
    except engine.LdcacheError as err:
        raise click.ClickException(str(err)) from None
    out = sys.stdout.buffer
    out.write(listing)
    out.flush()
