"""Fixtures of the cdi-shim-runtime end-to-end tests (see runtime_helpers.py).

A test module that sets ``RESIDENT_TOO = True`` runs each test that uses `world` twice: with
the interpreter started per create ("exec") and through a resident process ("resident",
`cdi-shim runtime serve`, one for the session); the results must not differ.
"""
import pytest

import runtime_helpers as rh


def pytest_configure(config):
    config.addinivalue_line("markers", "containerd: end-to-end test through a private containerd 1.6 "
                            "(select with -m containerd, leave out with -m 'not containerd')")
    config.addinivalue_line("markers", "runtime_e2e: end-to-end test of cdi-shim-runtime with real runc")
    config.addinivalue_line("markers", "own_resident: in a RESIDENT_TOO module, a test that starts its own "
                            "resident process (test_front_end_replay.Image): run once, not per world mode")


def pytest_generate_tests(metafunc):
    if "world_mode" in metafunc.fixturenames:
        both = getattr(metafunc.module, "RESIDENT_TOO", False) and not metafunc.definition.get_closest_marker(
            "own_resident")
        modes = ["exec", "resident"] if both else ["exec"]
        metafunc.parametrize("world_mode", modes)


@pytest.fixture(scope="session")
def resident_server(tmp_path_factory):
    server = rh.ResidentServer(str(tmp_path_factory.mktemp("resident")))
    yield server
    server.stop()


@pytest.fixture
def world(tmp_path, world_mode, request):
    """A private runc + CDI world (fake GPUs, spec, config.toml, runc root) for one test."""
    server = request.getfixturevalue("resident_server") if world_mode == "resident" else None
    w = rh.World(tmp_path, resident=server)
    yield w
    w.cleanup()
    if server:
        server.check_alive()


@pytest.fixture
def nvml_library(tmp_path):
    """A fake driver library: DRIVER_VERSION's libnvidia-ml.so (SONAME libnvidia-ml.so.1) in a folder of its own."""
    directory = tmp_path / "driver-root"
    directory.mkdir()
    source = tmp_path / "fake.c"
    source.write_text("int cdi_shim_fake(void) { return 42; }\n")
    library = directory / f"libnvidia-ml.so.{rh.DRIVER_VERSION}"
    rh.gcc("-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", "-o", str(library), str(source))
    return library


@pytest.fixture
def driver(tmp_path):
    """A fake driver: libnvidia-ml.so.<v> (SONAME libnvidia-ml.so.1), libcuda.so.<v> (libcuda.so.1)."""
    directory = tmp_path / "driver-root"
    directory.mkdir()
    v = rh.DRIVER_VERSION
    rh.library(directory / f"libnvidia-ml.so.{v}", "libnvidia-ml.so.1", "int cdi_shim_fake(void) { return 42; }\n")
    rh.library(directory / f"libcuda.so.{v}", "libcuda.so.1", "int fake_cuda_major(void) { return 550; }\n")
    return directory
