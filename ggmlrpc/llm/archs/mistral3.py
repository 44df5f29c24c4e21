"""mistral3 (Mistral Small 3.x, Ministral 3, Devstral): llama's layer, and where
the file sets attention.temperature_scale, each query scaled by its position's
temperature (llama4's tuning, floored on rope's original context, no offset)."""
from __future__ import annotations

from functools import partial

from ..gguf_file import ModelError
from . import ROPE_NORM, Arch, llama


def hparams(key) -> dict:
    temp = float(key("attention.temperature_scale", 0.0))
    floor = int(key("rope.scaling.original_context_length", 0) or key("context_length", 0))
    if temp and not floor:
        raise ModelError("mistral3: attention temperature scaling without an original context length")
    return {"attn_temp_scale": temp, "attn_temp_floor": floor, "attn_temp_offset": 0.0,
            "yarn_beta_fast": float(key("rope.scaling.yarn_beta_fast", 32.0)),
            "yarn_beta_slow": float(key("rope.scaling.yarn_beta_slow", 1.0))}


def write(s, moe: bool = False) -> None:
    """synth: llama's tensors, a temperature scale floored on a short original
    context (32), so that a prompt crosses a few of its steps."""
    s.add_f32("mistral3.attention.temperature_scale", 0.5)
    s.w.add_rope_scaling_orig_ctx_len(32)
    llama.write(s, moe=moe)


ARCH = Arch("mistral3", "llama's layer with the queries' temperature tuning by position", ROPE_NORM,
            llama.weights, partial(llama.layer, norm_w=True), hparams,
            synth={"mistral3": write})
