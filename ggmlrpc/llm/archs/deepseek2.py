"""deepseek2 (DeepSeek V2/V3/R1, Kimi K2): multi-head latent attention over a
compressed KV cache, leading dense layers, then routed experts plus shared ones.

Attention (llama.cpp's "absorbed" MLA): each token's KV is compressed to
n_lora_kv values (RMS-normed) plus n_rot rotated key values shared by every head,
and that row of n_lora_kv + n_rot is all the cache keeps (one K cache, no V
cache: V is the first n_lora_kv values of each cell). The query (wq, or the
low-rank wq_a, its norm and wq_b) is split into a part without position, taken
into the compressed space by wk_b, and a rotated part; every head then attends
the one shared cache head (MQA), and wv_b decompresses each head's result. The
scores' scale carries YaRN's magnitude squared (rope.scaling.yarn_log_multiplier).
The experts: soft-max or sigmoid gate, a selection bias (exp_probs_b), the best
expert groups first where the file has groups, the chosen weights renormalized
and scaled as the file says. Files converted before wkv_b was split into
wk_b/wv_b (no key_length_mla) run as llama.cpp runs them: wkv_b decompresses
every head's K and V into the common KV cache. Files with an attention
temperature (Mistral Large 3) or multi-token prediction layers are refused with
one error."""
from __future__ import annotations

import math
from functools import partial

import numpy as np

from ... import builder as B
from ..blocks import EXPERTS, FEED_FORWARD
from ..gguf_file import ModelError
from ..hparams import GATING_SIGMOID, GATING_SOFTMAX, yarn_hparams
from . import ROPE_NORM, Arch

f32 = np.float32


def hparams(key) -> dict:
    for name in ("attention.temperature_scale", "nextn_predict_layers"):
        if key(name, 0):
            raise ModelError(f"deepseek2 with {name} (Mistral Large 3's attention temperature, "
                             f"multi-token prediction layers) is not supported")
    out = {"n_layer_dense_lead": int(key("leading_dense_block_count", 0)),
           "n_lora_q": int(key("attention.q_lora_rank", 0)),
           "n_lora_kv": int(key("attention.kv_lora_rank", 0)),
           "head_dim_mla": int(key("attention.key_length_mla", 0)),
           "head_dim_v_mla": int(key("attention.value_length_mla", 0)),
           "expert_weights_scale": float(key("expert_weights_scale", 0.0)),
           "expert_weights_norm": bool(key("expert_weights_norm", False)),
           "expert_gating": int(key("expert_gating_func", 0)) or GATING_SOFTMAX}
    if not out["head_dim_mla"]:     # a file from before wk_b/wv_b: K and V heads of their own sizes
        out["head_dim_v"] = int(key("attention.value_length", 0))
    log_mul = key("rope.scaling.yarn_log_multiplier", None)
    if log_mul:     # the file holds 0.1 * mscale_all_dim; YaRN's own magnitude then cancels to 1
        out["rope_yarn_log_mul"] = float(f32(log_mul) / f32(0.1))
        scale = key("rope.scaling.factor", None)
        out.update(yarn_hparams(str(key("rope.scaling.type", "linear")), 1.0 / float(scale) if scale else 1.0,
                                float(key("rope.scaling.attn_factor", 1.0)), mscale=1.0))
    return out


def weights(hp) -> tuple[str, ...]:
    q = ("attn_q_a_norm", "attn_q_a", "attn_q_b") if hp.n_lora_q else ("attn_q",)
    kv_b = ("attn_k_b", "attn_v_b") if hp.is_mla else ("attn_kv_b",)
    return ("attn_norm", *q, "attn_kv_a_norm", "attn_kv_a_mqa", *kv_b, "attn_output", "ffn_norm")


def layer_weights(hp, il: int) -> tuple[str, ...]:
    if il < hp.n_layer_dense_lead:
        return tuple(n + ".weight" for n in FEED_FORWARD)
    return tuple(n + ".weight" for n in (*EXPERTS, "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"))


def kq_scale(hp) -> float:
    """YaRN's magnitude squared over sqrt(head size), in F32 as llama.cpp computes it."""
    lnf = f32(math.log(f32(1.0) / f32(hp.rope_scale)))
    attn_factor = f32(hp.rope_attn_factor) * (f32(1.0) + f32(0.1) * lnf)
    mscale = attn_factor * (f32(1.0) + f32(0.1) * f32(hp.rope_yarn_log_mul) * lnf)
    return float(f32(1.0) * mscale * mscale / f32(math.sqrt(f32(hp.head_dim_mla or hp.head_dim))))


def attention(c, il: int, cur):
    """Multi-head latent attention, up to the output projection: over the compressed
    cache (MLA), or decompressed by wkv_b into full heads over the common cache."""
    hp, w, T, g = c.hp, c.w, c.T, c.g
    p, rank, rot = f"blk.{il}.", hp.n_lora_kv, hp.n_rot
    nope = (hp.head_dim_mla or hp.head_dim) - rot
    if hp.n_lora_q:
        q = B.mul_mat(w[p + "attn_q_a.weight"], cur, name=f"q-{il}")
        q = B.mul_mat(w[p + "attn_q_b.weight"], c.norm(q, "attn_q_a_norm", il, "q"), name=f"q-{il}")
    else:
        q = B.mul_mat(w[p + "attn_q.weight"], cur, name=f"q-{il}")
    q = B.reshape(q, (nope + rot, hp.n_head, T), name=f"q-{il}")
    kv_pe = B.mul_mat(w[p + "attn_kv_a_mqa.weight"], cur, name=f"kv_cmpr_pe-{il}")
    es, row = kv_pe.nb[0], kv_pe.nb[1]
    kv = B.view(kv_pe, (rank, T), (es, row), 0, name=f"kv_cmpr-{il}")
    k_pe = B.view(kv_pe, (rot, 1, T), (es, row, row), es * rank, name=f"k_pe-{il}")
    k_pe = c.rope(k_pe, il, f"k_pe-{il}")
    kv = c.norm(kv, "attn_kv_a_norm", il, "kv_cmpr")
    if not hp.is_mla:
        return decompressed(c, il, q, kv, k_pe, nope)
    q_nope = B.view(q, (nope, hp.n_head, T), q.nb[:3], 0, name=f"q_nope-{il}")
    q_pe = c.rope(B.view(q, (rot, hp.n_head, T), q.nb[:3], es * nope, name=f"q_pe-{il}"), il, f"q_pe-{il}")
    q_abs = B.mul_mat(w[p + "attn_k_b.weight"], B.permute(q_nope, 0, 2, 1, 3), name=f"q_nope_absorbed-{il}")
    q = B.concat(B.permute(q_abs, 0, 2, 1, 3), q_pe, 0, name=f"Qcur-{il}")
    v = B.reshape(kv, (rank, 1, T), name=f"Vcur-{il}")
    k = B.concat(v, k_pe, 0, name=f"Kcur-{il}")
    for t in (q, v, k):
        g.expand(t)
    # the cache: one row of rank + rot values per cell; V is the first rank of them
    k_idx, _, mask = c.attn_in
    cache, _ = c.st.kv[il]
    d = rank + rot
    g.expand(B.set_rows(cache, B.reshape(k, (d, T)), k_idx))
    row = 2 * d    # F16
    kk = B.view(cache, (d, 1, c.n_kv, 1), (2, row, row, row * c.n_kv))
    vv = B.view(kk, (rank, 1, c.n_kv, 1), kk.nb)
    qq = B.permute(q, 0, 2, 1, 3)
    kk, vv = B.permute(kk, 0, 2, 1, 3), B.permute(vv, 0, 2, 1, 3)
    scale, wv_b = kq_scale(hp), w[p + "attn_v_b.weight"]
    if c.flash_attn:
        o = B.flash_attn_ext(qq, kk, vv, mask, scale)                 # (rank, n_head, T)
        o = B.mul_mat(wv_b, B.permute(o, 0, 2, 1, 3), name=f"fattn_mla-{il}")
    else:
        kq = B.soft_max_ext(B.mul_mat(kk, qq, name=f"kq-{il}", prec_f32=True), mask, scale,
                            name=f"kq_soft_max-{il}")
        vt = B.cont(B.transpose(vv), name=f"v_cont-{il}")
        o = B.mul_mat(wv_b, B.mul_mat(vt, kq, name=f"kqv-{il}"), name=f"kqv_mla-{il}")
    o = B.cont(B.permute(o, 0, 2, 1, 3), (hp.head_dim_v_mla * hp.n_head, T), name=f"kqv_out-{il}")
    return c.scaled(B.mul_mat(w[p + "attn_output.weight"], o, name=f"attn_out-{il}"), "attn_output", il)


def decompressed(c, il: int, q, kv, k_pe, nope: int):
    """Files before wk_b/wv_b: wkv_b makes each head's K (+ the shared rotated part)
    and V, and the query rotates its last n_rot values; then common attention."""
    hp, T, hv, rot = c.hp, c.T, c.hp.head_dim_v, c.hp.n_rot
    kv = B.mul_mat(c.w[f"blk.{il}.attn_kv_b.weight"], kv, name=f"kv-{il}")
    es, row = kv.nb[0], kv.nb[0] * (nope + hv)
    k_nope = B.view(kv, (nope, hp.n_head, T), (es, row, row * hp.n_head), 0, name=f"k_nope_view-{il}")
    v = B.cont(B.view(kv, (hv, hp.n_head, T), (es, row, row * hp.n_head), es * nope), name=f"Vcur_cont-{il}")
    q = c.rope(q, il, f"Qcur-{il}", offset=nope)
    k = B.concat(k_nope, B.repeat(k_pe, (rot, hp.n_head, T, 1)), 0, name=f"Kcur-{il}")
    return c.attention(il, q, k, v, kq_scale(hp))


def layer(c, il: int, x):
    hp = c.hp
    cur = attention(c, il, c.norm(x, "attn_norm", il))
    cur, x = c.out_rows(il, cur, x)
    ffn_inp = B.add(cur, x, name=f"ffn_inp-{il}")
    cur = c.norm(ffn_inp, "ffn_norm", il)
    if il < hp.n_layer_dense_lead:
        cur = c.ffn(il, cur, scales=False)     # llama.cpp passes deepseek2 no FFN scales
    else:
        cur = c.moe(il, cur, norm_w=hp.expert_weights_norm, scales=False)     # the shared expert added in it
    return B.add(cur, ffn_inp, name=f"l_out-{il}")


def write(s, q_lora: bool = True, v3: bool = False, mla: bool = True) -> None:
    """synth: one leading dense layer, then experts with one shared expert; one
    cache head of a 96-value compressed KV plus 32 rotated values (a multiple of
    32, as a quantized cache needs); query heads of 32 + 32 values, value heads of
    32. `q_lora`: the low-rank query (V3), else one matrix (V2-Lite); `v3`: sigmoid
    gate with a selection bias, groups of two experts of which half are used,
    renormalized weights, YaRN with its log multiplier (unless the shape sets a
    rope scaling); else soft-max (V2); not `mla`: one wkv_b, as files were
    converted before wk_b/wv_b."""
    import gguf

    sh, e, n = s.shape, s.shape.n_embd, s.shape.n_expert
    rank, rot, nope, hv, q_rank = 96, 32, 32, 32, 96 if q_lora else 0
    w, nh = s.w, sh.n_head
    ff_exp = s.experts()
    for name in ("attention.head_count_kv", "rope.dimension_count"):
        s.rewrite(name)
    w.add_head_count_kv(1 if mla else nh)
    w.add_rope_dimension_count(rot)
    w.add_leading_dense_block_count(1)
    w.add_expert_shared_count(1)
    w.add_q_lora_rank(q_rank)
    w.add_kv_lora_rank(rank)
    if mla:
        w.add_key_length(rank + rot)
        w.add_value_length(rank)
        w.add_key_length_mla(nope + rot)
        w.add_value_length_mla(hv)
    else:
        w.add_key_length(nope + rot)
        w.add_value_length(hv)
    w.add_expert_weights_scale(2.5 if v3 else 1.0 if not q_lora else 2.0)
    w.add_expert_weights_norm(v3)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType(GATING_SIGMOID if v3 else GATING_SOFTMAX))
    if v3:
        w.add_expert_group_count(n // 2)        # groups of two experts, half of them used
        w.add_expert_group_used_count(n // 4)
        if not sh.rope_scaling:
            w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            w.add_rope_scaling_factor(4.0)
            w.add_rope_scaling_orig_ctx_len(sh.n_ctx // 4)
            w.add_rope_scaling_yarn_log_mul(0.0707)
    w.add_tensor("token_embd.weight", s.embd())
    for i in range(sh.n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", s.norm(e))
        if q_lora:
            w.add_tensor(p + "attn_q_a_norm.weight", s.norm(q_rank))
            w.add_tensor(p + "attn_q_a.weight", s.mat(q_rank, e))
            w.add_tensor(p + "attn_q_b.weight", s.mat(nh * (nope + rot), q_rank))
        else:
            w.add_tensor(p + "attn_q.weight", s.mat(nh * (nope + rot), e))
        w.add_tensor(p + "attn_kv_a_norm.weight", s.norm(rank))
        w.add_tensor(p + "attn_kv_a_mqa.weight", s.mat(rank + rot, e))
        if mla:
            w.add_tensor(p + "attn_k_b.weight", s.mat(rank, nope, n=nh))
            w.add_tensor(p + "attn_v_b.weight", s.mat(hv, rank, n=nh))
        else:
            w.add_tensor(p + "attn_kv_b.weight", s.mat(nh * (nope + hv), rank))
        w.add_tensor(p + "attn_output.weight", s.mat(e, nh * hv))
        w.add_tensor(p + "ffn_norm.weight", s.norm(e))
        if i < 1:
            s.ffn(p, sh.n_ff)
            continue
        s.routed_experts(p, ff_exp)
        if v3:
            w.add_tensor(p + "exp_probs_b.bias", s.bias(n))
        s.ffn(p, ff_exp, "_shexp")
    w.add_tensor("output_norm.weight", s.norm(e))
    w.add_tensor("output.weight", s.mat(s.n_vocab, e))


ARCH = Arch("deepseek2", "multi-head latent attention over a compressed K-only cache (wk_b/wv_b absorbed), "
            "low-rank query, leading dense layers, routed experts (soft-max or sigmoid gate, selection "
            "bias, expert groups, scaled weights) plus shared ones", ROPE_NORM, weights, layer, hparams,
            layer_weights=layer_weights,
            synth={"deepseek2": write, "deepseek2-v3": partial(write, v3=True),
                   "deepseek2-lite": partial(write, q_lora=False), "deepseek2-wkv_b": partial(write, mla=False)},
            test_shape={"n_expert": 8})
