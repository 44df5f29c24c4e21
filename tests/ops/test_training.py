"""Training ops: the backward ops of SiLU, RMS_NORM, SOFT_MAX and GET_ROWS, the
cross-entropy loss and its gradient, and the AdamW / SGD optimizer steps (which
update the weights and moments in place), against NumPy formulas in float64."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlrpc.ggml import GGMLOp as Op, GGMLType as T
from tests.ops.conftest import assert_close, f32_bits, rejected


def rand(rng, shape, scale=1.0, offset=0.0):
    return (rng.standard_normal(shape) * scale + offset).astype(np.float32)


@pytest.mark.parametrize("t", [T.F32, T.F16], ids=lambda t: t.name)
def test_silu_back(ctx, rng, t):
    npt = np.float32 if t == T.F32 else np.float16
    dy, x = rand(rng, (3, 5, 40)).astype(npt), rand(rng, (3, 5, 40), 3.0).astype(npt)
    out = ctx.op(Op.SILU_BACK, t, (40, 5, 3), ctx.new(t, (40, 5, 3), dy), ctx.new(t, (40, 5, 3), x))
    ctx.compute()
    xd = x.astype(np.float64)
    s = 1 / (1 + np.exp(-xd))
    assert_close(ctx.read(out), dy * s * (1 + xd * (1 - s)), 1e-12 if t == T.F32 else 1e-6)


def test_rms_norm_back(ctx, rng):
    eps = 1e-5
    dz, x = rand(rng, (2, 6, 70)), rand(rng, (2, 6, 70), 1.0, 0.3)
    out = ctx.op(Op.RMS_NORM_BACK, T.F32, (70, 6, 2), ctx.new(T.F32, (70, 6, 2), dz),
                 ctx.new(T.F32, (70, 6, 2), x), params=[f32_bits(eps)])
    ctx.compute()
    xd, zd = x.astype(np.float64), dz.astype(np.float64)
    n = x.shape[-1]
    ms = (xd * xd).mean(-1, keepdims=True) + eps
    # d/dx of x / sqrt(mean(x^2) + eps), applied to dz
    ref = zd / np.sqrt(ms) - xd * (xd * zd).sum(-1, keepdims=True) / (n * ms ** 1.5)
    assert_close(ctx.read(out), ref, 1e-10)


def test_soft_max_back(ctx, rng):
    scale = 0.7
    y = rng.random((4, 3, 33)).astype(np.float32)
    y /= y.sum(-1, keepdims=True)
    dy = rand(rng, (4, 3, 33))
    out = ctx.op(Op.SOFT_MAX_BACK, T.F32, (33, 3, 4), ctx.new(T.F32, (33, 3, 4), dy),
                 ctx.new(T.F32, (33, 3, 4), y), params=[f32_bits(scale), 0])
    ctx.compute()
    yd, gd = y.astype(np.float64), dy.astype(np.float64)
    assert_close(ctx.read(out), scale * yd * (gd - (yd * gd).sum(-1, keepdims=True)), 1e-12)


@pytest.mark.parametrize("t", [T.F32, T.F16], ids=lambda t: t.name)
def test_get_rows_back(ctx, rng, t):
    g = rand(rng, (9, 17)).astype(np.float32 if t == T.F32 else np.float16)
    idx = np.array([4, 0, 4, 2, 4, 6, 0, 1, 2], np.int32)
    out = ctx.op(Op.GET_ROWS_BACK, T.F32, (17, 7), ctx.new(t, (17, 9), g), ctx.new(T.I32, (9,), idx))
    ctx.compute()
    ref = np.zeros((7, 17))
    np.add.at(ref, idx, g.astype(np.float64))
    assert_close(ctx.read(out), ref, 1e-12)


def test_get_rows_back_bad_index_closes(server, rng, caplog):
    with rejected(server, caplog, "GET_ROWS_BACK index 3 out of range [0, 3)") as c:
        g = c.new(T.F32, (8, 2), rand(rng, (2, 8)))
        c.op(Op.GET_ROWS_BACK, T.F32, (8, 3), g, c.new(T.I32, (2,), np.array([1, 3], np.int32)))


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def test_cross_entropy_loss(ctx, rng):
    logits = rand(rng, (3, 7, 50), 2.0)
    p = rng.random((3, 7, 50)).astype(np.float32)
    p /= p.sum(-1, keepdims=True)
    out = ctx.op(Op.CROSS_ENTROPY_LOSS, T.F32, (1,), ctx.new(T.F32, (50, 7, 3), logits),
                 ctx.new(T.F32, (50, 7, 3), p))
    ctx.compute()
    ref = -(log_softmax(logits) * p).sum() / (3 * 7)
    assert_close(ctx.read(out).ravel(), [ref], 1e-12)


def test_cross_entropy_loss_back(ctx, rng):
    logits = rand(rng, (5, 30), 2.0)
    p = rng.random((5, 30)).astype(np.float32)
    p /= p.sum(-1, keepdims=True)
    out = ctx.op(Op.CROSS_ENTROPY_LOSS_BACK, T.F32, (30, 5), ctx.new(T.F32, (1,), np.array([1.5], np.float32)),
                 ctx.new(T.F32, (30, 5), logits), ctx.new(T.F32, (30, 5), p))
    ctx.compute()
    ref = (np.exp(log_softmax(logits)) - p) * 1.5 / 5
    assert_close(ctx.read(out), ref, 1e-12)


def test_opt_step_adamw(ctx, rng):
    ne = (23, 4, 2)
    w, g = rand(rng, ne[::-1]), rand(rng, ne[::-1], 0.1)
    m, v = rand(rng, ne[::-1], 0.01), (rng.random(ne[::-1]) * 0.01).astype(np.float32)
    alpha, b1, b2, eps, wd, it = 1e-3, 0.9, 0.999, 1e-8, 0.1, 3
    b1h, b2h = 1 / (1 - b1 ** it), 1 / (1 - b2 ** it)
    tw, tm, tv = ctx.new(T.F32, ne, w), ctx.new(T.F32, ne, m), ctx.new(T.F32, ne, v)
    params = np.array([alpha, b1, b2, eps, wd, b1h, b2h], np.float32)
    ctx.op(Op.OPT_STEP_ADAMW, T.F32, ne, tw, ctx.new(T.F32, ne, g), tm, tv, ctx.new(T.F32, (7,), params))
    ctx.compute()
    a, b1, b2, eps, wd, b1h, b2h = params.astype(np.float64)
    m1 = m * b1 + g * (1 - b1)
    v1 = v * b2 + g.astype(np.float64) ** 2 * (1 - b2)
    w1 = w * (1 - a * wd) - a * (m1 * b1h) / (np.sqrt(v1 * b2h) + eps)
    assert_close(ctx.read(tm), m1, 1e-12)
    assert_close(ctx.read(tv), v1, 1e-12)
    assert_close(ctx.read(tw), w1, 1e-12)


def test_opt_step_sgd(ctx, rng):
    ne = (31, 5)
    w, g = rand(rng, ne[::-1]), rand(rng, ne[::-1])
    tw = ctx.new(T.F32, ne, w)
    ctx.op(Op.OPT_STEP_SGD, T.F32, ne, tw, ctx.new(T.F32, ne, g), ctx.new(T.F32, (2,), np.array([0.05, 0.2], np.float32)))
    ctx.compute()
    a, wd = np.float64(np.float32(0.05)), np.float64(np.float32(0.2))
    assert_close(ctx.read(tw), w * (1 - a * wd) - a * g, 1e-12)
