"""The lab's CRI client is the installed package's (shim/bench/cri.py, behind the `bench` extra):
this name stays for the lab's tests."""
from shim.bench.cri import CRIClient, CRIError, CRIUnavailable, messages, read_container_log

__all__ = ["CRIClient", "CRIError", "CRIUnavailable", "messages", "read_container_log"]
