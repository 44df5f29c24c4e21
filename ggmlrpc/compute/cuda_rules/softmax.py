"""CUDA kernel of SOFT_MAX (F32, with an F32 or F16 mask, ALiBi and sinks)."""
from __future__ import annotations

from ...cuda import ops
from ...ggml import GGMLOp as Op
from ...ggml import GGMLType as T
from ...ops import softmax as rules
from ...ops.base import contiguous
from ..cuda import Builder
from .base import f32_param, need_types
from .unary import _rows


def _types(node, srcs):
    s = srcs[0]
    m = srcs[1] if len(srcs) > 1 else None
    sk = srcs[2] if len(srcs) > 2 else None
    need_types(node, srcs, s.type == node.type == T.F32 and (m is None or m.type in (T.F32, T.F16))
               and (sk is None or sk.type == T.F32))


def rule_soft_max(node, srcs, b: Builder):
    s, m, sk = rules.soft_max(node, srcs, _types)
    dst, finish = b.out(node)
    p, ld = _rows(b, s)
    kw = {}
    if m is not None:
        # the kernel reads mask rows of exactly ncols at a dense stride
        kw.update(mask=b.packed(m, ne=(s.ne[0],) + tuple(m.ne[1:])), mask_ne=tuple(m.ne[1:]),
                  mask_f16=m.type == T.F16)
    if sk is not None:
        kw["sinks"] = b.ptr(sk) if contiguous(sk) else b.packed(sk)
    b.launch(ops.soft_max, dst, p, s.ne[0], s.ne[1], s.ne[2], s.ne[3], ld, scale=f32_param(node, 0),
             max_bias=f32_param(node, 1), **kw)
    finish()


RULES = {Op.SOFT_MAX: rule_soft_max}
