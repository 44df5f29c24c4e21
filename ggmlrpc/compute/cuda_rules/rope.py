"""CUDA kernel of ROPE (F32; normal, NEOX, multi-section and interleaved modes)."""
from __future__ import annotations

from ...cuda import ops
from ...ggml import GGMLOp as Op
from ...ggml import GGMLType as T
from ...ops import rope as rules
from ...ops.base import contiguous
from ..cuda import Builder
from .base import f32_param, need_types, unsupported


def _types(node, srcs):
    s, pos = srcs[0], srcs[1]
    ff = srcs[2] if len(srcs) > 2 else None
    need_types(node, srcs, s.type == node.type == T.F32 and pos.type == T.I32
               and (ff is None or ff.type == T.F32))


def rule_rope(node, srcs, b: Builder):
    s, pos, ff = rules.rope(node, srcs, _types)
    p = node.op_params
    mode = p[2]
    if mode not in ops.ROPE_MODES:
        raise unsupported(node, srcs, f"with rope mode {mode}")
    if p[15]:
        raise unsupported(node, srcs, "with rotated dimensions that do not start at 0 (n_offs)")
    dst, finish = b.out(node)
    kw = {"freq_base": f32_param(node, 5), "freq_scale": f32_param(node, 6), "ext_factor": f32_param(node, 7),
          "attn_factor": f32_param(node, 8), "n_ctx_orig": p[4], "beta_fast": f32_param(node, 9),
          "beta_slow": f32_param(node, 10), "sections": tuple(p[11:15])}
    if ff is not None:
        kw["freq_factors"] = b.ptr(ff)
    if not contiguous(pos):
        raise unsupported(node, srcs, "with strided positions")
    ne, nb = tuple(node.ne), tuple(s.nb)
    for i3 in range(node.ne[3]):      # the kernel covers three dims; positions index dim 2
        b.launch(ops.rope, dst + i3 * ne[0] * ne[1] * ne[2] * 4, b.ptr(s, i3 * nb[3]), b.ptr(pos), ne, nb,
                 p[1], mode, **kw)
    finish()


RULES = {Op.ROPE: rule_rope}
