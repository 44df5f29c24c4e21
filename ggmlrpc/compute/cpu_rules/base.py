"""What every CPU rule shares: the Spec it returns and the checks of what the CPU
kernels cover (types, quant conversions), which raise UnsupportedError."""
from __future__ import annotations

from dataclasses import dataclass, field

from ... import ggml
from ...errors import UnsupportedError
from ...ggml import GGMLType as T
from ...ops.base import describe
from .kernels import executor, ids, variant

FLOAT_TYPES = (T.F32, T.F16, T.BF16)


@dataclass
class Spec:
    """One node's kernel: its id, variant, derived integers and the sources it reads."""

    kernel: int
    sub: int = 0
    iparams: tuple = ()
    srcs: list = field(default_factory=list)


def unsupported(node, srcs, why: str = "is not supported by the CPU executor"):
    return UnsupportedError(describe(node, srcs, why))


def need_types(node, srcs, ok: bool):
    if not ok:
        raise unsupported(node, srcs, "has a type combination the CPU executor does not support")


def need_quant(node, srcs, t, to_float=False, from_float=False):
    """A quantized t needs the conversion kernels (other types convert inline)."""
    if not ggml.is_quantized(t.type):
        return
    ex = executor()
    if to_float and not ex.has_to_float(t.type):
        raise unsupported(node, srcs, f"needs {ggml.type_name(t.type)} -> F32, which is not implemented")
    if from_float and not ex.has_from_float(t.type):
        raise unsupported(node, srcs, f"needs F32 -> {ggml.type_name(t.type)}, which is not implemented")


def f32_only(node, srcs):
    """The CPU kernels of many ops read and write F32 only."""
    need_types(node, srcs, all(t.type == T.F32 for t in srcs) and node.type == T.F32)


def f32_to_i32(node, srcs):
    """An F32 source, an I32 result (indices)."""
    need_types(node, srcs, srcs[0].type == T.F32 and node.type == T.I32)


def same_type_in(types):
    """An admit: source and result of one type, one of `types`."""
    def admit(node, srcs):
        s = srcs[0]
        need_types(node, srcs, s.type == node.type and s.type in types)
    return admit


def simple(kernel: str, check, admit, variants: bool = False):
    """A rule with nothing to choose: `kernel` reads the sources that `check` (the
    op's ggml rule, given `admit`) returns; with `variants`, the kernel's variant
    is the one named like the node's op."""
    ids_of = {}     # op -> (kernel id, variant), looked up once (the ids load with the executor)

    def rule(node, srcs):
        used = check(node, srcs, admit)
        k = ids_of.get(node.op)
        if k is None:
            sub = variant(kernel, ggml.op_name(node.op)) if variants else 0
            k = ids_of[node.op] = (getattr(ids.K, kernel), sub)
        return Spec(k[0], k[1], srcs=used)
    rule.__name__ = rule.__qualname__ = f"rule_{check.__name__}"
    return rule
