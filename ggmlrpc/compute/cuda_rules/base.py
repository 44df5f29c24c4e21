"""What every CUDA rule shares: the UnsupportedError wording and type checks."""
from __future__ import annotations

from ... import ggml
from ...errors import UnsupportedError
from ...ggml import GGMLType as T
from ...ops.base import describe, f32_param

__all__ = ["f32_only", "f32_param", "need_types", "type_name", "unsupported"]

type_name = ggml.type_name


def unsupported(node, srcs, why: str = "is not supported by the CUDA executor"):
    return UnsupportedError(describe(node, srcs, why))


def need_types(node, srcs, ok: bool):
    if not ok:
        raise unsupported(node, srcs, "has a type combination the CUDA executor does not support")


def f32_only(node, srcs):
    """An admit: every source and the result F32."""
    need_types(node, srcs, all(t is None or t.type == T.F32 for t in srcs) and node.type == T.F32)
