"""qwen3next: a hybrid of gated delta-net layers (linear attention over a recurrent
state) and, every `full_attention_interval`-th layer, gated attention (the query
projection carries a sigmoid gate for the attention output, per-head q/k norms,
partial NeoX rope); each layer then routed experts (renormalized) plus a shared
expert behind a sigmoid gate, between an attention norm and a post-attention norm.

A delta-net layer keeps, per sequence, its short convolution's last d_conv - 1
inputs (llama.cpp's r state) and its (S_v, S_v) state per value head (s state),
both F32 beside the layer (placement's recurrent state, a slot per sequence); they
carry over from step to step, and are zeroed when a sequence starts. A micro-batch
of several sequences gives each as many tokens (n_t), so the layer runs on
(n_t, n_seqs) as llama.cpp's does. The delta net is ggml's fused
GATED_DELTA_NET (llama.cpp's default on every backend that has it)."""
from __future__ import annotations

import numpy as np

from ... import builder as B
from ...ggml import GGMLUnaryOp
from ..blocks import EXPERTS
from ..gguf_file import ModelError
from . import ROPE_NEOX, Arch

SHARED = ("ffn_gate_inp_shexp.weight", "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight")
LINEAR = ("attn_qkv.weight", "attn_gate.weight", "ssm_conv1d.weight", "ssm_dt.bias", "ssm_a", "ssm_ba.weight",
          "ssm_norm.weight", "ssm_out.weight")
GATED = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "attn_q_norm.weight",
         "attn_k_norm.weight")


def hparams(key) -> dict:
    """The delta net's sizes and which layers are recurrent (llama.cpp's defaults:
    every fourth layer attends)."""
    n_layer = int(key("block_count", 0))
    recurrent = key("attention.recurrent_layers", None)
    if recurrent is None:
        every = int(key("full_attention_interval", 4))
        recurrent = [(i + 1) % every != 0 for i in range(n_layer)]
    elif isinstance(recurrent, (bool, int, np.bool_)):
        recurrent = [bool(recurrent)] * n_layer
    sizes = {name: int(key(f"ssm.{k}", 0)) for name, k in (
        ("d_conv", "conv_kernel"), ("d_inner", "inner_size"), ("d_state", "state_size"),
        ("n_v_heads", "time_step_rank"), ("n_k_heads", "group_count"))}
    if not all(sizes.values()) or sizes["n_v_heads"] % sizes["n_k_heads"] \
            or sizes["d_inner"] != sizes["d_state"] * sizes["n_v_heads"] or len(recurrent) < n_layer:
        raise ModelError(f"the delta net's sizes (ssm.*: {sizes}) or recurrent layers are missing or inconsistent")
    return {"ssm": {**sizes, "recurrent": [bool(r) for r in recurrent]}}


def is_recurrent(hp, il: int) -> bool:
    return hp.ssm["recurrent"][il]


def conv_channels(s: dict) -> int:
    return s["d_inner"] + 2 * s["n_k_heads"] * s["d_state"]


def layer_weights(hp, il: int, linear: tuple[str, ...] = LINEAR) -> tuple[str, ...]:
    own = linear if is_recurrent(hp, il) else GATED
    return ("attn_norm.weight", "post_attention_norm.weight", *own, *(n + ".weight" for n in EXPERTS), *SHARED)


def state(hp, il: int) -> tuple:
    """The convolution's last inputs and the delta net's state, for one sequence."""
    if not is_recurrent(hp, il):
        return ()
    s = hp.ssm
    return (((s["d_conv"] - 1) * conv_channels(s), 1), (s["d_state"] * s["d_inner"], 1))


def proj(c, il: int, name: str, x, tname: str, scaled: bool = True):
    """x W, times W's per-matrix scale (unless not `scaled`), plus its bias, where the
    file has them (llama.cpp's order)."""
    t = B.mul_mat(c.w[f"blk.{il}.{name}.weight"], x, name=tname)
    t = c.scaled(t, name, il) if scaled else t
    b = c.w.get(f"blk.{il}.{name}.bias")
    return t if b is None else B.add(t, b, name=tname)


def linear_scales(c) -> bool:
    """llama.cpp scales the linear-attention matrices of qwen35moe, not of qwen3next."""
    return c.arch.name != "qwen3next"


def gated_attention(c, il: int, cur, rope=None):
    """`rope(c, t, il, name)`: the rotation (default: the architecture's rope)."""
    hp, w, T = c.hp, c.w, c.T
    rope = rope or (lambda c, t, il, name: c.rope(t, il, name))
    p, hd = f"blk.{il}.", hp.head_dim
    q_full = B.reshape(proj(c, il, "attn_q", cur, f"Qcur_full-{il}"), (2 * hd, hp.n_head, T))
    k = B.reshape(proj(c, il, "attn_k", cur, f"Kcur-{il}"), (hd, hp.n_head_kv, T))
    v = B.reshape(proj(c, il, "attn_v", cur, f"Vcur-{il}"), (hd, hp.n_head_kv, T))
    es = q_full.nb[0]
    q = B.view(q_full, (hd, hp.n_head, T), q_full.nb, 0, name=f"Qcur_view-{il}")
    gate = B.view(q_full, (hd, hp.n_head, T), q_full.nb, hd * es, name=f"gate-{il}")
    q = c.norm(q, "attn_q_norm", il, "Qcur_normed")
    k = c.norm(k, "attn_k_norm", il, "Kcur_normed")
    q, k = rope(c, q, il, f"Qcur-{il}"), rope(c, k, il, f"Kcur-{il}")
    cur = c.attention(il, q, k, v, project=False)
    gate = B.unary(GGMLUnaryOp.SIGMOID, B.cont(gate, (hd * hp.n_head, T)), name=f"gate_sigmoid-{il}")
    cur = B.mul(cur, gate, name=f"attn_gated-{il}")
    return c.scaled(B.mul_mat(w[p + "attn_output.weight"], cur, name=f"attn_output-{il}"), "attn_output", il)


def l2_norm(x, eps: float):
    """llama.cpp's L2 norm of the delta net's q and k: an RMS norm (eps / n), / sqrt(n)."""
    n = np.float32(x.ne[0])
    return B.scale(B.rms_norm(x, float(np.float32(eps) / n)), float(np.float32(1.0) / np.sqrt(n)))


def beta_gate(c, il: int, cur):
    """The delta net's per-head beta (sigmoid) and decay gate (softplus(alpha + dt)
    times A), (1, n_v_heads, n_t, n_seqs) each (n_t tokens of each of the
    micro-batch's sequences): beta and alpha interleaved per key head in one
    matrix's rows."""
    hp, w, T, p = c.hp, c.w, c.T, f"blk.{il}."
    Hk, Hv = hp.ssm["n_k_heads"], hp.ssm["n_v_heads"]
    ba = B.mul_mat(w[p + "ssm_ba.weight"], cur, name=f"linear_attn_mixed_ba-{il}")
    ba = B.reshape(ba, (2 * Hv // Hk, Hk, T, 1))
    b = B.view(ba, (Hv // Hk, Hk, T, 1), ba.nb, 0, name=f"b-{il}")
    a = B.view(ba, (Hv // Hk, Hk, T, 1), ba.nb, Hv // Hk * ba.nb[0], name=f"a-{il}")
    beta = B.unary(GGMLUnaryOp.SIGMOID, B.cont(b))
    alpha = B.cont(a, (Hv, T, 1))
    alpha = B.unary(GGMLUnaryOp.SOFTPLUS, B.add(alpha, w[p + "ssm_dt.bias"]), name=f"a_softplus-{il}")
    gate = B.mul(alpha, w[p + "ssm_a"], name=f"gate-{il}")
    shape = (1, Hv, T // c.n_seqs, c.n_seqs)
    return B.reshape(beta, shape), B.reshape(gate, shape)


def linear_attention(c, il: int, cur, beta_gate=beta_gate, repeat: bool = True):
    """The gated delta net over the layer's recurrent state, each sequence of the
    micro-batch over its own; `repeat`: the key heads repeated to the value heads'
    count before it (else the op broadcasts them)."""
    hp, w, T, N = c.hp, c.w, c.T, c.n_seqs
    p, s, n_t = f"blk.{il}.", hp.ssm, c.T // c.n_seqs
    S, Hk, Hv, d_conv = s["d_state"], s["n_k_heads"], s["n_v_heads"], s["d_conv"]
    dv = s["d_inner"] // Hv
    channels = conv_channels(s)
    qkv = proj(c, il, "attn_qkv", cur, f"linear_attn_qkv_mixed-{il}", linear_scales(c))
    qkv = B.reshape(qkv, (qkv.ne[0], n_t, N))
    z = proj(c, il, "attn_gate", cur, f"z-{il}", linear_scales(c))
    beta, gate = beta_gate(c, il, cur)
    conv_all, ssm_all = c.st.state[il]
    # the convolution's input: the state's last inputs, then this step's (channels as rows)
    conv_states = c.state(conv_all, (d_conv - 1, channels), f"conv_states_reshaped-{il}")
    conv_input = B.concat(conv_states, B.transpose(qkv, name=f"qkv_mixed_transposed-{il}"), 0,
                          name=f"conv_input-{il}")
    last = B.view(conv_input, (d_conv - 1, channels, N), conv_input.nb, n_t * conv_input.nb[0],
                  name=f"conv_state_last-{il}")
    c.keep_state(last, conv_all, f"conv_state_update-{il}")
    state = c.state(ssm_all, (dv, dv, Hv), f"state_predelta-{il}")
    conv = B.silu(B.ssm_conv(conv_input, w[p + "ssm_conv1d.weight"], name=f"conv_output_raw-{il}"),
                  name=f"conv_output_silu-{il}")
    es, row = conv.nb[0], conv.nb[1]
    q = B.view(conv, (S, Hk, n_t, N), (es, es * S, row, row * n_t), 0, name=f"q_conv-{il}")
    k = B.view(conv, (S, Hk, n_t, N), (es, es * S, row, row * n_t), S * Hk * es, name=f"k_conv-{il}")
    v = B.view(conv, (dv, Hv, n_t, N), (es, es * dv, row, row * n_t), 2 * S * Hk * es, name=f"v_conv-{il}")
    q, k = l2_norm(q, hp.eps), l2_norm(k, hp.eps)
    if Hk != Hv and repeat:    # each key head serves Hv / Hk value heads, repeated in place
        r = Hv // Hk
        q, k = (B.reshape(B.repeat(B.reshape(t, (S, 1, Hk, T)), (S, r, Hk, T)), (S, Hv, n_t, N))
                for t in (q, k))
    out = B.gated_delta_net(q, k, v, gate, beta, state, name=f"gdn-{il}")
    f = out.nb[0]
    o = B.view(out, (dv, Hv, n_t, N), (f, f * dv, f * dv * Hv, f * dv * Hv * n_t), 0, name=f"attn_output-{il}")
    new_state = B.view(out, (dv, dv, Hv, N), (f, f * dv, f * dv * dv, f * dv * dv * Hv), f * dv * Hv * T,
                       name=f"new_state-{il}")
    c.keep_state(new_state, ssm_all)
    normed = c.norm(o, "ssm_norm", il)
    cur = B.mul(normed, B.silu(B.reshape(z, (dv, Hv, n_t, N))))
    cur = proj(c, il, "ssm_out", B.reshape(cur, (dv * Hv, n_t, N)), f"linear_attn_out-{il}", linear_scales(c))
    return B.reshape(cur, (hp.n_embd, T))


def layer(c, il: int, x, attention=gated_attention, linear=linear_attention):
    cur = c.norm(x, "attn_norm", il)
    c.g.expand(cur)
    cur = (linear if is_recurrent(c.hp, il) else attention)(c, il, cur)
    res = B.add(cur, x, name=f"attn_residual-{il}")
    cur = c.norm(res, "post_attention_norm", il, "attn_post_norm")
    cur = c.moe(il, cur, norm_w=True, sigmoid_shexp=True)
    # llama.cpp picks the output rows after the output norm: a norm of rows, the same numbers
    (out,) = c.out_rows(il, B.add(cur, res, name=f"post_moe-{il}"))
    return out


def write(s, split_ba: bool = False) -> None:
    """synth: every second layer attends; two key heads for four value heads
    (`split_ba`: beta and alpha from two matrices, qwen35moe's)."""
    sh, e = s.shape, s.shape.n_embd
    S, Hk, Hv, d_conv = 16, 2, 4, 4
    ff_exp = s.experts()
    hd = s.head
    w = s.w
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_expert_shared_feed_forward_length(sh.n_ff_shexp or sh.n_ff)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(S * Hv)
    w.add_ssm_state_size(S)
    w.add_ssm_time_step_rank(Hv)
    w.add_ssm_group_count(Hk)
    w.add_full_attention_interval(2)
    f32 = np.float32
    w.add_tensor("token_embd.weight", s.embd())
    for i in range(sh.n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", s.norm(e))
        w.add_tensor(p + "post_attention_norm.weight", s.norm(e))
        if (i + 1) % 2:
            w.add_tensor(p + "attn_qkv.weight", s.mat(2 * S * Hk + S * Hv, e))
            w.add_tensor(p + "attn_gate.weight", s.mat(S * Hv, e))
            w.add_tensor(p + "ssm_conv1d.weight", s.mat(2 * S * Hk + S * Hv, d_conv, 0.5, dtype=f32))
            w.add_tensor(p + "ssm_dt.bias", s.bias(Hv, 0.5))
            w.add_tensor(p + "ssm_a", -np.exp(s.bias(Hv, 0.5)).astype(f32))
            for name, rows in ((("ssm_beta", Hv), ("ssm_alpha", Hv)) if split_ba else (("ssm_ba", 2 * Hv),)):
                w.add_tensor(p + name + ".weight", s.mat(rows, e))
            w.add_tensor(p + "ssm_norm.weight", s.norm(S))
            w.add_tensor(p + "ssm_out.weight", s.mat(e, S * Hv))
        else:
            w.add_tensor(p + "attn_q.weight", s.mat(2 * hd * sh.n_head, e))
            w.add_tensor(p + "attn_k.weight", s.mat(s.n_kv, e))
            w.add_tensor(p + "attn_v.weight", s.mat(s.n_kv, e))
            w.add_tensor(p + "attn_output.weight", s.mat(e, hd * sh.n_head))
            s.qk_norms(p)
        s.routed_experts(p, ff_exp)
        w.add_tensor(p + "ffn_gate_inp_shexp.weight", s.mat(1, e, dtype=f32).reshape(e))
        s.ffn(p, sh.n_ff_shexp or sh.n_ff, "_shexp")
    w.add_tensor("output_norm.weight", s.norm(e))
    w.add_tensor("output.weight", s.mat(s.n_vocab, e))


ARCH = Arch("qwen3next", "gated delta-net layers over a recurrent state (fused GATED_DELTA_NET, SSM_CONV) "
            "between gated-attention layers with partial rope, renormalized experts plus a sigmoid-gated "
            "shared expert", ROPE_NEOX, lambda hp: (), layer, hparams, synth={"qwen3next": write},
            synth_rope_share=0.25, layer_weights=layer_weights, state=state)
