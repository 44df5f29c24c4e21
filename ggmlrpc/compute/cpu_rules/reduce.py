"""CPU kernels of the reductions (MEAN is a variant of SUM_ROWS)."""
from __future__ import annotations

from ...ggml import GGMLOp as Op
from ...ggml import GGMLType as T
from ...ops import reduce as rules
from .base import FLOAT_TYPES, f32_only, f32_to_i32, need_types, same_type_in, simple


def _count_equal_types(node, srcs):
    a, b = srcs
    need_types(node, srcs, a.type == b.type == T.I32 and node.type == T.I64)


RULES = {
    Op.SUM: simple("SUM", rules.sum_all, same_type_in(FLOAT_TYPES)),
    Op.SUM_ROWS: simple("SUM_ROWS", rules.sum_rows, f32_only, variants=True),
    Op.MEAN: simple("SUM_ROWS", rules.sum_rows, f32_only, variants=True),
    Op.CUMSUM: simple("CUMSUM", rules.cumsum, f32_only),
    Op.ARGMAX: simple("ARGMAX", rules.argmax, f32_to_i32),
    Op.COUNT_EQUAL: simple("COUNT_EQUAL", rules.count_equal, _count_equal_types),
}
