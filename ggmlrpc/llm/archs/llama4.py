"""llama4 (Llama 4 Scout, Maverick): three of every four layers attend only their
position's chunk of 8192 (chunked attention), rotate q and k and RMS-normalize them
(no weights; not in the 128-expert model); every fourth layer has no rope and
scales its queries by their position's temperature. Every n-th layer
(interleave_moe_layer_step) is a mixture of experts chosen by their gate logits,
weighted by the sigmoid of those before the experts run, plus a shared expert; the
others a SwiGLU feed-forward. The feed-forwards take no per-matrix scales."""
from __future__ import annotations

import numpy as np

from ... import builder as B
from ...ggml import GGMLUnaryOp
from ..blocks import ATTENTION, EXPERTS, FEED_FORWARD
from . import ROPE_NORM, Arch

NO_ROPE_STEP = 4        # llama.cpp's n_no_rope_layer_step
SHARED = ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")


def hparams(key) -> dict:
    n_swa = key("attention.sliding_window", None)
    out = {"moe_step": int(key("interleave_moe_layer_step", 1))}
    if n_swa is not None and int(n_swa) == 0:      # no chunks: every layer rotates
        return {**out, "no_rope_step": int(key("block_count", 0))}
    pattern = key("attention.sliding_window_pattern", NO_ROPE_STEP)
    base = float(key("rope.freq_base", 10000.0))
    return {**out, "no_rope_step": NO_ROPE_STEP, "n_swa": 8192, "swa_chunked": True,
            "attn_temp_scale": 0.1, "attn_temp_floor": 8192, "attn_temp_offset": 1.0,
            **({"swa_layers": tuple(bool(v) for v in pattern)} if isinstance(pattern, list)
               else {"swa_pattern": int(pattern)}),
            "rope_base_swa": float(key("rope.freq_base_swa", base))}


def _is_moe(hp, il: int) -> bool:
    return hp.moe_step > 0 and (il + 1) % hp.moe_step == 0


def weights(hp) -> tuple[str, ...]:
    return (*ATTENTION, "ffn_norm")


def layer_weights(hp, il: int) -> tuple[str, ...]:
    """The feed-forward's tensors: experts and the shared expert, or a SwiGLU."""
    return tuple(n + ".weight" for n in ((*EXPERTS, *SHARED) if _is_moe(hp, il) else FEED_FORWARD))


def moe(c, il: int, cur):
    """Experts chosen by their top gate logits, the input weighted by each one's
    sigmoid before the experts run (llama.cpp's weight_before_ffn), plus the shared expert."""
    hp, w, p = c.hp, c.w, f"blk.{il}."
    n_embd, T, k = cur.ne[0], cur.ne[1], hp.n_expert_used
    logits = B.mul_mat(w[p + "ffn_gate_inp.weight"], cur, name=f"ffn_moe_logits-{il}")
    probs = B.unary(GGMLUnaryOp.SIGMOID, logits, name=f"ffn_moe_probs-{il}")
    chosen = B.argsort_top_k(logits, k, name=f"ffn_moe_topk-{il}")
    weights = B.get_rows(B.reshape(probs, (1, hp.n_expert, T)), chosen, name=f"ffn_moe_weights-{il}")
    c.g.expand(weights)
    x = B.repeat(B.reshape(cur, (n_embd, 1, T)), (n_embd, k, T))
    x = B.mul(x, weights, name=f"ffn_moe_weighted-{il}")
    up = B.mul_mat_id(w[p + "ffn_up_exps.weight"], x, chosen, name=f"ffn_moe_up-{il}")
    gate = B.mul_mat_id(w[p + "ffn_gate_exps.weight"], x, chosen, name=f"ffn_moe_gate-{il}")
    act = c.experts_whole(il, B.swiglu_split(gate, up, name=f"ffn_moe_swiglu-{il}"))
    out = c.rows_whole(il, c.sum_experts(il, B.mul_mat_id(w[p + "ffn_down_exps.weight"], act, chosen,
                                                          name=f"ffn_moe_down-{il}")))
    shared = c.ffn(il, cur, suffix="_shexp", scales=False)
    return B.add(out, shared, name=f"ffn_moe_out_merged-{il}")


def layer(c, il: int, x):
    hp = c.hp
    cur = c.norm(x, "attn_norm", il)
    rope = hp.no_rope_step > 0 and (il + 1) % hp.no_rope_step != 0
    q, k, v = c.qkv(il, cur, rotate=rope)
    if not rope and c.attn_scale is not None:
        q = B.mul(q, c.attn_scale, name=f"Qcur-{il}")
    if rope and hp.n_expert != 128:     # Llama4TextL2Norm
        q = B.rms_norm(q, hp.eps, name=f"Qcur_normed-{il}")
        k = B.rms_norm(k, hp.eps, name=f"Kcur_normed-{il}")
    cur = c.attention(il, q, k, v)
    cur, x = c.out_rows(il, cur, x)
    ffn_inp = B.add(cur, x, name=f"ffn_inp-{il}")
    cur = c.norm(ffn_inp, "ffn_norm", il)
    cur = moe(c, il, cur) if _is_moe(hp, il) else c.ffn(il, cur, scales=False)
    return B.add(cur, ffn_inp, name=f"l_out-{il}")


def write(s) -> None:
    """synth: four layers (the fourth without rope), experts in every second one."""
    sh, e = s.shape, s.shape.n_embd
    ff_exp = s.experts()
    s.w.add_uint32("llama4.interleave_moe_layer_step", 2)
    s.w.add_tensor("token_embd.weight", s.embd())
    for i in range(sh.n_layer):
        p = f"blk.{i}."
        s.attention(p)
        s.w.add_tensor(p + "ffn_norm.weight", s.norm(e))
        if (i + 1) % 2 == 0:
            s.routed_experts(p, ff_exp, gate_scale=1.0 / np.sqrt(e))
            s.ffn(p, ff_exp, suffix="_shexp")
        else:
            s.ffn(p, sh.n_ff)
    s.w.add_tensor("output_norm.weight", s.norm(e))
    s.w.add_tensor("output.weight", s.mat(s.n_vocab, e))


ARCH = Arch("llama4", "chunked attention on three of four layers, the fourth without rope and with "
            "temperature-tuned queries, q/k RMS-normalized, experts in every n-th layer weighted "
            "(sigmoid) before they run, plus a shared expert", ROPE_NORM, weights, layer, hparams,
            layer_weights=layer_weights,
            synth={"llama4": write}, test_shape={"n_layer": 4, "n_expert_used": 1})
