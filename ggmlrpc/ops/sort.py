"""ARGSORT (every row sorted) and TOP_K (the first ne0 of each row's order)."""
from __future__ import annotations

from ..ggml import GGMLOp as Op
from ..ggml import SortOrder
from .base import accept, invalid, need_rows, sources

_ORDERS = frozenset(SortOrder)


def argsort(node, srcs, admit=accept):
    """ARGSORT's op_params[0]: the sort order."""
    s, = sources(node, srcs, 1)
    admit(node, srcs)
    top_k = node.op == Op.TOP_K
    if tuple(node.ne[1:]) != tuple(s.ne[1:]) or (not top_k and node.ne[0] != s.ne[0]) \
            or not 1 <= node.ne[0] <= s.ne[0]:
        raise invalid(node, srcs, "result shape")
    if not top_k and node.op_params[0] not in _ORDERS:
        raise invalid(node, srcs, f"sort order {node.op_params[0]}")
    need_rows(node, srcs, s, node)
    return [s]


CHECKS = {
    Op.ARGSORT: argsort,
    Op.TOP_K: argsort,
}
