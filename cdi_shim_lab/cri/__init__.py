"""A minimal CRI client (the RPCs our tests and the pod benchmark use), over grpcio.

The messages live in ``api.proto`` beside this file (upstream field numbers). They are compiled
with grpcio-tools on first use into a cache directory keyed by the proto text and the protobuf
and grpcio-tools versions (``$CDI_SHIM_CRI_BUILD_DIR``, else ``$XDG_CACHE_HOME/cdi-shim/cri``,
else ``~/.cache/cdi-shim/cri``), so nothing generated is checked in and a protobuf upgrade
recompiles. Only message classes are generated; the RPC stubs are plain ``unary_unary`` calls.
"""
import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile

PROTO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "api.proto")
MODULE = "cdi_shim_cri_pb2"
SERVICE = "/runtime.v1.RuntimeService/"


class CRIUnavailable(ImportError):
    """grpcio, grpcio-tools or protobuf is missing."""


def build_dir():
    explicit = os.environ.get("CDI_SHIM_CRI_BUILD_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "cdi-shim", "cri")


def _versions():
    try:
        import google.protobuf
        import grpc_tools
        from importlib.metadata import version
    except ImportError as err:
        raise CRIUnavailable(f"the CRI client needs grpcio-tools and protobuf ({err})") from None
    try:
        tools = version("grpcio-tools")
    except Exception:  # metadata missing: fall back to the module path
        tools = os.path.dirname(grpc_tools.__file__)
    return f"protobuf={google.protobuf.__version__} grpcio-tools={tools}"


def compile_proto(out_dir=None):
    """Compile api.proto (if not already compiled for these versions); returns the module's path."""
    with open(PROTO, "rb") as stream:
        proto = stream.read()
    key = hashlib.sha256(proto + _versions().encode()).hexdigest()[:16]
    target = os.path.join(out_dir or build_dir(), key)
    module_path = os.path.join(target, MODULE + ".py")
    if os.path.exists(module_path):
        return module_path
    from grpc_tools import protoc

    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".build-", dir=parent)
    try:
        with open(os.path.join(work, "cdi_shim_cri.proto"), "wb") as stream:
            stream.write(proto)
        # protoc resolves google/protobuf imports from grpc_tools' bundled includes (none needed here)
        status = protoc.main(["grpc_tools.protoc", f"-I{work}", f"--python_out={work}",
                              os.path.join(work, "cdi_shim_cri.proto")])
        if status != 0 or not os.path.exists(os.path.join(work, MODULE + ".py")):
            raise RuntimeError(f"grpc_tools.protoc failed on {PROTO} (exit {status})")
        try:
            os.rename(work, target)
        except OSError:  # another process won the race
            if not os.path.exists(module_path):
                raise
    finally:
        if os.path.isdir(work):
            shutil.rmtree(work, ignore_errors=True)
    return module_path


def messages():
    """The compiled message module (compiled on first use)."""
    module = sys.modules.get(MODULE)
    if module is not None:
        return module
    path = compile_proto()
    spec = importlib.util.spec_from_file_location(MODULE, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[MODULE]
        raise
    return module


from .client import CRIClient, CRIError  # noqa: E402  (after the loader it uses)

__all__ = ["CRIClient", "CRIError", "CRIUnavailable", "compile_proto", "messages"]
