"""qwen3: llama's layer with an RMS norm over each query and key head (before rope)
and NeoX rope."""
from __future__ import annotations

from . import ROPE_NEOX, Arch, llama

ARCH = Arch("qwen3", "per-head q/k norms", ROPE_NEOX, llama.weights, llama.layer)
