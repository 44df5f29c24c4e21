"""Element-wise ops of one tensor: UNARY, GLU, SQR...CLAMP, SCALE, FILL."""
from __future__ import annotations

from .. import ggml
from ..ggml import GGMLOp as Op
from .base import accept, invalid, need_rows, same_shape, sources


def elementwise(node, srcs, admit=accept):
    """One source of the result's shape; rows packed in both."""
    s, = sources(node, srcs, 1)
    if not same_shape(s, node):
        raise invalid(node, srcs, "source and result differ in shape")
    admit(node, srcs)
    need_rows(node, srcs, s, node)
    return [s]


def unary(node, srcs, admit=accept):
    """op_params[0]: the ggml_unary_op."""
    u = node.op_params[0]
    if not 0 <= u < ggml.UNARY_OP_COUNT:
        raise invalid(node, srcs, f"unknown unary op {u}")
    return elementwise(node, srcs, admit)


def glu(node, srcs, admit=accept):
    """op_params[0]: the ggml_glu_op. With one source its rows hold both halves (the
    result is half as wide; an odd last element is unused), else src1 is the gate."""
    a, b = sources(node, srcs, 1, optional=1)
    g = node.op_params[0]
    if not 0 <= g < ggml.GLU_OP_COUNT:
        raise invalid(node, srcs, f"unknown glu op {g}")
    admit(node, srcs)
    if b is not None:
        if not (same_shape(a, b) and same_shape(a, node)):
            raise invalid(node, srcs, "sources and result differ in shape")
    elif node.ne[0] != a.ne[0] // 2 or tuple(a.ne[1:]) != tuple(node.ne[1:]):
        raise invalid(node, srcs, "the result is not half of src0")
    need_rows(node, srcs, a, b, node)
    return [a] + ([b] if b is not None else [])


def fill(node, srcs, admit=accept):
    """The result of src0's shape filled with one value (src0 is not read)."""
    s, = sources(node, srcs, 1)
    admit(node, srcs)
    if not same_shape(s, node):
        raise invalid(node, srcs, "source and result differ in shape")
    need_rows(node, srcs, node)
    return [s]


CHECKS = {
    Op.UNARY: unary,
    Op.GLU: glu,
    Op.SQR: elementwise,
    Op.SQRT: elementwise,
    Op.LOG: elementwise,
    Op.SIN: elementwise,
    Op.COS: elementwise,
    Op.LEAKY_RELU: elementwise,
    Op.CLAMP: elementwise,
    Op.SCALE: elementwise,
    Op.FILL: fill,
}
