"""CUDA kernels of SUM_ROWS and MEAN (F32)."""
from __future__ import annotations

from ...cuda import ops
from ...ggml import GGMLOp as Op
from ...ops import reduce as rules
from ...ops.base import nrows
from ..cuda import Builder
from .base import f32_only
from .unary import _rows


def rule_sum_rows(node, srcs, b: Builder):
    s, = rules.sum_rows(node, srcs, f32_only)
    dst, finish = b.out(node)
    p, ld = _rows(b, s) if s.nb[0] == 4 else (b.packed(s), s.ne[0])
    b.launch(ops.row_sum, dst, p, s.ne[0], nrows(s), ld, node.op == Op.MEAN)
    finish()


RULES = {Op.SUM_ROWS: rule_sum_rows, Op.MEAN: rule_sum_rows}
