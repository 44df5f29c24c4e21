"""CUDA kernels of the recurrent family: none yet (these ops raise UnsupportedError)."""
RULES: dict = {}
