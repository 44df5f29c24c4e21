"""Training ops: SILU_BACK, GET_ROWS_BACK, SOFT_MAX_BACK, RMS_NORM_BACK,
CROSS_ENTROPY_LOSS (+ _BACK), OPT_STEP_ADAMW, OPT_STEP_SGD."""
from __future__ import annotations

from ..ggml import GGMLOp as Op
from .base import (
    accept,
    contiguous,
    f32_param,
    invalid,
    need_rows,
    nelements,
    same_shape,
    sources,
    ts,
    unknown,
)


def silu_back(node, srcs, admit=accept):
    """The gradient dy and the forward input x, of the result's shape."""
    dy, x = sources(node, srcs, 2)
    admit(node, srcs)
    if not (same_shape(dy, x) and same_shape(x, node)):
        raise invalid(node, srcs, "sources and result differ in shape")
    need_rows(node, srcs, dy, x, node)
    return [dy, x]


def same_shapes(node, srcs, admit=accept, count: int = 2):
    """`count` sources of the result's shape, rows packed."""
    used = sources(node, srcs, count)
    admit(node, srcs)
    if not all(same_shape(t, node) for t in used):
        raise invalid(node, srcs, "sources and result differ in shape")
    need_rows(node, srcs, node, *used)
    return used


def soft_max_back(node, srcs, admit=accept):
    """op_params: scale, max_bias."""
    used = same_shapes(node, srcs, admit)
    if f32_param(node, 1) != 0.0:
        raise unknown(node, srcs, "with ALiBi (max_bias != 0) is not supported by ggml either")
    return used


def get_rows_back(node, srcs, admit=accept):
    """The gradient of GET_ROWS: rows of g added into the result rows ids name."""
    g, idx = sources(node, srcs, 2)
    admit(node, srcs)
    if (g.ne[2] != 1 or g.ne[3] != 1 or g.nb[0] != ts(g) or not contiguous(idx) or not contiguous(node)
            or node.ne[0] != g.ne[0] or node.ne[2] != 1 or node.ne[3] != 1 or g.ne[1] < nelements(idx)):
        raise invalid(node, srcs, "shapes of gradient, ids and result do not agree")
    return [g, idx]


def cross_entropy_loss(node, srcs, admit=accept):
    a, b = sources(node, srcs, 2)
    admit(node, srcs)
    if not same_shape(a, b) or nelements(node) != 1:
        raise invalid(node, srcs, "logits and labels differ in shape or the result is not a scalar")
    need_rows(node, srcs, a, b)
    return [a, b]


def cross_entropy_loss_back(node, srcs, admit=accept):
    g, a, b = sources(node, srcs, 3)
    admit(node, srcs)
    if not (same_shape(a, b) and same_shape(a, node) and nelements(g) >= 1
            and all(contiguous(t) for t in (g, a, b, node))):
        raise invalid(node, srcs, "shapes of gradient, logits, labels and result do not agree")
    return [g, a, b]


def opt_step(node, srcs, admit=accept):
    """Weights, gradient (AdamW: and both moments), then the step's parameters (2 for
    SGD, 7 for AdamW)."""
    sgd = node.op == Op.OPT_STEP_SGD
    used = sources(node, srcs, 3 if sgd else 5)
    w, params = used[0], used[-1]
    admit(node, srcs)
    if not all(same_shape(t, w) for t in used[:-1]) or nelements(params) != (2 if sgd else 7):
        raise invalid(node, srcs, "weights, gradients and moments differ in shape, or wrong parameter count")
    if not contiguous(params):
        raise invalid(node, srcs, "the parameters must be contiguous")
    need_rows(node, srcs, *used[:-1])
    return used


CHECKS = {
    Op.SILU_BACK: silu_back,
    Op.GET_ROWS_BACK: get_rows_back,
    Op.SOFT_MAX_BACK: soft_max_back,
    Op.RMS_NORM_BACK: same_shapes,
    Op.CROSS_ENTROPY_LOSS: cross_entropy_loss,
    Op.CROSS_ENTROPY_LOSS_BACK: cross_entropy_loss_back,
    Op.OPT_STEP_ADAMW: opt_step,
    Op.OPT_STEP_SGD: opt_step,
}
