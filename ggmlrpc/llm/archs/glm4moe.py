"""glm4moe (GLM-4.5, GLM-4.5-Air): q/k/v biases, per-head q/k norms where the file
has them (the 355B model), rope on part of each head, a norm after attention
feeding the feed-forward, a dense feed-forward in the leading layers and routed
experts in the others: sigmoid gates, the experts chosen after adding a
per-expert selection bias (exp_probs_b, e_score_correction), their weights
renormalized and scaled, plus an ungated shared expert. The NextN/MTP layers a
file carries after the others are not run (llama.cpp runs them only to draft)."""
from __future__ import annotations

from ... import builder as B
from ..blocks import ATTENTION, EXPERTS, FEED_FORWARD
from ..gguf_file import ModelError
from ..hparams import GATING_SIGMOID, GATING_SOFTMAX
from . import ROPE_NEOX, Arch


def gating(key, default: int) -> int:
    """The file's expert gating function (none given: `default`)."""
    kind = int(key("expert_gating_func", 0)) or default
    if kind not in (GATING_SOFTMAX, GATING_SIGMOID):
        raise ModelError(f"expert gating function {kind} is not supported (1 soft-max, 2 sigmoid)")
    return kind


def hparams(key) -> dict:
    return {"n_layer_dense_lead": int(key("leading_dense_block_count", 0)),
            "expert_gating": gating(key, GATING_SIGMOID),
            "expert_weights_norm": bool(key("expert_weights_norm", False)),
            "expert_weights_scale": float(key("expert_weights_scale", 0.0))}


def weights(hp) -> tuple[str, ...]:
    return (*ATTENTION, "post_attention_norm")


def layer_weights(hp, il: int) -> tuple[str, ...]:
    return tuple(n + ".weight" for n in (FEED_FORWARD if il < hp.n_layer_dense_lead else EXPERTS))


def layer(c, il: int, x):
    cur = c.norm(x, "attn_norm", il)
    cur = c.attention(il, *c.qkv(il, cur))
    cur, x = c.out_rows(il, cur, x)
    ffn_inp = B.add(cur, x, name=f"ffn_inp-{il}")
    cur = c.norm(ffn_inp, "post_attention_norm", il, "post_attn_norm")
    cur = (c.ffn(il, cur, scales=False) if il < c.hp.n_layer_dense_lead     # llama.cpp passes glm4moe no FFN scales
           else c.moe(il, cur, norm_w=c.hp.expert_weights_norm, scales=False))
    return B.add(cur, ffn_inp, name=f"l_out-{il}")


def write(s) -> None:
    """synth: one leading dense layer, then routed experts with a shared one; one
    NextN/MTP layer after the others (which the runner must skip)."""
    import gguf

    sh, e, n = s.shape, s.shape.n_embd, s.shape.n_expert
    ff_exp = s.experts()
    s.w.add_expert_shared_count(1)
    s.w.add_leading_dense_block_count(1)
    s.w.add_expert_weights_norm(True)
    s.w.add_expert_weights_scale(2.5)
    s.w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    s.w.add_nextn_predict_layers(1)
    s.w.kv_data[0].pop(gguf.Keys.LLM.BLOCK_COUNT.format(arch=s.w.arch))
    s.w.add_block_count(sh.n_layer + 1)
    s.w.add_tensor("token_embd.weight", s.embd())
    for i in range(sh.n_layer + 1):
        p = f"blk.{i}."
        s.attention(p, biases=True)
        s.qk_norms(p)
        s.w.add_tensor(p + "post_attention_norm.weight", s.norm(e))
        if i == 0:
            s.ffn(p, sh.n_ff)
            continue
        s.routed_experts(p, ff_exp)
        s.w.add_tensor(p + "exp_probs_b.bias", s.bias(n))
        s.ffn(p, ff_exp, "_shexp")
        if i == sh.n_layer:     # the MTP layer's own tensors
            s.w.add_tensor(p + "nextn.eh_proj.weight", s.mat(e, 2 * e))
            for name in ("enorm", "hnorm", "shared_head_norm"):
                s.w.add_tensor(p + f"nextn.{name}.weight", s.norm(e))
    s.w.add_tensor("output_norm.weight", s.norm(e))
    s.w.add_tensor("output.weight", s.mat(s.n_vocab, e))


ARCH = Arch("glm4moe", "q/k/v biases, partial rope, leading dense layers, sigmoid-gated experts chosen with a "
            "selection bias, renormalized and scaled, plus a shared expert; NextN/MTP layers skipped",
            ROPE_NEOX, weights, layer, hparams, layer_weights=layer_weights,
            synth={"glm4moe": write}, synth_rope_share=0.5)
