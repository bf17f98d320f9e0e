"""The install tests use the CRI client and the lab of tests/cri."""
from tests.cri.conftest import cri_build_dir, lab  # noqa: F401 (fixtures)
