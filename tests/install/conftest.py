"""The install tests use the CRI client of tests/cri."""
from tests.cri.conftest import cri_build_dir  # noqa: F401 (a fixture)
