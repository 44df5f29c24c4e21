"""qwen3moe: qwen3 with routed experts whose chosen gate weights are renormalized
to sum to 1, no shared expert."""
from __future__ import annotations

from functools import partial

from . import ROPE_NEOX, Arch, llama, qwen3

ARCH = Arch("qwen3moe", "qwen3 with routed experts, their weights renormalized", ROPE_NEOX, llama.weights,
            partial(llama.layer, norm_w=True), synth={"qwen3moe": partial(qwen3.write, moe=True)})
