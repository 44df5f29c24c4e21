"""CPU kernel of ROPE and ROPE_BACK (one kernel, the direction its variant)."""
from __future__ import annotations

from ...ggml import GGMLOp as Op
from ...ggml import GGMLType as T
from ...ops import rope as rules
from .base import need_types, simple


def _types(node, srcs):
    s, pos = srcs[0], srcs[1]
    ff = srcs[2] if len(srcs) > 2 else None
    need_types(node, srcs, s.type in (T.F32, T.F16) and node.type == s.type and pos.type == T.I32
               and (ff is None or ff.type == T.F32))


RULES = {
    Op.ROPE: simple("ROPE", rules.rope, _types, variants=True),
    Op.ROPE_BACK: simple("ROPE", rules.rope, _types, variants=True),
}
