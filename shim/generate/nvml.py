"""The GPUs as NVML reports them, through the driver root's own libnvidia-ml.so.1.

pynvml loads its library by bare name (`CDLL("libnvidia-ml.so.1")`, in
`pynvml._LoadNvmlLibrary`, kept in the module global `pynvml.nvmlLib`), which would find the
host's library, not the one of `--driver-root` (a driver container's root, say). We load the
library by full path ourselves and put it in `pynvml.nvmlLib` under pynvml's own lock, so
`_LoadNvmlLibrary` sees it loaded and every pynvml function calls into it; the function
pointers pynvml caches by name are dropped before and after, so a second library in the same
process is never called through the first one's pointers.

NVML errors keep NVML's own text (`str(pynvml.NVMLError)` asks the library's
nvmlErrorString), prefixed with the call and the GPU.
"""
import ctypes
import time

from . import GenerateError

LIBRARY = "libnvidia-ml.so.1"


class Mig:
    """A MIG device: its slot on the parent GPU, UUID, GPU instance and compute instance."""

    __slots__ = ("index", "uuid", "gi", "ci")

    def __init__(self, index, uuid, gi, ci):
        self.index = index
        self.uuid = uuid
        self.gi = gi
        self.ci = ci

    def __repr__(self):
        return f"Mig({self.index}, {self.uuid!r}, gi={self.gi}, ci={self.ci})"


class Gpu:
    """One GPU: what the spec needs of it (migs: its MIG devices when MIG mode is on)."""

    __slots__ = ("index", "uuid", "name", "minor", "bus_id", "mig_enabled", "migs")

    def __init__(self, index, uuid, name, minor, bus_id, mig_enabled):
        self.index = index
        self.uuid = uuid
        self.name = name
        self.minor = minor
        self.bus_id = bus_id
        self.mig_enabled = mig_enabled
        self.migs = []

    def __repr__(self):
        return f"Gpu({self.index}, {self.uuid!r}, minor={self.minor}, bus_id={self.bus_id!r})"


class NvmlInfo:
    """What NVML said: the driver version, the GPUs in index order, and the time it took."""

    def __init__(self, library, driver_version, gpus, import_seconds, load_seconds, call_seconds, calls):
        self.library = library
        self.driver_version = driver_version
        self.gpus = gpus
        self.import_seconds = import_seconds  # import pynvml
        self.load_seconds = load_seconds    # dlopen of the library
        self.call_seconds = call_seconds    # inside NVML calls, nvmlInit and nvmlShutdown included
        self.calls = calls


class _Session:
    """pynvml pointed at one library for the duration of a `with` block."""

    def __init__(self, pynvml, library):
        self.pynvml = pynvml
        self.library = library
        self.seconds = 0.0
        self.calls = 0

    def __enter__(self):
        nv = self.pynvml
        with nv.libLoadLock:
            self.saved = nv.nvmlLib
            nv.nvmlLib = self.library
            self._forget()
        return self

    def _forget(self):
        """Drop what pynvml cached from a library: its function pointers, its error texts."""
        for cache in (getattr(self.pynvml, "_nvmlGetFunctionPointer_cache", None),
                      getattr(self.pynvml.NVMLError, "_errcode_to_string", None)):
            if isinstance(cache, dict):
                cache.clear()

    def __exit__(self, *exc):
        nv = self.pynvml
        with nv.libLoadLock:
            nv.nvmlLib = self.saved
            self._forget()

    def call(self, what, function, *args, accept=None):
        """FUNCTION(*ARGS), timed; an NVML error becomes GenerateError("WHAT: <NVML's text>"),
        except the codes ACCEPT maps to a value to return instead."""
        start = time.perf_counter()
        try:
            return function(*args)
        except self.pynvml.NVMLError as err:
            if accept and err.value in accept:
                return accept[err.value]
            raise GenerateError(f"{what}: {_text(err)}") from None
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1


def _text(err):
    """NVML's own text for ERR (its nvmlErrorString), or the code when even that fails."""
    try:
        return str(err)
    except Exception:  # a library without nvmlErrorString
        return f"NVML error {err.value}"


def _string(value):
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def load_library(path):
    """ctypes handle of the NVML library at PATH (a host path), or GenerateError."""
    try:
        return ctypes.CDLL(path)
    except OSError as err:
        raise GenerateError(f"cannot load {path}: {err}") from None


def query(path):
    """NvmlInfo from the NVML library at PATH: nvmlInit, the driver version, every GPU, nvmlShutdown."""
    start = time.perf_counter()
    import pynvml

    import_seconds = time.perf_counter() - start
    start = time.perf_counter()
    library = load_library(path)
    load_seconds = time.perf_counter() - start
    with _Session(pynvml, library) as nv:
        try:
            nv.call("nvmlInit_v2", pynvml.nvmlInit)
        except GenerateError as err:
            raise GenerateError(
                f"NVML could not be initialised ({path}): {str(err).partition(': ')[2]}; "
                "check that the NVIDIA kernel module is loaded and matches the user-space driver "
                "(cat /proc/driver/nvidia/version; nvidia-smi)") from None
        try:
            version = _string(nv.call("nvmlSystemGetDriverVersion", pynvml.nvmlSystemGetDriverVersion))
            count = nv.call("nvmlDeviceGetCount_v2", pynvml.nvmlDeviceGetCount)
            gpus = [_gpu(nv, pynvml, index) for index in range(count)]
        finally:
            try:
                nv.call("nvmlShutdown", pynvml.nvmlShutdown)
            except GenerateError:
                pass  # what we read stands; a failed shutdown changes nothing in it
        return NvmlInfo(path, version, gpus, import_seconds, load_seconds, nv.seconds, nv.calls)


def _gpu(nv, pynvml, index):
    where = f"GPU {index}"
    handle = nv.call(f"{where}: nvmlDeviceGetHandleByIndex_v2", pynvml.nvmlDeviceGetHandleByIndex, index)
    name = _string(nv.call(f"{where}: nvmlDeviceGetName", pynvml.nvmlDeviceGetName, handle))
    uuid = _string(nv.call(f"{where}: nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, handle))
    minor = nv.call(f"{where} ({uuid}): nvmlDeviceGetMinorNumber", pynvml.nvmlDeviceGetMinorNumber, handle)
    pci = nv.call(f"{where} ({uuid}): nvmlDeviceGetPciInfo_v3", pynvml.nvmlDeviceGetPciInfo_v3, handle)
    bus_id = _string(pci.busId)
    # A GPU without MIG answers NOT_SUPPORTED.
    current, _pending = nv.call(f"{where} ({uuid}): nvmlDeviceGetMigMode", pynvml.nvmlDeviceGetMigMode, handle,
                                accept={pynvml.NVML_ERROR_NOT_SUPPORTED: (None, None)})
    gpu = Gpu(index, uuid, name, minor, bus_id, current == pynvml.NVML_DEVICE_MIG_ENABLE)
    if gpu.mig_enabled:
        gpu.migs = _migs(nv, pynvml, gpu, handle)
    return gpu


def _migs(nv, pynvml, gpu, handle):
    """The GPU's MIG devices, as go-nvlib's VisitMigDevices walks them: every slot up to
    nvmlDeviceGetMaxMigDeviceCount, an empty one (NOT_FOUND) skipped; the index is the slot's."""
    where = f"GPU {gpu.index} ({gpu.uuid})"
    count = nv.call(f"{where}: nvmlDeviceGetMaxMigDeviceCount", pynvml.nvmlDeviceGetMaxMigDeviceCount, handle)
    migs = []
    for slot in range(count):
        mig = nv.call(f"{where}: nvmlDeviceGetMigDeviceHandleByIndex({slot})",
                      pynvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot,
                      accept={pynvml.NVML_ERROR_NOT_FOUND: None})
        if mig is None:
            continue
        at = f"{where} MIG device {slot}"
        uuid = _string(nv.call(f"{at}: nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, mig))
        gi = nv.call(f"{at} ({uuid}): nvmlDeviceGetGpuInstanceId", pynvml.nvmlDeviceGetGpuInstanceId, mig)
        ci = nv.call(f"{at} ({uuid}): nvmlDeviceGetComputeInstanceId", pynvml.nvmlDeviceGetComputeInstanceId, mig)
        migs.append(Mig(slot, uuid, gi, ci))
    return migs
