"""CPU kernel of ARGSORT and TOP_K (one kernel, TOP_K its variant)."""
from __future__ import annotations

from ...ggml import GGMLOp as Op
from ...ops import sort as rules
from .base import f32_to_i32, simple

RULES = {
    Op.ARGSORT: simple("ARGSORT", rules.argsort, f32_to_i32, variants=True),
    Op.TOP_K: simple("ARGSORT", rules.argsort, f32_to_i32, variants=True),
}
