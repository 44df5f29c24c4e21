"""Row norms: NORM, RMS_NORM, L2_NORM, GROUP_NORM."""
from __future__ import annotations

from ..ggml import GGMLOp as Op
from .base import accept, f32_param, invalid, one_source

# ggml's NORM and L2_NORM walk rows through nb[0]; RMS_NORM and GROUP_NORM need them packed
_PACKED_ROWS = (Op.RMS_NORM, Op.GROUP_NORM)


def norm(node, srcs, admit=accept):
    """op_params: eps (GROUP_NORM: n_groups, then eps)."""
    packed = node.op in _PACKED_ROWS
    s = one_source(node, srcs, admit, rows=packed, result_rows=packed)
    eps = f32_param(node, 0 if node.op != Op.GROUP_NORM else 1)
    if not eps >= 0.0:
        raise invalid(node, srcs, f"eps {eps} < 0")
    if node.op == Op.GROUP_NORM and node.op_params[0] <= 0:
        raise invalid(node, srcs, "n_groups <= 0")
    return [s]


CHECKS = {
    Op.NORM: norm,
    Op.RMS_NORM: norm,
    Op.L2_NORM: norm,
    Op.GROUP_NORM: norm,
}
