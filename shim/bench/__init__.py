"""Benchmarks run from the command line: GPU pod start-up through a real containerd (`pods`)."""
