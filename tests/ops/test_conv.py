"""Direct convolutions (CONV_2D, CONV_3D, CONV_2D_DW in both of ggml's layouts,
CONV_TRANSPOSE_1D/2D) and their helpers (IM2COL_3D, COL2IM_1D, IM2COL_BACK,
POOL_2D_BACK), with F32 and F16 kernels, strides, paddings and dilations,
against NumPy written from the definitions (F16 kernels: ggml rounds the input
to F16 too, so the reference does)."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlrpc.ggml import GGMLOp as Op, GGMLType as T
from tests.ops.conftest import assert_close

NPT = {T.F32: np.float32, T.F16: np.float16}


def rand(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def out_size(n, k, s, p, d):
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def conv_ref(x, k, s, p, d):
    """x (N, C, *spatial), k (OC, C, *kernel); spatial dims in NumPy order (z, y, x)."""
    nd = x.ndim - 2
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0)] + [(pi, pi) for pi in p])
    outs = [out_size(x.shape[2 + i], k.shape[2 + i], s[i], p[i], d[i]) for i in range(nd)]
    out = np.zeros((x.shape[0], k.shape[0], *outs))
    for taps in np.ndindex(*k.shape[2:]):
        sl = tuple(slice(t * d[i], t * d[i] + s[i] * (outs[i] - 1) + 1, s[i]) for i, t in enumerate(taps))
        win = xp[(slice(None), slice(None)) + sl]
        out += np.einsum("nc...,oc->no...", win, k[(slice(None), slice(None)) + taps].astype(np.float64))
    return out


@pytest.mark.parametrize("kt", [T.F32, T.F16], ids=lambda t: t.name)
def test_conv_2d(ctx, rng, kt):
    N, C, H, W, OC, KH, KW = 2, 3, 9, 11, 5, 3, 2
    s, p, d = (2, 1), (1, 2), (2, 1)          # NumPy order (y, x)
    x, k = rand(rng, (N, C, H, W)), rand(rng, (OC, C, KH, KW), 0.3).astype(NPT[kt])
    oh, ow = out_size(H, KH, s[0], p[0], d[0]), out_size(W, KW, s[1], p[1], d[1])
    out = ctx.op(Op.CONV_2D, T.F32, (ow, oh, OC, N), ctx.new(kt, (KW, KH, C, OC), k),
                 ctx.new(T.F32, (W, H, C, N), x), params=[s[1], s[0], p[1], p[0], d[1], d[0]])
    ctx.compute()
    assert_close(ctx.read(out), conv_ref(x.astype(NPT[kt]), k, s, p, d), 1e-10 if kt == T.F32 else 1e-6)


def test_conv_2d_kernel_wider_than_padded_input(ctx, rng):
    """ggml sizes outputs with C's division, which truncates toward zero: a dilated
    kernel reaching past the padded input still gives one output row, summing
    the taps that land inside (here only the middle one)."""
    W, H, KW, KH = 4, 2, 1, 3
    s, p, d = (3, 1), (1, 0), (2, 1)           # (y, x): (H + 2 - 2*2 - 1) = -1 -> 0 -> 1 row
    x, k = rand(rng, (1, 1, H, W)), rand(rng, (1, 1, KH, KW))
    out = ctx.op(Op.CONV_2D, T.F32, (W, 1, 1, 1), ctx.new(T.F32, (KW, KH, 1, 1), k),
                 ctx.new(T.F32, (W, H, 1, 1), x), params=[s[1], s[0], p[1], p[0], d[1], d[0]])
    ctx.compute()
    # output row 0 reads input rows 0*3 + ky*2 - 1 = -1, 1, 3: only ky = 1 is inside
    assert_close(ctx.read(out), (k[0, 0, 1, 0] * x[0, 0, 1]).reshape(1, 1, 1, W), 1e-12)


def test_conv_3d(ctx, rng):
    N, C, D, H, W, OC = 2, 3, 5, 6, 7, 4
    x, k = rand(rng, (N, C, D, H, W)), rand(rng, (OC, C, 2, 3, 3), 0.3)
    s, p, d = (2, 1, 1), (0, 1, 1), (1, 2, 1)  # (z, y, x)
    od, oh, ow = (out_size(n, kk, *a) for n, kk, a in zip((D, H, W), (2, 3, 3), zip(s, p, d)))
    out = ctx.op(Op.CONV_3D, T.F32, (ow, oh, od, OC * N), ctx.new(T.F32, (3, 3, 2, C * OC), k),
                 ctx.new(T.F32, (W, H, D, C * N), x),
                 params=[s[2], s[1], s[0], p[2], p[1], p[0], d[2], d[1], d[0], C, N, OC])
    ctx.compute()
    assert_close(ctx.read(out).reshape(N, OC, od, oh, ow), conv_ref(x, k, s, p, d), 1e-10)


@pytest.mark.parametrize("kt, cwhn", [(T.F32, False), (T.F16, False), (T.F32, True)], ids=["whcn", "whcn-f16", "cwhn"])
def test_conv_2d_dw(ctx, rng, kt, cwhn):
    N, C, H, W = 2, 6, 7, 9
    x, k = rand(rng, (N, C, H, W)), rand(rng, (C, 3, 3), 0.5).astype(NPT[kt])
    s, p, d = (1, 2), (1, 1), (2, 1)
    oh, ow = out_size(H, 3, s[0], p[0], d[0]), out_size(W, 3, s[1], p[1], d[1])
    params = [s[1], s[0], p[1], p[0], d[1], d[0]]
    if cwhn:   # channels innermost: the data laid out (N, H, W, C), viewed as (W, H, C, N)
        tk = ctx.permute(ctx.new(kt, (C, 1, 3, 3), k.transpose(1, 2, 0)[:, :, None, :]), 3, 2, 0, 1)
        tx = ctx.permute(ctx.new(T.F32, (C, W, H, N), x.transpose(0, 2, 3, 1)), 2, 0, 1, 3)
        out = ctx.op(Op.CONV_2D_DW, T.F32, (C, ow, oh, N), tk, tx, params=params)
        out.ne, out.nb = [ow, oh, C, N], [C * 4, C * ow * 4, 4, C * ow * oh * 4]
    else:
        out = ctx.op(Op.CONV_2D_DW, T.F32, (ow, oh, C, N), ctx.new(kt, (3, 3, 1, C), k),
                     ctx.new(T.F32, (W, H, C, N), x), params=params)
    ctx.compute()
    ref = np.concatenate([conv_ref(x[:, c:c + 1], k[c:c + 1, None].astype(np.float32), s, p, d) for c in range(C)], 1)
    assert_close(ctx.read(out), ref, 1e-10)


@pytest.mark.parametrize("kt", [T.F32, T.F16], ids=lambda t: t.name)
def test_conv_transpose_1d(ctx, rng, kt):
    Cin, Cout, K, L, st = 4, 3, 5, 8, 3
    x, w = rand(rng, (Cin, L)), rand(rng, (Cin, Cout, K), 0.5).astype(NPT[kt])
    out = ctx.op(Op.CONV_TRANSPOSE_1D, T.F32, ((L - 1) * st + K, Cout), ctx.new(kt, (K, Cout, Cin), w),
                 ctx.new(T.F32, (L, Cin), x), params=[st, 0, 1])
    ctx.compute()
    ref = np.zeros((Cout, (L - 1) * st + K))
    xr = x.astype(NPT[kt]).astype(np.float64)
    for i in range(L):
        ref[:, i * st:i * st + K] += np.einsum("c,cok->ok", xr[:, i], w.astype(np.float64))
    assert_close(ctx.read(out), ref, 1e-10 if kt == T.F32 else 1e-6)


@pytest.mark.parametrize("kt", [T.F32, T.F16], ids=lambda t: t.name)
def test_conv_transpose_2d(ctx, rng, kt):
    N, Cin, Cout, H, W, KH, KW, st = 2, 3, 4, 4, 5, 2, 3, 2
    x, w = rand(rng, (N, Cin, H, W)), rand(rng, (Cin, Cout, KH, KW), 0.5).astype(NPT[kt])
    OH, OW = (H - 1) * st + KH, (W - 1) * st + KW
    out = ctx.op(Op.CONV_TRANSPOSE_2D, T.F32, (OW, OH, Cout, N), ctx.new(kt, (KW, KH, Cout, Cin), w),
                 ctx.new(T.F32, (W, H, Cin, N), x), params=[st])
    ctx.compute()
    ref = np.zeros((N, Cout, OH, OW))
    xr = x.astype(NPT[kt]).astype(np.float64)
    for y in range(H):
        for xx in range(W):
            ref[:, :, y * st:y * st + KH, xx * st:xx * st + KW] += np.einsum("nc,cohw->nohw", xr[:, :, y, xx],
                                                                             w.astype(np.float64))
    assert_close(ctx.read(out), ref, 1e-10 if kt == T.F32 else 1e-6)


def test_im2col_3d(ctx, rng):
    N, IC, D, H, W, KD, KH, KW = 2, 2, 5, 6, 7, 2, 2, 3
    x = rand(rng, (N * IC, D, H, W))
    s, p, d = (1, 2, 1), (0, 0, 1), (2, 1, 1)   # (z, y, x)
    od, oh, ow = (out_size(n, k, *a) for n, k, a in zip((D, H, W), (KD, KH, KW), zip(s, p, d)))
    out = ctx.op(Op.IM2COL_3D, T.F32, (IC * KD * KH * KW, ow, oh, od * N), ctx.new(T.F16, (KW, KH, KD, IC * 3)),
                 ctx.new(T.F32, (W, H, D, N * IC), x),
                 params=[s[2], s[1], s[0], p[2], p[1], p[0], d[2], d[1], d[0], IC])
    ctx.compute()
    xp = np.pad(x.reshape(N, IC, D, H, W), [(0, 0), (0, 0)] + [(pi, pi) for pi in p])
    ref = np.zeros((N, od, oh, ow, IC, KD, KH, KW), np.float32)
    for kz, ky, kx in np.ndindex(KD, KH, KW):
        win = xp[:, :, kz * d[0]::s[0], ky * d[1]::s[1], kx * d[2]::s[2]][:, :, :od, :oh, :ow]
        ref[..., kz, ky, kx] = win.transpose(0, 2, 3, 4, 1)
    np.testing.assert_array_equal(ctx.read(out).ravel(), ref.ravel())


def test_col2im_1d(ctx, rng):
    K, OC, T_in, s0, p0 = 5, 3, 9, 2, 1
    a = rand(rng, (T_in, K * OC))
    T_out = (T_in - 1) * s0 + K - 2 * p0
    out = ctx.op(Op.COL2IM_1D, T.F32, (T_out, OC), ctx.new(T.F32, (K * OC, T_in), a), params=[s0, OC, p0])
    ctx.compute()
    full = np.zeros((OC, (T_in - 1) * s0 + K))
    for t in range(T_in):
        full[:, t * s0:t * s0 + K] += a[t].reshape(OC, K)
    assert_close(ctx.read(out), full[:, p0:p0 + T_out], 1e-12)


def test_im2col_back(ctx, rng):
    N, IC, IH, IW, KH, KW = 2, 2, 6, 8, 3, 3
    s, p, d = (2, 2), (1, 1), (1, 1)
    oh, ow = out_size(IH, KH, s[0], p[0], d[0]), out_size(IW, KW, s[1], p[1], d[1])
    g = rand(rng, (N, oh, ow, IC * KH * KW))
    out = ctx.op(Op.IM2COL_BACK, T.F32, (IW, IH, IC, N), ctx.new(T.F32, (IC * KH * KW, ow, oh, N), g),
                 ctx.new(T.F16, (KW, KH, IC, 4)), params=[s[1], s[0], p[1], p[0], d[1], d[0], 1])
    ctx.compute()
    # the adjoint of IM2COL: every patch entry goes back to the input position it copied
    ref = np.zeros((N, IC, IH + 2 * p[0], IW + 2 * p[1]))
    gg = g.reshape(N, oh, ow, IC, KH, KW)
    for y, x, ky, kx in np.ndindex(oh, ow, KH, KW):
        ref[:, :, y * s[0] + ky * d[0], x * s[1] + kx * d[1]] += gg[:, y, x, :, ky, kx]
    assert_close(ctx.read(out), ref[:, :, p[0]:p[0] + IH, p[1]:p[1] + IW], 1e-12)


@pytest.mark.parametrize("op", [0, 1], ids=["max", "avg"])
def test_pool_2d_back(ctx, rng, op):
    P, IH, IW, k, s, p = 3, 7, 9, 3, 2, 1
    f = rand(rng, (P, IH, IW))
    oh, ow = (IH + 2 * p - k) // s + 1, (IW + 2 * p - k) // s + 1
    g = rand(rng, (P, oh, ow))
    out = ctx.op(Op.POOL_2D_BACK, T.F32, (IW, IH, P), ctx.new(T.F32, (ow, oh, P), g),
                 ctx.new(T.F32, (IW, IH, P), f), params=[op, k, k, s, s, p, p])
    ctx.compute()
    ref = np.zeros((P, IH, IW))
    for c, y, x in np.ndindex(P, oh, ow):
        y0, x0 = y * s - p, x * s - p
        ys, xs = slice(max(y0, 0), min(y0 + k, IH)), slice(max(x0, 0), min(x0 + k, IW))
        if op == 0:
            win = f[c, ys, xs]
            iy, ix = np.unravel_index(np.argmax(win), win.shape)
            ref[c, ys.start + iy, xs.start + ix] += g[c, y, x]
        else:
            ref[c, ys, xs] += g[c, y, x] / (k * k)
    assert_close(ctx.read(out), ref, 1e-12)
