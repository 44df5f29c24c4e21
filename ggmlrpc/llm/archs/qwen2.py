"""qwen2: llama's layer with q/k/v biases and NeoX rope."""
from __future__ import annotations

import numpy as np

from . import ROPE_NEOX, Arch, llama


def write(s, moe: bool = False) -> None:
    """synth: `moe` (qwen2moe) replaces the feed-forward by routed experts plus a
    shared expert behind a sigmoid gate."""
    sh, e = s.shape, s.shape.n_embd
    if moe:
        ff_exp = s.experts()
        s.w.add_expert_shared_feed_forward_length(sh.n_ff_shexp or sh.n_ff)
    s.w.add_tensor("token_embd.weight", s.embd())
    for i in range(sh.n_layer):
        p = f"blk.{i}."
        s.attention(p, biases=True)
        s.w.add_tensor(p + "ffn_norm.weight", s.norm(e))
        if not moe:
            s.ffn(p, sh.n_ff)
            continue
        s.routed_experts(p, ff_exp)
        s.w.add_tensor(p + "ffn_gate_inp_shexp.weight", s.bias(e, 1.0 / np.sqrt(e)))
        s.ffn(p, sh.n_ff_shexp or sh.n_ff, "_shexp")
    s.w.add_tensor("output_norm.weight", s.norm(e))
    s.w.add_tensor("output.weight", s.mat(s.n_vocab, e))


ARCH = Arch("qwen2", "llama's layer with q/k/v biases, NeoX rope", ROPE_NEOX, llama.weights, llama.layer, synth={"qwen2": write})
