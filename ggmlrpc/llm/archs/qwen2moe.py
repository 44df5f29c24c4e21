"""qwen2moe: qwen2 with routed experts (soft-max gate, top-k, MUL_MAT_ID) plus a
shared expert behind a sigmoid gate."""
from __future__ import annotations

from functools import partial

from . import ROPE_NEOX, Arch, llama, qwen2

ARCH = Arch("qwen2moe", "qwen2 with routed experts through MUL_MAT_ID plus a gated shared expert", ROPE_NEOX,
            llama.weights, llama.layer, synth={"qwen2moe": partial(qwen2.write, moe=True)})
