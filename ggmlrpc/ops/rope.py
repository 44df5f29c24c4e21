"""Rotary position embeddings: ROPE and ROPE_BACK (a rotation by -theta).

op_params: [1] n_dims, [2] mode, [5..10] floats, [11..14] sections of the
multi-section modes, [15] n_offs (the first rotated dimension)."""
from __future__ import annotations

from ..ggml import GGMLOp as Op
from ..ggml import RopeMode
from .base import accept, contiguous, invalid, need_rows, same_shape, sources, unknown

_MODES = frozenset(RopeMode)


def rope(node, srcs, admit=accept):
    """Sources: x, positions (I32, 4 per token in the multi-section modes), optional
    frequency factors (one per rotated pair)."""
    s, pos, ff = sources(node, srcs, 2, optional=1)
    admit(node, srcs)
    if not same_shape(s, node):
        raise invalid(node, srcs, "source and result differ in shape")
    need_rows(node, srcs, s, node)
    p = node.op_params
    n_dims, mode, n_offs = p[1], p[2], p[15]
    ne0 = node.ne[0]
    if mode not in _MODES:
        raise unknown(node, srcs, f"has rope mode {mode}")
    if not (0 < n_dims <= ne0 and n_dims % 2 == 0):
        raise invalid(node, srcs, f"n_dims {n_dims} for ne0 {ne0}")
    if n_offs < 0 or n_offs % 2 or n_offs + n_dims > ne0:
        raise invalid(node, srcs, f"n_offs {n_offs}")
    multi = bool(mode & RopeMode.MROPE)
    if not contiguous(pos) or pos.ne[0] < node.ne[2] * (4 if multi else 1):
        raise invalid(node, srcs, "positions do not cover the tokens")
    if multi:
        sections = p[11:15]
        if any(x < 0 for x in sections) or not 0 < sum(sections) <= ne0:
            raise invalid(node, srcs, f"rope sections {sections}")
    vision = mode == RopeMode.VISION
    if vision and (n_dims * 2 != ne0 or n_offs):
        raise invalid(node, srcs, "vision rope needs n_dims == ne0/2")
    # one factor per rotated pair (vision mode rotates ne0 / 2 pairs)
    if ff is not None and (not contiguous(ff) or ff.ne[0] < (ne0 if vision else n_dims) // 2):
        raise invalid(node, srcs, "too few frequency factors")
    return [s, pos, ff]


CHECKS = {
    Op.ROPE: rope,
    Op.ROPE_BACK: rope,
}
