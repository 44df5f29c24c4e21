"""llama (and mistral-style): RMS norms, rope on consecutive pairs, a SwiGLU
feed-forward, or routed experts where the file has them (untested: llama.cpp
renormalizes a llama's chosen expert weights, which this layer does only when
asked). The layer serves the qwen family too (biases and per-head q/k norms are
taken where a file has them)."""
from __future__ import annotations

from functools import partial

import numpy as np

from ... import builder as B
from ..blocks import ATTENTION, EXPERTS, FEED_FORWARD
from . import ROPE_NORM, Arch


def weights(hp) -> tuple[str, ...]:
    return (*ATTENTION, "ffn_norm", *(EXPERTS if hp.n_expert else FEED_FORWARD))


def layer(c, il: int, x, norm_w: bool = False):
    """Attention and feed-forward (`norm_w`: the chosen experts' weights renormalized),
    each added to the residual stream."""
    cur = c.norm(x, "attn_norm", il)
    cur = c.attention(il, *c.qkv(il, cur))
    cur, x = c.out_rows(il, cur, x)
    ffn_inp = B.add(cur, x, name=f"ffn_inp-{il}")
    cur = c.norm(ffn_inp, "ffn_norm", il)
    cur = c.moe(il, cur, norm_w=norm_w) if c.hp.n_expert else c.ffn(il, cur)
    return B.add(cur, ffn_inp, name=f"l_out-{il}")


def write(s, tied: bool = False) -> None:
    """synth: `tied` leaves out output.weight, so the output layer reuses the token
    embeddings (llama.cpp duplicates them onto the output device)."""
    sh, e = s.shape, s.shape.n_embd
    s.w.add_tensor("token_embd.weight", s.embd(tied))
    for i in range(sh.n_layer):
        p = f"blk.{i}."
        s.attention(p)
        s.w.add_tensor(p + "ffn_norm.weight", s.norm(e))
        s.ffn(p, sh.n_ff)
    s.w.add_tensor("output_norm.weight", np.ones(e, np.float32))
    if not tied:
        s.w.add_tensor("output.weight", s.mat(s.n_vocab, e))


ARCH = Arch("llama", "RMS norms, rope on consecutive pairs, SwiGLU feed-forward (mistral-style models too)", ROPE_NORM, weights, layer,
            synth={"llama": write, "llama-tied": partial(write, tied=True)})
