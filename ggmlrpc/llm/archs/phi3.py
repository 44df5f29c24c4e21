"""phi3: one fused q/k/v matrix and one fused gate/up matrix (read as views), the
query scaled instead of the scores, LongRoPE frequency factors (the long set when
the context exceeds the original one)."""
from __future__ import annotations

import numpy as np

from ... import builder as B
from ...ggml import GGMLGluOp
from . import ROPE_NEOX, Arch


def weights(hp) -> tuple[str, ...]:
    return ("attn_norm", "attn_qkv", "attn_output", "ffn_norm", "ffn_up", "ffn_down")


def layer(c, il: int, x):
    w, p = c.w, f"blk.{il}."
    cur = c.norm(x, "attn_norm", il)
    q, k, v = c.qkv(il, cur)
    cur = c.attention(il, c.scale_query(q, il), k, v, 1.0)
    cur, x = c.out_rows(il, cur, x)
    ffn_inp = B.add(cur, x, name=f"ffn_inp-{il}")
    cur = c.norm(ffn_inp, "ffn_norm", il)
    up = B.mul_mat(w[p + "ffn_up.weight"], cur, name=f"ffn_up-{il}")   # gate and up halves
    act = B.glu(GGMLGluOp.SWIGLU, up, name=f"ffn_swiglu-{il}")
    if c.tp is not None:     # -sm row over linked servers: every device's hidden rows
        act = c.tp.gather(act, "ffn_up", il)
    cur = c.rows_whole(il, B.mul_mat(w[p + "ffn_down.weight"], act, name=f"ffn_out-{il}"))
    return B.add(cur, ffn_inp, name=f"l_out-{il}")


def write(s) -> None:
    """synth: an original context of half the model's, so that the full context
    takes the long factors."""
    sh, e, kv = s.shape, s.shape.n_embd, s.n_kv
    s.w.add_rope_scaling_orig_ctx_len(sh.n_ctx // 2)
    s.w.add_tensor("token_embd.weight", s.embd())
    for name in ("rope_factors_long", "rope_factors_short"):
        s.w.add_tensor(name + ".weight", 1.0 + 3.0 * s.rng.random(s.head // 2, dtype=np.float32))
    for i in range(sh.n_layer):
        p = f"blk.{i}."
        s.w.add_tensor(p + "attn_norm.weight", s.norm(e))
        s.w.add_tensor(p + "attn_qkv.weight", s.mat(e + 2 * kv, e))
        s.w.add_tensor(p + "attn_output.weight", s.mat(e, e))
        s.w.add_tensor(p + "ffn_norm.weight", s.norm(e))
        s.w.add_tensor(p + "ffn_up.weight", s.mat(2 * sh.n_ff, e))
        s.w.add_tensor(p + "ffn_down.weight", s.mat(e, sh.n_ff))
    s.w.add_tensor("output_norm.weight", s.norm(e))
    s.w.add_tensor("output.weight", s.mat(s.n_vocab, e))


ARCH = Arch("phi3", "fused q/k/v and gate/up matrices, LongRoPE frequency factors", ROPE_NEOX,
            weights, layer, synth={"phi3": write})
