"""CUDA kernels of ADD, SUB, MUL, DIV, ADD1 (src1 broadcast over src0) and ADD_ID (its
expert ids checked first, as MUL_MAT_ID's); F32 only."""
from __future__ import annotations

from ...cuda import ops
from ...ggml import GGMLOp as Op
from ...ggml import GGMLType as T
from ...ops import binary as rules
from ..cuda import Builder
from .base import f32_only, need_types, unsupported

_NAME = {Op.ADD: "add", Op.ADD1: "add", Op.SUB: "sub", Op.MUL: "mul", Op.DIV: "div"}


def rule_binary(node, srcs, b: Builder):
    a, y = rules.binary(node, srcs, f32_only)
    dst, finish = b.out(node)
    # the kernel walks a and y at their own strides but reads elements of y densely within a row
    yp = b.ptr(y) if y.nb[0] == 4 else b.packed(y)
    ynb = tuple(y.nb) if y.nb[0] == 4 else (4, 4 * y.ne[0], 4 * y.ne[0] * y.ne[1], 4 * y.ne[0] * y.ne[1] * y.ne[2])
    b.launch(ops.binary, _NAME[node.op], dst, b.ptr(a), tuple(a.ne), tuple(a.nb), yp, tuple(y.ne), ynb)
    finish()


def _add_id_types(node, srcs):
    a, y, sel = srcs
    need_types(node, srcs, a.type == y.type == node.type == T.F32 and sel.type == T.I32)


def rule_add_id(node, srcs, b: Builder):
    a, y, sel = rules.add_id(node, srcs, _add_id_types)
    n_used, n_tokens = a.ne[1], a.ne[2]
    if sel.nb[0] != 4 or sel.nb[1] % 4:
        raise unsupported(node, srcs, "with strided expert ids")
    ids = b.alloc(4 * n_used * n_tokens)
    b.launch(ops.sanitize_ids, ids, b.ptr(sel), n_used, n_tokens, sel.nb[1] // 4, y.ne[1], **b.error_flag())
    dst, finish = b.out(node)
    b.launch(ops.add_id, dst, b.packed(a), b.packed(y, ne=(y.ne[0], y.ne[1], 1, 1)), ids, a.ne[0], n_used, n_tokens)
    finish()


RULES = {**dict.fromkeys(_NAME, rule_binary), Op.ADD_ID: rule_add_id}
