"""qwen3: llama's layer with an RMS norm over each query and key head (before rope)
and NeoX rope."""
from __future__ import annotations

from . import ROPE_NEOX, Arch, llama


def write(s, moe: bool = False) -> None:
    """synth: `moe` (qwen3moe) replaces the feed-forward by routed experts."""
    sh, e = s.shape, s.shape.n_embd
    if moe:
        ff_exp = s.experts()
    s.w.add_tensor("token_embd.weight", s.embd())
    for i in range(sh.n_layer):
        p = f"blk.{i}."
        s.attention(p)
        s.qk_norms(p)
        s.w.add_tensor(p + "ffn_norm.weight", s.norm(e))
        if not moe:
            s.ffn(p, sh.n_ff)
            continue
        s.routed_experts(p, ff_exp)
    s.w.add_tensor("output_norm.weight", s.norm(e))
    s.w.add_tensor("output.weight", s.mat(s.n_vocab, e))


ARCH = Arch("qwen3", "llama's layer with per-head q/k norms, NeoX rope", ROPE_NEOX, llama.weights, llama.layer, synth={"qwen3": write})
