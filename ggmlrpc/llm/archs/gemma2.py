"""gemma2: embeddings scaled by sqrt(n_embd), norms after attention and after the
feed-forward too, a GeGLU feed-forward, the query scaled instead of the scores,
every other layer on a sliding window, tanh soft-capped attention scores and
logits. The layer serves gemma3 too."""
from __future__ import annotations

from ... import builder as B
from ...ggml import GGMLGluOp
from ..blocks import ATTENTION, FEED_FORWARD
from ..hparams import inverse_scale
from . import ROPE_NEOX, Arch


def hparams(key) -> dict:
    return {"n_swa": int(key("attention.sliding_window", 4096)),
            "rope_base_swa": float(key("rope.freq_base_swa", key("rope.freq_base", 10000.0))),
            "rope_scale_swa": inverse_scale(key),
            "attn_softcap": float(key("attn_logit_softcapping", 50.0)),
            "final_softcap": float(key("final_logit_softcapping", 30.0))}


def weights(hp) -> tuple[str, ...]:
    return (*ATTENTION, "ffn_norm", *FEED_FORWARD, "post_attention_norm", "post_ffw_norm")


def layer(c, il: int, x, n_layer_27b: int = 46):
    """The 27B model (n_layer_27b layers) scales the query by n_embd / n_head, not
    the head size."""
    hp = c.hp
    cur = c.norm(x, "attn_norm", il)
    q, k, v = c.qkv(il, cur)
    q = c.scale_query(q, il, hp.n_embd // hp.n_head if hp.n_layer == n_layer_27b else 0)
    cur = c.attention(il, q, k, v, 1.0)
    cur, x = c.out_rows(il, cur, x)
    cur = c.norm(cur, "post_attention_norm", il, "attn_post_norm")
    ffn_inp = B.add(cur, x, name=f"ffn_inp-{il}")
    cur = c.ffn(il, c.norm(ffn_inp, "ffn_norm", il), GGMLGluOp.GEGLU)
    cur = c.norm(cur, "post_ffw_norm", il, "ffn_post_norm")
    return B.add(cur, ffn_inp, name=f"l_out-{il}")


def softcaps(s) -> None:
    s.w.add_attn_logit_softcapping(s.shape.attn_softcap)
    s.w.add_final_logit_softcapping(s.shape.final_softcap)


def write(s, keys=softcaps, qk_norms: bool = False) -> None:
    """synth: output tied to the embeddings, a short window; `keys` writes the
    model's own keys, `qk_norms` adds per-head q/k norms (gemma3)."""
    sh, e = s.shape, s.shape.n_embd
    s.w.add_key_length(s.head)
    s.w.add_value_length(s.head)
    s.w.add_sliding_window(sh.n_swa)
    keys(s)
    s.w.add_tensor("token_embd.weight", s.embd(tied=True))
    for i in range(sh.n_layer):
        p = f"blk.{i}."
        s.attention(p)
        if qk_norms:
            s.qk_norms(p)
        s.w.add_tensor(p + "post_attention_norm.weight", s.norm(e))
        s.w.add_tensor(p + "ffn_norm.weight", s.norm(e))
        s.ffn(p, sh.n_ff)
        s.w.add_tensor(p + "post_ffw_norm.weight", s.norm(e))
    s.w.add_tensor("output_norm.weight", s.norm(e))


ARCH = Arch("gemma2", "scaled embeddings, post-norms, GeGLU, soft-capped attention and logits, "
            "every other layer on a sliding window", ROPE_NEOX, weights, layer, hparams,
            scale_embd=True, swa_pattern=2, synth={"gemma2": write})
