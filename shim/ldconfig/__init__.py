"""ldconfig, re-implemented over the C engine (csrc/engine, through shim._native), knowing
nothing of containers' hooks (that is shim.linker's).

`ldcache` is its Python face; `engine` the binding and in-root file access; `cachefile` reads
caches; `ldconf` and `globbing` the image's ld.so.conf; `plan` plans a cache (and keeps plans);
`mounted` reads folders a directory mount provides.

Nothing is imported here: the create path loads the engine only when a device mounts
libraries.
"""
