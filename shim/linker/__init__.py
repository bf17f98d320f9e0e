"""The container's dynamic-linker cache and the native work of the hooks we replace.

`ldcache` is the engine's Python face (the C engine in csrc/engine, through shim._native;
its binding and in-root file access in `engine`): reading caches (`cachefile`), the image's
ld.so.conf (`ldconf`, `globbing`), planning a cache (`plan`). `container` is the runtime's use
of it on create (the bundle's cache, which hooks it replaces; the links in `links`, the /etc files
in `etcfiles`); `hooks` is the same
work as OCI hooks for other runtimes.

Nothing is imported here: the create path loads the engine only when a device mounts
libraries.
"""
