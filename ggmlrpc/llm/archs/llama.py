"""llama (and mistral-style): RMS norms, rope on consecutive pairs, a SwiGLU
feed-forward, or routed experts where the file has them. The layer serves the
qwen family too (biases and per-head q/k norms are taken where a file has them)."""
from __future__ import annotations

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


ARCH = Arch("llama", "mistral-style too; routed experts where the file has them", ROPE_NORM, weights, layer)
