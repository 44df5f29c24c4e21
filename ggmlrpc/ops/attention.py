"""FLASH_ATTN_EXT: softmax(q k^T * scale + mask) v per head, k/v heads shared by
groups of q heads (GQA), optional mask and sinks."""
from __future__ import annotations

from ..ggml import GGMLOp as Op
from ..ggml import Prec
from .base import accept, contiguous, invalid, need_rows, sources, ts

_PRECISIONS = frozenset(Prec)


def flash_attn_ext(node, srcs, admit=accept):
    """q (DK, queries, heads, ne3), k (DK, keys, kv heads, ne3'), v (DV, keys, ...),
    mask (keys, queries, ...) -> a contiguous (DV, heads, queries, ne3).
    op_params[3]: the precision."""
    q, k, v, m, sk = sources(node, srcs, 3, optional=2)
    if node.op_params[3] not in _PRECISIONS:
        raise invalid(node, srcs, f"precision {node.op_params[3]}")
    admit(node, srcs)
    DK, DV = k.ne[0], v.ne[0]
    if q.ne[0] != DK or v.ne[1] != k.ne[1]:
        raise invalid(node, srcs, "q, k and v do not agree")
    if q.ne[2] % k.ne[2] or q.ne[3] % k.ne[3] or q.ne[2] % v.ne[2] or q.ne[3] % v.ne[3]:
        raise invalid(node, srcs, "k/v heads do not divide q heads")
    if tuple(node.ne) != (DV, q.ne[2], q.ne[1], q.ne[3]) or not contiguous(node):
        raise invalid(node, srcs, "result is not a contiguous (DV, heads, queries, ne3) tensor")
    need_rows(node, srcs, q, k, v, m, sk)
    if q.nb[0] != ts(q) or k.nb[0] != ts(k) or v.nb[0] != ts(v):
        raise invalid(node, srcs, "rows of q, k or v are not contiguous")
    if m is not None and (m.ne[0] < k.ne[1] or m.ne[1] < q.ne[1] or q.ne[2] % m.ne[2]
                          or q.ne[3] % m.ne[3]):
        raise invalid(node, srcs, "mask does not cover the scores")
    if sk is not None and sk.ne[0] < q.ne[2]:
        raise invalid(node, srcs, "fewer sinks than heads")
    return [q, k, v, m, sk]


CHECKS = {
    Op.FLASH_ATTN_EXT: flash_attn_ext,
}
