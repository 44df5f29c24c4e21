"""gpt-oss: a learned sink logit per head in attention, every other layer on a
sliding window, routed experts with biases (ADD_ID) and the clamped SwiGLU, gate
weights soft-maxed over the chosen experts only, the output rows picked after the
last layer."""
from __future__ import annotations

import numpy as np

from ... import builder as B
from ..blocks import ATTENTION, EXPERTS
from ..hparams import inverse_scale
from . import ROPE_NEOX, Arch


def hparams(key) -> dict:
    return {"n_swa": int(key("attention.sliding_window", 0)),
            "rope_base_swa": float(key("rope.freq_base_swa", key("rope.freq_base", 10000.0))),
            "rope_scale_swa": inverse_scale(key)}


def weights(hp) -> tuple[str, ...]:
    return (*ATTENTION, "attn_sinks", "post_attention_norm", *EXPERTS)


def layer(c, il: int, x):
    cur = c.norm(x, "attn_norm", il)
    cur = c.attention(il, *c.qkv(il, cur))
    ffn_inp = B.add(cur, x, name=f"ffn_inp-{il}")
    cur = c.moe(il, c.norm(ffn_inp, "post_attention_norm", il, "ffn_norm"), oai=True)
    (out,) = c.out_rows(il, B.add(cur, ffn_inp, name=f"l_out-{il}"))
    return out


def write(s) -> None:
    """synth: a short window."""
    sh, e, n = s.shape, s.shape.n_embd, s.shape.n_expert
    ff_exp = s.experts()
    s.w.add_sliding_window(sh.n_swa)
    s.w.add_tensor("token_embd.weight", s.embd())
    for i in range(sh.n_layer):
        p = f"blk.{i}."
        s.attention(p, biases=True)
        s.w.add_tensor(p + "attn_output.bias", s.bias(e))
        s.w.add_tensor(p + "attn_sinks.weight", s.bias(sh.n_head, 1.0))
        s.w.add_tensor(p + "post_attention_norm.weight", s.norm(e))
        s.w.add_tensor(p + "ffn_gate_inp.weight", s.mat(n, e, 1.0, dtype=np.float32))
        s.w.add_tensor(p + "ffn_gate_inp.bias", s.bias(n))
        for name, rows, cols in (("ffn_gate_exps", ff_exp, e), ("ffn_up_exps", ff_exp, e),
                                 ("ffn_down_exps", e, ff_exp)):
            s.w.add_tensor(p + name + ".weight", s.mat(rows, cols, n=n))
            s.w.add_tensor(p + name + ".bias", s.mat(n, rows, 0.1, dtype=np.float32))
    s.w.add_tensor("output_norm.weight", s.norm(e))
    s.w.add_tensor("output.weight", s.mat(s.n_vocab, e))


ARCH = Arch("gpt-oss", "a sink logit per head, every other layer on a sliding window, biased experts "
            "through ADD_ID, the clamped SwiGLU, gate weights soft-maxed over the chosen experts",
            ROPE_NEOX, weights, layer, hparams, swa_pattern=2, synth={"gpt-oss": write})
