"""The Container Device Interface: names, specs, spec directories, and edits to OCI configs.

This package knows nothing about runtimes; `shim` builds on it. Semantics follow the CNCF CDI
library head (see shared/reference/cdi-semantics.md); error texts carry over verbatim.
"""

__version__ = "0.1.0"
