"""CUDA kernels of the deepseek family: none yet (these ops raise UnsupportedError)."""
RULES: dict = {}
