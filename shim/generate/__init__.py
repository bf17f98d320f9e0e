"""`cdi-shim cdi generate`: a CDI spec for this node's NVIDIA GPUs, from NVML.

    nvml.py      the driver root's own libnvidia-ml.so.1, loaded by full path into pynvml; the
                 GPUs it reports (index, UUID, minor number, PCI bus id, MIG mode)
    discover.py  the driver's files in the driver root (libraries through the root's own
                 ld.so.cache, binaries, GSP firmware, IPC sockets, config files) and the
                 device nodes under the dev root
    graphics.py  the graphics files (Xorg modules, EGL platform libraries, ICD and config
                 files), each GPU's DRM nodes and /dev/dri/by-path links, additionalGids
    spec.py      the spec document (a dict) built from both

`generate(options)` runs the three in order and returns a `Result`: the document, the
warnings (an expected library missing, a GPU without a device node, ...) and timings.
Everything that cannot be found and is needed is a `GenerateError` with the reason and how
to check it; nothing is guessed.
"""


class GenerateError(Exception):
    """A spec cannot be generated; the message says why and what to check."""


from .spec import Options, Result, generate  # noqa: E402  (after GenerateError: they import it)

__all__ = ["GenerateError", "Options", "Result", "generate"]
