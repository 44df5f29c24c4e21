"""minimax-m2: an RMS norm over all of q's and all of k's heads at once (before
they are split), rope on part of each head, routed experts only (gated as the
file says, sigmoid in MiniMax-M2's, chosen after adding the exp_probs_b selection
bias), their weights renormalized."""
from __future__ import annotations

from ... import builder as B
from ..blocks import ATTENTION, EXPERTS
from . import ROPE_NEOX, Arch
from .glm4moe import gating


def hparams(key) -> dict:
    return {"expert_gating": gating(key, 0)}


def weights(hp) -> tuple[str, ...]:
    return (*ATTENTION, "attn_q_norm", "attn_k_norm", "ffn_norm", *EXPERTS)


def layer(c, il: int, x):
    cur = c.norm(x, "attn_norm", il)
    cur = c.attention(il, *c.qkv(il, cur))
    cur, x = c.out_rows(il, cur, x)
    ffn_inp = B.add(cur, x, name=f"ffn_inp-{il}")
    cur = c.moe(il, c.norm(ffn_inp, "ffn_norm", il), norm_w=True, scales=False)   # llama.cpp passes no expert scales
    return B.add(cur, ffn_inp, name=f"l_out-{il}")


def write(s) -> None:
    """synth: sigmoid gates; the experts are n_ff wide (llama.cpp sizes them so)."""
    import gguf

    sh, e, n = s.shape, s.shape.n_embd, s.shape.n_expert
    ff_exp = s.experts()
    s.w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    s.w.add_tensor("token_embd.weight", s.embd())
    for i in range(sh.n_layer):
        p = f"blk.{i}."
        s.attention(p)
        s.w.add_tensor(p + "attn_q_norm.weight", s.norm(e))
        s.w.add_tensor(p + "attn_k_norm.weight", s.norm(s.n_kv))
        s.w.add_tensor(p + "ffn_norm.weight", s.norm(e))
        s.routed_experts(p, ff_exp)
        s.w.add_tensor(p + "exp_probs_b.bias", s.bias(n))
    s.w.add_tensor("output_norm.weight", s.norm(e))
    s.w.add_tensor("output.weight", s.mat(s.n_vocab, e))


ARCH = Arch("minimax-m2", "q and k RMS-normed across all heads, partial rope, sigmoid-gated experts chosen "
            "with a selection bias, renormalized", ROPE_NEOX, weights, layer, hparams,
            synth={"minimax-m2": write}, synth_rope_share=0.5)
