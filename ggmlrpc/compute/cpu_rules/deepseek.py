"""CPU kernels of DeepSeek V4's ops."""
from __future__ import annotations

from ... import ggml
from ...ggml import GGMLOp as Op
from ...ggml import GGMLType as T
from ...ops import deepseek as rules
from .base import f32_only, need_quant, need_types, simple


def _indexer_types(node, srcs):
    q, k, w, m = srcs
    need_types(node, srcs, q.type == w.type == node.type == T.F32 and m.type == T.F16
               and (k.type in (T.F32, T.F16, T.BF16) or ggml.is_quantized(k.type)))
    need_quant(node, srcs, k, to_float=True)


RULES = {
    Op.LIGHTNING_INDEXER: simple("LIGHTNING_INDEXER", rules.lightning_indexer, _indexer_types),
    Op.DSV4_HC_COMB: simple("DSV4_HC_COMB", rules.hc_comb, f32_only),
    Op.DSV4_HC_PRE: simple("DSV4_HC_PRE", rules.hc_pre, f32_only),
    Op.DSV4_HC_POST: simple("DSV4_HC_POST", rules.hc_post, f32_only),
}
