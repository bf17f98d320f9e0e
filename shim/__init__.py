"""cdi-shim: the runtime wrapper and node tooling built on the `cdi` package."""
from cdi import __version__  # noqa: F401 - one version for the whole distribution
