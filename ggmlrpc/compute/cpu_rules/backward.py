"""CPU kernels of the training ops: SILU_BACK is a variant of the GLU kernel, the
loss and its gradient share one kernel, and so do the two optimizer steps."""
from __future__ import annotations

from ...ggml import GGMLOp as Op
from ...ggml import GGMLType as T
from ...ops import backward as rules
from .base import Spec, f32_only, need_types, simple
from .kernels import ids, variant


def _silu_back_types(node, srcs):
    dy, x = srcs
    need_types(node, srcs, dy.type == x.type == node.type and x.type in (T.F32, T.F16))


def rule_silu_back(node, srcs):
    used = rules.silu_back(node, srcs, _silu_back_types)
    return Spec(ids.K.GLU, variant("GLU", "SILU_BACK"), srcs=used)


def _get_rows_back_types(node, srcs):
    g, idx = srcs
    need_types(node, srcs, g.type in (T.F32, T.F16) and idx.type == T.I32 and node.type == T.F32)


def _all_f32(node, srcs):
    """Every source F32 (the result's type is the op's own)."""
    need_types(node, srcs, all(t.type == T.F32 for t in srcs))


RULES = {
    Op.SILU_BACK: rule_silu_back,
    Op.GET_ROWS_BACK: simple("GET_ROWS_BACK", rules.get_rows_back, _get_rows_back_types),
    Op.SOFT_MAX_BACK: simple("SOFT_MAX_BACK", rules.soft_max_back, f32_only),
    Op.RMS_NORM_BACK: simple("RMS_NORM_BACK", rules.same_shapes, f32_only),
    Op.CROSS_ENTROPY_LOSS: simple("CROSS_ENTROPY", rules.cross_entropy_loss, f32_only, variants=True),
    Op.CROSS_ENTROPY_LOSS_BACK: simple("CROSS_ENTROPY", rules.cross_entropy_loss_back, f32_only,
                                       variants=True),
    Op.OPT_STEP_ADAMW: simple("OPT_STEP", rules.opt_step, _all_f32, variants=True),
    Op.OPT_STEP_SGD: simple("OPT_STEP", rules.opt_step, _all_f32, variants=True),
}
