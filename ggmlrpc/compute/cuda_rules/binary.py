"""CUDA kernels of ADD, SUB, MUL, DIV, ADD1 (src1 broadcast over src0); F32 only."""
from __future__ import annotations

from ...cuda import ops
from ...ggml import GGMLOp as Op
from ...ops import binary as rules
from ..cuda import Builder
from .base import f32_only

_NAME = {Op.ADD: "add", Op.ADD1: "add", Op.SUB: "sub", Op.MUL: "mul", Op.DIV: "div"}


def rule_binary(node, srcs, b: Builder):
    a, y = rules.binary(node, srcs, f32_only)
    dst, finish = b.out(node)
    # the kernel walks a and y at their own strides but reads elements of y densely within a row
    yp = b.ptr(y) if y.nb[0] == 4 else b.packed(y)
    ynb = tuple(y.nb) if y.nb[0] == 4 else (4, 4 * y.ne[0], 4 * y.ne[0] * y.ne[1], 4 * y.ne[0] * y.ne[1] * y.ne[2])
    b.launch(ops.binary, _NAME[node.op], dst, b.ptr(a), tuple(a.ne), tuple(a.nb), yp, tuple(y.ne), ynb)
    finish()


# ADD_ID has no rule: its kernel reads the expert row without checking the id
RULES = dict.fromkeys(_NAME, rule_binary)
