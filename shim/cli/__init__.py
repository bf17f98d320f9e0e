"""The command lines: `cdi-shim` (click; `main` and one module per command group) and the lean
`cdi-shim-hook` (`hook_main`, no click). Argument handling and output only; the work lives in
the packages beside this one.

Nothing is imported here: `cdi-shim-hook` must start without click.
"""
