"""CUDA kernel of FLASH_ATTN_EXT: F32 q, K and V of one type (ops.FA_TYPES), an F16
mask (an F32 one is converted), sinks, ALiBi and softcap."""
from __future__ import annotations

from ...cuda import ops
from ...ggml import GGMLOp as Op
from ...ggml import GGMLType as T
from ...ops import attention as rules
from ...ops.base import contiguous
from ..cuda import Builder
from .base import f32_param, need_types, unsupported


def _types(node, srcs):
    q, k, v = srcs[:3]
    m = srcs[3] if len(srcs) > 3 else None
    sk = srcs[4] if len(srcs) > 4 else None
    need_types(node, srcs, q.type == node.type == T.F32 and k.type == v.type and k.type in ops.FA_TYPES
               and (m is None or m.type in (T.F16, T.F32)) and (sk is None or sk.type == T.F32))


def _batch_nb(t, B):
    nb = tuple(t.nb)
    if t.ne[3] == B:
        return nb
    if t.ne[3] == 1:
        return nb[:3] + (0,)
    return None


def rule_flash_attn_ext(node, srcs, b: Builder):
    q, k, v, m, sk = rules.flash_attn_ext(node, srcs, _types)
    D, Dv, n_q, H, B = q.ne[0], v.ne[0], q.ne[1], q.ne[2], q.ne[3]
    n_kv, H_kv = k.ne[1], k.ne[2]
    if max(D, Dv) > ops.FA_HEAD_SIZES[-1]:
        raise unsupported(node, srcs, f"with head size {max(D, Dv)}")
    if v.ne[2] != H_kv:
        raise unsupported(node, srcs, "with K and V of different head counts")
    k_nb, v_nb = _batch_nb(k, B), _batch_nb(v, B)
    if k_nb is None or v_nb is None:
        raise unsupported(node, srcs, "with K/V broadcast over part of dim 3")
    kw = {}
    if m is not None:
        if m.type == T.F16 and m.nb[0] == 2:
            kw.update(mask=b.ptr(m), mask_nb=tuple(m.nb))
        else:
            kw.update(mask=b.packed(m, T.F16), mask_nb=(2, 2 * m.ne[0], 2 * m.ne[0] * m.ne[1],
                                                          2 * m.ne[0] * m.ne[1] * m.ne[2]))
        kw["mask_ne"] = (m.ne[2], m.ne[3])
    if sk is not None:
        kw["sinks"] = b.ptr(sk) if contiguous(sk) else b.packed(sk)
    if any(n % 4 for n in q.nb[1:]):
        raise unsupported(node, srcs, "with q at unaligned strides")
    b.launch(ops.flash_attn_ext, k.type, b.ptr(node), b.ptr(q), b.ptr(k), b.ptr(v), D, Dv, n_q, H, n_kv, H_kv,
             B=B, q_nb=tuple(q.nb), k_nb=k_nb, v_nb=v_nb, scale=f32_param(node, 0), max_bias=f32_param(node, 1),
             softcap=f32_param(node, 2), **kw)


RULES = {Op.FLASH_ATTN_EXT: rule_flash_attn_ext}
