"""What the CPU executor accepts, op by op: types, shapes and op_params.

Each rule takes a graph node and its sources and returns a Spec (kernel id,
variant, derived integers, the sources the kernel reads) or raises:
UnsupportedError for valid ggml we have no kernel for, ValidationError for what
ggml itself would reject (its CPU backend asserts and aborts the process).

The kernels rely on these checks for memory safety: a kernel walks each tensor
only inside its own ne/nb, and these rules make sure that the shapes a kernel
combines (a row of src0 with a row of src1...) agree. Rules mirror the asserts of
ggml's ggml.c and ggml-cpu/ops.cpp at protocol v7.0.0.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

from .. import ggml
from ..errors import UnsupportedError, ValidationError
from ..ggml import GGMLOp as Op, GGMLType as T


def _ex():
    from .._native import executor
    return executor


class _Ids:
    """Kernel and function ids from the native module (loaded on first use)."""

    def __getattr__(self, name):
        ex = _ex()
        self.K = type("K", (), ex.KERNEL)
        self.UN = type("UN", (), ex.UNOP)
        return getattr(self, name)


ids = _Ids()

FLOAT_TYPES = (T.F32, T.F16, T.BF16)
PREC_OK = (0, 10)          # GGML_PREC_DEFAULT, GGML_PREC_F32
MAX_UNARY = 22
MAX_GLU = 7
ROPE_MODES = (0, 2, 8, 24, 40)
# weights whose prompt-time products ggml computes in its tiled K-quant order
TILED_TYPES = (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS)


@dataclass
class Spec:
    kernel: int
    sub: int = 0
    iparams: tuple = ()
    srcs: list = field(default_factory=list)


def describe(node, srcs, what: str) -> str:
    types = ", ".join(ggml.type_name(s.type) if s is not None else "-" for s in srcs)
    return (f"op {ggml.op_name(node.op)} ({ggml.type_name(node.type)} <- {types or '-'}) "
            f"of node {node.name_str!r} {what}")


def unsupported(node, srcs, why: str = "is not supported by the CPU executor"):
    return UnsupportedError(describe(node, srcs, why))


def invalid(node, srcs, why: str):
    return ValidationError(describe(node, srcs, f"is invalid: {why}"))


# ---- shape helpers ------------------------------------------------------------

def ts(t) -> int:
    return ggml.type_size(t.type)


def blck(t) -> int:
    return ggml.blck_size(t.type)


def nelements(t) -> int:
    return t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]


def nrows(t) -> int:
    return t.ne[1] * t.ne[2] * t.ne[3]


def row_bytes(t) -> int:
    return t.ne[0] // blck(t) * ts(t)


def rows_contiguous(t) -> bool:
    return t.nb[0] == ts(t) or t.ne[0] == blck(t)


def contiguous(t, from_dim: int = 0) -> bool:
    """ggml_is_contiguous (from_dim 0) / _1 / _2: dims above from_dim packed."""
    if not rows_contiguous(t):
        return False
    nxt = ts(t) * (t.ne[0] // blck(t))
    for i in range(1, 4):
        if i > from_dim:
            if t.ne[i] != 1 and t.nb[i] != nxt:
                return False
            nxt *= t.ne[i]
        else:
            nxt = t.ne[i] * t.nb[i]
    return True


def same_shape(a, b) -> bool:
    return tuple(a.ne) == tuple(b.ne)


def can_repeat(small, big) -> bool:
    return all(s > 0 and b % s == 0 for s, b in zip(small.ne, big.ne))


def f32_param(node, i: int) -> float:
    return struct.unpack("<f", struct.pack("<i", node.op_params[i]))[0]


def need(node, srcs, count: int, optional: int = 0):
    if len(srcs) < count or any(s is None for s in srcs[:count]):
        raise invalid(node, srcs, f"needs {count} sources")
    if len(srcs) > count + optional:
        raise invalid(node, srcs, f"has {len(srcs)} sources (at most {count + optional})")


def need_types(node, srcs, ok: bool):
    if not ok:
        raise unsupported(node, srcs, "has a type combination the CPU executor does not support")


def need_rows(node, srcs, *tensors):
    for t in tensors:
        if t is not None and not rows_contiguous(t):
            raise invalid(node, srcs, f"tensor {t.name_str!r} has non-contiguous rows (nb[0]={t.nb[0]})")


def f32_like_source(node, srcs, same: bool = True):
    """The one F32 source of an F32 node (of the node's shape when `same`), rows
    contiguous in both."""
    need(node, srcs, 1)
    s = srcs[0]
    need_types(node, srcs, s.type == T.F32 and node.type == T.F32)
    if same and not same_shape(s, node):
        raise invalid(node, srcs, "source and result differ in shape")
    need_rows(node, srcs, s, node)
    return s


def f32_strided_source(node, srcs, same: bool = False, packed_result: bool = True):
    """The one F32 source of an F32 node (of the node's shape when `same`), read
    element by element through its strides (permuted views welcome); the result's
    rows packed when `packed_result`."""
    need(node, srcs, 1)
    s = srcs[0]
    need_types(node, srcs, s.type == T.F32 and node.type == T.F32)
    if same and not same_shape(s, node):
        raise invalid(node, srcs, "source and result differ in shape")
    if packed_result:
        need_rows(node, srcs, node)
    return s


def need_quant(node, srcs, t, to_float=False, from_float=False):
    """A quantized t needs the conversion kernels (other types convert inline)."""
    if not ggml.is_quantized(t.type):
        return
    ex = _ex()
    if to_float and not ex.has_to_float(t.type):
        raise unsupported(node, srcs, f"needs {ggml.type_name(t.type)} -> F32, which is not implemented")
    if from_float and not ex.has_from_float(t.type):
        raise unsupported(node, srcs, f"needs F32 -> {ggml.type_name(t.type)}, which is not implemented")


# ---- rules ----------------------------------------------------------------------

def rule_dup(node, srcs):
    """DUP, CONT, CPY: src0 copied into the node in element order (same count)."""
    need(node, srcs, 2 if node.op == Op.CPY else 1)
    s = srcs[0]
    if nelements(s) != nelements(node):
        raise invalid(node, srcs, "element counts differ")
    st, dt = s.type, node.type
    conv = {T.F32, T.F16, T.BF16}
    if ggml.is_quantized(st) or ggml.is_quantized(dt):
        if st == dt:
            # whole blocks: rows of the same shape copied as bytes, else block by
            # block in logical order (rows of whole blocks on both sides)
            need_rows(node, srcs, s, node)
            if same_shape(s, node):
                return Spec(ids.K.DUP, iparams=(ts(s), row_bytes(s), 0), srcs=[s])
            if s.ne[0] % blck(s) or node.ne[0] % blck(node):
                raise invalid(node, srcs, "rows are not whole blocks")
            return Spec(ids.K.DUP, iparams=(ts(s), 0, 0, blck(s)), srcs=[s])
        if dt == T.F32:     # ggml dequantizes only to F32
            need_quant(node, srcs, s, to_float=True)
            need_rows(node, srcs, s, node)
            if same_shape(s, node):
                return Spec(ids.K.DUP, iparams=(4, 0, 1), srcs=[s])
            # another shape: block by block; a block must not straddle two result rows
            # unless the result is contiguous (ggml's dup_from_q asserts the same)
            if node.ne[0] % blck(s) and not contiguous(node):
                raise invalid(node, srcs, "dequantized blocks would straddle rows of the result")
            return Spec(ids.K.DUP, iparams=(4, 0, 3, blck(s)), srcs=[s])
        if st in conv:      # quantized rows of src0's row length into a contiguous result
            need_quant(node, srcs, node, from_float=True)
            if not contiguous(node) or s.ne[0] % blck(node):
                raise invalid(node, srcs, "quantizing needs a contiguous result and whole blocks per row")
            need_rows(node, srcs, s)
            return Spec(ids.K.DUP, iparams=(4, s.ne[0] // blck(node) * ts(node), 2), srcs=[s])
        raise unsupported(node, srcs)
    if st == dt:
        return Spec(ids.K.DUP, iparams=(ts(s), 0, 0), srcs=[s])
    if st in conv and dt in conv or {st, dt} == {T.F32, T.I32}:
        return Spec(ids.K.DUP, iparams=(4, 0, 0), srcs=[s])
    raise unsupported(node, srcs)


def rule_add_q(node, srcs):
    """ADD / ADD1 on a quantized src0: ggml dequantizes, adds and quantizes back
    row by row (same shapes; ADD1: a scalar src1)."""
    a, b = srcs
    add1 = node.op == Op.ADD1
    need_types(node, srcs, b.type == T.F32 and (node.type == a.type or (not add1 and node.type == T.F32)))
    need_quant(node, srcs, a, to_float=True, from_float=node.type != T.F32)
    if not same_shape(a, node) or (not add1 and not same_shape(a, b)) or a.ne[0] % blck(a):
        raise invalid(node, srcs, "sources and result differ in shape, or rows are not whole blocks")
    if add1 and node.ne[3] != 1:   # ggml's ADD1 on quantized data misplaces rows of dim 3
        raise unsupported(node, srcs, "with a quantized 4-D result")
    need_rows(node, srcs, a, b, node)
    return Spec(ids.K.ADD_Q, int(add1), srcs=[a, b])


def rule_binary(node, srcs):
    need(node, srcs, 2)
    a, b = srcs
    if node.op in (Op.ADD, Op.ADD1) and ggml.is_quantized(a.type):
        return rule_add_q(node, srcs)
    if not same_shape(a, node):
        raise invalid(node, srcs, "src0 and the result differ in shape")
    if not can_repeat(b, a):
        raise invalid(node, srcs, "src1 does not repeat to src0's shape")
    combos = {(T.F32, T.F32, T.F32), (T.F16, T.F16, T.F16), (T.BF16, T.BF16, T.BF16),
              (T.BF16, T.F32, T.BF16), (T.BF16, T.F32, T.F32), (T.F16, T.F32, T.F16),
              (T.F16, T.F32, T.F32)}
    need_types(node, srcs, (a.type, b.type, node.type) in combos)
    need_rows(node, srcs, a, node)
    sub = {Op.ADD: 0, Op.ADD1: 0, Op.SUB: 1, Op.MUL: 2, Op.DIV: 3}[node.op]
    return Spec(ids.K.BINARY, sub, srcs=[a, b])


def _elementwise(node, srcs, sub, types=FLOAT_TYPES):
    need(node, srcs, 1)
    s = srcs[0]
    if not same_shape(s, node):
        raise invalid(node, srcs, "source and result differ in shape")
    need_types(node, srcs, s.type == node.type and s.type in types)
    need_rows(node, srcs, s, node)
    return Spec(ids.K.UNARY, sub, srcs=[s])


def rule_unary(node, srcs):
    u = node.op_params[0]
    if not 0 <= u < MAX_UNARY:
        raise invalid(node, srcs, f"unknown unary op {u}")
    return _elementwise(node, srcs, u)


def rule_simple_unary(node, srcs):
    sub = getattr(ids.UN, ggml.op_name(node.op))
    return _elementwise(node, srcs, sub, (T.F32, T.F16))


def rule_glu(node, srcs):
    need(node, srcs, 1, optional=1)
    g = node.op_params[0]
    if not 0 <= g < MAX_GLU:
        raise invalid(node, srcs, f"unknown glu op {g}")
    a = srcs[0]
    b = srcs[1] if len(srcs) > 1 else None
    need_types(node, srcs, a.type == node.type and a.type in FLOAT_TYPES
               and (b is None or b.type == a.type))
    if (g == 3 and a.type != T.F32) or (g == 6 and a.type == T.BF16):
        raise unsupported(node, srcs)      # ggml: SWIGLU_OAI on F32 only, SWIGLU_CLAMP on F32/F16
    if b is not None:
        if not (same_shape(a, b) and same_shape(a, node)):
            raise invalid(node, srcs, "sources and result differ in shape")
    elif node.ne[0] != a.ne[0] // 2 or tuple(a.ne[1:]) != tuple(node.ne[1:]):
        raise invalid(node, srcs, "the result is not half of src0")   # (an odd last element unused)
    need_rows(node, srcs, a, b, node)
    return Spec(ids.K.GLU, g, srcs=[a] + ([b] if b is not None else []))


def rule_scale(node, srcs):
    need(node, srcs, 1)
    s = srcs[0]
    if not same_shape(s, node):
        raise invalid(node, srcs, "source and result differ in shape")
    need_types(node, srcs, s.type == node.type and s.type in (T.F32, T.BF16))
    need_rows(node, srcs, s, node)
    return Spec(ids.K.SCALE, srcs=[s])


def rule_get_rows(node, srcs):
    need(node, srcs, 2)
    a, idx = srcs
    need_types(node, srcs, idx.type == T.I32 and (
        (a.type == node.type and a.type in (T.F32, T.I32))
        or (node.type == T.F32 and a.type in (T.F16, T.BF16))
        or (node.type == T.F32 and ggml.is_quantized(a.type))))
    need_quant(node, srcs, a, to_float=True)
    if (node.ne[0] != a.ne[0] or node.ne[1] != idx.ne[0] or node.ne[2] != idx.ne[1]
            or node.ne[3] != idx.ne[2] or idx.ne[3] != 1):
        raise invalid(node, srcs, "result shape does not match the indices")
    if a.ne[2] != idx.ne[1] or a.ne[3] != idx.ne[2]:
        raise invalid(node, srcs, "src0 and the indices differ in dims 2 and 3")
    need_rows(node, srcs, a, node)
    return Spec(ids.K.GET_ROWS, iparams=(row_bytes(a),), srcs=[a, idx])


def rule_set_rows(node, srcs):
    need(node, srcs, 2, optional=1)
    a, idx = srcs[0], srcs[1]
    need_types(node, srcs, a.type in (T.F32, T.F16) and idx.type in (T.I64, T.I32)
               and (node.type in (T.F32, T.F16, T.BF16) or ggml.is_quantized(node.type)))
    need_quant(node, srcs, node, from_float=True)
    if node.ne[0] != a.ne[0] or node.ne[2] != a.ne[2] or node.ne[3] != a.ne[3]:
        raise invalid(node, srcs, "src0 and the result differ in shape")
    if (idx.ne[0] != a.ne[1] or idx.ne[3] != 1 or a.ne[2] % idx.ne[1]
            or a.ne[3] % idx.ne[2]):
        raise invalid(node, srcs, "indices do not match src0")
    need_rows(node, srcs, a, node)
    return Spec(ids.K.SET_ROWS, iparams=(row_bytes(a),), srcs=[a, idx])


def _norm(kernel_name, sub=0, strided=False):
    """strided: the kernel also reads and writes rows with element strides (ggml's
    NORM and L2_NORM walk nb[0]; RMS_NORM and GROUP_NORM need packed rows)."""
    def rule(node, srcs):
        if strided:
            s = f32_strided_source(node, srcs, same=True, packed_result=False)
        else:
            s = f32_like_source(node, srcs)
        eps = f32_param(node, 0 if node.op != Op.GROUP_NORM else 1)
        if not eps >= 0.0:
            raise invalid(node, srcs, f"eps {eps} < 0")
        if node.op == Op.GROUP_NORM and node.op_params[0] <= 0:
            raise invalid(node, srcs, "n_groups <= 0")
        return Spec(getattr(ids.K, kernel_name), sub, srcs=[s])
    return rule


def rule_soft_max(node, srcs):
    need(node, srcs, 1, optional=2)
    s = srcs[0]
    m = srcs[1] if len(srcs) > 1 else None
    sk = srcs[2] if len(srcs) > 2 else None
    if not same_shape(s, node):
        raise invalid(node, srcs, "source and result differ in shape")
    need_types(node, srcs, s.type == T.F32 and node.type == T.F32
               and (m is None or m.type in (T.F16, T.F32)) and (sk is None or sk.type == T.F32))
    need_rows(node, srcs, s, node, m, sk)
    if m is not None:
        if m.ne[0] < s.ne[0] or m.ne[1] < s.ne[1] or s.ne[2] % m.ne[2] or s.ne[3] % m.ne[3]:
            raise invalid(node, srcs, "mask does not cover src0")
    if sk is not None and sk.ne[0] < s.ne[2]:
        raise invalid(node, srcs, "fewer sinks than heads")
    max_bias = f32_param(node, 1)
    if max_bias > 0.0 and m is None:
        raise invalid(node, srcs, "ALiBi without a mask")
    return Spec(ids.K.SOFT_MAX, srcs=[s, m, sk])


def rule_rope(node, srcs):
    need(node, srcs, 2, optional=1)
    s, pos = srcs[0], srcs[1]
    ff = srcs[2] if len(srcs) > 2 else None
    need_types(node, srcs, s.type in (T.F32, T.F16) and node.type == s.type and pos.type == T.I32
               and (ff is None or ff.type == T.F32))
    if not same_shape(s, node):
        raise invalid(node, srcs, "source and result differ in shape")
    need_rows(node, srcs, s, node)
    p = node.op_params
    n_dims, mode, n_offs = p[1], p[2], p[15]
    ne0 = node.ne[0]
    if mode not in ROPE_MODES:
        raise unsupported(node, srcs, f"has rope mode {mode}")
    if not (0 < n_dims <= ne0 and n_dims % 2 == 0):
        raise invalid(node, srcs, f"n_dims {n_dims} for ne0 {ne0}")
    if n_offs < 0 or n_offs % 2 or n_offs + n_dims > ne0:
        raise invalid(node, srcs, f"n_offs {n_offs}")
    multi = bool(mode & 8)
    if not contiguous(pos) or pos.ne[0] < node.ne[2] * (4 if multi else 1):
        raise invalid(node, srcs, "positions do not cover the tokens")
    if multi:
        sections = p[11:15]
        if any(x < 0 for x in sections) or not 0 < sum(sections) <= ne0:
            raise invalid(node, srcs, f"rope sections {sections}")
    if mode == 24 and (n_dims * 2 != ne0 or n_offs):
        raise invalid(node, srcs, "vision rope needs n_dims == ne0/2")
    # one factor per rotated pair (vision mode rotates ne0 / 2 pairs)
    if ff is not None and (not contiguous(ff) or ff.ne[0] < (ne0 if mode == 24 else n_dims) // 2):
        raise invalid(node, srcs, "too few frequency factors")
    return Spec(ids.K.ROPE, 1 if node.op == Op.ROPE_BACK else 0, srcs=[s, pos, ff])


def rule_mul_mat(node, srcs):
    need(node, srcs, 2)
    w, x = srcs
    ex = _ex()
    if node.op_params[1] == 1:
        return _fwht(node, srcs)
    if node.op_params[1] != 0:
        raise unsupported(node, srcs, f"has hint {node.op_params[1]}")
    vdt = ex.vec_dot_type(w.type) if w.type not in (T.F32, T.F16) else w.type
    if vdt < 0 or node.type != T.F32:
        raise unsupported(node, srcs)
    if w.type not in (T.F32, T.F16) and not ex.has_vec_dot(w.type):
        raise unsupported(node, srcs)
    if x.type != vdt:
        ok = (x.type == T.F32 and (vdt in (T.F32, T.F16) or ex.has_from_float(vdt))) or \
             (vdt == T.F32 and x.type in (T.F16, T.BF16))
        need_types(node, srcs, ok)
    if w.ne[0] != x.ne[0]:
        raise invalid(node, srcs, "inner dimensions differ")
    if (node.ne[0] != w.ne[1] or node.ne[1] != x.ne[1] or node.ne[2] != x.ne[2]
            or node.ne[3] != x.ne[3]):
        raise invalid(node, srcs, "result shape is not (src0.ne1, src1.ne1, src1.ne2, src1.ne3)")
    if x.ne[2] % w.ne[2] or x.ne[3] % w.ne[3]:
        raise invalid(node, srcs, "src0 does not broadcast over src1")
    need_rows(node, srcs, w, x, node)
    if w.nb[0] != ts(w) or x.nb[0] != ts(x) or node.nb[0] != 4:
        raise invalid(node, srcs, "permuted or transposed operands")
    K, M, N = w.ne[0], w.ne[1], x.ne[1]
    if K % ggml.blck_size(vdt):
        raise invalid(node, srcs, "rows are not whole blocks of the activation type")
    # ggml's summation order: its prompt-time GEMM for F32/F16 weights, its tiled
    # K-quant GEMM from 8 activation rows on, else one vec_dot per output (whose
    # order is tinyBLAS's too for Q4_0, Q5_0 and Q8_0)
    gemm = int(w.type in (T.F32, T.F16) and N >= 2 and K % ex.vec_lanes() == 0 and M % 4 == 0
               and (x.type != vdt or contiguous(x)))
    # BF16 on an AVX512-BF16 build: tinyBLAS's VDPBF16PS order over steps of 32
    if w.type == T.BF16 and ex.has_bf16_products() and N >= 2 and K % 32 == 0 \
            and (x.type != vdt or contiguous(x)):
        gemm = 1
    if w.type in TILED_TYPES and N >= 8:
        gemm = 2
    # IQ4_NL from 2 activation rows on: tinyBLAS's one accumulator per output
    # (vec_dot has two); like ggml, only for src1 converted here or contiguous
    if w.type == T.IQ4_NL and N >= 2 and (x.type != vdt or contiguous(x)):
        gemm = 3
    row_size = K // ggml.blck_size(vdt) * ggml.type_size(vdt)
    return Spec(ids.K.MUL_MAT, iparams=(vdt, gemm, row_size), srcs=[w, x])


def _fwht(node, srcs):
    """MUL_MAT with SRC0_IS_HADAMARD: ggml's CPU backend runs a fast Walsh-Hadamard
    transform of src1's rows instead of the product (src0 is not read)."""
    w, x = srcs
    n = x.ne[0]
    need_types(node, srcs, x.type in (T.F32, T.F16) and node.type == T.F32)
    if n & (n - 1) or w.ne[0] != n or w.ne[1] != n or tuple(node.ne) != tuple(x.ne):
        raise invalid(node, srcs, "a Hadamard product needs a power-of-two (n, n) src0")
    need_rows(node, srcs, x, node)
    return Spec(ids.K.FWHT, srcs=[w, x])


def rule_flash_attn(node, srcs):
    need(node, srcs, 3, optional=2)
    q, k, v = srcs[:3]
    m = srcs[3] if len(srcs) > 3 else None
    sk = srcs[4] if len(srcs) > 4 else None
    ex = _ex()
    if node.op_params[3] not in PREC_OK:
        raise invalid(node, srcs, f"precision {node.op_params[3]}")
    vdt = k.type if k.type in (T.F32, T.F16) else ex.vec_dot_type(k.type)
    ok = (q.type == T.F32 and node.type == T.F32 and vdt >= 0
          and (k.type in (T.F32, T.F16) or (ex.has_vec_dot(k.type) and ex.has_from_float(vdt)))
          and (v.type in (T.F32, T.F16) or ex.has_to_float(v.type))
          and (m is None or m.type == T.F16) and (sk is None or sk.type == T.F32))
    need_types(node, srcs, ok)
    DK, DV = k.ne[0], v.ne[0]
    if q.ne[0] != DK or v.ne[1] != k.ne[1]:
        raise invalid(node, srcs, "q, k and v do not agree")
    if q.ne[2] % k.ne[2] or q.ne[3] % k.ne[3] or q.ne[2] % v.ne[2] or q.ne[3] % v.ne[3]:
        raise invalid(node, srcs, "k/v heads do not divide q heads")
    if tuple(node.ne) != (DV, q.ne[2], q.ne[1], q.ne[3]) or not contiguous(node):
        raise invalid(node, srcs, "result is not a contiguous (DV, heads, queries, ne3) tensor")
    need_rows(node, srcs, q, k, v, m, sk)
    if q.nb[0] != 4 or k.nb[0] != ts(k) or v.nb[0] != ts(v):
        raise invalid(node, srcs, "rows of q, k or v are not contiguous")
    if m is not None and (m.ne[0] < k.ne[1] or m.ne[1] < q.ne[1] or q.ne[2] % m.ne[2]
                          or q.ne[3] % m.ne[3]):
        raise invalid(node, srcs, "mask does not cover the scores")
    if sk is not None and sk.ne[0] < q.ne[2]:
        raise invalid(node, srcs, "fewer sinks than heads")
    if DK % ggml.blck_size(vdt) or DV % blck(v):
        raise invalid(node, srcs, "head size is not whole blocks")
    # ggml's three paths: per query row, 64x64 tiles from 64 queries on, and for
    # one query over 512 keys or more, keys split between threads
    path = 0
    if k.type == v.type and k.type in (T.F32, T.F16):
        if q.ne[1] == 1 and q.ne[3] == 1 and k.ne[1] >= 512:
            path = 2
        elif q.ne[1] >= 64:
            path = 1
    return Spec(ids.K.FLASH_ATTN, iparams=(vdt, path), srcs=[q, k, v, m, sk])



def rule_add1(node, srcs):
    need(node, srcs, 2)
    if nelements(srcs[1]) != 1:
        raise invalid(node, srcs, "src1 is not a scalar")
    return rule_binary(node, srcs)


def rule_clamp(node, srcs):
    return _elementwise(node, srcs, ids.UN.CLAMP, (T.F32, T.F16))


def rule_acc_set(node, srcs):
    """ACC / SET: src1 added to / written into a strided view of a copy of src0."""
    need(node, srcs, 2)
    a, b = srcs
    types = (T.F32,) if node.op == Op.ACC else (T.F32, T.I32)
    need_types(node, srcs, a.type == b.type == node.type and a.type in types)
    if not same_shape(a, node) or not contiguous(a) or not contiguous(node):
        raise invalid(node, srcs, "src0 and the result must be contiguous and of one shape")
    need_rows(node, srcs, b)
    nb1, nb2, nb3, offset = node.op_params[:4]
    if min(nb1, nb2, nb3, offset) < 0:
        raise invalid(node, srcs, "negative view strides or offset")
    last = offset + (b.ne[0] - 1) * 4 + (b.ne[1] - 1) * nb1 + (b.ne[2] - 1) * nb2 + (b.ne[3] - 1) * nb3
    if last + 4 > ggml.nbytes(node.type, node.ne, node.nb):
        raise invalid(node, srcs, "the view lies outside the result")
    return Spec(ids.K.ACC if node.op == Op.ACC else ids.K.SET, iparams=(4,), srcs=[a, b])


def rule_sum(node, srcs):
    need(node, srcs, 1)
    s = srcs[0]
    need_types(node, srcs, s.type in FLOAT_TYPES and node.type == s.type)
    if nelements(node) != 1:
        raise invalid(node, srcs, "the result is not a scalar")
    # ggml sums ne0 packed elements from each row's start whatever nb[0] is (a
    # permuted view is summed over other elements than its own); the kernel does
    # the same, which stays inside the validated extent while nb[0] >= the type size
    if s.nb[0] < ts(s):
        need_rows(node, srcs, s)
    return Spec(ids.K.SUM, srcs=[s])


def rule_sum_rows(node, srcs):
    s = f32_like_source(node, srcs, same=False)
    if tuple(node.ne) != (1,) + tuple(s.ne[1:]):
        raise invalid(node, srcs, "the result is not one value per row")
    return Spec(ids.K.SUM_ROWS, int(node.op == Op.MEAN), srcs=[s])


def rule_cumsum(node, srcs):
    return Spec(ids.K.CUMSUM, srcs=[f32_like_source(node, srcs)])


def rule_argmax(node, srcs):
    need(node, srcs, 1)
    s = srcs[0]
    need_types(node, srcs, s.type == T.F32 and node.type == T.I32)
    if s.ne[2] != 1 or s.ne[3] != 1 or tuple(node.ne) != (s.ne[1], 1, 1, 1):
        raise invalid(node, srcs, "argmax of a matrix gives one index per row")
    need_rows(node, srcs, s)
    return Spec(ids.K.ARGMAX, srcs=[s])


def rule_count_equal(node, srcs):
    need(node, srcs, 2)
    a, b = srcs
    need_types(node, srcs, a.type == b.type == T.I32 and node.type == T.I64)
    if not same_shape(a, b) or nelements(node) != 1:
        raise invalid(node, srcs, "sources differ in shape or the result is not a scalar")
    return Spec(ids.K.COUNT_EQUAL, srcs=[a, b])


def rule_repeat(node, srcs):
    need(node, srcs, 1)
    s = srcs[0]
    need_types(node, srcs, s.type == node.type and not ggml.is_quantized(s.type))
    if not can_repeat(s, node):
        raise invalid(node, srcs, "the source does not repeat to the result")
    need_rows(node, srcs, s, node)
    return Spec(ids.K.REPEAT, iparams=(ts(s),), srcs=[s])


def rule_repeat_back(node, srcs):
    s = f32_like_source(node, srcs, same=False)
    if not can_repeat(node, s):
        raise invalid(node, srcs, "the result does not repeat to the source")
    return Spec(ids.K.REPEAT_BACK, srcs=[s])


def rule_concat(node, srcs):
    need(node, srcs, 2)
    a, b = srcs
    dim = node.op_params[0]
    need_types(node, srcs, a.type == b.type == node.type)
    if not 0 <= dim < 4:
        raise invalid(node, srcs, f"dimension {dim}")
    if dim == 0 and (a.ne[0] % blck(a) or b.ne[0] % blck(b)):
        raise invalid(node, srcs, "rows of whole blocks are concatenated")
    for i in range(4):
        want = a.ne[i] + b.ne[i] if i == dim else a.ne[i]
        if node.ne[i] != want or (i != dim and b.ne[i] != a.ne[i]):
            raise invalid(node, srcs, "shapes do not concatenate")
    need_rows(node, srcs, a, b, node)
    return Spec(ids.K.CONCAT, iparams=(ts(a), blck(a)), srcs=[a, b])


def rule_pad(node, srcs):
    s = f32_strided_source(node, srcs)
    p = node.op_params
    if any(x < 0 for x in p[:8]) or any(node.ne[i] != s.ne[i] + p[2 * i] + p[2 * i + 1] for i in range(4)):
        raise invalid(node, srcs, "padding does not match the shapes")
    return Spec(ids.K.PAD, srcs=[s])


def rule_arange(node, srcs):
    need(node, srcs, 0)
    import math
    import numpy as np
    start, stop, step = (np.float32(f32_param(node, i)) for i in range(3))
    if node.type != T.F32 or not contiguous(node):
        raise unsupported(node, srcs)
    with np.errstate(all="ignore"):
        q = np.float32((stop - start) / step)
    if not np.isfinite(q) or math.ceil(q) != nelements(node):
        raise invalid(node, srcs, "the element count does not match start, stop and step")
    return Spec(ids.K.ARANGE)


def rule_tri(node, srcs):
    s = f32_like_source(node, srcs)
    if not contiguous(s) or not 0 <= node.op_params[0] <= 3:
        raise invalid(node, srcs, "layout or triangle type")
    return Spec(ids.K.TRI, srcs=[s])


def rule_fill(node, srcs):
    need(node, srcs, 1)
    s = srcs[0]
    need_types(node, srcs, node.type == s.type and s.type in (T.F32, T.F16))
    if not same_shape(s, node):
        raise invalid(node, srcs, "source and result differ in shape")
    need_rows(node, srcs, node)
    return Spec(ids.K.FILL, srcs=[s])


def rule_diag_mask(node, srcs):
    s = f32_like_source(node, srcs)
    if not contiguous(s) or not contiguous(node):
        raise invalid(node, srcs, "source and result must be contiguous")
    if node.op_params[0] < 0:
        raise invalid(node, srcs, "n_past < 0")
    return Spec(ids.K.DIAG_MASK, int(node.op == Op.DIAG_MASK_ZERO), srcs=[s])


def rule_diag(node, srcs):
    s = f32_like_source(node, srcs, same=False)
    if s.ne[1] != 1 or tuple(node.ne) != (s.ne[0], s.ne[0], s.ne[2], s.ne[3]):
        raise invalid(node, srcs, "diag makes (n, n) matrices of (n, 1) rows")
    return Spec(ids.K.DIAG, srcs=[s])


def rule_argsort(node, srcs):
    need(node, srcs, 1)
    s = srcs[0]
    need_types(node, srcs, s.type == T.F32 and node.type == T.I32)
    top_k = node.op == Op.TOP_K
    if tuple(node.ne[1:]) != tuple(s.ne[1:]) or (not top_k and node.ne[0] != s.ne[0]) \
            or not 1 <= node.ne[0] <= s.ne[0]:
        raise invalid(node, srcs, "result shape")
    if not top_k and node.op_params[0] not in (0, 1):
        raise invalid(node, srcs, f"sort order {node.op_params[0]}")
    need_rows(node, srcs, s, node)
    return Spec(ids.K.ARGSORT, int(top_k), srcs=[s])


def rule_mul_mat_id(node, srcs):
    need(node, srcs, 3)
    w, x, sel = srcs
    ex = _ex()
    vdt = ex.vec_dot_type(w.type) if w.type not in (T.F32, T.F16) else w.type
    if vdt < 0 or node.type != T.F32 or sel.type != T.I32:
        raise unsupported(node, srcs)
    if w.type not in (T.F32, T.F16) and not ex.has_vec_dot(w.type):
        raise unsupported(node, srcs)
    if x.type != vdt:
        need_types(node, srcs, x.type == T.F32 and (vdt in (T.F32, T.F16) or ex.has_from_float(vdt)))
    K, M, n_as = w.ne[0], w.ne[1], w.ne[2]
    n_used, T_ = sel.ne[0], sel.ne[1]
    if (w.ne[3] != 1 or x.ne[3] != 1 or sel.ne[2] != 1 or sel.ne[3] != 1 or x.ne[0] != K
            or sel.ne[1] != x.ne[2] or n_used % x.ne[1] or tuple(node.ne) != (M, n_used, T_, 1)):
        raise invalid(node, srcs, "shapes of experts, activations, ids and result do not agree")
    need_rows(node, srcs, w, x, node)
    if w.nb[0] != ts(w) or x.nb[0] != ts(x) or node.nb[0] != 4:
        raise invalid(node, srcs, "permuted or transposed operands")
    if K % ggml.blck_size(vdt):
        raise invalid(node, srcs, "rows are not whole blocks of the activation type")
    row_size = K // ggml.blck_size(vdt) * ggml.type_size(vdt)
    # experts with 8 routed rows or more take ggml's tiled K-quant order
    return Spec(ids.K.MUL_MAT_ID, iparams=(vdt, 2 if w.type in TILED_TYPES else 0, row_size), srcs=[w, x, sel])


def rule_add_id(node, srcs):
    need(node, srcs, 3)
    a, b, sel = srcs
    need_types(node, srcs, a.type == b.type == node.type == T.F32 and sel.type == T.I32)
    if (not same_shape(a, node) or b.ne[0] != a.ne[0] or sel.ne[0] != a.ne[1]
            or sel.ne[1] != a.ne[2] or a.ne[3] != 1):
        raise invalid(node, srcs, "shapes do not agree")
    need_rows(node, srcs, a, b, node)
    return Spec(ids.K.ADD_ID, srcs=[a, b, sel])


def rule_out_prod(node, srcs):
    need(node, srcs, 2)
    a, b = srcs
    need_types(node, srcs, b.type == T.F32 and node.type == T.F32 and
               (a.type in (T.F32, T.F16) or (ggml.is_quantized(a.type) and _ex().has_to_float(a.type))))
    if (a.ne[1] != b.ne[1] or b.ne[2] % a.ne[2] or b.ne[3] % a.ne[3]
            or tuple(node.ne) != (a.ne[0], b.ne[0], b.ne[2], b.ne[3])):
        raise invalid(node, srcs, "shapes do not agree")
    if a.type != T.F32 and (a.ne[2] != b.ne[2] or a.ne[3] != b.ne[3]):
        raise invalid(node, srcs, "F16 and quantized src0 do not broadcast")
    need_rows(node, srcs, a, node)
    return Spec(ids.K.OUT_PROD, srcs=[a, b])


def rule_ssm_conv(node, srcs):
    need(node, srcs, 2)
    sx, c = srcs
    need_types(node, srcs, sx.type == c.type == node.type == T.F32)
    d_conv, d_inner = c.ne[0], c.ne[1]
    n_t = sx.ne[0] - d_conv + 1
    if (c.ne[2] != 1 or c.ne[3] != 1 or sx.ne[3] != 1 or n_t < 0 or sx.ne[1] != d_inner
            or tuple(node.ne) != (d_inner, n_t, sx.ne[2], 1)):
        raise invalid(node, srcs, "shapes of window, kernel and result do not agree")
    if sx.nb[0] != 4 or sx.nb[1] != sx.ne[0] * 4 or c.nb[0] != 4:
        raise invalid(node, srcs, "the window and kernel rows must be contiguous")
    return Spec(ids.K.SSM_CONV, srcs=[sx, c])


def rule_ssm_scan(node, srcs):
    need(node, srcs, 7)
    s, x, dt, a, b, c, sel = srcs
    need_types(node, srcs, all(t.type == T.F32 for t in (s, x, dt, a, b, c, node)) and sel.type == T.I32)
    K = node.op_params[0]
    d_state, head_dim, n_head = s.ne[0], s.ne[1], s.ne[2]
    n_t, n_s = x.ne[2], x.ne[3]
    ok = (K >= 1 and contiguous(s) and contiguous(dt) and contiguous(a) and contiguous(sel)
          and x.ne[0] == head_dim and x.ne[1] == n_head and x.nb[0] == 4 and x.nb[1] == head_dim * 4
          and tuple(dt.ne[:3]) == (n_head, n_t, n_s) and dt.ne[3] == 1
          and a.ne[1] == n_head and a.ne[2] == a.ne[3] == 1 and (a.ne[0] == 1 or (a.ne[0] == d_state and K == 1))
          and same_shape(b, c) and b.ne[0] == d_state and b.ne[2] == n_t and b.ne[3] == n_s
          and n_head % b.ne[1] == 0 and all(t.nb[0] == 4 and t.nb[1] == t.ne[0] * 4 for t in (b, c))
          and sel.ne[0] == n_s and sel.ne[1] == sel.ne[2] == sel.ne[3] == 1
          and contiguous(node) and nelements(node) == nelements(x) + K * d_state * head_dim * n_head * n_s)
    if not ok:
        raise invalid(node, srcs, "shapes of states, inputs and result do not agree")
    return Spec(ids.K.SSM_SCAN, srcs=[s, x, dt, a, b, c, sel])


def rule_im2col(node, srcs):
    need(node, srcs, 2)
    k, img = srcs
    p = node.op_params
    is2d = p[6] == 1
    need_types(node, srcs, img.type in (T.F32, T.F16) and (node.type == T.F16 or
                                                           (node.type == T.F32 and img.type == T.F32)))
    N, IC = (img.ne[3], img.ne[2]) if is2d else (img.ne[2], img.ne[1])
    KH, KW = (k.ne[1], k.ne[0]) if is2d else (1, k.ne[0])
    want = (IC * KH * KW, node.ne[1], node.ne[2] if is2d else N, N if is2d else 1)
    if (tuple(node.ne) != want or not contiguous(node) or img.nb[0] != ts(img)
            or (is2d and img.nb[1] != img.ne[0] * ts(img)) or (not is2d and img.ne[3] != 1)
            or (is2d and k.ne[2] != IC) or (not is2d and k.ne[1] != IC)):
        raise invalid(node, srcs, "shapes of kernel, image and result do not agree")
    return Spec(ids.K.IM2COL, srcs=[k, img])


def _pool_out(ins, k, st, p):
    """ggml_calc_pool_output_size, or -1 when the window is larger than the padded input
    (ggml would make a tensor of no elements; the loops over the taps would run on)."""
    num = ins + 2 * p - k
    return -1 if num < 0 or p < 0 else num // st + 1


def rule_pool(node, srcs):
    need(node, srcs, 1)
    s = srcs[0]
    need_types(node, srcs, s.type in (T.F32, T.F16) and node.type == T.F32)
    p = node.op_params
    if p[0] not in (0, 1):
        raise invalid(node, srcs, f"pool op {p[0]}")
    if node.op == Op.POOL_1D:
        if (tuple(node.ne[1:]) != tuple(s.ne[1:]) or p[1] <= 0 or p[2] <= 0
                or node.ne[0] != _pool_out(s.ne[0], p[1], p[2], p[3])):
            raise invalid(node, srcs, "pooling shape")
        need_rows(node, srcs, s, node)
        return Spec(ids.K.POOL_1D, srcs=[s])
    if (tuple(node.ne[2:]) != tuple(s.ne[2:]) or p[1] <= 0 or p[2] <= 0 or p[3] <= 0 or p[4] <= 0
            or node.ne[0] != _pool_out(s.ne[0], p[1], p[3], p[5])
            or node.ne[1] != _pool_out(s.ne[1], p[2], p[4], p[6])):
        raise invalid(node, srcs, "pooling shape")
    need_rows(node, srcs, node)
    return Spec(ids.K.POOL_2D, srcs=[s])


def rule_upscale(node, srcs):
    s = f32_strided_source(node, srcs)
    if (node.op_params[0] & 0xFF) not in (0, 1, 2):
        raise unsupported(node, srcs, f"has scale mode {node.op_params[0] & 0xFF}")
    return Spec(ids.K.UPSCALE, srcs=[s])


def rule_roll(node, srcs):
    s = f32_like_source(node, srcs)
    if any(abs(node.op_params[i]) >= s.ne[i] for i in range(4)):
        raise invalid(node, srcs, "a shift is not smaller than its dimension")
    return Spec(ids.K.ROLL, srcs=[s])


def rule_pad_reflect_1d(node, srcs):
    s = f32_like_source(node, srcs, same=False)
    p0, p1 = node.op_params[:2]
    if (not 0 <= p0 < s.ne[0] or not 0 <= p1 < s.ne[0] or node.ne[0] != s.ne[0] + p0 + p1
            or tuple(node.ne[1:]) != tuple(s.ne[1:])):
        raise invalid(node, srcs, "reflection padding")
    return Spec(ids.K.PAD_REFLECT_1D, srcs=[s])


def rule_timestep_embedding(node, srcs):
    need(node, srcs, 1)
    s = srcs[0]
    need_types(node, srcs, s.type == node.type == T.F32)
    dim = node.op_params[0]
    if dim <= 0 or node.op_params[1] <= 0 or tuple(node.ne) != (dim, s.ne[0], 1, 1) or node.nb[0] != 4:
        raise invalid(node, srcs, "embedding shape")
    return Spec(ids.K.TIMESTEP_EMBEDDING, srcs=[s])


def _recurrence(node, srcs, n_src, state_i):
    """Shared checks of the linear-attention recurrences: all F32 and contiguous,
    sources (S, H, T) except the state (S*S*H*n_seqs elements), dst (S*H, T + S*n_seqs)."""
    need(node, srcs, n_src)
    need_types(node, srcs, all(t.type == T.F32 for t in srcs) and node.type == T.F32)
    state = srcs[state_i]
    S, H, n_t = srcs[0].ne[0], srcs[0].ne[1], srcs[0].ne[2]
    n_seqs = state.ne[1]
    if not all(contiguous(t) for t in srcs) or not contiguous(node):
        raise invalid(node, srcs, "sources and result must be contiguous")
    ok = (all(tuple(t.ne[:3]) == (S, H, n_t) and t.ne[3] == 1 for i, t in enumerate(srcs) if i != state_i
              and not (node.op == Op.RWKV_WKV6 and i == 3))
          and n_seqs > 0 and n_t % n_seqs == 0 and nelements(state) == S * S * H * n_seqs
          and tuple(node.ne) == (S * H, n_t + S * n_seqs, 1, 1))
    if node.op == Op.RWKV_WKV6:
        ok = ok and nelements(srcs[3]) == S * H
    if not ok:
        raise invalid(node, srcs, "shapes of inputs, state and result do not agree")


def rule_rwkv_wkv6(node, srcs):
    _recurrence(node, srcs, 6, 5)
    return Spec(ids.K.RWKV_WKV6, srcs=list(srcs))


def rule_gated_linear_attn(node, srcs):
    _recurrence(node, srcs, 5, 4)
    return Spec(ids.K.RWKV_WKV6, sub=1, srcs=list(srcs))


def rule_rwkv_wkv7(node, srcs):
    _recurrence(node, srcs, 7, 6)
    return Spec(ids.K.RWKV_WKV7, srcs=list(srcs))


def rule_solve_tri(node, srcs):
    need(node, srcs, 2)
    a, b = srcs
    need_types(node, srcs, a.type == b.type == node.type == T.F32)
    if not (contiguous(a) and contiguous(b) and contiguous(node)):
        raise invalid(node, srcs, "sources and result must be contiguous")
    if (a.ne[0] != a.ne[1] or a.ne[1] != b.ne[1] or tuple(a.ne[2:]) != tuple(b.ne[2:])
            or not same_shape(node, b)):
        raise invalid(node, srcs, "A must be square and match B and the result")
    return Spec(ids.K.SOLVE_TRI, srcs=[a, b])


def rule_gated_delta_net(node, srcs):
    need(node, srcs, 6)
    q, k, v, g, beta, state = srcs
    need_types(node, srcs, all(t.type == T.F32 for t in srcs) and node.type == T.F32)
    S, H, n_t, n_s = v.ne
    K = node.op_params[0]
    rows_ok = all(t.nb[0] == 4 for t in (q, k, v))
    heads_ok = all(t.ne[0] == S and t.ne[2] == n_t and n_s % t.ne[3] == 0 for t in (q, k))
    ok = (K >= 1 and rows_ok and heads_ok and contiguous(g) and contiguous(beta) and contiguous(state)
          and g.ne[0] in (1, S) and tuple(g.ne[1:]) == (H, n_t, n_s)
          and tuple(beta.ne) == (1, H, n_t, n_s) and tuple(state.ne) == (S, S, H, n_s)
          and contiguous(node) and tuple(node.ne) == (S * H, n_t * n_s + K * S * n_s, 1, 1))
    if not ok:
        raise invalid(node, srcs, "shapes of q, k, v, gate, beta, state and result do not agree")
    return Spec(ids.K.GATED_DELTA_NET, srcs=list(srcs))


# ---- training ops ----

def rule_silu_back(node, srcs):
    need(node, srcs, 2)
    dy, x = srcs
    need_types(node, srcs, dy.type == x.type == node.type and x.type in (T.F32, T.F16))
    if not (same_shape(dy, x) and same_shape(x, node)):
        raise invalid(node, srcs, "sources and result differ in shape")
    need_rows(node, srcs, dy, x, node)
    return Spec(ids.K.GLU, 7, srcs=[dy, x])


def _f32_pair(node, srcs, n_src=2):
    """n_src F32 sources of the node's (F32) shape, rows contiguous."""
    need(node, srcs, n_src)
    need_types(node, srcs, node.type == T.F32 and all(t.type == T.F32 for t in srcs))
    if not all(same_shape(t, node) for t in srcs):
        raise invalid(node, srcs, "sources and result differ in shape")
    need_rows(node, srcs, node, *srcs)


def rule_get_rows_back(node, srcs):
    need(node, srcs, 2)
    g, idx = srcs
    need_types(node, srcs, g.type in (T.F32, T.F16) and idx.type == T.I32 and node.type == T.F32)
    if (g.ne[2] != 1 or g.ne[3] != 1 or g.nb[0] != ts(g) or not contiguous(idx) or not contiguous(node)
            or node.ne[0] != g.ne[0] or node.ne[2] != 1 or node.ne[3] != 1 or g.ne[1] < nelements(idx)):
        raise invalid(node, srcs, "shapes of gradient, ids and result do not agree")
    return Spec(ids.K.GET_ROWS_BACK, srcs=[g, idx])


def rule_soft_max_back(node, srcs):
    _f32_pair(node, srcs)
    if f32_param(node, 1) != 0.0:
        raise unsupported(node, srcs, "with ALiBi (max_bias != 0) is not supported by ggml either")
    return Spec(ids.K.SOFT_MAX_BACK, srcs=list(srcs))


def rule_rms_norm_back(node, srcs):
    _f32_pair(node, srcs)
    return Spec(ids.K.RMS_NORM_BACK, srcs=list(srcs))


def rule_cross_entropy_loss(node, srcs):
    need(node, srcs, 2)
    a, b = srcs
    need_types(node, srcs, a.type == b.type == node.type == T.F32)
    if not same_shape(a, b) or nelements(node) != 1:
        raise invalid(node, srcs, "logits and labels differ in shape or the result is not a scalar")
    need_rows(node, srcs, a, b)
    return Spec(ids.K.CROSS_ENTROPY, srcs=[a, b])


def rule_cross_entropy_loss_back(node, srcs):
    need(node, srcs, 3)
    g, a, b = srcs
    need_types(node, srcs, all(t.type == T.F32 for t in srcs) and node.type == T.F32)
    if not (same_shape(a, b) and same_shape(a, node) and nelements(g) >= 1
            and all(contiguous(t) for t in (g, a, b, node))):
        raise invalid(node, srcs, "shapes of gradient, logits, labels and result do not agree")
    return Spec(ids.K.CROSS_ENTROPY, 1, srcs=[g, a, b])


def rule_opt_step(node, srcs):
    sgd = node.op == Op.OPT_STEP_SGD
    need(node, srcs, 3 if sgd else 5)
    w, params = srcs[0], srcs[-1]
    need_types(node, srcs, all(t.type == T.F32 for t in srcs))
    if not all(same_shape(t, w) for t in srcs[:-1]) or nelements(params) != (2 if sgd else 7):
        raise invalid(node, srcs, "weights, gradients and moments differ in shape, or wrong parameter count")
    if not contiguous(params):
        raise invalid(node, srcs, "the parameters must be contiguous")
    need_rows(node, srcs, *srcs[:-1])
    return Spec(ids.K.OPT_STEP, int(sgd), srcs=list(srcs))


# ---- Segment Anything ----

def rule_win_part(node, srcs):
    s = f32_like_source(node, srcs, same=False)
    if node.op == Op.WIN_PART:
        npx, npy, w = node.op_params[:3]
        ok = (w > 0 and npx > 0 and npy > 0 and s.ne[3] == 1
              and tuple(node.ne) == (s.ne[0], w, w, npx * npy))
    else:
        w = node.op_params[0]
        ok = (w > 0 and node.ne[3] == 1 and node.ne[0] == s.ne[0] and s.ne[1] == w and s.ne[2] == w
              and s.ne[3] >= -(-node.ne[1] // w) * -(-node.ne[2] // w))
    if not ok:
        raise invalid(node, srcs, "window shapes do not agree")
    if not (contiguous(s) and contiguous(node)):
        raise invalid(node, srcs, "source and result must be contiguous")
    return Spec(ids.K.WIN_PART, int(node.op == Op.WIN_UNPART), srcs=[s])


def rule_get_rel_pos(node, srcs):
    need(node, srcs, 1)
    s = srcs[0]
    need_types(node, srcs, s.type in (T.F16, T.BF16) and node.type == T.F16)
    ok = (node.ne[1] == node.ne[2] and s.ne[1] == 2 * node.ne[1] - 1 and s.ne[0] == node.ne[0]
          and node.ne[3] == 1 and contiguous(s) and contiguous(node))
    if not ok:
        raise invalid(node, srcs, "a (C, 2n - 1) table and a (C, n, n) result are needed")
    return Spec(ids.K.GET_REL_POS, srcs=[s])


def rule_add_rel_pos(node, srcs):
    need(node, srcs, 3)
    a, pw, ph = srcs
    need_types(node, srcs, all(t.type == T.F32 for t in srcs) and node.type == T.F32)
    ok = (same_shape(pw, ph) and same_shape(a, node) and all(contiguous(t) for t in (a, pw, ph, node))
          and pw.ne[3] == a.ne[2] and pw.ne[0] * pw.ne[0] == a.ne[0] and pw.ne[1] * pw.ne[2] == a.ne[1])
    if not ok:
        raise invalid(node, srcs, "shapes of attention and position terms do not agree")
    return Spec(ids.K.ADD_REL_POS, srcs=[a, pw, ph])


# ---- convolutions ----

def _conv_out(ins, ks, s, p, d):
    """ggml_calc_conv_output_size: C's division, which truncates toward zero (a
    kernel wider than the padded input still gives one output)."""
    num = ins + 2 * p - d * (ks - 1) - 1
    return (abs(num) // s) * (1 if num >= 0 else -1) + 1


def rule_conv(node, srcs):
    """CONV_2D / CONV_3D: ggml's im2col + matrix product, patch by patch."""
    need(node, srcs, 2)
    k, x = srcs
    three = node.op == Op.CONV_3D
    need_types(node, srcs, k.type in (T.F32, T.F16) and x.type == T.F32 and node.type == T.F32)
    op = node.op_params
    nd = 3 if three else 2
    s, p, d = (op[0:3], op[3:6], op[6:9]) if three else (op[0:2], op[2:4], op[4:6])
    if min(s) <= 0 or min(d) <= 0 or min(p) < 0:
        raise invalid(node, srcs, "strides and dilations must be positive, paddings not negative")
    if three:
        c, n, oc = op[9:12]
        ok = c > 0 and n > 0 and oc > 0 and k.ne[3] == c * oc and x.ne[3] == c * n and node.ne[3] == oc * n
    else:
        c, n, oc = x.ne[2], x.ne[3], k.ne[3]
        ok = k.ne[2] == c and tuple(node.ne[2:]) == (oc, n)
    ok = ok and all(node.ne[i] == _conv_out(x.ne[i], k.ne[i], s[i], p[i], d[i]) > 0 for i in range(nd))
    if not ok:
        raise invalid(node, srcs, "shapes of kernel, input and result do not agree")
    if not contiguous(k):
        raise invalid(node, srcs, "the kernel must be contiguous")
    K = nelements(k) // oc
    if K * ts(k) + oc * 4 > 16 << 20:
        raise unsupported(node, srcs, "with patches over ggml's 16 MiB work buffer")
    gemm = int(K % _ex().vec_lanes() == 0 and oc % 4 == 0)
    return Spec(ids.K.CONV, int(three), iparams=(0, gemm), srcs=[k, x])


def rule_conv_2d_dw(node, srcs):
    need(node, srcs, 2)
    k, x = srcs
    need_types(node, srcs, k.type in (T.F32, T.F16) and x.type == node.type == T.F32)
    op = node.op_params
    C = x.ne[2]
    ok = (k.ne[2] == 1 and k.ne[3] == C and min(op[0], op[1], op[4], op[5]) > 0 and min(op[2], op[3]) >= 0
          and node.ne[0] == _conv_out(x.ne[0], k.ne[0], op[0], op[2], op[4]) > 0
          and node.ne[1] == _conv_out(x.ne[1], k.ne[1], op[1], op[3], op[5]) > 0
          and tuple(node.ne[2:]) == tuple(x.ne[2:]))
    if not ok:
        raise invalid(node, srcs, "shapes of kernel, input and result do not agree")
    # ggml's two layouts: all contiguous, or channels innermost throughout
    tk = ts(k)
    whcn = contiguous(x) and contiguous(k) and contiguous(node)
    cwhn = (x.nb[2] == 4 and x.nb[0] == C * 4 and x.nb[1] == x.ne[0] * C * 4 and x.nb[3] == x.ne[1] * x.nb[1]
            and k.nb[3] == tk and k.nb[0] == C * tk and k.nb[1] == k.ne[0] * C * tk
            and node.nb[2] == 4 and node.nb[0] == C * 4 and node.nb[1] == node.ne[0] * C * 4
            and node.nb[3] == node.ne[1] * node.nb[1])
    if not (whcn or cwhn):
        raise unsupported(node, srcs, "with a layout other than WHCN or channels innermost")
    return Spec(ids.K.CONV_2D_DW, srcs=[k, x])


def rule_conv_transpose(node, srcs):
    need(node, srcs, 2)
    k, x = srcs
    two = node.op == Op.CONV_TRANSPOSE_2D
    need_types(node, srcs, k.type in (T.F32, T.F16) and x.type == node.type == T.F32)
    st = node.op_params[0]
    if two:
        ok = (k.ne[3] == x.ne[2] and node.ne[0] == (x.ne[0] - 1) * st + k.ne[0]
              and node.ne[1] == (x.ne[1] - 1) * st + k.ne[1] and node.ne[2] == k.ne[2] and node.ne[3] == x.ne[3])
    else:
        ok = (k.ne[3] == 1 and x.ne[2] == 1 and x.ne[3] == 1 and k.ne[2] == x.ne[1]
              and node.op_params[1] == 0 and node.op_params[2] == 1
              and tuple(node.ne) == ((x.ne[0] - 1) * st + k.ne[0], k.ne[1], 1, 1))
    if st <= 0 or not ok:
        raise invalid(node, srcs, "shapes of kernel, input and result do not agree")
    if not contiguous(node):
        raise invalid(node, srcs, "the result must be contiguous")
    return Spec(ids.K.CONV_TRANSPOSE, int(two), srcs=[k, x])


def rule_im2col_3d(node, srcs):
    need(node, srcs, 2)
    k, x = srcs
    need_types(node, srcs, x.type == T.F32 and node.type in (T.F32, T.F16))
    op = node.op_params
    IC = op[9]
    if min(op[0:3]) <= 0 or min(op[6:9]) <= 0 or min(op[3:6]) < 0 or IC <= 0 or x.ne[3] % IC:
        raise invalid(node, srcs, "bad strides, paddings, dilations or channel count")
    N = x.ne[3] // IC
    outs = [_conv_out(x.ne[i], k.ne[i], op[i], op[3 + i], op[6 + i]) for i in range(3)]
    if min(outs) <= 0 or tuple(node.ne) != (k.ne[0] * k.ne[1] * k.ne[2] * IC, outs[0], outs[1], outs[2] * N):
        raise invalid(node, srcs, "shapes of kernel, input and result do not agree")
    if not contiguous(node):
        raise invalid(node, srcs, "the result must be contiguous")
    return Spec(ids.K.IM2COL_3D, srcs=[k, x])


def rule_col2im_1d(node, srcs):
    need(node, srcs, 1)
    a = srcs[0]
    need_types(node, srcs, a.type == node.type and a.type in (T.F32, T.F16, T.BF16))
    s0, oc, p0 = node.op_params[:3]
    ok = (s0 > 0 and oc > 0 and p0 >= 0 and a.ne[0] % oc == 0 and a.ne[2] == a.ne[3] == 1
          and tuple(node.ne) == ((a.ne[1] - 1) * s0 + a.ne[0] // oc - 2 * p0, oc, 1, 1) and node.ne[0] > 0)
    if not ok:
        raise invalid(node, srcs, "shapes of columns and result do not agree")
    if not (contiguous(a) and contiguous(node)):
        raise invalid(node, srcs, "source and result must be contiguous")
    return Spec(ids.K.COL2IM_1D, srcs=[a])


def rule_im2col_back(node, srcs):
    need(node, srcs, 2)
    g, k = srcs
    need_types(node, srcs, g.type == T.F32 and node.type == T.F32)
    op = node.op_params
    two = op[6] == 1
    if min(op[0], op[1], op[4], op[5]) <= 0:
        raise invalid(node, srcs, "strides and dilations must be positive")
    N, IC = (node.ne[3], node.ne[2]) if two else (node.ne[2], node.ne[1])
    KH, KW = (k.ne[1] if two else 1), k.ne[0]
    ok = g.ne[0] == IC * KH * KW and (g.ne[3] == N if two else (g.ne[2] == N and g.ne[3] == 1 and node.ne[3] == 1))
    if not ok:
        raise invalid(node, srcs, "shapes of gradient, kernel and result do not agree")
    if not (contiguous(g) and contiguous(node)):
        raise invalid(node, srcs, "gradient and result must be contiguous")
    return Spec(ids.K.IM2COL_BACK, srcs=[g, k])


def rule_pool_2d_back(node, srcs):
    need(node, srcs, 2)
    g, f = srcs
    need_types(node, srcs, g.type == f.type == node.type == T.F32)
    op = node.op_params
    ok = (op[0] in (0, 1) and min(op[1:5]) > 0 and same_shape(f, node)
          and g.ne[2] == node.ne[2] and g.ne[3] == node.ne[3]
          and g.ne[0] == _pool_out(f.ne[0], op[1], op[3], op[5])
          and g.ne[1] == _pool_out(f.ne[1], op[2], op[4], op[6]))
    if not ok:
        raise invalid(node, srcs, "bad pooling or shapes of gradient, input and result do not agree")
    if not all(contiguous(t) for t in (g, f, node)):
        raise invalid(node, srcs, "gradient, input and result must be contiguous")
    return Spec(ids.K.POOL_2D_BACK, srcs=[g, f])


# ---- DeepSeek V4 ----

def rule_lightning_indexer(node, srcs):
    need(node, srcs, 4)
    q, k, w, m = srcs
    need_types(node, srcs, q.type == w.type == node.type == T.F32 and m.type == T.F16
               and (k.type in (T.F32, T.F16, T.BF16) or ggml.is_quantized(k.type)))
    need_quant(node, srcs, k, to_float=True)
    E, H, n_t, S = q.ne
    ok = (k.ne[0] == E and k.ne[1] == 1 and k.ne[3] == S and tuple(w.ne) == (H, n_t, 1, S)
          and m.ne[0] == k.ne[2] and m.ne[1] == n_t and m.ne[2] == 1 and S % m.ne[3] == 0
          and tuple(node.ne) == (k.ne[2], n_t, 1, S))
    if not ok:
        raise invalid(node, srcs, "shapes of q, k, weights, mask and result do not agree")
    need_rows(node, srcs, q, k, w, m, node)
    return Spec(ids.K.LIGHTNING_INDEXER, srcs=[q, k, w, m])


def rule_dsv4_hc_comb(node, srcs):
    need(node, srcs, 3)
    mx, sc, bs = srcs
    need_types(node, srcs, all(t.type == T.F32 for t in srcs) and node.type == T.F32)
    ok = (mx.ne[0] == 24 and mx.ne[2] == mx.ne[3] == 1 and sc.ne[0] >= 3 and bs.ne[0] == 24
          and tuple(node.ne) == (4, 4, mx.ne[1], 1) and node.op_params[1] > 0)
    if not ok:
        raise invalid(node, srcs, "needs 4 streams (24 mixes per token), a scale of 3+ and n_iter > 0")
    return Spec(ids.K.DSV4_HC_COMB, srcs=[mx, sc, bs])


def rule_dsv4_hc_pre(node, srcs):
    need(node, srcs, 2)
    x, w = srcs
    need_types(node, srcs, x.type == w.type == node.type == T.F32)
    E, hc, n_t = x.ne[:3]
    gated = node.op_params[1] != 0
    ok = (x.ne[3] == 1 and tuple(node.ne) == (E, n_t, 1, 1)
          and (tuple(w.ne) == (E, hc, n_t, 1) if gated else tuple(w.ne) == (hc, n_t, 1, 1)))
    if not ok:
        raise invalid(node, srcs, "shapes of streams, weights and result do not agree")
    return Spec(ids.K.DSV4_HC_PRE, srcs=[x, w])


def rule_dsv4_hc_post(node, srcs):
    need(node, srcs, 3, optional=1)
    x, r, p = srcs[:3]
    cb = srcs[3] if len(srcs) > 3 else None
    need_types(node, srcs, all(t.type == T.F32 for t in srcs) and node.type == T.F32)
    E, n_t = x.ne[0], x.ne[1]
    hc = r.ne[1]
    ok = (x.ne[2] == x.ne[3] == 1 and tuple(r.ne) == (E, hc, n_t, 1) and tuple(p.ne) == (hc, n_t, 1, 1)
          and (cb is None or tuple(cb.ne) == (hc, hc, n_t, 1)) and tuple(node.ne) == (E, hc, n_t, 1))
    if not ok:
        raise invalid(node, srcs, "shapes of output, residual, post, comb and result do not agree")
    return Spec(ids.K.DSV4_HC_POST, srcs=list(srcs))


RULES = {
    Op.DUP: rule_dup,
    Op.CONT: rule_dup,
    Op.CPY: rule_dup,
    Op.ADD: rule_binary,
    Op.SUB: rule_binary,
    Op.MUL: rule_binary,
    Op.DIV: rule_binary,
    Op.UNARY: rule_unary,
    Op.SQR: rule_simple_unary,
    Op.SQRT: rule_simple_unary,
    Op.LOG: rule_simple_unary,
    Op.SIN: rule_simple_unary,
    Op.COS: rule_simple_unary,
    Op.LEAKY_RELU: rule_simple_unary,
    Op.GLU: rule_glu,
    Op.SCALE: rule_scale,
    Op.GET_ROWS: rule_get_rows,
    Op.SET_ROWS: rule_set_rows,
    Op.RMS_NORM: _norm("RMS_NORM"),
    Op.NORM: _norm("NORM", strided=True),
    Op.L2_NORM: _norm("RMS_NORM", 1, strided=True),
    Op.GROUP_NORM: _norm("GROUP_NORM"),
    Op.SOFT_MAX: rule_soft_max,
    Op.ROPE: rule_rope,
    Op.ROPE_BACK: rule_rope,
    Op.MUL_MAT: rule_mul_mat,
    Op.FLASH_ATTN_EXT: rule_flash_attn,
    Op.ADD1: rule_add1,
    Op.CLAMP: rule_clamp,
    Op.ACC: rule_acc_set,
    Op.SET: rule_acc_set,
    Op.SUM: rule_sum,
    Op.SUM_ROWS: rule_sum_rows,
    Op.MEAN: rule_sum_rows,
    Op.CUMSUM: rule_cumsum,
    Op.ARGMAX: rule_argmax,
    Op.COUNT_EQUAL: rule_count_equal,
    Op.REPEAT: rule_repeat,
    Op.REPEAT_BACK: rule_repeat_back,
    Op.CONCAT: rule_concat,
    Op.PAD: rule_pad,
    Op.ARANGE: rule_arange,
    Op.TRI: rule_tri,
    Op.FILL: rule_fill,
    Op.DIAG_MASK_INF: rule_diag_mask,
    Op.DIAG_MASK_ZERO: rule_diag_mask,
    Op.DIAG: rule_diag,
    Op.ARGSORT: rule_argsort,
    Op.TOP_K: rule_argsort,
    Op.MUL_MAT_ID: rule_mul_mat_id,
    Op.ADD_ID: rule_add_id,
    Op.OUT_PROD: rule_out_prod,
    Op.SSM_CONV: rule_ssm_conv,
    Op.SSM_SCAN: rule_ssm_scan,
    Op.IM2COL: rule_im2col,
    Op.POOL_1D: rule_pool,
    Op.POOL_2D: rule_pool,
    Op.UPSCALE: rule_upscale,
    Op.ROLL: rule_roll,
    Op.PAD_REFLECT_1D: rule_pad_reflect_1d,
    Op.TIMESTEP_EMBEDDING: rule_timestep_embedding,
    Op.RWKV_WKV6: rule_rwkv_wkv6,
    Op.GATED_LINEAR_ATTN: rule_gated_linear_attn,
    Op.RWKV_WKV7: rule_rwkv_wkv7,
    Op.SOLVE_TRI: rule_solve_tri,
    Op.GATED_DELTA_NET: rule_gated_delta_net,
    Op.SILU_BACK: rule_silu_back,
    Op.GET_ROWS_BACK: rule_get_rows_back,
    Op.SOFT_MAX_BACK: rule_soft_max_back,
    Op.RMS_NORM_BACK: rule_rms_norm_back,
    Op.CROSS_ENTROPY_LOSS: rule_cross_entropy_loss,
    Op.CROSS_ENTROPY_LOSS_BACK: rule_cross_entropy_loss_back,
    Op.OPT_STEP_ADAMW: rule_opt_step,
    Op.OPT_STEP_SGD: rule_opt_step,
    Op.WIN_PART: rule_win_part,
    Op.WIN_UNPART: rule_win_part,
    Op.GET_REL_POS: rule_get_rel_pos,
    Op.ADD_REL_POS: rule_add_rel_pos,
    Op.CONV_2D: rule_conv,
    Op.CONV_3D: rule_conv,
    Op.CONV_2D_DW: rule_conv_2d_dw,
    Op.CONV_TRANSPOSE_1D: rule_conv_transpose,
    Op.CONV_TRANSPOSE_2D: rule_conv_transpose,
    Op.IM2COL_3D: rule_im2col_3d,
    Op.COL2IM_1D: rule_col2im_1d,
    Op.IM2COL_BACK: rule_im2col_back,
    Op.POOL_2D_BACK: rule_pool_2d_back,
    Op.LIGHTNING_INDEXER: rule_lightning_indexer,
    Op.DSV4_HC_COMB: rule_dsv4_hc_comb,
    Op.DSV4_HC_PRE: rule_dsv4_hc_pre,
    Op.DSV4_HC_POST: rule_dsv4_hc_post,
}
