"""CUDA kernels of the conv family: none yet (these ops raise UnsupportedError)."""
RULES: dict = {}
