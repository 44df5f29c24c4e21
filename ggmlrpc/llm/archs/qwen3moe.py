"""qwen3moe: qwen3 with routed experts whose chosen gate weights are renormalized
to sum to 1, no shared expert."""
from __future__ import annotations

from functools import partial

from . import ROPE_NEOX, Arch, llama

ARCH = Arch("qwen3moe", "renormalized expert weights", ROPE_NEOX, llama.weights,
            partial(llama.layer, norm_w=True))
