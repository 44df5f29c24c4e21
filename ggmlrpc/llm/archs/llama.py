"""llama (and mistral-style): RMS norms, rope on consecutive pairs, a SwiGLU
feed-forward, or (Mixtral-style) routed experts whose chosen soft-max weights are
renormalized to sum to 1. The layer serves the qwen family and mistral3 too
(biases, per-head q/k norms and the query's temperature scale are taken where a
file has them)."""
from __future__ import annotations

from functools import partial

import numpy as np

from ... import builder as B
from ..blocks import ATTENTION, EXPERTS, FEED_FORWARD
from . import ROPE_NORM, Arch


def weights(hp) -> tuple[str, ...]:
    return (*ATTENTION, "ffn_norm", *(EXPERTS if hp.n_expert else FEED_FORWARD))


def layer(c, il: int, x, norm_w: bool = False):
    """Attention and feed-forward (`norm_w`: the chosen experts' weights renormalized),
    each added to the residual stream."""
    cur = c.norm(x, "attn_norm", il)
    q, k, v = c.qkv(il, cur)
    if c.attn_scale is not None:    # mistral3's temperature tuning
        q = B.mul(q, c.attn_scale, name=f"Qcur_attn_temp_scaled-{il}")
    cur = c.attention(il, q, k, v)
    cur, x = c.out_rows(il, cur, x)
    ffn_inp = B.add(cur, x, name=f"ffn_inp-{il}")
    cur = c.norm(ffn_inp, "ffn_norm", il)
    cur = c.moe(il, cur, norm_w=norm_w) if c.hp.n_expert else c.ffn(il, cur)
    return B.add(cur, ffn_inp, name=f"l_out-{il}")


def write(s, tied: bool = False, moe: bool = False) -> None:
    """synth: `tied` leaves out output.weight, so the output layer reuses the token
    embeddings (llama.cpp duplicates them onto the output device); `moe`: routed
    experts (Mixtral-style) in place of the feed-forward, their gate mild enough that
    the chosen weights' renormalization matters."""
    sh, e = s.shape, s.shape.n_embd
    ff_exp = s.experts() if moe else 0
    s.w.add_tensor("token_embd.weight", s.embd(tied))
    for i in range(sh.n_layer):
        p = f"blk.{i}."
        s.attention(p)
        s.w.add_tensor(p + "ffn_norm.weight", s.norm(e))
        if moe:
            s.routed_experts(p, ff_exp, gate_scale=1.0 / np.sqrt(e))
        else:
            s.ffn(p, sh.n_ff)
    s.w.add_tensor("output_norm.weight", np.ones(e, np.float32))
    if not tied:
        s.w.add_tensor("output.weight", s.mat(s.n_vocab, e))


ARCH = Arch("llama", "RMS norms, rope on consecutive pairs, SwiGLU feed-forward or routed experts with "
            "renormalized weights (Mixtral; mistral-style models too)", ROPE_NORM, weights,
            partial(layer, norm_w=True),
            synth={"llama": write, "llama-tied": partial(write, tied=True), "llama-moe": partial(write, moe=True)})
