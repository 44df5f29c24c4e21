"""DeepSeek V4 ops: the lightning indexer (ReLU'd per-head q.k scores, weighted,
plus a mask; F32, F16 and Q8_0 keys) and the hyper-connection ops DSV4_HC_COMB
(softmax then Sinkhorn normalization of a 4x4 mixing matrix per token),
DSV4_HC_PRE (weighted or gated sum of the streams) and DSV4_HC_POST (mix the
streams back), against float64 NumPy."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import quants as gq

from ggmlrpc.ggml import GGMLOp as Op, GGMLType as T
from tests.ops.conftest import assert_close, f32_bits


def rand(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize("kt", [T.F32, T.F16, T.Q8_0], ids=lambda t: t.name)
def test_lightning_indexer(ctx, rng, kt):
    E, H, n_t, S, n_kv = 64, 4, 3, 2, 21
    q, w, k = rand(rng, (S, n_t, H, E)), rand(rng, (S, 1, n_t, H)), rand(rng, (S, n_kv, 1, E))
    mask = np.where(rng.random((1, 1, n_t, n_kv)) < 0.25, -np.inf, rng.standard_normal((1, 1, n_t, n_kv)))
    mask = mask.astype(np.float16)
    out = ctx.op(Op.LIGHTNING_INDEXER, T.F32, (n_kv, n_t, 1, S), ctx.new(T.F32, (E, H, n_t, S), q),
                 ctx.new(kt, (E, 1, n_kv, S), k), ctx.new(T.F32, (H, n_t, 1, S), w),
                 ctx.new(T.F16, (n_kv, n_t, 1, 1), mask))
    ctx.compute()
    if kt == T.F16:
        k = k.astype(np.float16)
    elif kt == T.Q8_0:
        k = gq.dequantize(gq.quantize(k.reshape(-1, E), kt), kt).reshape(k.shape)
    qk = np.einsum("sthe,sje->stjh", q.astype(np.float64), k[:, :, 0].astype(np.float64))
    ref = (np.maximum(qk, 0) * w[:, 0, :, None, :]).sum(-1) + mask[0, 0]
    assert_close(ctx.read(out)[:, 0], ref, 1e-10)


def test_dsv4_hc_comb(ctx, rng):
    n_t, eps, n_iter = 5, 1e-6, 3
    mixes, scale, base = rand(rng, (n_t, 24)), rand(rng, (3,)), rand(rng, (24,))
    out = ctx.op(Op.DSV4_HC_COMB, T.F32, (4, 4, n_t), ctx.new(T.F32, (24, n_t), mixes), ctx.new(T.F32, (3,), scale),
                 ctx.new(T.F32, (24,), base), params=[f32_bits(eps), n_iter])
    ctx.compute()
    # comb[t][src][dst]: softmax over dst of each source's 4 mixes, + eps, then Sinkhorn
    c = (mixes[:, 8:].astype(np.float64) * scale[2] + base[8:]).reshape(n_t, 4, 4)
    c = np.exp(c - c.max(-1, keepdims=True))
    c = c / c.sum(-1, keepdims=True) + eps
    for it in range(n_iter):
        if it:
            c = c / (c.sum(-1, keepdims=True) + eps)
        c = c / (c.sum(-2, keepdims=True) + eps)
    assert_close(ctx.read(out), c, 1e-12)


@pytest.mark.parametrize("gated", [False, True], ids=["weights", "gated"])
def test_dsv4_hc_pre(ctx, rng, gated):
    E, hc, n_t, scale = 37, 4, 3, 0.7
    x = rand(rng, (n_t, hc, E))
    w = rand(rng, (n_t, hc, E) if gated else (n_t, hc))
    out = ctx.op(Op.DSV4_HC_PRE, T.F32, (E, n_t), ctx.new(T.F32, (E, hc, n_t), x), ctx.new(T.F32, w.shape[::-1], w),
                 params=[f32_bits(scale if gated else 1.0), int(gated)])
    ctx.compute()
    wd = 1 / (1 + np.exp(-w.astype(np.float64))) if gated else w[:, :, None].astype(np.float64)
    ref = (x * wd).sum(1) * (scale if gated else 1.0)
    assert_close(ctx.read(out), ref, 1e-12)


@pytest.mark.parametrize("with_comb", [True, False], ids=["comb", "identity"])
def test_dsv4_hc_post(ctx, rng, with_comb):
    E, hc, n_t = 37, 4, 3
    x, r, p, cb = rand(rng, (n_t, E)), rand(rng, (n_t, hc, E)), rand(rng, (n_t, hc)), rand(rng, (n_t, hc, hc))
    srcs = [ctx.new(T.F32, (E, n_t), x), ctx.new(T.F32, (E, hc, n_t), r), ctx.new(T.F32, (hc, n_t), p)]
    if with_comb:
        srcs.append(ctx.new(T.F32, (hc, hc, n_t), cb))    # cb[t][src][dst]
    out = ctx.op(Op.DSV4_HC_POST, T.F32, (E, hc, n_t), *srcs)
    ctx.compute()
    mixed = np.einsum("tsd,tse->tde", cb.astype(np.float64), r) if with_comb else r.astype(np.float64)
    assert_close(ctx.read(out), x[:, None, :] * p[:, :, None].astype(np.float64) + mixed, 1e-12)
