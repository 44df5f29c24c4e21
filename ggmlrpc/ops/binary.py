"""Element-wise ops of two tensors: ADD, SUB, MUL, DIV (src1 repeated over src0),
ADD1 (a scalar src1), ADD_ID (one row of src1 per selected expert)."""
from __future__ import annotations

from .. import ggml
from ..ggml import GGMLOp as Op
from .base import (
    accept,
    blck,
    can_repeat,
    invalid,
    need_rows,
    nelements,
    same_shape,
    sources,
)


def adds_quantized(node, a) -> bool:
    """ADD / ADD1 onto a quantized src0: ggml dequantizes, adds and quantizes back
    row by row, which asks for other shapes than the float ops."""
    return node.op in (Op.ADD, Op.ADD1) and ggml.is_quantized(a.type)


def binary(node, srcs, admit=accept):
    a, b = sources(node, srcs, 2)
    if node.op == Op.ADD1 and nelements(b) != 1:
        raise invalid(node, srcs, "src1 is not a scalar")
    if adds_quantized(node, a):
        return _add_quantized(node, srcs, admit)
    if not same_shape(a, node):
        raise invalid(node, srcs, "src0 and the result differ in shape")
    if not can_repeat(b, a):
        raise invalid(node, srcs, "src1 does not repeat to src0's shape")
    admit(node, srcs)
    need_rows(node, srcs, a, node)
    return [a, b]


def _add_quantized(node, srcs, admit):
    """Same shapes (ADD1: a scalar src1) and rows of whole blocks."""
    a, b = srcs
    admit(node, srcs)
    if not same_shape(a, node) or (node.op != Op.ADD1 and not same_shape(a, b)) or a.ne[0] % blck(a):
        raise invalid(node, srcs, "sources and result differ in shape, or rows are not whole blocks")
    need_rows(node, srcs, a, b, node)
    return [a, b]


def add_id(node, srcs, admit=accept):
    """src0 (n, n_used, tokens) plus the src1 row (n) that ids (n_used, tokens) selects."""
    a, b, sel = sources(node, srcs, 3)
    admit(node, srcs)
    if (not same_shape(a, node) or b.ne[0] != a.ne[0] or sel.ne[0] != a.ne[1]
            or sel.ne[1] != a.ne[2] or a.ne[3] != 1):
        raise invalid(node, srcs, "shapes do not agree")
    need_rows(node, srcs, a, b, node)
    return [a, b, sel]


CHECKS = {
    Op.ADD: binary,
    Op.SUB: binary,
    Op.MUL: binary,
    Op.DIV: binary,
    Op.ADD1: binary,
    Op.ADD_ID: add_id,
}
