"""CPU kernels of the element-wise ops of one tensor: UNARY (its sub is the
ggml_unary_op), the ops ggml keeps apart from it (SQR...CLAMP), GLU, SCALE, FILL."""
from __future__ import annotations

from ... import ggml
from ...ggml import GGMLGluOp as Glu
from ...ggml import GGMLOp as Op
from ...ggml import GGMLType as T
from ...ops import unary as rules
from .base import FLOAT_TYPES, Spec, need_types, same_type_in, simple, unsupported
from .kernels import ids

_ANY_FLOAT = same_type_in(FLOAT_TYPES)
_F32_F16 = same_type_in((T.F32, T.F16))
_F32_BF16 = same_type_in((T.F32, T.BF16))


def rule_unary(node, srcs):
    return Spec(ids.K.UNARY, node.op_params[0], srcs=rules.unary(node, srcs, _ANY_FLOAT))


def rule_simple_unary(node, srcs):
    sub = getattr(ids.UN, ggml.op_name(node.op))
    return Spec(ids.K.UNARY, sub, srcs=rules.elementwise(node, srcs, _F32_F16))


def _glu_types(node, srcs):
    a = srcs[0]
    b = srcs[1] if len(srcs) > 1 else None
    need_types(node, srcs, a.type == node.type and a.type in FLOAT_TYPES
               and (b is None or b.type == a.type))
    g = node.op_params[0]
    if (g == Glu.SWIGLU_OAI and a.type != T.F32) or (g == Glu.SWIGLU_CLAMP and a.type == T.BF16):
        raise unsupported(node, srcs)      # ggml: SWIGLU_OAI on F32 only, SWIGLU_CLAMP on F32/F16


def rule_glu(node, srcs):
    return Spec(ids.K.GLU, node.op_params[0], srcs=rules.glu(node, srcs, _glu_types))


RULES = {
    Op.UNARY: rule_unary,
    Op.SQR: rule_simple_unary,
    Op.SQRT: rule_simple_unary,
    Op.LOG: rule_simple_unary,
    Op.SIN: rule_simple_unary,
    Op.COS: rule_simple_unary,
    Op.LEAKY_RELU: rule_simple_unary,
    Op.CLAMP: rule_simple_unary,
    Op.GLU: rule_glu,
    Op.SCALE: simple("SCALE", rules.elementwise, _F32_BF16),
    Op.FILL: simple("FILL", rules.fill, _F32_F16),
}
