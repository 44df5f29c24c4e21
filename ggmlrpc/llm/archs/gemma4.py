"""gemma4 (Gemma 4 31B, 26B-A4B): gemma3's scaled embeddings and post-norms with
attention shaped per layer: the sliding-window layers (a flag per layer) have their
own head size, K/V head count, rotated dims and rope base, the global ones a larger
head whose V is K where the file has no V matrix and a rope whose frequency
factors leave most dims unrotated; q and k RMS-normed with weights, v without; no
scaling of the scores; a learned scale on each layer's output; soft-capped logits.
The MoE model adds routed experts (GeGLU, router on the scaled RMS norm of the
residual stream, a scale per expert) beside the dense feed-forward, each with its
own norms. Models with per-layer embeddings or layers sharing K/V (E2B, E4B) are
refused."""
from __future__ import annotations

import math
from functools import partial

import numpy as np

from ... import builder as B
from ...ggml import GGMLGluOp
from ..blocks import FEED_FORWARD
from ..gguf_file import ModelError
from . import ROPE_NEOX, Arch

MOE = ("ffn_gate_inp", "ffn_down_exps", "pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2")


def hparams(key) -> dict:
    for name in ("attention.shared_kv_layers", "embedding_length_per_layer_input"):
        if int(key(name, 0)):
            raise ModelError(f"gemma4 with {name} (E2B/E4B) is not supported")
    pattern = key("attention.sliding_window_pattern", None)
    if not isinstance(pattern, list):
        raise ModelError("gemma4: attention.sliding_window_pattern must be a list of per-layer flags")
    return {"n_swa": int(key("attention.sliding_window", 0)),
            "swa_layers": tuple(bool(x) for x in pattern),
            "head_dim_swa": int(key("attention.key_length_swa", 0)),
            "n_rot_swa": int(key("rope.dimension_count_swa", 0)),
            "rope_base_swa": float(key("rope.freq_base_swa", 10000.0)),
            "final_softcap": float(key("final_logit_softcapping", 0.0))}


def weights(hp) -> tuple[str, ...]:
    return ("attn_norm", "attn_q", "attn_k", "attn_output", "attn_q_norm", "attn_k_norm", "post_attention_norm",
            "ffn_norm", *FEED_FORWARD, "post_ffw_norm", *(MOE if hp.n_expert else ()))


def attention(c, il: int, cur):
    """q, k and v (k's projection where the file has no v), each split into heads
    and RMS-normed (v without weight), q and k rotated, attended with no scaling."""
    hp, w, T, p = c.hp, c.w, c.T, f"blk.{il}."
    hd, full = hp.head_dim_of(il), not hp.is_swa(il)

    def heads(t):
        return B.reshape(t, (hd, t.ne[0] // hd, T))

    q = heads(B.mul_mat(w[p + "attn_q.weight"], cur, name=f"Qcur-{il}"))
    q = B.mul(B.rms_norm(q, hp.eps), w[p + "attn_q_norm.weight"], name=f"Qcur_normed-{il}")
    q = c.rope(q, il, f"Qcur_pos-{il}", factors=full)
    k = B.mul_mat(w[p + "attn_k.weight"], cur, name=f"Kcur-{il}")
    v = B.mul_mat(w[p + "attn_v.weight"], cur, name=f"Vcur-{il}") if p + "attn_v.weight" in w else k
    k, v = heads(k), heads(v)
    k = B.mul(B.rms_norm(k, hp.eps), w[p + "attn_k_norm.weight"], name=f"Kcur_normed-{il}")
    v = B.rms_norm(v, hp.eps, name=f"Vcur_normed-{il}")
    k = c.rope(k, il, f"Kcur_pos-{il}", factors=full)
    return c.attention(il, q, k, v, 1.0)


def moe(c, il: int, x):
    """The dense feed-forward and the routed experts side by side, each normed
    before and after; the router reads the residual stream's RMS norm scaled by
    1/sqrt(n_embd) and by its own weights."""
    hp, w, p = c.hp, c.w, f"blk.{il}."
    mlp = c.ffn(il, c.norm(x, "ffn_norm", il, "ffn_norm_1"), GGMLGluOp.GEGLU)
    mlp = c.norm(mlp, "post_ffw_norm_1", il, "ffn_mlp")
    r = B.scale(B.rms_norm(x, hp.eps), 1.0 / math.sqrt(hp.n_embd))
    r = B.mul(r, w[p + "ffn_gate_inp.scale"])
    logits = B.mul_mat(w[p + "ffn_gate_inp.weight"], r, name=f"ffn_moe_logits-{il}")
    experts = c.moe(il, c.norm(x, "pre_ffw_norm_2", il, "ffn_norm_2"), norm_w=True, logits=logits,
                    act=GGMLGluOp.GEGLU)
    experts = c.norm(experts, "post_ffw_norm_2", il, "ffn_moe")
    return B.add(mlp, experts, name=f"ffn_moe_combined-{il}")


def layer(c, il: int, x):
    w, p = c.w, f"blk.{il}."
    cur = attention(c, il, c.norm(x, "attn_norm", il))
    cur = c.norm(cur, "post_attention_norm", il, "attn_post_norm")
    attn_out = B.add(cur, x, name=f"attn_out-{il}")
    if c.hp.n_expert:
        cur = moe(c, il, attn_out)
    else:
        cur = c.ffn(il, c.norm(attn_out, "ffn_norm", il), GGMLGluOp.GEGLU)
    cur = B.add(c.norm(cur, "post_ffw_norm", il, "ffn_post_norm"), attn_out)
    if p + "layer_output_scale.weight" in w:
        cur = B.mul(cur, w[p + "layer_output_scale.weight"], name=f"out_scaled-{il}")
    # llama.cpp keeps every row through the last layer and picks the output rows after
    (out,) = c.out_rows(il, cur)
    return out


def write(s, experts: bool = False) -> None:
    """synth: every third layer global (a head twice the sliding-window layers',
    one K/V head, V = K, a quarter of its dims rotated through the frequency
    factors), the others on a short window; `experts`: the 26B-A4B's MoE."""
    import gguf

    sh, e, n = s.shape, s.shape.n_embd, s.shape.n_expert
    hd_swa, kv_swa = s.head, sh.n_head_kv
    hd_full, kv_full = 2 * s.head, 1
    swa = [il % 3 != 2 for il in range(sh.n_layer)]
    for k in (gguf.Keys.Rope.DIMENSION_COUNT, gguf.Keys.Attention.HEAD_COUNT_KV):
        s.w.kv_data[0].pop(k.format(arch=s.w.arch))
    s.w.add_head_count_kv([kv_swa if f else kv_full for f in swa])
    s.w.add_sliding_window(sh.n_swa)
    s.w.add_sliding_window_pattern(swa)
    s.w.add_key_length(hd_full)
    s.w.add_value_length(hd_full)
    s.w.add_key_length_swa(hd_swa)
    s.w.add_value_length_swa(hd_swa)
    s.w.add_rope_dimension_count(hd_full)
    s.w.add_rope_dimension_count_swa(hd_swa)
    s.add_f32(gguf.Keys.Rope.FREQ_BASE_SWA.format(arch=s.w.arch), 10000.0)
    s.w.add_final_logit_softcapping(sh.final_softcap)
    s.w.add_shared_kv_layers(0)
    s.w.add_embedding_length_per_layer_input(0)
    if experts:
        ff_exp = s.experts()
    s.w.add_tensor("token_embd.weight", s.embd(tied=True))
    n_rot = hd_full // 8
    s.w.add_tensor("rope_freqs.weight", np.array([1.0] * n_rot + [1e30] * (hd_full // 2 - n_rot), np.float32))
    for i, sliding in enumerate(swa):
        p = f"blk.{i}."
        hd, kv = (hd_swa, kv_swa) if sliding else (hd_full, kv_full)
        s.w.add_tensor(p + "attn_norm.weight", s.norm(e))
        s.w.add_tensor(p + "attn_q.weight", s.mat(hd * sh.n_head, e))
        s.w.add_tensor(p + "attn_k.weight", s.mat(hd * kv, e))
        if sliding:
            s.w.add_tensor(p + "attn_v.weight", s.mat(hd * kv, e))
        s.w.add_tensor(p + "attn_output.weight", s.mat(e, hd * sh.n_head))
        s.w.add_tensor(p + "attn_q_norm.weight", s.norm(hd))
        s.w.add_tensor(p + "attn_k_norm.weight", s.norm(hd))
        for name in ("post_attention_norm", "ffn_norm", "post_ffw_norm"):
            s.w.add_tensor(p + name + ".weight", s.norm(e))
        s.ffn(p, sh.n_ff)
        s.w.add_tensor(p + "layer_output_scale.weight", np.array([0.5 + 0.5 * s.rng.random()], np.float32))
        if experts:
            # as converted: the gate and up halves of each expert in one matrix
            s.w.add_tensor(p + "ffn_gate_inp.weight", s.mat(n, e, 1.0, dtype=np.float32))
            s.w.add_tensor(p + "ffn_gate_up_exps.weight", s.mat(2 * ff_exp, e, n=n))
            s.w.add_tensor(p + "ffn_down_exps.weight", s.mat(e, ff_exp, n=n))
            s.w.add_tensor(p + "ffn_gate_inp.scale", s.norm(e))
            s.w.add_tensor(p + "ffn_down_exps.scale", s.norm(n))
            for name in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
                s.w.add_tensor(p + name + ".weight", s.norm(e))
    s.w.add_tensor("output_norm.weight", s.norm(e))


ARCH = Arch("gemma4", "gemma3's layer with attention shaped per layer (head size, K/V heads, rope), V = K in "
            "global layers, a v norm, proportional rope factors, unscaled scores, a scale per layer's output, "
            "GeGLU experts beside the dense feed-forward (26B-A4B)", ROPE_NEOX, weights, layer, hparams,
            scale_embd=True, synth={"gemma4": write, "gemma4-moe": partial(write, experts=True)},
            test_shape={"n_layer": 3})
