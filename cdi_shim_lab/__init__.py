"""The test bench: private containerd, podman and Docker labs, their images and fake driver, the
containerd/podman/Docker releases they fetch, the CRI client, and the pod benchmark.

Development only: the wheel a node installs does not ship this package (pyproject's package list
names cdi and shim only; tests/install checks the wheel). It imports shim, never the reverse; the
one way in from shim is `cdi-shim bench pods`, which imports it lazily from a checkout.
"""
