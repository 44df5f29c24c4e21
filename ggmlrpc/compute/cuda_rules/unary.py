"""CUDA kernels of UNARY, GLU, SQR...CLAMP, LEAKY_RELU and SCALE; F32 only."""
from __future__ import annotations

from ...cuda import ops
from ...ggml import GGMLOp as Op
from ...ops import unary as rules
from ...ops.base import nelements, nrows
from ..cuda import Builder, row_stride
from .base import f32_only, f32_param


def rule_unary(node, srcs, b: Builder):
    s, = rules.unary(node, srcs, f32_only)
    dst, finish = b.out(node)
    params = tuple(f32_param(node, i) for i in range(1, 5))     # XIELU's alpha_n, alpha_p, beta, eps
    b.launch(ops.unary, node.op_params[0], dst, b.packed(s), nelements(node), params)
    finish()


def rule_math(node, srcs, b: Builder):
    s, = rules.elementwise(node, srcs, f32_only)
    dst, finish = b.out(node)
    n = nelements(node)
    if node.op == Op.SCALE:
        b.launch(ops.scale, dst, b.packed(s), n, f32_param(node, 0), f32_param(node, 1))
    else:
        p1 = f32_param(node, 1) if node.op == Op.CLAMP else 0.0
        b.launch(ops.math_op, int(node.op), dst, b.packed(s), n, f32_param(node, 0), p1)
    finish()


def _rows(b, t):
    """(address, element stride of rows) of t, packed when its rows lie unevenly."""
    ld = row_stride(t)
    if ld is None:
        return b.packed(t), t.ne[0]
    return b.ptr(t), ld


def rule_glu(node, srcs, b: Builder):
    used = rules.glu(node, srcs, f32_only)
    dst, finish = b.out(node)
    nc = node.ne[0]
    alpha, limit = f32_param(node, 2), f32_param(node, 3)
    if len(used) == 2:
        (pa, lda), (pb, ldb) = _rows(b, used[0]), _rows(b, used[1])
    else:
        p, ld = _rows(b, used[0])
        swapped = node.op_params[1] != 0
        pa, pb = (p + 4 * nc, p) if swapped else (p, p + 4 * nc)
        lda = ldb = ld
    b.launch(ops.glu, node.op_params[0], dst, pa, pb, nc, nrows(node), lda, ldb, alpha, limit)
    finish()


RULES = {
    Op.UNARY: rule_unary,
    Op.GLU: rule_glu,
    Op.SCALE: rule_math,
    **{getattr(Op, name): rule_math for name in ops.MATH_OPS},
}
