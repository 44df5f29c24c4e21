"""CPU kernels of Segment Anything's window and relative-position ops (WIN_UNPART is
a variant of WIN_PART)."""
from __future__ import annotations

from ...ggml import GGMLOp as Op
from ...ggml import GGMLType as T
from ...ops import vision as rules
from .base import f32_only, need_types, simple


def _get_rel_pos_types(node, srcs):
    need_types(node, srcs, srcs[0].type in (T.F16, T.BF16) and node.type == T.F16)


RULES = {
    Op.WIN_PART: simple("WIN_PART", rules.win_part, f32_only, variants=True),
    Op.WIN_UNPART: simple("WIN_PART", rules.win_part, f32_only, variants=True),
    Op.GET_REL_POS: simple("GET_REL_POS", rules.get_rel_pos, _get_rel_pos_types),
    Op.ADD_REL_POS: simple("ADD_REL_POS", rules.add_rel_pos, f32_only),
}
