"""gemma4 (Gemma 4 31B, 26B-A4B, E2B, E4B): gemma3's scaled embeddings and post-norms
with attention shaped per layer: the sliding-window layers (a flag per layer) have
their own head size, K/V head count, rotated dims and rope base, the global ones a
larger head whose V is K where the file has no V matrix and a rope whose frequency
factors leave most dims unrotated; q and k RMS-normed with weights, v without; no
scaling of the scores; a learned scale on each layer's output; soft-capped logits.
The MoE model adds routed experts (GeGLU, router on the scaled RMS norm of the
residual stream, a scale per expert) beside the dense feed-forward, each with its
own norms. E2B/E4B add per-layer embeddings (a table row per token plus a
projection of the embeddings, one slice of it gating an extra block in each layer)
and their last layers attend the cache of the last earlier layer of their kind
instead of keeping one."""
from __future__ import annotations

import math
from functools import partial

import numpy as np

from ... import builder as B
from ...ggml import GGMLGluOp, GGMLUnaryOp
from ..blocks import FEED_FORWARD
from ..gguf_file import ModelError
from . import ROPE_NEOX, Arch

PER_LAYER = ("inp_gate.weight", "proj.weight", "post_norm.weight")
MOE = ("ffn_gate_inp", "ffn_down_exps", "pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2")


def hparams(key) -> dict:
    pattern = key("attention.sliding_window_pattern", None)
    if not isinstance(pattern, list):
        raise ModelError("gemma4: attention.sliding_window_pattern must be a list of per-layer flags")
    swa = tuple(bool(x) for x in pattern)
    n_layer, shared = int(key("block_count", 0)), int(key("attention.shared_kv_layers", 0))
    n_kv = n_layer - shared if shared else 0
    if shared and (n_kv < 2 or len(swa) < n_layer):
        raise ModelError(f"gemma4: {shared} shared KV layers of {n_layer} leave no cache of each kind")
    # a layer reusing a cache reads the last earlier one of its kind (llama.cpp's rule)
    if shared and any(swa[il] != swa[n_kv - (2 if swa[il] else 1)] for il in range(n_kv, n_layer)):
        raise ModelError("gemma4: a shared KV layer would read a cache of the other attention kind")
    return {"n_swa": int(key("attention.sliding_window", 0)),
            "swa_layers": swa,
            "head_dim_swa": int(key("attention.key_length_swa", 0)),
            "n_rot_swa": int(key("rope.dimension_count_swa", 0)),
            "rope_base_swa": float(key("rope.freq_base_swa", 10000.0)),
            "final_softcap": float(key("final_logit_softcapping", 0.0)),
            "n_embd_per_layer": int(key("embedding_length_per_layer_input", 0)),
            "n_layer_kv": n_kv}


def weights(hp) -> tuple[str, ...]:
    return ("attn_norm", "attn_q", "attn_output", "attn_q_norm", "post_attention_norm",
            "ffn_norm", *FEED_FORWARD, "post_ffw_norm", *(MOE if hp.n_expert else ()))


def layer_weights(hp, il: int) -> tuple[str, ...]:
    """K where the layer keeps a cache, the per-layer embedding's block where the file has them."""
    own = ("attn_k.weight", "attn_k_norm.weight") if hp.kv_layer(il) == il else ()
    return own + (PER_LAYER if hp.n_embd_per_layer else ())


def per_layer_inputs(c, x) -> dict:
    """Each token's per-layer embeddings, (n_embd_per_layer * n_layer, T): its row of the
    table (scaled by sqrt(n_embd_per_layer)) plus the RMS-normed projection of the
    scaled embeddings x (by 1/sqrt(n_embd)), times 1/sqrt(2); layer il's are rows
    il * n_embd_per_layer on."""
    hp, w, T = c.hp, c.w, c.T
    n, f32 = hp.n_embd_per_layer, np.float32
    if not n:
        return {}
    rows = B.reshape(B.get_rows(w["per_layer_token_embd.weight"], c.tokens), (n, hp.n_layer, T))
    rows = B.scale(rows, float(np.sqrt(f32(n))), name="inp_per_layer_selected")
    proj = B.scale(B.mul_mat(w["per_layer_model_proj.weight"], x), float(f32(1) / np.sqrt(f32(hp.n_embd))))
    proj = B.rms_norm(B.reshape(proj, (n, hp.n_layer, T)), hp.eps)
    proj = B.mul(proj, w["per_layer_proj_norm.weight"], name="per_layer_proj")
    ple = B.scale(B.add(proj, rows), float(f32(1) / np.sqrt(f32(2))), name="inp_per_layer")
    return {"ple": B.reshape(ple, (n * hp.n_layer, T))}


def per_layer_block(c, il: int, cur):
    """cur plus the post-normed projection of gelu(gate cur) times the layer's slice
    of the per-layer embeddings."""
    w, p, ple, n = c.w, f"blk.{il}.", c.side["ple"], c.hp.n_embd_per_layer
    mine = B.cont(B.view(ple, (n, c.T), (ple.nb[0], ple.nb[1]), n * il * ple.nb[0]))
    t = B.unary(GGMLUnaryOp.GELU, B.mul_mat(w[p + "inp_gate.weight"], cur))
    t = B.mul_mat(w[p + "proj.weight"], B.mul(t, mine))
    return B.add(cur, c.norm(t, "post_norm", il, "per_layer_embd_out"))


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
    if hp.kv_layer(il) != il:
        return c.attention(il, q, None, None, 1.0)
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
    if c.hp.n_embd_per_layer:
        cur = per_layer_block(c, il, cur)
    if p + "layer_output_scale.weight" in w:
        cur = B.mul(cur, w[p + "layer_output_scale.weight"], name=f"out_scaled-{il}")
    # llama.cpp keeps every row through the last layer and picks the output rows after
    (out,) = c.out_rows(il, cur)
    return out


def write(s, experts: bool = False, small: bool = False) -> None:
    """synth: every third layer global (a head twice the sliding-window layers',
    one K/V head, V = K, a quarter of its dims rotated through the frequency
    factors), the others on a short window; `experts`: the 26B-A4B's MoE; `small`:
    E2B's per-layer embeddings (n_embd / 4 per layer), every other layer global and
    the last third reusing the caches of the last two before them (no K, V or K norm
    of their own, a feed-forward twice as wide)."""
    import gguf

    sh, e, n = s.shape, s.shape.n_embd, s.shape.n_expert
    hd_swa, kv_swa = s.head, sh.n_head_kv
    hd_full, kv_full = 2 * s.head, 1
    swa = [il % (2 if small else 3) != (1 if small else 2) for il in range(sh.n_layer)]
    n_kv = max(2, (sh.n_layer - sh.n_layer // 3) // 2 * 2) if small else sh.n_layer
    n_epl = e // 4 if small else 0
    ff = [sh.n_ff if il < n_kv else 2 * sh.n_ff for il in range(sh.n_layer)]
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
    s.w.add_shared_kv_layers(sh.n_layer - n_kv)
    s.w.add_embedding_length_per_layer_input(n_epl)
    if small:
        s.rewrite("feed_forward_length")
        s.w.add_feed_forward_length(ff)
    if experts:
        ff_exp = s.experts()
    s.w.add_tensor("token_embd.weight", s.embd(tied=True))
    if small:
        s.w.add_tensor("per_layer_token_embd.weight", s.mat(s.n_vocab, n_epl * sh.n_layer, 1.0))
        s.w.add_tensor("per_layer_model_proj.weight", s.mat(n_epl * sh.n_layer, e))
        s.w.add_tensor("per_layer_proj_norm.weight", s.norm(n_epl))
    n_rot = hd_full // 8
    s.w.add_tensor("rope_freqs.weight", np.array([1.0] * n_rot + [1e30] * (hd_full // 2 - n_rot), np.float32))
    for i, sliding in enumerate(swa):
        p = f"blk.{i}."
        hd, kv = (hd_swa, kv_swa) if sliding else (hd_full, kv_full)
        s.w.add_tensor(p + "attn_norm.weight", s.norm(e))
        s.w.add_tensor(p + "attn_q.weight", s.mat(hd * sh.n_head, e))
        if i < n_kv:
            s.w.add_tensor(p + "attn_k.weight", s.mat(hd * kv, e))
            if sliding:
                s.w.add_tensor(p + "attn_v.weight", s.mat(hd * kv, e))
        s.w.add_tensor(p + "attn_output.weight", s.mat(e, hd * sh.n_head))
        s.w.add_tensor(p + "attn_q_norm.weight", s.norm(hd))
        if i < n_kv:
            s.w.add_tensor(p + "attn_k_norm.weight", s.norm(hd))
        for name in ("post_attention_norm", "ffn_norm", "post_ffw_norm"):
            s.w.add_tensor(p + name + ".weight", s.norm(e))
        s.ffn(p, ff[i])
        if small:
            s.w.add_tensor(p + "inp_gate.weight", s.mat(n_epl, e))
            s.w.add_tensor(p + "proj.weight", s.mat(e, n_epl))
            s.w.add_tensor(p + "post_norm.weight", s.norm(e))
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
            "GeGLU experts beside the dense feed-forward (26B-A4B), per-layer embeddings and layers reading "
            "an earlier layer's KV cache (E2B, E4B)", ROPE_NEOX, weights, layer, hparams,
            layer_weights=layer_weights, scale_embd=True,
            synth={"gemma4": write, "gemma4-moe": partial(write, experts=True),
                   "gemma4-e2b": partial(write, small=True)},
            test_shape={"n_layer": 3}, inputs=per_layer_inputs,
            input_weights=("per_layer_token_embd.weight", "per_layer_model_proj.weight",
                           "per_layer_proj_norm.weight"))
