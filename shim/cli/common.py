"""What every command group of `cdi-shim` shares: failing with a one-line reason, the settings."""
import click

from ..config import ConfigError, load_config


def fail(message):
    raise click.ClickException(message)


def settings():
    """cdi-shim's configuration (/etc/cdi-shim/config.toml or $CDI_SHIM_CONFIG), or a click error."""
    try:
        return load_config()
    except ConfigError as err:
        raise click.ClickException(str(err)) from None


def spec_dirs(given):
    """The spec directories the user gave, else the configured ones."""
    return tuple(given) if given else settings().spec_dirs
