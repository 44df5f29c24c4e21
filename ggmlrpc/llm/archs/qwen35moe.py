"""qwen35moe: qwen3next's hybrid layers with interleaved M-RoPE (rope_multi over the
file's four dimension sections; text tokens rotate by their position in the first
three), beta and alpha from two matrices, and the key heads broadcast to the value
heads by the fused delta net itself."""
from __future__ import annotations

import math
from functools import partial

from ... import builder as B
from ...ggml import GGMLType, GGMLUnaryOp
from . import ROPE_NEOX, Arch, qwen3next

ROPE_IMROPE = 40     # ggml's interleaved M-RoPE
LINEAR = tuple(n for n in qwen3next.LINEAR if n != "ssm_ba.weight") + ("ssm_beta.weight", "ssm_alpha.weight")


def hparams(key) -> dict:
    hp = qwen3next.hparams(key)
    hp["ssm"]["rope_sections"] = [int(x) for x in key("rope.dimension_sections", [0, 0, 0, 0])][:4]
    return hp


def rope(c, t, il: int, name: str):
    """ggml_rope_multi in interleaved mode, over four positions per token (one input
    for the stage's graph)."""
    hp = c.hp
    if not hasattr(c, "pos_4"):
        c.pos_4 = c.inp.new(GGMLType.I32, (4 * c.T,), "inp_pos_4")
    return B.rope_ext(t, c.pos_4, None, name=name, n_dims=hp.n_rot, mode=ROPE_IMROPE, n_ctx_orig=c.n_ctx_orig,
                      freq_base=hp.rope_base, freq_scale=hp.rope_scale, ext_factor=hp.rope_ext_factor,
                      attn_factor=hp.rope_attn_factor, beta_fast=hp.yarn_beta_fast, beta_slow=hp.yarn_beta_slow,
                      sections=hp.ssm["rope_sections"])


def beta_gate(c, il: int, cur):
    hp, w, p = c.hp, c.w, f"blk.{il}."
    Hv, n_t, N = hp.ssm["n_v_heads"], c.T // c.n_seqs, c.n_seqs
    beta = B.reshape(qwen3next.proj(c, il, "ssm_beta", cur, f"beta-{il}"), (1, Hv, n_t, N))
    beta = B.unary(GGMLUnaryOp.SIGMOID, beta, name=f"beta_sigmoid-{il}")
    alpha = B.reshape(qwen3next.proj(c, il, "ssm_alpha", cur, f"alpha-{il}"), (Hv, n_t, N))
    alpha = B.unary(GGMLUnaryOp.SOFTPLUS, B.add(alpha, w[p + "ssm_dt.bias"]), name=f"a_softplus-{il}")
    gate = B.mul(alpha, w[p + "ssm_a"], name=f"gate-{il}")
    return beta, B.reshape(gate, (1, Hv, n_t, N))


def write(s) -> None:
    """synth: qwen3next's model with rope sections splitting the rotated half in three."""
    half = int(s.head * SHARE) // 2
    a = math.ceil(half / 3)
    b = math.ceil((half - a) / 2)
    s.w.add_rope_dimension_sections([a, b, half - a - b, 0])
    qwen3next.write(s, split_ba=True)


SHARE = 0.25
ARCH = Arch("qwen35moe", "qwen3next's hybrid layers with interleaved M-RoPE (four position sections), "
            "beta and alpha from two matrices, key heads broadcast by the fused delta net",
            ROPE_NEOX, lambda hp: (),
            partial(qwen3next.layer, attention=partial(qwen3next.gated_attention, rope=rope),
                    linear=partial(qwen3next.linear_attention, beta_gate=beta_gate, repeat=False)),
            hparams, synth={"qwen35moe": write}, synth_rope_share=SHARE,
            layer_weights=partial(qwen3next.layer_weights, linear=LINEAR), state=qwen3next.state)
