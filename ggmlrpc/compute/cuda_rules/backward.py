"""CUDA kernels of the backward family: none yet (these ops raise UnsupportedError)."""
RULES: dict = {}
