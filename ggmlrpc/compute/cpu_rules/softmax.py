"""CPU kernels of SOFT_MAX and the causal masks (one kernel, the fill value its variant)."""
from __future__ import annotations

from ...ggml import GGMLOp as Op
from ...ggml import GGMLType as T
from ...ops import softmax as rules
from .base import f32_only, need_types, simple


def _soft_max_types(node, srcs):
    s = srcs[0]
    m = srcs[1] if len(srcs) > 1 else None
    sk = srcs[2] if len(srcs) > 2 else None
    need_types(node, srcs, s.type == T.F32 and node.type == T.F32
               and (m is None or m.type in (T.F16, T.F32)) and (sk is None or sk.type == T.F32))


RULES = {
    Op.SOFT_MAX: simple("SOFT_MAX", rules.soft_max, _soft_max_types),
    Op.DIAG_MASK_INF: simple("DIAG_MASK", rules.diag_mask, f32_only, variants=True),
    Op.DIAG_MASK_ZERO: simple("DIAG_MASK", rules.diag_mask, f32_only, variants=True),
}
