"""CUDA kernels of NORM, RMS_NORM and L2_NORM (F32); GROUP_NORM has none."""
from __future__ import annotations

from ...cuda import ops
from ...ggml import GGMLOp as Op
from ...ops import norm as rules
from ...ops.base import nrows
from ..cuda import Builder
from .base import f32_only, f32_param
from .unary import _rows

_KIND = {Op.NORM: "norm", Op.RMS_NORM: "rms_norm", Op.L2_NORM: "l2_norm"}


def rule_norm(node, srcs, b: Builder):
    s, = rules.norm(node, srcs, f32_only)
    dst, finish = b.out(node)
    p, ld = _rows(b, s) if s.nb[0] == 4 else (b.packed(s), s.ne[0])
    b.launch(ops.norm, _KIND[node.op], dst, p, node.ne[0], nrows(node), ld, f32_param(node, 0))
    finish()


RULES = {op: rule_norm for op in _KIND}
