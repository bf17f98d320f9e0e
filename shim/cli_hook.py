"""`cdi-shim hook ...`: OCI hooks (the container state JSON arrives on stdin)."""
import click


@click.group()
def hook():
    """OCI hooks that replace nvidia-cdi-hook's, safely and without ldconfig."""
