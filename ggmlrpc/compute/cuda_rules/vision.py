"""CUDA kernels of the vision family: none yet (these ops raise UnsupportedError)."""
RULES: dict = {}
