"""qwen2: llama's layer with q/k/v biases and NeoX rope."""
from __future__ import annotations

from . import ROPE_NEOX, Arch, llama

ARCH = Arch("qwen2", "q/k/v biases", ROPE_NEOX, llama.weights, llama.layer)
