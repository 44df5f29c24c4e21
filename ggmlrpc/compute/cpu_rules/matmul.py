"""CPU kernels of the matrix products. MUL_MAT converts src1 to ggml's vec_dot type
of the weights and picks ggml's summation order for the shape (the path in
iparams[1]), so that the result is bit-identical with the reference build."""
from __future__ import annotations

from ... import ggml
from ...ggml import GGMLOp as Op
from ...ggml import GGMLType as T
from ...ops import matmul as rules
from ...ops.base import contiguous, invalid
from .base import Spec, need_types, simple, unsupported
from .kernels import executor, ids, path

# weights whose prompt-time products ggml computes in its tiled K-quant order
TILED_TYPES = (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS)


def vec_dot_type(w) -> int:
    """The type src1 is converted to for weights w (-1: none)."""
    return executor().vec_dot_type(w.type) if w.type not in (T.F32, T.F16) else w.type


def _weight_types(node, srcs, vdt, ok: bool):
    """Weights with a vec_dot, an F32 result, activations given or converted as vdt."""
    ex = executor()
    w, x = srcs[0], srcs[1]
    if vdt < 0 or not ok:
        raise unsupported(node, srcs)
    if w.type not in (T.F32, T.F16) and not ex.has_vec_dot(w.type):
        raise unsupported(node, srcs)
    if x.type != vdt:
        converts = x.type == T.F32 and (vdt in (T.F32, T.F16) or ex.has_from_float(vdt))
        if node.op == Op.MUL_MAT:
            converts = converts or (vdt == T.F32 and x.type in (T.F16, T.BF16))
        need_types(node, srcs, converts)


def _product_types(node, srcs):
    if node.op_params[1] != ggml.MUL_MAT_HINT_NONE:
        raise unsupported(node, srcs, f"has hint {node.op_params[1]}")
    _weight_types(node, srcs, vec_dot_type(srcs[0]), node.type == T.F32)


def _whole_blocks(node, srcs, K, vdt):
    """The activation rows (K of them) in whole blocks of vdt; returns their bytes."""
    if K % ggml.blck_size(vdt):
        raise invalid(node, srcs, "rows are not whole blocks of the activation type")
    return K // ggml.blck_size(vdt) * ggml.type_size(vdt)


def _hadamard_types(node, srcs):
    need_types(node, srcs, srcs[1].type in (T.F32, T.F16) and node.type == T.F32)


def rule_mul_mat(node, srcs):
    if rules.is_hadamard(node):
        return Spec(ids.K.FWHT, srcs=rules.hadamard(node, srcs, _hadamard_types))
    w, x = rules.product(node, srcs, _product_types)
    ex = executor()
    vdt = vec_dot_type(w)
    K, M, N = w.ne[0], w.ne[1], x.ne[1]
    row_size = _whole_blocks(node, srcs, K, vdt)
    # ggml's summation order: its prompt-time GEMM for F32/F16 weights, its tiled
    # K-quant GEMM from 8 activation rows on, else one vec_dot per output (whose
    # order is tinyBLAS's too for Q4_0, Q5_0 and Q8_0)
    x_ready = x.type != vdt or contiguous(x)
    order = path("MUL_MAT", "VEC_DOT")
    if w.type in (T.F32, T.F16) and N >= 2 and K % ex.vec_lanes() == 0 and M % 4 == 0 and x_ready:
        order = path("MUL_MAT", "GEMM")
    # BF16: tinyBLAS's one accumulator, over VDPBF16PS steps of 32 on an AVX512-BF16
    # build, else over the family's lanes (it takes 4 weight rows at a time, as for F32)
    bf16_step = 32 if ex.has_bf16_products() else ex.vec_lanes()
    if w.type == T.BF16 and N >= 2 and K % bf16_step == 0 and M % 4 == 0 and x_ready:
        order = path("MUL_MAT", "GEMM")
    if w.type in TILED_TYPES and N >= 8:
        order = path("MUL_MAT", "TILED")
    # IQ4_NL from 2 activation rows on: tinyBLAS's one accumulator per output
    # (vec_dot has two); like ggml, only for src1 converted here or contiguous
    if w.type == T.IQ4_NL and N >= 2 and x_ready:
        order = path("MUL_MAT", "Q0_GEMM")
    return Spec(ids.K.MUL_MAT, iparams=(vdt, order, row_size), srcs=[w, x])


def _mul_mat_id_types(node, srcs):
    _weight_types(node, srcs, vec_dot_type(srcs[0]), node.type == T.F32 and srcs[2].type == T.I32)


def rule_mul_mat_id(node, srcs):
    w, x, sel = rules.mul_mat_id(node, srcs, _mul_mat_id_types)
    vdt = vec_dot_type(w)
    row_size = _whole_blocks(node, srcs, w.ne[0], vdt)
    # experts with 8 routed rows or more take ggml's tiled K-quant order
    order = path("MUL_MAT", "TILED") if w.type in TILED_TYPES else path("MUL_MAT", "VEC_DOT")
    return Spec(ids.K.MUL_MAT_ID, iparams=(vdt, order, row_size), srcs=[w, x, sel])


def _out_prod_types(node, srcs):
    a, b = srcs
    need_types(node, srcs, b.type == T.F32 and node.type == T.F32 and
               (a.type in (T.F32, T.F16) or (ggml.is_quantized(a.type) and executor().has_to_float(a.type))))


RULES = {
    Op.MUL_MAT: rule_mul_mat,
    Op.MUL_MAT_ID: rule_mul_mat_id,
    Op.OUT_PROD: simple("OUT_PROD", rules.out_prod, _out_prod_types),
}
