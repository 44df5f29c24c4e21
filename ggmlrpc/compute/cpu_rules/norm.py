"""CPU kernels of the row norms (L2_NORM is a variant of the RMS_NORM kernel)."""
from __future__ import annotations

from ...ggml import GGMLOp as Op
from ...ops import norm as rules
from .base import f32_only, simple

RULES = {
    Op.RMS_NORM: simple("RMS_NORM", rules.norm, f32_only, variants=True),
    Op.L2_NORM: simple("RMS_NORM", rules.norm, f32_only, variants=True),
    Op.NORM: simple("NORM", rules.norm, f32_only),
    Op.GROUP_NORM: simple("GROUP_NORM", rules.norm, f32_only),
}
