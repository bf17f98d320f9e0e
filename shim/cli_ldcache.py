"""`cdi-shim ldcache ...`: the native ld.so.cache engine on a directory tree."""
import click


@click.group()
def ldcache():
    """Read and write glibc linker caches (ld.so.cache) without running ldconfig."""
