"""CPU kernels of ADD, SUB, MUL, DIV, ADD1 (one kernel, sub = the binary op; ADD_Q
for a quantized src0) and ADD_ID."""
from __future__ import annotations

from ...ggml import GGMLOp as Op
from ...ggml import GGMLType as T
from ...ops import binary as rules
from .base import Spec, need_quant, need_types, simple, unsupported
from .kernels import ids, variant

# (src0, src1, result) types of ggml's CPU binary ops
_COMBOS = {(T.F32, T.F32, T.F32), (T.F16, T.F16, T.F16), (T.BF16, T.BF16, T.BF16),
           (T.BF16, T.F32, T.BF16), (T.BF16, T.F32, T.F32), (T.F16, T.F32, T.F16),
           (T.F16, T.F32, T.F32)}

_BINOP_NAME = {Op.ADD: "ADD", Op.ADD1: "ADD", Op.SUB: "SUB", Op.MUL: "MUL", Op.DIV: "DIV"}


def _types(node, srcs):
    a, b = srcs
    if not rules.adds_quantized(node, a):
        need_types(node, srcs, (a.type, b.type, node.type) in _COMBOS)
        return
    add1 = node.op == Op.ADD1
    need_types(node, srcs, b.type == T.F32 and (node.type == a.type or (not add1 and node.type == T.F32)))
    need_quant(node, srcs, a, to_float=True, from_float=node.type != T.F32)


def rule_binary(node, srcs):
    a, b = rules.binary(node, srcs, _types)
    if not rules.adds_quantized(node, a):
        return Spec(ids.K.BINARY, getattr(ids.BINOP, _BINOP_NAME[node.op]), srcs=[a, b])
    if node.op == Op.ADD1 and node.ne[3] != 1:   # ggml's ADD1 on quantized data misplaces rows of dim 3
        raise unsupported(node, srcs, "with a quantized 4-D result")
    return Spec(ids.K.ADD_Q, variant("ADD_Q", "ADD1" if node.op == Op.ADD1 else "ADD"), srcs=[a, b])


def _add_id_types(node, srcs):
    a, b, sel = srcs
    need_types(node, srcs, a.type == b.type == node.type == T.F32 and sel.type == T.I32)


RULES = {
    Op.ADD: rule_binary,
    Op.SUB: rule_binary,
    Op.MUL: rule_binary,
    Op.DIV: rule_binary,
    Op.ADD1: rule_binary,
    Op.ADD_ID: simple("ADD_ID", rules.add_id, _add_id_types),
}
