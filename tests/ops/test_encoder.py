"""Ops of vision and audio encoders: IM2COL (1-D and 2-D, F32/F16), POOL_1D/POOL_2D,
UPSCALE (nearest, bilinear with and without aligned corners or antialiasing,
bicubic), ROLL, PAD_REFLECT_1D, TIMESTEP_EMBEDDING and Segment Anything's
WIN_PART/WIN_UNPART, GET_REL_POS and ADD_REL_POS, against NumPy."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlrpc.ggml import GGMLOp as Op, GGMLType as T
from tests.ops.conftest import assert_close, rejected


def im2col_ref(img, KH, KW, s0, s1, p0, p1, d0, d1):
    """img (N, IC, IH, IW) -> (N, OH, OW, IC*KH*KW)"""
    N, IC, IH, IW = img.shape
    OW = (IW + 2 * p0 - d0 * (KW - 1) - 1) // s0 + 1
    OH = (IH + 2 * p1 - d1 * (KH - 1) - 1) // s1 + 1
    out = np.zeros((N, OH, OW, IC, KH, KW), img.dtype)
    for oh in range(OH):
        for ow in range(OW):
            for kh in range(KH):
                for kw in range(KW):
                    ih, iw = oh * s1 + kh * d1 - p1, ow * s0 + kw * d0 - p0
                    if 0 <= ih < IH and 0 <= iw < IW:
                        out[:, oh, ow, :, kh, kw] = img[:, :, ih, iw]
    return out.reshape(N, OH, OW, IC * KH * KW)


@pytest.mark.parametrize("out_t", [T.F32, T.F16], ids=lambda t: t.name)
def test_im2col_2d(ctx, rng, out_t):
    img = rng.standard_normal((2, 3, 7, 9)).astype(np.float32)
    s0, s1, p0, p1, d0, d1 = 2, 1, 1, 2, 1, 2
    ref = im2col_ref(img, 3, 3, s0, s1, p0, p1, d0, d1)
    out = ctx.op(Op.IM2COL, out_t, ref.shape[::-1], ctx.new(T.F16, (3, 3, 3, 4)), ctx.new(T.F32, (9, 7, 3, 2), img),
                 params=[s0, s1, p0, p1, d0, d1, 1])
    ctx.compute()
    np.testing.assert_array_equal(ctx.read(out).astype(np.float32), ref.astype(out_t == T.F16 and np.float16 or np.float32).astype(np.float32))


def test_im2col_1d(ctx, rng):
    img = rng.standard_normal((2, 4, 11)).astype(np.float32)               # (N, IC, IW)
    ref = im2col_ref(img[:, :, None, :], 1, 3, 1, 1, 1, 0, 2, 1)[:, 0]    # (N, OW, IC*KW)
    out = ctx.op(Op.IM2COL, T.F32, (12, ref.shape[1], 2, 1), ctx.new(T.F16, (3, 4, 5)),
                 ctx.new(T.F32, (11, 4, 2), img), params=[1, 0, 1, 0, 2, 0, 0])
    ctx.compute()
    np.testing.assert_array_equal(ctx.read(out).reshape(ref.shape), ref)


@pytest.mark.parametrize("op", [0, 1], ids=["max", "avg"])
def test_pool_1d(ctx, rng, op):
    x = rng.standard_normal((2, 4, 11)).astype(np.float32)
    k, s, p = 3, 2, 1
    ow = (11 + 2 * p - k) // s + 1
    out = ctx.op(Op.POOL_1D, T.F32, (ow, 4, 2), ctx.new(T.F32, (11, 4, 2), x), params=[op, k, s, p])
    ctx.compute()
    ref = np.empty((2, 4, ow))
    for o in range(ow):
        win = x[..., max(0, o * s - p):min(11, o * s - p + k)].astype(np.float64)
        ref[..., o] = win.max(-1) if op == 0 else win.mean(-1)          # average over taps inside
    assert_close(ctx.read(out), ref, 1e-13)


@pytest.mark.parametrize("op, ne, params", [
    (Op.POOL_1D, (1, 4, 2), [0, 14, 1, 1]),                  # window over the padded row (13)
    (Op.POOL_1D, (1 << 16, 4, 2), [0, 3, 1 << 16, 0]),        # result longer than ggml's size
    (Op.POOL_2D, (1, 1, 3, 2), [0, 3, 10, 1, 1, 0, 1]),       # window over the padded column (9)
    (Op.POOL_2D, (7, 5, 3, 2), [0, 3, 3, 1, 1, 0, -1]),       # negative padding
])
def test_pool_window_past_its_input_is_rejected(server, caplog, op, ne, params):
    """ggml's pools make an empty result for a window larger than the padded input; the
    rules ask for ggml's output size, so the taps loop no further than that."""
    src_ne = (11, 4, 2) if op == Op.POOL_1D else (9, 7, 3, 2)
    with rejected(server, caplog, "pooling shape") as c:
        c.op(op, T.F32, ne, c.new(T.F32, src_ne), params=params)


@pytest.mark.parametrize("op", [0, 1], ids=["max", "avg"])
def test_pool_2d(ctx, rng, op):
    x = rng.standard_normal((2, 3, 7, 9)).astype(np.float32)
    k0, k1, s0, s1, p0, p1 = 3, 2, 2, 2, 1, 0
    ow, oh = (9 + 2 * p0 - k0) // s0 + 1, (7 + 2 * p1 - k1) // s1 + 1
    out = ctx.op(Op.POOL_2D, T.F32, (ow, oh, 3, 2), ctx.new(T.F32, (9, 7, 3, 2), x),
                 params=[op, k0, k1, s0, s1, p0, p1])
    ctx.compute()
    ref = np.empty((2, 3, oh, ow))
    for i in range(oh):
        for j in range(ow):
            ys, xs = i * s1 - p1, j * s0 - p0
            win = x[..., max(0, ys):ys + k1, max(0, xs):xs + k0].astype(np.float64)
            ref[..., i, j] = win.max((-1, -2)) if op == 0 else win.sum((-1, -2)) / (k0 * k1)   # / whole window
    assert_close(ctx.read(out), ref, 1e-13)


def bilinear_ref(x, ne0, ne1, align):
    H, W = x.shape[-2:]
    if align:
        sy, sx = (ne1 - 1) / (H - 1), (ne0 - 1) / (W - 1)
        off = 0.0
    else:
        sy, sx, off = ne1 / H, ne0 / W, 0.5
    out = np.empty(x.shape[:-2] + (ne1, ne0))
    for i in range(ne1):
        y = (i + off) / sy - off
        y0 = int(np.floor(y))
        dy = min(max(y - min(max(y0, 0), H - 1), 0), 1)
        ya, yb = min(max(y0, 0), H - 1), min(max(y0 + 1, 0), H - 1)
        for j in range(ne0):
            xx = (j + off) / sx - off
            x0 = int(np.floor(xx))
            xa, xb = min(max(x0, 0), W - 1), min(max(x0 + 1, 0), W - 1)
            dx = min(max(xx - xa, 0), 1)
            out[..., i, j] = (x[..., ya, xa] * (1 - dx) * (1 - dy) + x[..., ya, xb] * dx * (1 - dy)
                              + x[..., yb, xa] * (1 - dx) * dy + x[..., yb, xb] * dx * dy)
    return out


def test_upscale_of_transposed(ctx, rng):
    """UPSCALE reads its source through the strides (a transposed view)."""
    x = rng.standard_normal((2, 3, 6, 5)).astype(np.float32)                    # ne (5, 6, 3, 2)
    t = ctx.transpose(ctx.new(T.F32, (5, 6, 3, 2), x))                           # ne (6, 5, 3, 2)
    out = ctx.op(Op.UPSCALE, T.F32, (13, 9, 3, 2), t, params=[0])
    ctx.compute()
    xt = np.swapaxes(x, -1, -2).astype(np.float64)                               # (2, 3, 5, 6)
    ref = xt[..., (np.arange(9) * 5 // 9)[:, None], (np.arange(13) * 6 // 13)[None, :]]
    np.testing.assert_array_equal(ctx.read(out), ref)


@pytest.mark.parametrize("mode", ["nearest", "bilinear", "bilinear-corners"])
def test_upscale(ctx, rng, mode):
    x = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
    ne = (13, 9, 3, 2)
    flags = {"nearest": 0, "bilinear": 1, "bilinear-corners": 1 | 256}[mode]
    out = ctx.op(Op.UPSCALE, T.F32, ne, ctx.new(T.F32, (6, 5, 3, 2), x), params=[flags])
    ctx.compute()
    xd = x.astype(np.float64)
    if mode == "nearest":
        ref = xd[..., (np.arange(9) * 5 // 9)[:, None], (np.arange(13) * 6 // 13)[None, :]]
    else:
        ref = bilinear_ref(xd, 13, 9, mode.endswith("corners"))
    assert_close(ctx.read(out), ref, 1e-12)


def bicubic_ref(x, ne0, ne1):
    """PyTorch's bicubic (align_corners=False, a = -0.75, edges clamped)."""
    a = -0.75
    w1 = lambda t: ((a + 2) * t - (a + 3)) * t * t + 1
    w2 = lambda t: ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    H, W = x.shape[-2:]
    out = np.empty(x.shape[:-2] + (ne1, ne0))
    for i in range(ne1):
        y = (i + 0.5) * H / ne1 - 0.5
        y0 = int(np.floor(y))
        dy = y - y0
        wy = [w2(dy + 1), w1(dy), w1(1 - dy), w2(2 - dy)]
        for j in range(ne0):
            xx = (j + 0.5) * W / ne0 - 0.5
            x0 = int(np.floor(xx))
            dx = xx - x0
            wx = [w2(dx + 1), w1(dx), w1(1 - dx), w2(2 - dx)]
            acc = 0
            for r in range(4):
                yy = min(max(y0 - 1 + r, 0), H - 1)
                for c in range(4):
                    acc = acc + wy[r] * wx[c] * x[..., yy, min(max(x0 - 1 + c, 0), W - 1)]
            out[..., i, j] = acc
    return out


def test_upscale_bicubic(ctx, rng):
    x = rng.standard_normal((2, 1, 6, 8)).astype(np.float32)
    out = ctx.op(Op.UPSCALE, T.F32, (16, 12, 1, 2), ctx.new(T.F32, (8, 6, 1, 2), x), params=[2])
    ctx.compute()
    assert_close(ctx.read(out), bicubic_ref(x.astype(np.float64), 16, 12), 1e-12)


def test_upscale_antialiased_downscale(ctx):
    """Antialiased bilinear downscaling averages with a triangle filter: a constant
    image stays that constant, a checkerboard flattens towards its mean."""
    const = np.full((1, 1, 9, 12), 3.5, np.float32)
    board = (np.indices((9, 12)).sum(0) % 2).astype(np.float32)[None, None]
    a = ctx.op(Op.UPSCALE, T.F32, (5, 4, 1, 1), ctx.new(T.F32, (12, 9, 1, 1), const), params=[1 | 512])
    b = ctx.op(Op.UPSCALE, T.F32, (3, 3, 1, 1), ctx.new(T.F32, (12, 9, 1, 1), board), params=[1 | 512])
    ctx.compute()
    assert_close(ctx.read(a), np.full((1, 1, 4, 5), 3.5), 1e-12)
    assert np.all(np.abs(ctx.read(b) - 0.5) < 0.1)


def test_roll(ctx, rng):
    x = rng.standard_normal((2, 3, 5, 7)).astype(np.float32)
    out = ctx.op(Op.ROLL, T.F32, (7, 5, 3, 2), ctx.new(T.F32, (7, 5, 3, 2), x), params=[3, -2, 1, 0])
    ctx.compute()
    np.testing.assert_array_equal(ctx.read(out), np.roll(x, (3, -2, 1), axis=(3, 2, 1)))


def test_pad_reflect_1d(ctx, rng):
    x = rng.standard_normal((2, 4, 9)).astype(np.float32)
    out = ctx.op(Op.PAD_REFLECT_1D, T.F32, (14, 4, 2), ctx.new(T.F32, (9, 4, 2), x), params=[3, 2])
    ctx.compute()
    np.testing.assert_array_equal(ctx.read(out).reshape(2, 4, 14), np.pad(x, [(0, 0), (0, 0), (3, 2)], mode="reflect"))


def test_timestep_embedding(ctx, rng):
    t = (rng.random(5) * 1000).astype(np.float32)
    dim, max_period = 33, 10000
    out = ctx.op(Op.TIMESTEP_EMBEDDING, T.F32, (dim, 5), ctx.new(T.F32, (5,), t), params=[dim, max_period])
    ctx.compute()
    half = dim // 2
    freqs = np.exp(-np.log(max_period) * np.arange(half) / half)
    args = t[:, None].astype(np.float64) * freqs[None]
    ref = np.concatenate([np.cos(args), np.sin(args), np.zeros((5, 1))], axis=1)
    assert_close(ctx.read(out), ref, 1e-9)


def test_win_part_unpart(ctx, rng):
    C, W, H, w = 5, 10, 7, 4
    x = rng.standard_normal((H, W, C)).astype(np.float32)
    npx, npy = -(-W // w), -(-H // w)
    parts = ctx.op(Op.WIN_PART, T.F32, (C, w, w, npx * npy), ctx.new(T.F32, (C, W, H), x), params=[npx, npy, w])
    back = ctx.op(Op.WIN_UNPART, T.F32, (C, W, H), parts, params=[w])
    ctx.compute()
    padded = np.zeros((npy * w, npx * w, C), np.float32)
    padded[:H, :W] = x
    ref = padded.reshape(npy, w, npx, w, C).transpose(0, 2, 1, 3, 4).reshape(npx * npy, w, w, C)
    np.testing.assert_array_equal(ctx.read(parts), ref)
    np.testing.assert_array_equal(ctx.read(back).reshape(H, W, C), x)


def test_get_rel_pos(ctx, rng):
    C, n = 6, 5
    table = rng.standard_normal((2 * n - 1, C)).astype(np.float16)
    out = ctx.op(Op.GET_REL_POS, T.F16, (C, n, n), ctx.new(T.F16, (C, 2 * n - 1), table))
    ctx.compute()
    q, k = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    np.testing.assert_array_equal(ctx.read(out)[0], table[q - k + n - 1])


def test_add_rel_pos(ctx, rng):
    W, H, heads = 4, 3, 2
    a = rng.standard_normal((heads, W * H, W * W)).astype(np.float32)
    pw = rng.standard_normal((heads, H, W, W)).astype(np.float32)
    ph = rng.standard_normal((heads, H, W, W)).astype(np.float32)
    out = ctx.op(Op.ADD_REL_POS, T.F32, (W * W, W * H, heads), ctx.new(T.F32, (W * W, W * H, heads), a),
                 ctx.new(T.F32, (W, W, H, heads), pw), ctx.new(T.F32, (W, W, H, heads), ph), params=[0])
    ctx.compute()
    # each attention row (one query) is a (W, W) block: row r gets ph[.., r], column c gets pw[.., c]
    blk = a.astype(np.float64).reshape(heads, H, W, W, W)
    ref = blk + ph[..., :, None] + pw[..., None, :]
    assert_close(ctx.read(out), ref, 1e-12)
