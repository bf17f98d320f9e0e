"""The create step: the container's dynamic-linker cache and the native work of the hooks we
replace, over shim.ldconfig.

`container` is the runtime's step on create (the bundle's cache, which hooks it replaces; the
links in `links`, the /etc files in `etcfiles`, the binds hook in `filebinds`, the toolkit's
other hooks in `toolkit_hooks` and `cudacompat`); `stepresult` is what a step did and `stepmemo`
the resident worker's memo of whole steps and the front end's recipes; `hooks` is the same work
as OCI hooks for other runtimes.

Nothing is imported here: the create path loads the engine only when a device mounts
libraries.
"""
