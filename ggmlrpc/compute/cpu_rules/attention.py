"""CPU kernel of FLASH_ATTN_EXT: k converted to its vec_dot type like ggml, and
ggml's three orders of work (the path in iparams[1])."""
from __future__ import annotations

from ... import ggml
from ...ggml import GGMLOp as Op
from ...ggml import GGMLType as T
from ...ops import attention as rules
from ...ops.base import blck, invalid
from .base import Spec, need_types
from .kernels import executor, ids, path


def _key_dot_type(k) -> int:
    return k.type if k.type in (T.F32, T.F16) else executor().vec_dot_type(k.type)


def _types(node, srcs):
    q, k, v = srcs[:3]
    m = srcs[3] if len(srcs) > 3 else None
    sk = srcs[4] if len(srcs) > 4 else None
    ex = executor()
    vdt = _key_dot_type(k)
    ok = (q.type == T.F32 and node.type == T.F32 and vdt >= 0
          and (k.type in (T.F32, T.F16) or (ex.has_vec_dot(k.type) and ex.has_from_float(vdt)))
          and (v.type in (T.F32, T.F16) or ex.has_to_float(v.type))
          and (m is None or m.type == T.F16) and (sk is None or sk.type == T.F32))
    need_types(node, srcs, ok)


def rule_flash_attn(node, srcs):
    q, k, v, m, sk = rules.flash_attn_ext(node, srcs, _types)
    vdt = _key_dot_type(k)
    if k.ne[0] % ggml.blck_size(vdt) or v.ne[0] % blck(v):
        raise invalid(node, srcs, "head size is not whole blocks")
    # ggml's three paths: per query row, 64x64 tiles from 64 queries on, and for
    # one query over 512 keys or more, keys split between threads
    order = path("FLASH_ATTN", "ROWS")
    if k.type == v.type and k.type in (T.F32, T.F16):
        if q.ne[1] == 1 and q.ne[3] == 1 and k.ne[1] >= 512:
            order = path("FLASH_ATTN", "SPLIT")
        elif q.ne[1] >= 64:
            order = path("FLASH_ATTN", "TILED")
    return Spec(ids.K.FLASH_ATTN, iparams=(vdt, order), srcs=[q, k, v, m, sk])


RULES = {
    Op.FLASH_ATTN_EXT: rule_flash_attn,
}
