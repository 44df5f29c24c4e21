# cython: language_level=3, boundscheck=False, wraparound=False
"""NumPy access to csrc/cpu/quants/quants.c: fp16/bf16 conversion, row (de)quantization and
the MUL_MAT dot products, for tests and benchmarks. The executor calls the C API
directly; nothing here is on a hot path.

Rows are 1-D: float32 arrays of n elements, or uint8 arrays holding n/blck blocks.
"""
from libc.stdint cimport int64_t, uint16_t, uint32_t

import numpy as np

from ggmlrpc._native.rpc cimport ggmlrpc_blck_size, ggmlrpc_type_size


cdef extern from "cpu/quants/quants.h" nogil:
    float ggmlrpc_fp16_to_fp32(uint16_t h)
    uint16_t ggmlrpc_fp32_to_fp16(float f)
    float ggmlrpc_bf16_to_fp32(uint16_t h)
    uint16_t ggmlrpc_fp32_to_bf16(float f)
    int ggmlrpc_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n)
    int ggmlrpc_quantize_row(uint32_t type, const float *src, void *dst, int64_t n)
    int ggmlrpc_quantize_row_ref(uint32_t type, const float *src, void *dst, int64_t n)
    int ggmlrpc_vec_dot_type(uint32_t weight_type)
    int ggmlrpc_vec_dot(uint32_t weight_type, int64_t n, float *s, const void *w_row, const void *act_row)
    int ggmlrpc_quants_simd(int level)


def simd(int level=-1):
    """The kernel level in force (0 portable C, 1 AVX2+FMA+F16C, 2 that and the
    AVX-512 VNNI decode kernels); with level >= 0
    set it first (clamped to what this CPU has). Process-wide."""
    return ggmlrpc_quants_simd(level)


def vec_dot_type(uint32_t weight_type):
    """ggml's MUL_MAT activation type for weight_type, or -1."""
    return ggmlrpc_vec_dot_type(weight_type)


cdef int64_t _row_bytes(uint32_t type, int64_t n) except -1:
    cdef int64_t blck = ggmlrpc_blck_size(type)
    if blck <= 0:
        raise ValueError(f"unknown type {type}")
    if n < 0 or n % blck:
        raise ValueError(f"{n} elements is not a whole number of blocks of {blck}")
    return n // blck * <int64_t>ggmlrpc_type_size(type)


cdef int64_t _row_elems(uint32_t type, int64_t nbytes) except -1:
    cdef int64_t blck = ggmlrpc_blck_size(type)
    cdef int64_t tsize = <int64_t>ggmlrpc_type_size(type)
    if blck <= 0:
        raise ValueError(f"unknown type {type}")
    if nbytes % tsize:
        raise ValueError(f"{nbytes} bytes is not a whole number of blocks of {tsize} bytes")
    return nbytes // tsize * blck


def dequantize(uint32_t type, raw):
    """Blocks of `type` (any bytes-like) -> float32 array."""
    cdef const unsigned char[::1] src = np.frombuffer(raw, dtype=np.uint8)
    cdef int64_t n = _row_elems(type, src.shape[0])
    out = np.empty(n, dtype=np.float32)
    cdef float[::1] dst = out
    cdef const void *sp = &src[0] if src.shape[0] else NULL
    cdef float *dp = &dst[0] if n else NULL
    cdef int rc
    with nogil:
        rc = ggmlrpc_dequantize_row(type, sp, dp, n)
    if rc != 0:
        raise ValueError(f"cannot dequantize type {type}")
    return out


def quantize(uint32_t type, x, bint ref=False):
    """float32 row -> uint8 array of `type` blocks. ref=True: Q8_0/Q8_1 as
    ggml-quants.c's reference instead of ggml's x86 CPU path."""
    cdef const float[::1] src = np.ascontiguousarray(x, dtype=np.float32)
    cdef int64_t n = src.shape[0]
    out = np.empty(_row_bytes(type, n), dtype=np.uint8)
    cdef unsigned char[::1] dst = out
    cdef const float *sp = &src[0] if n else NULL
    cdef void *dp = &dst[0] if dst.shape[0] else NULL
    cdef int rc
    with nogil:
        if ref:
            rc = ggmlrpc_quantize_row_ref(type, sp, dp, n)
        else:
            rc = ggmlrpc_quantize_row(type, sp, dp, n)
    if rc != 0:
        raise ValueError(f"cannot quantize to type {type}")
    return out


def vec_dot(uint32_t weight_type, w_row, act_row):
    """Dot product of one weight row (blocks of weight_type) with one activation
    row already in vec_dot_type(weight_type)."""
    cdef int act = ggmlrpc_vec_dot_type(weight_type)
    if act < 0:
        raise ValueError(f"no dot product for type {weight_type}")
    cdef const unsigned char[::1] w = np.frombuffer(w_row, dtype=np.uint8)
    cdef const unsigned char[::1] a = np.frombuffer(act_row, dtype=np.uint8)
    cdef int64_t n = _row_elems(weight_type, w.shape[0])
    if _row_bytes(<uint32_t>act, n) != a.shape[0]:
        raise ValueError(f"activation row has {a.shape[0]} bytes, expected {_row_bytes(act, n)}")
    if n == 0:
        return 0.0
    cdef float s = 0
    cdef int rc
    with nogil:
        rc = ggmlrpc_vec_dot(weight_type, n, &s, &w[0], &a[0])
    if rc != 0:
        raise ValueError(f"no dot product for type {weight_type}")
    return s


cdef object _half_to_f32(h, uint32_t type, bint scalar):
    """binary16 (type F16) or bfloat16 (BF16) bits -> float32, through the row
    kernel or one value at a time through the scalar conversion."""
    cdef const uint16_t[::1] src = np.ascontiguousarray(h, dtype=np.uint16)
    cdef int64_t n = src.shape[0], i
    out = np.empty(n, dtype=np.float32)
    cdef float[::1] dst = out
    if n == 0:
        return out
    with nogil:
        if not scalar:
            ggmlrpc_dequantize_row(type, &src[0], &dst[0], n)
        elif type == 1:
            for i in range(n):
                dst[i] = ggmlrpc_fp16_to_fp32(src[i])
        else:
            for i in range(n):
                dst[i] = ggmlrpc_bf16_to_fp32(src[i])
    return out


cdef object _f32_to_half(x, uint32_t type, bint scalar):
    """float32 -> binary16 (F16) or bfloat16 (BF16) bits."""
    cdef const float[::1] src = np.ascontiguousarray(x, dtype=np.float32)
    cdef int64_t n = src.shape[0], i
    out = np.empty(n, dtype=np.uint16)
    cdef uint16_t[::1] dst = out
    if n == 0:
        return out
    with nogil:
        if not scalar:
            ggmlrpc_quantize_row(type, &src[0], &dst[0], n)
        elif type == 1:
            for i in range(n):
                dst[i] = ggmlrpc_fp32_to_fp16(src[i])
        else:
            for i in range(n):
                dst[i] = ggmlrpc_fp32_to_bf16(src[i])
    return out


def fp16_to_fp32(h, bint scalar=False):
    """uint16 array of binary16 bits -> float32."""
    return _half_to_f32(h, 1, scalar)


def fp32_to_fp16(x, bint scalar=False):
    """float32 array -> uint16 binary16 bits (F16C rounding and NaNs)."""
    return _f32_to_half(x, 1, scalar)


def bf16_to_fp32(h, bint scalar=False):
    """uint16 array of bfloat16 bits -> float32."""
    return _half_to_f32(h, 30, scalar)


def fp32_to_bf16(x, bint scalar=False):
    """float32 array -> uint16 bfloat16 bits (ggml's rounding)."""
    return _f32_to_half(x, 30, scalar)
