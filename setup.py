from setuptools import setup

# The C parts are built through cffi (API mode); pyproject.toml holds the metadata.
setup(cffi_modules=["csrc/build_native.py:ffibuilder"])
