"""phi2: LayerNorm with biases, one fused q/k/v matrix, rope on part of each head,
the query scaled instead of the scores, attention and a GELU feed-forward side by
side on the same normed input, a biased output layer."""
from __future__ import annotations

from ... import builder as B
from ...ggml import GGMLUnaryOp
from . import ROPE_NEOX, Arch


def weights(hp) -> tuple[str, ...]:
    return ("attn_norm", "attn_qkv", "attn_output", "ffn_up", "ffn_down")


def layer(c, il: int, x):
    w, p = c.w, f"blk.{il}."
    cur = c.norm(x, "attn_norm", il)
    q, k, v = c.qkv(il, cur)
    attn = c.attention(il, c.scale_query(q, il), k, v, 1.0)
    attn, x, cur = c.out_rows(il, attn, x, cur)
    # the feed-forward reads the attention's input, not its output
    up = B.mul_mat(w[p + "ffn_up.weight"], cur, name=f"ffn_up-{il}")
    if p + "ffn_up.bias" in w:
        up = B.add(up, w[p + "ffn_up.bias"], name=f"ffn_up_b-{il}")
    act = B.unary(GGMLUnaryOp.GELU, up, name=f"ffn_gelu-{il}")
    if c.tp is not None:     # -sm row over linked servers: every device's hidden rows
        act = c.tp.gather(act, "ffn_up", il)
    ffn = B.mul_mat(w[p + "ffn_down.weight"], act, name=f"ffn_down-{il}")
    if p + "ffn_down.bias" in w:
        ffn = B.add(ffn, w[p + "ffn_down.bias"], name=f"ffn_out-{il}")
    return B.add(B.add(attn, c.rows_whole(il, ffn)), x, name=f"l_out-{il}")


def write(s) -> None:
    sh, e, kv = s.shape, s.shape.n_embd, s.n_kv
    s.w.add_tensor("token_embd.weight", s.embd())
    for i in range(sh.n_layer):
        p = f"blk.{i}."
        s.w.add_tensor(p + "attn_norm.weight", s.norm(e))
        s.w.add_tensor(p + "attn_norm.bias", s.bias(e))
        s.w.add_tensor(p + "attn_qkv.weight", s.mat(e + 2 * kv, e))
        s.w.add_tensor(p + "attn_qkv.bias", s.bias(e + 2 * kv))
        s.w.add_tensor(p + "attn_output.weight", s.mat(e, e))
        s.w.add_tensor(p + "attn_output.bias", s.bias(e))
        s.w.add_tensor(p + "ffn_up.weight", s.mat(sh.n_ff, e))
        s.w.add_tensor(p + "ffn_up.bias", s.bias(sh.n_ff))
        s.w.add_tensor(p + "ffn_down.weight", s.mat(e, sh.n_ff))
        s.w.add_tensor(p + "ffn_down.bias", s.bias(e))
    s.w.add_tensor("output_norm.weight", s.norm(e))
    s.w.add_tensor("output_norm.bias", s.bias(e))
    s.w.add_tensor("output.weight", s.mat(s.n_vocab, e))
    s.w.add_tensor("output.bias", s.bias(s.n_vocab))


ARCH = Arch("phi2", "LayerNorm with biases, fused q/k/v read as views, rope on part of each head, "
            "attention and a GELU feed-forward side by side", ROPE_NEOX, weights, layer,
            layer_norm=True, synth={"phi2": write}, synth_rope_share=0.5)
