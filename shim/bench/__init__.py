"""Benchmarks an installed node runs: `cdi-shim bench pods --endpoint` (node.py) measures GPU
against no-GPU pod start-up through the node's own containerd, over its CRI socket (cri.py, a
grpc client of the messages in cri_messages.py).

grpcio is the `bench` extra (pip install 'cdi-shim[bench]'), imported only when a benchmark runs;
the lab that runs private containerds (cdi_shim_lab, a checkout's) is not part of this package.
"""

EXTRA = "pip install 'cdi-shim[bench]'"


class BenchError(Exception):
    """A benchmark that cannot run or whose pods did not do the work: one line for the user."""
