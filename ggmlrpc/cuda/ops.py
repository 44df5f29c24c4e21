"""Launchers: one function per kernel, choosing grid and block and typing the
arguments, shared by the CUDA device and the emulator tests.

Shapes are ggml's: `ne` lists the innermost dimension first, `nb` byte strides.
Device pointers are whatever the runtime passes to a kernel (a PyCUDA
DeviceAllocation, an emulator buffer).
"""
from __future__ import annotations

import math

import numpy as np

from ..ggml import GGMLType as T

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


def unary(k, op: int, dst, x, n: int, *, max_blocks=MAX_BLOCKS):
    """op: a GGMLUnaryOp value."""
    k.function("elementwise", "unary_f32")(i32(op), dst, x, i64(n),
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
