"""CUDA kernel of ARGSORT and TOP_K (F32 rows -> I32 indices)."""
from __future__ import annotations

from ...cuda import ops
from ...ggml import GGMLOp as Op
from ...ggml import GGMLType as T
from ...ops import sort as rules
from ...ops.base import contiguous, nrows
from ..cuda import Builder
from .base import need_types, unsupported
from .unary import _rows


def _types(node, srcs):
    need_types(node, srcs, srcs[0].type == T.F32 and node.type == T.I32)


def rule_argsort(node, srcs, b: Builder):
    s, = rules.argsort(node, srcs, _types)
    if not contiguous(node):
        raise unsupported(node, srcs, "with a strided result")
    p, ld = _rows(b, s)
    n, rows = s.ne[0], nrows(s)
    need = ops.argsort_scratch_bytes(n, rows)
    scratch = b.alloc(need) if need else None
    top_k = node.ne[0] if node.op == Op.TOP_K else None
    descending = node.op == Op.TOP_K or node.op_params[0] == 1
    b.launch(ops.argsort, b.ptr(node), p, n, rows, ld, descending, top_k, scratch)


RULES = {Op.ARGSORT: rule_argsort, Op.TOP_K: rule_argsort}
