"""FLASH_ATTN_EXT against softmax(scale * Q K^T + slope * mask) V in float64: F16 and
F32 K/V, quantized K/V, grouped-query heads, causal masks with -inf, logit softcap,
ALiBi, sinks, permuted views of a KV cache, and both of ggml's paths (per query
row for short batches, 64x64 tiles from 64 queries on)."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlrpc.ggml import GGMLOp as Op, GGMLType as T
from tests.ops.conftest import assert_close, f32_bits
from tests.ops.test_norm import alibi_slopes, softmax_ref


def attention_ref(q, k, v, scale, mask=None, softcap=0.0, max_bias=0.0, sinks=None):
    """q: (ne3, heads, nq, dk); k, v: (ne3k, kv_heads, nkv, d); mask: (nq, nkv) -> (ne3, nq, heads, dv)."""
    heads, kvh = q.shape[1], k.shape[1]
    kk = np.repeat(k, heads // kvh, axis=1)
    vv = np.repeat(v, heads // kvh, axis=1)
    s = np.einsum("bhqd,bhkd->bhqk", q, kk) * scale
    if softcap:
        s = softcap * np.tanh(s / softcap)
    p = softmax_ref(s, 1.0, mask, alibi_slopes(heads, max_bias), sinks)
    o = np.einsum("bhqk,bhkd->bhqd", p, vv)
    return o.transpose(0, 2, 1, 3)


def run(ctx, rng, nq, nkv=48, dk=32, dv=32, heads=4, kv_heads=2, kv_t=T.F16, masked=True,
        softcap=0.0, max_bias=0.0, sinks=False, ne3=1):
    scale = 1 / np.sqrt(dk)
    q = rng.standard_normal((ne3, heads, nq, dk)).astype(np.float32)
    k = rng.standard_normal((ne3, kv_heads, nkv, dk)).astype(np.float32)
    v = rng.standard_normal((ne3, kv_heads, nkv, dv)).astype(np.float32)
    tq = ctx.new(T.F32, (dk, nq, heads, ne3), q)
    store = np.float16 if kv_t == T.F16 else np.float32
    if kv_t not in (T.F16, T.F32):
        from gguf import quants as gq
        tk = ctx.new(kv_t, (dk, nkv, kv_heads, ne3), k)
        tv = ctx.new(kv_t, (dv, nkv, kv_heads, ne3), v)
        kd = gq.dequantize(gq.quantize(k, kv_t), kv_t).astype(np.float64)
        vd = gq.dequantize(gq.quantize(v, kv_t), kv_t).astype(np.float64)
    else:
        tk = ctx.new(kv_t, (dk, nkv, kv_heads, ne3), k.astype(store))
        tv = ctx.new(kv_t, (dv, nkv, kv_heads, ne3), v.astype(store))
        kd, vd = k.astype(store).astype(np.float64), v.astype(store).astype(np.float64)
    srcs = [tq, tk, tv]
    mask = None
    if masked:
        # causal: query i sees keys up to nkv - nq + i, padded rows beyond nq
        rows = -(-nq // 8) * 8
        m = np.zeros((rows, nkv), np.float32)
        for i in range(nq):
            m[i, nkv - nq + i + 1:] = -np.inf
        m16 = m.astype(np.float16)
        srcs.append(ctx.new(T.F16, (nkv, rows), m16))
        mask = m16[:nq].astype(np.float64)
    sk = None
    if sinks:
        if not masked:
            srcs.append(None)
        sk = rng.standard_normal(heads).astype(np.float32)
        srcs.append(ctx.new(T.F32, (heads,), sk))
    out = ctx.op(Op.FLASH_ATTN_EXT, T.F32, (dv, heads, nq, ne3), *srcs,
                 params=[f32_bits(scale), f32_bits(max_bias), f32_bits(softcap), 10])
    ctx.compute()
    ref = attention_ref(q.astype(np.float64), kd, vd, scale, mask, softcap, max_bias,
                        sk.astype(np.float64) if sinks else None)
    return ctx.read(out), ref


@pytest.mark.parametrize("nq", [1, 7, 70], ids=lambda n: f"nq{n}")
@pytest.mark.parametrize("kv_t", [T.F16, T.F32], ids=lambda t: t.name)
def test_flash_attn(ctx, rng, nq, kv_t):
    got, ref = run(ctx, rng, nq, nkv=80, kv_t=kv_t)
    # the per-row path rounds Q to F16 for F16 keys and accumulates V in F16;
    # the tiled path stays in F32
    tol = 1e-5 if kv_t == T.F16 and nq < 64 else 1e-9
    assert_close(got, ref, tol)


@pytest.mark.parametrize("kv_t", [T.Q8_0, T.Q4_0], ids=lambda t: t.name)
def test_flash_attn_quantized_kv(ctx, rng, kv_t):
    got, ref = run(ctx, rng, 5, nkv=64, kv_t=kv_t)
    assert_close(got, ref, 5e-4)    # Q is quantized to Q8_0 for the dot products


@pytest.mark.parametrize("nq", [3, 65], ids=lambda n: f"nq{n}")
def test_flash_attn_extras(ctx, rng, nq):
    """softcap, ALiBi, sinks, no GQA, a batch dim, a head size that differs for V."""
    got, ref = run(ctx, rng, nq, nkv=70, dk=64, dv=32, heads=3, kv_heads=3, softcap=20.0,
                   max_bias=8.0, sinks=True, ne3=2)
    assert_close(got, ref, 1e-5)


def test_flash_attn_no_mask(ctx, rng):
    got, ref = run(ctx, rng, 4, nkv=20, masked=False, sinks=True)
    assert_close(got, ref, 1e-5)


def test_flash_attn_cache_views(ctx, rng):
    """The llama graph: K and V are permuted views of F16 caches with both kv heads
    in each row; only the first n_kv cells are attended to."""
    hd, heads, kvh, nq, n_kv, cells = 32, 4, 2, 3, 24, 40
    kc = rng.standard_normal((cells, kvh * hd)).astype(np.float16)
    vc = rng.standard_normal((cells, kvh * hd)).astype(np.float16)
    tkc, tvc = ctx.new(T.F16, (kvh * hd, cells), kc), ctx.new(T.F16, (kvh * hd, cells), vc)
    row = kvh * hd * 2

    def view(t):
        return ctx.permute(ctx.view(t, (hd, kvh, n_kv, 1), (2, hd * 2, row, row * n_kv)), 0, 2, 1, 3)

    qraw = rng.standard_normal((nq, heads, hd)).astype(np.float32)
    q = ctx.permute(ctx.new(T.F32, (hd, heads, nq), qraw), 0, 2, 1, 3)
    m = np.zeros((8, n_kv), np.float16)
    m[:, -2:] = -np.inf
    out = ctx.op(Op.FLASH_ATTN_EXT, T.F32, (hd, heads, nq, 1), q, view(tkc), view(tvc),
                 ctx.new(T.F16, (n_kv, 8), m), params=[f32_bits(0.125), 0, 0, 10])
    ctx.compute()
    k = kc[:n_kv].reshape(n_kv, kvh, hd).transpose(1, 0, 2)[None].astype(np.float64)
    v = vc[:n_kv].reshape(n_kv, kvh, hd).transpose(1, 0, 2)[None].astype(np.float64)
    ref = attention_ref(qraw.transpose(1, 0, 2)[None].astype(np.float64), k, v, 0.125,
                        m[:nq].astype(np.float64))
    assert_close(ctx.read(out), ref, 1e-5)
