"""Launchers: one function per kernel, choosing grid and block and typing the
arguments, shared by the CUDA device and the emulator tests.

Shapes are ggml's: `ne` lists the innermost dimension first, `nb` byte strides.
Device pointers are whatever the runtime passes to a kernel (a PyCUDA
DeviceAllocation, an emulator buffer).
"""
from __future__ import annotations

import math

import numpy as np

from .. import ggml
from ..ggml import GGMLOp, GGMLType as T
from . import type_list

i32, i64, f32 = np.int32, np.int64, np.float32

BLOCK = 256
MAX_BLOCKS = 4096          # grid-stride loops cover the rest
BIN_OPS = {"add": 0, "sub": 1, "mul": 2, "div": 3}


def grid_for(n: int, block: int = BLOCK, max_blocks: int = MAX_BLOCKS) -> tuple[int, int, int]:
    return (max(1, min(max_blocks, -(-n // block))), 1, 1)


def pad4(v, fill=1):
    v = list(v)
    return v + [fill] * (4 - len(v))


# ---- elementwise ----

def binary(k, op: str, dst, a, a_ne, a_nb, b, b_ne, b_nb, *, max_blocks=MAX_BLOCKS):
    """dst = a (op) b with b broadcast over a; dst contiguous with a's shape."""
    ne, bne = pad4(a_ne), pad4(b_ne)
    if any(x % y for x, y in zip(ne, bne)):
        raise ValueError(f"cannot broadcast {b_ne} over {a_ne}")
    anb, bnb = pad4(a_nb, 0), pad4(b_nb, 0)
    n = math.prod(ne)
    k.function("elementwise", "binary_f32")(
        i32(BIN_OPS[op]), dst, a, b, *map(i32, ne), *map(i64, anb[1:]), *map(i32, bne), *map(i64, bnb[1:]),
        block=(BLOCK, 1, 1), grid=grid_for(n, BLOCK, max_blocks))


def add_id(k, dst, a, b, ids, ne0: int, n_used: int, n_tokens: int):
    k.function("elementwise", "add_id_f32")(dst, a, b, ids, i32(ne0), i32(n_used), i32(n_tokens),
                                           block=(128, 1, 1), grid=(n_used * n_tokens, 1, 1))


def scale(k, dst, x, n: int, s: float, bias: float = 0.0, *, max_blocks=MAX_BLOCKS):
    k.function("elementwise", "scale_f32")(dst, x, f32(s), f32(bias), i64(n),
                                          block=(BLOCK, 1, 1), grid=grid_for(n, BLOCK, max_blocks))


def unary(k, op: int, dst, x, n: int, params=(0.0, 0.0, 0.0, 0.0), *, max_blocks=MAX_BLOCKS):
    """op: a GGMLUnaryOp value; params: XIELU's op params 1..4 (alpha_n, alpha_p, beta, eps)."""
    k.function("elementwise", "unary_f32")(i32(op), dst, x, i64(n), *map(f32, params),
                                          block=(BLOCK, 1, 1), grid=grid_for(n, BLOCK, max_blocks))


MATH_OPS = ("SQR", "SQRT", "LOG", "SIN", "COS", "CLAMP", "LEAKY_RELU")


def math_op(k, op: int, dst, x, n: int, p0: float = 0.0, p1: float = 0.0, *, max_blocks=MAX_BLOCKS):
    """op: a GGMLOp value among MATH_OPS; p0, p1: CLAMP's (min, max), LEAKY_RELU's slope."""
    if GGMLOp(op).name not in MATH_OPS:
        raise ValueError(f"{GGMLOp(op).name} is not an element-wise op of math_f32")
    k.function("elementwise", "math_f32")(i32(op), dst, x, i64(n), f32(p0), f32(p1),
                                         block=(BLOCK, 1, 1), grid=grid_for(n, BLOCK, max_blocks))


def glu(k, op: int, dst, a, b, nc: int, nrows: int, lda: int, ldb: int, alpha=1.702, limit=7.0,
        *, max_blocks=MAX_BLOCKS):
    """op: a GGMLGluOp value; a, b: row pointers with element strides lda, ldb."""
    k.function("elementwise", "glu_f32")(i32(op), dst, a, b, i32(nc), i32(nrows), i64(lda), i64(ldb),
                                        f32(alpha), f32(limit),
                                        block=(BLOCK, 1, 1), grid=grid_for(nc * nrows, BLOCK, max_blocks))


def concat(k, dst, a, b, a_ne, b_ne, dim: int):
    ane, bne = pad4(a_ne), pad4(b_ne)
    ne = list(ane)
    ne[dim] += bne[dim]
    k.function("elementwise", "concat_f32")(dst, a, b, i32(dim), *map(i32, ne), *map(i32, ane),
                                           block=(BLOCK, 1, 1), grid=grid_for(math.prod(ne)))


def repeat(k, dst, src, dst_ne, src_ne):
    ne, sne = pad4(dst_ne), pad4(src_ne)
    k.function("elementwise", "repeat_f32")(dst, src, *map(i32, ne), *map(i32, sne),
                                           block=(BLOCK, 1, 1), grid=grid_for(math.prod(ne)))


# ---- norm, softmax, rope ----

NORM_KINDS = {"rms_norm": 0, "norm": 1, "l2_norm": 2}


def row_block(ncols: int) -> int:
    """Threads per row for the row-wise kernels: a warp for short rows."""
    return 32 if ncols < 1024 else 256


def norm(k, kind: str, dst, x, ncols: int, nrows: int, ldx: int, eps: float, block: int | None = None):
    k.function("norm", "norm_f32")(i32(NORM_KINDS[kind]), dst, x, i32(ncols), i64(ldx), f32(eps),
                                  block=(block or row_block(ncols), 1, 1), grid=(nrows, 1, 1))


def row_sum(k, dst, x, ncols: int, nrows: int, ldx: int, mean: bool = False, block: int | None = None):
    """SUM_ROWS (or MEAN): dst (nrows,) f32."""
    k.function("norm", "row_sum_f32")(i32(bool(mean)), dst, x, i32(ncols), i64(ldx),
                                     block=(block or row_block(ncols), 1, 1), grid=(nrows, 1, 1))


def alibi(max_bias: float, n_head: int) -> tuple[float, float, int]:
    """(m0, m1, n_head_log2) as ggml derives the ALiBi slopes."""
    n_head_log2 = 1 << int(math.floor(math.log2(n_head))) if n_head > 0 else 1
    m0 = 2.0 ** (-max_bias / n_head_log2)
    m1 = 2.0 ** (-(max_bias / 2.0) / n_head_log2)
    return m0, m1, n_head_log2


NULL = np.intp(0)


def soft_max(k, dst, x, ncols: int, ne01: int, ne02: int, ne03: int, ldx: int, *, mask=None,
             mask_ne=(1, 1, 1), mask_f16=False, sinks=None, scale=1.0, max_bias=0.0, block=None):
    """x: (ne03, ne02, ne01, ncols) rows at stride ldx; mask_ne: (ne11, ne12, ne13)."""
    m0, m1, nhl2 = alibi(max_bias, ne02)
    k.function("softmax", "soft_max_f32")(
        dst, x, NULL if mask is None else mask, NULL if sinks is None else sinks, i32(ncols), i64(ldx),
        i32(ne01), i32(ne02), *map(i32, mask_ne), i32(bool(mask_f16)), f32(scale), f32(max_bias), f32(m0),
        f32(m1), i32(nhl2), block=(block or row_block(ncols), 1, 1), grid=(ne01 * ne02 * ne03, 1, 1))


ROPE_MODES = {0: "normal", 2: "neox", 8: "mrope", 40: "imrope"}


def yarn_corr_dims(n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float, beta_slow: float):
    def corr_dim(n_rot):
        return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(freq_base))
    start = math.floor(corr_dim(beta_fast))
    end = math.ceil(corr_dim(beta_slow))
    return float(max(0, start)), float(min(n_dims - 1, end))


def rope(k, dst, x, pos, ne, nb, n_dims: int, mode: int, *, freq_base=10000.0, freq_scale=1.0,
         ext_factor=0.0, attn_factor=1.0, n_ctx_orig=0, beta_fast=32.0, beta_slow=1.0, freq_factors=None,
         sections=(0, 0, 0, 0), max_blocks=MAX_BLOCKS):
    """x: (ne2 tokens, ne1 heads, ne0) with byte strides nb (nb[0] == 4)."""
    if mode not in ROPE_MODES:
        raise ValueError(f"rope mode {mode} is not supported on CUDA yet")
    corr = yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow) if ext_factor else (0.0, 0.0)
    ne0, ne1, ne2 = ne[:3]
    n = ne0 // 2 * ne1 * ne2
    k.function("rope", "rope_f32")(
        dst, x, pos, NULL if freq_factors is None else freq_factors, i32(ne0), i32(ne1), i32(ne2), i64(nb[1]),
        i64(nb[2]), i32(n_dims), i32(mode), f32(freq_base), f32(freq_scale), f32(ext_factor), f32(attn_factor),
        f32(corr[0]), f32(corr[1]), *map(i32, sections),
        block=(BLOCK, 1, 1), grid=grid_for(n, BLOCK, max_blocks))


# ---- rows: GET_ROWS, SET_ROWS, CPY ----

def _types(names) -> tuple[int, ...]:
    return tuple(T[n.upper()] for n in names)


# which types have kernels: read from the X-macro lists in the kernel sources
TYPES = _types(type_list("GR_ALL_TYPES"))                # GET_ROWS, mat-vec, tiled GEMM, dequantize
QUANT_TYPES = _types(type_list("GR_QUANT_TYPES"))        # the dp4a mat-vec
STORE_TYPES = _types(type_list("GR_STORE_TYPES", "rows"))   # SET_ROWS, F32 -> blocks
FA_TYPES = _types(type_list("GR_FA_TYPES", "flash_attn"))   # FLASH_ATTN_EXT K/V
FLOAT_TYPES = (T.F32, T.F16, T.BF16)
SCALAR_IDS = {T.F32: 0, T.F16: 1, T.BF16: 2}


def _suffix(type_: int, among=TYPES) -> str:
    """The kernel-name suffix of a type (`q4_K` for Q4_K)."""
    if type_ not in among:
        raise ValueError(f"type {T(type_).name} has no such CUDA kernel")
    name = T(type_).name.lower()
    return name[:-2] + "_K" if name.endswith("_k") else name


def row_bytes(type_: int, n: int) -> int:
    qk, bs = ggml.blck_size(type_), ggml.type_size(type_)
    if n % qk:
        raise ValueError(f"{n} elements are not whole blocks of {T(type_).name}")
    return n // qk * bs


NO_CHECK = 2**31 - 1       # a row count that lets every index through


def get_rows(k, type_: int, dst, src, ids, ne00: int, ids_ne, nb, *, n_rows=NO_CHECK, err=None, err_code=1):
    """src rows of type_ with byte strides nb = (nb0, nb1, nb2, nb3); ids (ne10, ne11, ne12) i32.
    An id outside [0, n_rows) reads nothing and stores err_code at err (an i32 on the device)."""
    ne10, ne11, ne12 = pad4(ids_ne)[:3]
    block = 32 if ne00 <= 64 else 128
    k.function("rows", f"get_rows_{_suffix(type_)}")(
        dst, src, ids, i32(ne00), i32(ne10), i32(ne11), i64(nb[1]), i64(nb[2]), i64(nb[3]), i32(n_rows),
        NULL if err is None else err, i32(err_code), block=(block, 1, 1), grid=(ne10 * ne11 * ne12, 1, 1))


def set_rows(k, type_: int, dst, dst_nb, src, src_ne, ids, ids_ne, ids_i32=False, *, max_blocks=MAX_BLOCKS,
             n_rows=NO_CHECK, err=None, err_code=1):
    """src (ne00, ne01, ne02, ne03) f32 contiguous; ids (ne01, ne11, ne12) i64 or i32. An id outside
    [0, n_rows) writes nothing and stores err_code at err (an i32 on the device)."""
    if type_ not in STORE_TYPES:
        raise ValueError(f"SET_ROWS to {T(type_).name} is not supported on CUDA yet")
    ne = pad4(src_ne)
    _, ne11, ne12 = pad4(ids_ne)[:3]
    row_bytes(type_, ne[0])
    n = ne[0] // ggml.blck_size(type_) * ne[1] * ne[2] * ne[3]
    k.function("rows", f"set_rows_{_suffix(type_)}")(
        dst, src, ids, i32(bool(ids_i32)), *map(i32, ne), i32(ne11), i32(ne12), *map(i64, pad4(dst_nb, 0)[1:]),
        i64(n_rows), NULL if err is None else err, i32(err_code), block=(BLOCK, 1, 1), grid=grid_for(n, BLOCK, max_blocks))


def cpy_scalar(k, dst, dtype: int, dst_nb, src, stype: int, src_nb, ne, *, max_blocks=MAX_BLOCKS):
    """Between F32/F16/BF16 with any byte strides."""
    ne = pad4(ne)
    k.function("rows", "cpy_scalar")(
        dst, i32(SCALAR_IDS[dtype]), src, i32(SCALAR_IDS[stype]), *map(i32, ne), *map(i64, pad4(src_nb, 0)),
        *map(i64, pad4(dst_nb, 0)), block=(BLOCK, 1, 1), grid=grid_for(math.prod(ne), BLOCK, max_blocks))


def cpy_to_blocks(k, type_: int, dst, src, ne00: int, nrows: int, src_ld: int, dst_ld: int):
    """F32 rows (byte stride src_ld) into rows of type_ blocks (byte stride dst_ld)."""
    if type_ not in STORE_TYPES:
        raise ValueError(f"CPY to {T(type_).name} is not supported on CUDA yet")
    row_bytes(type_, ne00)
    n = ne00 // ggml.blck_size(type_) * nrows
    k.function("rows", f"quantize_rows_{_suffix(type_)}")(dst, src, i32(ne00), i32(nrows), i64(src_ld), i64(dst_ld),
                                                   block=(BLOCK, 1, 1), grid=grid_for(n))


def cpy_from_blocks(k, type_: int, dst, src, ne00: int, nrows: int, src_ld: int, dst_ld: int):
    """Rows of type_ (byte stride src_ld) into F32 rows (byte stride dst_ld)."""
    k.function("rows", f"dequantize_rows_{_suffix(type_)}")(dst, src, i32(ne00), i32(nrows), i64(src_ld), i64(dst_ld),
                                                   block=(BLOCK, 1, 1), grid=grid_for(ne00 * nrows))


# ---- MUL_MAT, MUL_MAT_ID ----

MMV_WARPS = 4              # GR_MMV_WARPS in matmul.cu
QUANTIZE_WARPS = 8
TILE, TILE_THREADS = 32, 16
MMVQ_MAX_COLS = 8          # up to this many activation columns the mat-vec kernels win
MMVQ_COLS = 8              # GR_MMVQ_COLS: columns one dp4a mat-vec block handles


def q8_1_bytes(ncols: int, ncols_total: int) -> int:
    """Scratch for activations quantized to q8_1: ncols_total columns of ncols values."""
    return -(-ncols // 32) * 36 * ncols_total


def choose_mul_mat(type_: int, ncols_y: int) -> str:
    if ncols_y <= MMVQ_MAX_COLS:
        return "mmvq" if type_ in QUANT_TYPES else "vec"
    return "tiled"


def _quantize_q8_1(k, q8, x, ncols: int, ncols_y: int, nz: int, x_col: int, x_mat: int):
    nb = -(-ncols // 32)
    k.function("matmul", "quantize_q8_1")(q8, x, i32(ncols), i32(32 * nb), i32(ncols_y), i64(x_col), i64(x_mat),
                                         block=(32, QUANTIZE_WARPS, 1),
                                         grid=(-(-nb // QUANTIZE_WARPS), ncols_y * nz, 1))
    return nb


def _mat_vec(k, type_, strategy, dst, w, x, ids, ncols, nrows, cols, nz, w_row, w_mat, x_col, x_mat,
             d_col, d_mat, r2, ne11, ids_ld, q8_scratch):
    suffix = _suffix(type_)
    grid = (-(-nrows // MMV_WARPS), cols, nz)
    tail = (i64(d_col), i64(d_mat), i32(r2), i32(ne11), i32(ids_ld))
    if strategy == "mmvq":
        if type_ not in QUANT_TYPES:
            raise ValueError(f"the dp4a mat-vec takes quantized weights, not {T(type_).name}")
        if q8_scratch is None:
            raise ValueError("mmvq needs q8_scratch of q8_1_bytes(ncols, columns) bytes")
        ycols = ne11 if ids is not None else cols
        nb = _quantize_q8_1(k, q8_scratch, x, ncols, ycols, nz, x_col, x_mat)
        per_block = 1 if ids is not None else MMVQ_COLS     # plain: weights read once per 8 columns
        k.function("matmul", f"mul_mat_vec_q_{suffix}")(
            w, q8_scratch, dst, NULL if ids is None else ids, i32(ncols), i32(nrows), i32(cols), i32(per_block),
            i64(w_row), i64(w_mat), i64(nb), i64(nb * ycols), *tail, block=(32, MMV_WARPS, 1),
            grid=(grid[0], -(-cols // per_block), nz))
    else:
        k.function("matmul", f"mul_mat_vec_{suffix}")(
            w, x, dst, NULL if ids is None else ids, i32(ncols), i32(nrows), i64(w_row), i64(w_mat), i64(x_col),
            i64(x_mat), *tail, block=(32, MMV_WARPS, 1), grid=grid)


def mul_mat(k, type_: int, dst, w, x, ncols: int, nrows: int, ncols_y: int, *, nz: int = 1, r2: int = 1,
            w_row: int | None = None, w_mat: int = 0, x_col: int | None = None, x_mat: int | None = None,
            d_col: int | None = None, d_mat: int | None = None, strategy: str | None = None, q8_scratch=None):
    """dst[z][c][r] = W[z / r2][r] . X[z][c]: W rows of ncols type_ values (byte strides w_row,
    w_mat), X f32 columns (float strides x_col, x_mat), dst f32 (float strides d_col, d_mat)."""
    w_row = row_bytes(type_, ncols) if w_row is None else w_row
    x_col = ncols if x_col is None else x_col
    x_mat = x_col * ncols_y if x_mat is None else x_mat
    d_col = nrows if d_col is None else d_col
    d_mat = d_col * ncols_y if d_mat is None else d_mat
    strategy = strategy or choose_mul_mat(type_, ncols_y)
    if strategy == "tiled":
        k.function("matmul", f"mul_mat_tiled_{_suffix(type_)}")(
            w, x, dst, i32(ncols), i32(nrows), i32(ncols_y), i64(w_row), i64(w_mat), i64(x_col), i64(x_mat),
            i64(d_col), i64(d_mat), i32(r2), block=(TILE_THREADS, TILE_THREADS, 1),
            grid=(-(-nrows // TILE), -(-ncols_y // TILE), nz))
        return
    _mat_vec(k, type_, strategy, dst, w, x, None, ncols, nrows, ncols_y, nz, w_row, w_mat, x_col, x_mat,
             d_col, d_mat, r2, 1, 0, q8_scratch)


def mul_mat_id(k, type_: int, dst, w, x, ids, ncols: int, nrows: int, n_used: int, n_tokens: int, ne11: int,
               *, w_row: int | None = None, w_mat: int | None = None, ids_ld: int | None = None,
               strategy: str | None = None, q8_scratch=None):
    """dst[t][e] = W[ids[t][e]] . X[t][e % ne11]: W (n_expert, nrows, ncols) type_, X (n_tokens,
    ne11, ncols) f32, ids (n_tokens, ids_ld) i32, dst (n_tokens, n_used, nrows) f32, all contiguous."""
    w_row = row_bytes(type_, ncols) if w_row is None else w_row
    w_mat = w_row * nrows if w_mat is None else w_mat
    strategy = strategy or ("mmvq" if type_ in QUANT_TYPES else "vec")
    _mat_vec(k, type_, strategy, dst, w, x, ids, ncols, nrows, n_used, n_tokens, w_row, w_mat, ncols,
             ncols * ne11, nrows, nrows * n_used, 1, ne11, n_used if ids_ld is None else ids_ld, q8_scratch)


def sanitize_ids(k, out, ids, n_used: int, n_tokens: int, ids_ld: int, n_as: int, *, err=None, err_code=1):
    """MUL_MAT_ID's ids (n_tokens, ids_ld) i32 packed into out (n_tokens, n_used), an id
    outside [0, n_as) replaced by 0 and reported as err_code at err."""
    k.function("matmul", "sanitize_ids")(out, ids, i32(n_used), i32(n_tokens), i64(ids_ld), i32(n_as),
                                         NULL if err is None else err, i32(err_code),
                                         block=(BLOCK, 1, 1), grid=grid_for(n_used * n_tokens))


# ---- FLASH_ATTN_EXT ----

FA_WARPS = 4
FA_HEAD_SIZES = (256, 576)     # kernels for head sizes up to each


def flash_attn_ext(k, kv_type: int, dst, q, kk, v, D: int, Dv: int, n_q: int, H: int, n_kv: int, H_kv: int,
                   *, B: int = 1, q_nb=None, k_nb=None, v_nb=None, mask=None, mask_nb=None, mask_ne=(1, 1),
                   sinks=None, scale=1.0, max_bias=0.0, softcap=0.0):
    """q (B, H, n_q, D) f32, k (B, H_kv, n_kv, D) and v (B, H_kv, n_kv, Dv) of kv_type, strides in
    bytes as ggml's nb (innermost first); mask F16 (.., n_q.., n_kv); dst (B, n_q, H, Dv) f32."""
    if kv_type not in FA_TYPES:
        raise ValueError(f"FLASH_ATTN_EXT with {T(kv_type).name} K/V is not supported on CUDA yet")
    maxd = next((m for m in FA_HEAD_SIZES if max(D, Dv) <= m), None)
    if maxd is None:
        raise ValueError(f"FLASH_ATTN_EXT head size {max(D, Dv)} > {FA_HEAD_SIZES[-1]}")
    q_nb = q_nb or (4, 4 * D, 4 * D * n_q, 4 * D * n_q * H)
    krow = row_bytes(kv_type, D)
    k_nb = k_nb or (0, krow, krow * n_kv, krow * n_kv * H_kv)
    vrow = row_bytes(kv_type, Dv)
    v_nb = v_nb or (0, vrow, vrow * n_kv, vrow * n_kv * H_kv)
    mask_nb = mask_nb or (2, 2 * n_kv, 2 * n_kv * n_q, 2 * n_kv * n_q)
    m0, m1, nhl2 = alibi(max_bias, H)
    k.function("flash_attn", f"flash_attn_vec{maxd}_{_suffix(kv_type, FA_TYPES)}")(
        dst, q, kk, v, NULL if mask is None else mask, NULL if sinks is None else sinks, i32(D), i32(Dv), i32(n_q),
        i32(H), i32(B), i32(n_kv), i32(H_kv), *(i64(n // 4) for n in q_nb[1:4]), *map(i64, k_nb[1:4]),
        *map(i64, v_nb[1:4]), *(i64(n // 2) for n in mask_nb[1:4]), *map(i32, mask_ne), f32(scale),
        f32(max_bias), f32(m0), f32(m1), i32(nhl2), f32(softcap),
        block=(32, FA_WARPS, 1), grid=(-(-(n_q * H * B) // FA_WARPS), 1, 1))


# ---- ARGSORT, TOP_K ----

SORT_SHARED_MAX = 1024     # longer rows sort in a global scratch row


def sort_pad(ncols: int) -> int:
    return 1 << max(0, (ncols - 1).bit_length())


def argsort_scratch_bytes(ncols: int, nrows: int) -> int:
    """Scratch the long-row argsort needs (0 for rows that sort in shared memory)."""
    pad = sort_pad(ncols)
    return 0 if pad <= SORT_SHARED_MAX else 4 * pad * nrows


def argsort(k, dst, x, ncols: int, nrows: int, ldx: int, descending=False, top_k: int | None = None,
            scratch=None):
    """dst: (nrows, top_k or ncols) i32 indices of each row in sorted order."""
    pad = sort_pad(ncols)
    kk = ncols if top_k is None else top_k
    tail = (i32(ncols), i32(pad), i64(ldx), i32(int(descending)), i32(kk))
    if pad <= SORT_SHARED_MAX:
        k.function("sort", "argsort_f32")(dst, x, *tail, block=(pad, 1, 1), grid=(nrows, 1, 1), shared=4 * pad)
        return
    if scratch is None:
        raise ValueError(f"ARGSORT of rows of {ncols} needs argsort_scratch_bytes() of scratch")
    k.function("sort", "argsort_f32_large")(dst, scratch, x, *tail, block=(SORT_SHARED_MAX, 1, 1),
                                            grid=(nrows, 1, 1))
