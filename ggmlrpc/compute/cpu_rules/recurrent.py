"""CPU kernels of the recurrences (GATED_LINEAR_ATTN is a variant of RWKV_WKV6), all
on F32."""
from __future__ import annotations

from ...ggml import GGMLOp as Op
from ...ggml import GGMLType as T
from ...ops import recurrent as rules
from .base import f32_only, need_types, simple


def _ssm_scan_types(node, srcs):
    need_types(node, srcs, all(t.type == T.F32 for t in srcs[:6]) and node.type == T.F32
               and srcs[6].type == T.I32)


RULES = {
    Op.SSM_CONV: simple("SSM_CONV", rules.ssm_conv, f32_only),
    Op.SSM_SCAN: simple("SSM_SCAN", rules.ssm_scan, _ssm_scan_types),
    Op.RWKV_WKV6: simple("RWKV_WKV6", rules.recurrence, f32_only, variants=True),
    Op.GATED_LINEAR_ATTN: simple("RWKV_WKV6", rules.recurrence, f32_only, variants=True),
    Op.RWKV_WKV7: simple("RWKV_WKV7", rules.recurrence, f32_only),
    Op.SOLVE_TRI: simple("SOLVE_TRI", rules.solve_tri, f32_only),
    Op.GATED_DELTA_NET: simple("GATED_DELTA_NET", rules.gated_delta_net, f32_only),
}
