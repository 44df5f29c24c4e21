"""MUL_MAT: F32, F16 and BF16 weights (both of ggml's summation orders), every
quantized weight type with a dot product (reference: gguf-py's dequantization in
float64), batch broadcasting, permuted operands (the attention pattern), and the
shapes ggml rejects."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import quants as gq

from ggmlrpc import ggml
from ggmlrpc.ggml import GGMLOp as Op, GGMLType as T
from tests.ops.conftest import assert_close, from_bf16, rejected, to_bf16
from tests.ops.test_quants import random_blocks

QUANT = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K,
         T.IQ4_NL, T.IQ4_XS, T.TQ1_0, T.TQ2_0, T.MXFP4]


def weights(ctx, rng, t, K, M, batch=1):
    """A weight tensor (K, M, batch) of type t on the server and its float64 values."""
    if t == T.F32:
        w = rng.standard_normal((batch, M, K)).astype(np.float32)
        return ctx.new(t, (K, M, batch), w), w.astype(np.float64)
    if t == T.F16:
        w = rng.standard_normal((batch, M, K)).astype(np.float16)
        return ctx.new(t, (K, M, batch), w), w.astype(np.float64)
    if t == T.BF16:
        w = from_bf16(to_bf16(rng.standard_normal((batch, M, K))))
        return ctx.new(t, (K, M, batch), w), w.astype(np.float64)
    raw = random_blocks(rng, t, K * M * batch)
    tw = ctx.new(t, (K, M, batch))
    ctx.rb.set_tensor(tw, raw.tobytes())
    blck, size = ggml.TYPE_TRAITS[t]
    w = gq.dequantize(raw.reshape(batch * M, K // blck * size), t).reshape(batch, M, K)
    return tw, w.astype(np.float64)


# (K, M, N): N == 1 and M % 4 != 0 take ggml's vec_dot order, the others its GEMM order
SHAPES = [(64, 12, 1), (64, 12, 5), (96, 10, 3), (72, 8, 2), (40, 4, 7)]


@pytest.mark.parametrize("K, M, N", SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("wt", [T.F32, T.F16, T.BF16], ids=lambda t: t.name)
def test_mul_mat_float(ctx, rng, wt, K, M, N):
    tw, w = weights(ctx, rng, wt, K, M)
    x = rng.standard_normal((N, K)).astype(np.float32)
    out = ctx.op(Op.MUL_MAT, T.F32, (M, N), tw, ctx.new(T.F32, (K, N), x))
    ctx.compute()
    xr = x.astype(np.float16) if wt == T.F16 else (from_bf16(to_bf16(x)) if wt == T.BF16 else x)
    assert_close(ctx.read(out), xr.astype(np.float64) @ w[0].T, 1e-12)


@pytest.mark.parametrize("xt", [T.F16, T.BF16], ids=lambda t: t.name)
def test_mul_mat_low_precision_activations(ctx, rng, xt):
    """F16 activations with F16 weights are used as they are; F16/BF16 activations
    with F32 weights are widened to F32 first."""
    K, M, N = 64, 8, 3
    wt = T.F16 if xt == T.F16 else T.F32
    tw, w = weights(ctx, rng, wt, K, M)
    x = rng.standard_normal((N, K)).astype(np.float32)
    xr = x.astype(np.float16).astype(np.float64) if xt == T.F16 else from_bf16(to_bf16(x)).astype(np.float64)
    out = ctx.op(Op.MUL_MAT, T.F32, (M, N), tw, ctx.new(xt, (K, N), xr))
    ctx.compute()
    assert_close(ctx.read(out), xr @ w[0].T, 1e-12)


@pytest.mark.parametrize("N", [3, 9], ids=lambda n: f"N{n}")   # K-quants take ggml's tiled order from 8 rows
@pytest.mark.parametrize("wt", QUANT, ids=lambda t: t.name)
def test_mul_mat_quantized(ctx, rng, wt, N):
    blck = ggml.blck_size(wt)
    K, M = 2 * max(blck, 64), 6
    tw, w = weights(ctx, rng, wt, K, M)
    x = rng.standard_normal((N, K)).astype(np.float32)
    out = ctx.op(Op.MUL_MAT, T.F32, (M, N), tw, ctx.new(T.F32, (K, N), x))
    ctx.compute()
    # activations are quantized to the dot-product type (Q8_0, Q8_1 or Q8_K) first:
    # test-backend-ops' bound for quantized matmuls
    assert_close(ctx.read(out), x.astype(np.float64) @ w[0].T, 5e-4)


def test_mul_mat_q8_0_activation_rounding(ctx, rng):
    """Q8_0 weights: the result is the exact dot product of the weights with the
    activations quantized to Q8_0 (per 32-block scale amax/127), up to float sums."""
    K, M, N = 128, 4, 2
    tw, w = weights(ctx, rng, T.Q8_0, K, M)
    x = rng.standard_normal((N, K)).astype(np.float32)
    out = ctx.op(Op.MUL_MAT, T.F32, (M, N), tw, ctx.new(T.F32, (K, N), x))
    ctx.compute()
    xb = x.reshape(N, K // 32, 32).astype(np.float64)
    amax = np.abs(xb).max(axis=-1, keepdims=True)
    d = (amax / 127).astype(np.float16).astype(np.float64)
    q = np.rint(xb * np.where(amax > 0, 127 / np.where(amax > 0, amax, 1), 0))
    xq = (q * d).reshape(N, K)
    assert_close(ctx.read(out), xq @ w[0].T, 1e-9)


def test_mul_mat_broadcast_batches(ctx, rng):
    """src0 batches repeat over src1's: ne12 = 3 * ne02, ne13 = 2 * ne03."""
    K, M, N = 32, 5, 4
    w = rng.standard_normal((1, 2, M, K)).astype(np.float32)
    x = rng.standard_normal((2, 6, N, K)).astype(np.float32)
    out = ctx.op(Op.MUL_MAT, T.F32, (M, N, 6, 2), ctx.new(T.F32, (K, M, 2, 1), w),
                 ctx.new(T.F32, (K, N, 6, 2), x))
    ctx.compute()
    wb = np.repeat(w, 3, axis=1)          # batch i12 uses src0 batch i12 // 3
    ref = np.einsum("bhnk,bhmk->bhnm", x.astype(np.float64), np.broadcast_to(wb, (2, 6, M, K)))
    assert_close(ctx.read(out), ref, 1e-12)


def test_mul_mat_attention_pattern(ctx, rng):
    """KQ of the non-flash path: K a permuted view of an F16 cache with the heads
    interleaved in each row, Q a permuted F32 projection (GQA: 4 q heads, 2 kv)."""
    hd, n_kv, kv_heads, q_heads, tokens = 32, 16, 2, 4, 3
    cache = rng.standard_normal((n_kv, kv_heads * hd)).astype(np.float16)
    tc = ctx.new(T.F16, (kv_heads * hd, n_kv), cache)
    kview = ctx.view(tc, (hd, kv_heads, n_kv, 1), (2, hd * 2, kv_heads * hd * 2, kv_heads * hd * 2 * n_kv))
    k = ctx.permute(kview, 0, 2, 1, 3)                          # (hd, n_kv, kv_heads)
    qraw = rng.standard_normal((tokens, q_heads, hd)).astype(np.float32)
    q = ctx.permute(ctx.new(T.F32, (hd, q_heads, tokens), qraw), 0, 2, 1, 3)   # (hd, tokens, q_heads)
    out = ctx.op(Op.MUL_MAT, T.F32, (n_kv, tokens, q_heads, 1), k, q)
    ctx.compute()
    kk = cache.reshape(n_kv, kv_heads, hd).astype(np.float64)
    qq = qraw.astype(np.float16).astype(np.float64)            # activations rounded to F16
    ref = np.einsum("thd,nhd->htn", qq, np.repeat(kk, q_heads // kv_heads, axis=1))
    assert_close(ctx.read(out), ref, 1e-12)


@pytest.mark.parametrize("what", ["transposed src0", "wrong dst shape", "hadamard hint, non-square src0"])
def test_mul_mat_rejected(server, caplog, what):
    with rejected(server, caplog, "op MUL_MAT (F32 <- F32, F32)") as c:
        w = c.new(T.F32, (16, 8), np.ones((8, 16), np.float32))
        x = c.new(T.F32, (16, 2), np.ones((2, 16), np.float32))
        if what == "transposed src0":
            c.op(Op.MUL_MAT, T.F32, (16, 2), c.transpose(c.new(T.F32, (8, 16), np.ones((16, 8), np.float32))),
                 c.new(T.F32, (8, 2), np.ones((2, 8), np.float32)))
        elif what == "wrong dst shape":
            c.op(Op.MUL_MAT, T.F32, (8, 3), w, x)
        else:
            c.op(Op.MUL_MAT, T.F32, (8, 2), w, x, params=[0, 1])


@pytest.mark.parametrize("xt", [T.F32, T.F16], ids=lambda t: t.name)
def test_mul_mat_hadamard_hint(ctx, rng, xt):
    """llama.cpp rotates K/V for quantized caches with MUL_MAT(H, x) marked
    SRC0_IS_HADAMARD; ggml then runs a fast Walsh-Hadamard transform instead."""
    from scipy.linalg import hadamard
    n, rows = 64, 5
    h = (hadamard(n) / np.sqrt(n)).astype(np.float32)
    x = rng.standard_normal((rows, n)).astype(np.float32 if xt == T.F32 else np.float16)
    out = ctx.op(Op.MUL_MAT, T.F32, (n, rows), ctx.new(T.F32, (n, n), h), ctx.new(xt, (n, rows), x),
                 params=[0, 1])
    ctx.compute()
    assert_close(ctx.read(out), x.astype(np.float64) @ hadamard(n).T / np.sqrt(n), 1e-13)
