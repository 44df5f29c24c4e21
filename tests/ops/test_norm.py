"""Row normalizations and softmax: RMS_NORM, NORM, L2_NORM, GROUP_NORM and SOFT_MAX
(scale, F16/F32 masks broadcast over heads, ALiBi slopes, attention sinks)."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlrpc.ggml import GGMLOp as Op, GGMLType as T
from tests.ops.conftest import assert_close, f32_bits, rejected


def strided_input(ctx, rng, ne):
    """An F32 input whose rows sit in a wider tensor (nb1 > ne0*4): a view."""
    wide = rng.standard_normal((ne[3], ne[2], ne[1], ne[0] + 3)).astype(np.float32) * 2 + 0.5
    full = ctx.new(T.F32, (ne[0] + 3, ne[1], ne[2], ne[3]), wide)
    nb1 = (ne[0] + 3) * 4
    v = ctx.view(full, ne, (4, nb1, nb1 * ne[1], nb1 * ne[1] * ne[2]), offset=12)
    return v, wide[..., 3:].astype(np.float64)


def norm_ref(opcode, xd, eps):
    """RMS_NORM, NORM or L2_NORM of the last axis, in float64."""
    if opcode == Op.RMS_NORM:
        return xd / np.sqrt(np.mean(xd * xd, axis=-1, keepdims=True) + eps)
    if opcode == Op.NORM:
        c = xd - xd.mean(axis=-1, keepdims=True)
        return c / np.sqrt(np.mean(c * c, axis=-1, keepdims=True) + eps)
    return xd / np.maximum(np.sqrt(np.sum(xd * xd, axis=-1, keepdims=True)), eps)


@pytest.mark.parametrize("opcode", [Op.RMS_NORM, Op.NORM, Op.L2_NORM], ids=lambda o: o.name)
def test_row_norms(ctx, rng, opcode):
    ne = (96, 5, 3, 2)
    eps = 1e-5
    x, xd = strided_input(ctx, rng, ne)
    out = ctx.op(opcode, T.F32, ne, x, params=[f32_bits(eps)])
    ctx.compute()
    assert_close(ctx.read(out), norm_ref(opcode, xd, eps), 1e-12)


@pytest.mark.parametrize("opcode", [Op.NORM, Op.L2_NORM], ids=lambda o: o.name)
def test_row_norms_of_permuted_rows(ctx, rng, opcode):
    """NORM and L2_NORM walk rows through nb[0] (a permuted view, no packed rows)."""
    x = (rng.standard_normal((2, 3, 7, 33)) * 2 + 0.5).astype(np.float32)     # ne (33, 7, 3, 2)
    p = ctx.permute(ctx.new(T.F32, (33, 7, 3, 2), x), 1, 0, 2, 3)            # ne (7, 33, 3, 2)
    eps = 1e-5
    out = ctx.op(opcode, T.F32, tuple(p.ne), p, params=[f32_bits(eps)])
    ctx.compute()
    xd = np.swapaxes(x, -1, -2).astype(np.float64)                              # rows of 7
    assert_close(ctx.read(out), norm_ref(opcode, xd, eps), 1e-10)


# (1 << 31) - 1: empty groups past the last channel, which the kernel must not walk one by one
@pytest.mark.parametrize("n_groups", [1, 3, 4, 8, (1 << 31) - 1])
def test_group_norm(ctx, rng, n_groups):
    ne = (6, 5, 8, 2)     # channels in dim 2; 8 channels in 3 groups: 3 + 3 + 2
    eps = 1e-6
    x = rng.standard_normal(ne[::-1]).astype(np.float32) + 1
    out = ctx.op(Op.GROUP_NORM, T.F32, ne, ctx.new(T.F32, ne, x), params=[n_groups, f32_bits(eps)])
    ctx.compute()
    xd = x.astype(np.float64)
    per = -(-ne[2] // n_groups)
    ref = np.empty_like(xd)
    for g in range(0, ne[2], per):
        blk = xd[:, g:g + per]
        m = blk.mean(axis=(1, 2, 3), keepdims=True)
        v = ((blk - m) ** 2).mean(axis=(1, 2, 3), keepdims=True)
        ref[:, g:g + per] = (blk - m) / np.sqrt(v + eps)
    assert_close(ctx.read(out), ref, 1e-12)


def test_negative_eps_is_rejected(server, caplog):
    with rejected(server, caplog, "RMS_NORM", "eps") as c:
        c.op(Op.RMS_NORM, T.F32, (8,), c.new(T.F32, (8,), np.ones(8, np.float32)), params=[f32_bits(-1.0)])


def alibi_slopes(n_head, max_bias):
    if max_bias <= 0:
        return np.ones(n_head)
    n2 = 2 ** int(np.floor(np.log2(n_head)))
    m0 = 2.0 ** (-max_bias / n2)
    m1 = 2.0 ** (-(max_bias / 2) / n2)
    return np.array([m0 ** (h + 1) if h < n2 else m1 ** (2 * (h - n2) + 1) for h in range(n_head)])


def softmax_ref(x, scale, mask, slopes, sinks=None):
    """x: (ne3, heads, rows, cols); mask broadcast over heads/ne3; slopes per head."""
    z = x * scale
    if mask is not None:
        z = z + slopes[None, :, None, None] * mask
    m = z.max(axis=-1, keepdims=True)
    if sinks is not None:
        m = np.maximum(m, sinks[None, :, None, None])
    e = np.exp(z - m)
    s = e.sum(axis=-1, keepdims=True)
    if sinks is not None:
        s = s + np.exp(sinks[None, :, None, None] - m)
    return e / s


SOFT_MAX_CASES = [(m, b, s) for m in (None, T.F16, T.F32) for b in (0.0, 8.0) for s in (False, True)
                  if m is not None or not b]   # ALiBi needs a mask


@pytest.mark.parametrize("mask_t, max_bias, sinks", SOFT_MAX_CASES,
                         ids=lambda v: getattr(v, "name", str(v)))
def test_soft_max(ctx, rng, mask_t, max_bias, sinks):
    cols, rows, heads, ne3 = 37, 6, 5, 2
    scale = 0.35
    x = rng.standard_normal((ne3, heads, rows, cols)).astype(np.float32) * 3
    srcs = [ctx.new(T.F32, (cols, rows, heads, ne3), x)]
    mask = None
    if mask_t is not None:
        # a causal-style mask with -inf, wider and taller than needed, one per ne3
        m = np.where(rng.random((ne3, 1, rows + 2, cols + 3)) < 0.3, -np.inf, rng.standard_normal((ne3, 1, rows + 2, cols + 3)))
        m[..., 0] = 0.0
        m = m.astype(np.float16 if mask_t == T.F16 else np.float32)
        srcs.append(ctx.new(mask_t, (cols + 3, rows + 2, 1, ne3), m))
        mask = m[:, :, :rows, :cols].astype(np.float64)
    sk = None
    if sinks:
        if len(srcs) == 1:
            srcs.append(None)
        sk = rng.standard_normal(heads).astype(np.float32)
        srcs.append(ctx.new(T.F32, (heads,), sk))
    out = ctx.op(Op.SOFT_MAX, T.F32, (cols, rows, heads, ne3), *srcs,
                 params=[f32_bits(scale), f32_bits(max_bias)])
    ctx.compute()
    ref = softmax_ref(x.astype(np.float64), scale, mask, alibi_slopes(heads, max_bias),
                      sk.astype(np.float64) if sinks else None)
    assert_close(ctx.read(out), ref, 1e-10)
