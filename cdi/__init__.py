"""The Container Device Interface: names, specs, spec directories, and edits to OCI configs.

This package knows nothing about runtimes; `shim` builds on it. Semantics follow the CNCF CDI
library head (strict parsing, version gates, directory priority, conflict deletion, edit order);
error texts carry over verbatim.
"""

__version__ = "0.2.0"
