"""SOFT_MAX (with mask, ALiBi and attention sinks) and the causal masks DIAG_MASK_INF
and DIAG_MASK_ZERO."""
from __future__ import annotations

from ..ggml import GGMLOp as Op
from .base import (
    accept,
    contiguous,
    f32_param,
    invalid,
    need_rows,
    one_source,
    same_shape,
    sources,
)


def soft_max(node, srcs, admit=accept):
    """Sources: x, an optional mask (broadcast over dims 2 and 3), optional sinks
    (one per head); op_params: scale, max_bias (ALiBi, which needs the mask)."""
    s, m, sk = sources(node, srcs, 1, optional=2)
    if not same_shape(s, node):
        raise invalid(node, srcs, "source and result differ in shape")
    admit(node, srcs)
    need_rows(node, srcs, s, node, m, sk)
    if m is not None and (m.ne[0] < s.ne[0] or m.ne[1] < s.ne[1] or s.ne[2] % m.ne[2] or s.ne[3] % m.ne[3]):
        raise invalid(node, srcs, "mask does not cover src0")
    if sk is not None and sk.ne[0] < s.ne[2]:
        raise invalid(node, srcs, "fewer sinks than heads")
    max_bias = f32_param(node, 1)
    if max_bias > 0.0 and m is None:
        raise invalid(node, srcs, "ALiBi without a mask")
    return [s, m, sk]


def diag_mask(node, srcs, admit=accept):
    """op_params[0]: n_past."""
    s = one_source(node, srcs, admit)
    if not contiguous(s) or not contiguous(node):
        raise invalid(node, srcs, "source and result must be contiguous")
    if node.op_params[0] < 0:
        raise invalid(node, srcs, "n_past < 0")
    return [s]


CHECKS = {
    Op.SOFT_MAX: soft_max,
    Op.DIAG_MASK_INF: diag_mask,
    Op.DIAG_MASK_ZERO: diag_mask,
}
