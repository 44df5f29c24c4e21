"""ROPE and ROPE_BACK: normal and NeoX pairing, partial rotation, YaRN (ext_factor,
freq_scale, attn_factor), frequency factors, multi-section (MROPE, IMROPE, VISION),
F16 data and strided inputs, against a NumPy model of the rotation.

The model keeps one float32 detail of ggml on purpose: the angle of pair i is
built by repeated float32 multiplication (theta *= theta_scale), which is what
ggml does and what its results depend on at large positions; everything else is
float64."""
from __future__ import annotations

import math

import numpy as np
import pytest

from ggmlrpc.ggml import GGMLOp as Op, GGMLType as T
from tests.ops.conftest import assert_close, f32_bits

F = np.float32


def corr_dims(n_dims, n_ctx_orig, base, beta_fast, beta_slow):
    def dim(n_rot):
        return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))
    return max(0.0, math.floor(dim(beta_fast))), min(n_dims - 1.0, math.ceil(dim(beta_slow)))


def angles(pos4, ne0, n_dims, mode, base, freq_scale, ext_factor, attn_factor, corr, ff, sections):
    """(cos, sin) for each pair index i0/2 of one token, ggml's cache layout."""
    theta_scale = F(base) ** F(-2.0 / n_dims)
    th = [F(p) for p in pos4]
    sect = sum(sections)
    out = []
    for i in range(ne0 // 2):
        if mode & 8:
            sector = i % sect
            if mode == 24:  # vision: every section restarts its angle
                starts = [0, sections[0], sections[0] + sections[1], sections[0] + sections[1] + sections[2]]
                for k in range(4):
                    if sector == starts[k]:
                        th[k] = F(pos4[k])
            if mode == 40:  # interleaved
                k = 3
                if sector % 3 == 1 and sector < 3 * sections[1]:
                    k = 1
                elif sector % 3 == 2 and sector < 3 * sections[2]:
                    k = 2
                elif sector % 3 == 0 and sector < 3 * sections[0]:
                    k = 0
            else:
                k = 0
                if sections[0] <= sector < sections[0] + sections[1]:
                    k = 1
                elif sections[0] + sections[1] <= sector < sections[0] + sections[1] + sections[2]:
                    k = 2
                elif sector >= sections[0] + sections[1] + sections[2]:
                    k = 3
            theta_e = float(th[k])
        else:
            theta_e = float(th[0])
        theta_e /= ff[i] if ff is not None else 1.0
        theta = freq_scale * theta_e
        mscale = attn_factor
        if ext_factor:
            y = (i - corr[0]) / max(0.001, corr[1] - corr[0])
            ramp = (1 - min(1.0, max(0.0, y))) * ext_factor
            theta = theta * (1 - ramp) + theta_e * ramp
            mscale *= 1 + 0.1 * math.log(1 / freq_scale)
        out.append((math.cos(theta) * mscale, math.sin(theta) * mscale))
        th = [t * theta_scale for t in th]
    return out


def rope_ref(x, pos, n_dims, mode, base=10000.0, freq_scale=1.0, ext_factor=0.0, attn_factor=1.0,
             n_ctx_orig=512, beta_fast=32.0, beta_slow=1.0, ff=None, sections=(0, 0, 0, 0), n_offs=0,
             backward=False):
    """x: numpy (ne3, tokens, heads, ne0) float64."""
    ne0 = x.shape[-1]
    tokens = x.shape[1]
    corr = corr_dims(n_dims, n_ctx_orig, base, beta_fast, beta_slow)
    y = x.copy()
    for t in range(tokens):
        pos4 = [pos[t + k * tokens] for k in range(4)] if mode & 8 else [pos[t]] * 4
        cs = angles(pos4, ne0 if mode == 24 else n_dims, n_dims, mode, base, freq_scale, ext_factor,
                    attn_factor, corr, ff, sections)
        for i, (c, s) in enumerate(cs):
            if backward:
                s = -s
            if mode == 24:
                a, b = i, i + n_dims
            elif mode == 0:
                a, b = n_offs + 2 * i, n_offs + 2 * i + 1
            else:
                a, b = n_offs + i, n_offs + i + n_dims // 2
            x0, x1 = x[:, t, :, a], x[:, t, :, b]
            y[:, t, :, a] = x0 * c - x1 * s
            y[:, t, :, b] = x0 * s + x1 * c
    return y


def params(n_dims, mode, base=10000.0, freq_scale=1.0, ext_factor=0.0, attn_factor=1.0,
           n_ctx_orig=512, beta_fast=32.0, beta_slow=1.0, sections=(0, 0, 0, 0), n_offs=0):
    p = [0, n_dims, mode, 0, n_ctx_orig, f32_bits(base), f32_bits(freq_scale), f32_bits(ext_factor),
         f32_bits(attn_factor), f32_bits(beta_fast), f32_bits(beta_slow), *sections, n_offs]
    return p


CASES = {
    "normal": dict(n_dims=32, mode=0),
    "neox": dict(n_dims=32, mode=2),
    "normal-partial": dict(n_dims=16, mode=0),
    "neox-partial-offs": dict(n_dims=12, mode=2, n_offs=6),
    "yarn": dict(n_dims=32, mode=2, freq_scale=0.25, ext_factor=1.0, attn_factor=1.1, n_ctx_orig=64),
    "yarn-normal": dict(n_dims=32, mode=0, freq_scale=0.5, ext_factor=0.5, n_ctx_orig=128, base=500.0),
}


@pytest.mark.parametrize("name", list(CASES))
def test_rope(ctx, rng, name):
    kw = CASES[name]
    ne = (32, 4, 7, 2)   # (head dim, heads, tokens, ne3)
    x = rng.standard_normal(ne[::-1]).astype(np.float32)
    pos = rng.integers(0, 60, ne[2]).astype(np.int32)
    out = ctx.op(Op.ROPE, T.F32, ne, ctx.new(T.F32, ne, x), ctx.new(T.I32, (ne[2],), pos),
                 params=params(**kw))
    ctx.compute()
    assert_close(ctx.read(out), rope_ref(x.astype(np.float64), pos, **kw), 1e-11)


def test_rope_back_undoes_rope(ctx, rng):
    ne = (16, 2, 5, 1)
    x = rng.standard_normal(ne[::-1]).astype(np.float32)
    pos = np.arange(5, dtype=np.int32) * 7
    tp = ctx.new(T.I32, (5,), pos)
    fwd = ctx.op(Op.ROPE, T.F32, ne, ctx.new(T.F32, ne, x), tp, params=params(16, 2))
    back = ctx.op(Op.ROPE_BACK, T.F32, ne, fwd, tp, params=params(16, 2))
    ctx.compute()
    assert_close(ctx.read(back), x, 1e-12)
    assert_close(ctx.read(fwd), rope_ref(x.astype(np.float64), pos, 16, 2), 1e-11)


def test_rope_freq_factors(ctx, rng):
    ne = (24, 3, 4, 1)
    x = rng.standard_normal(ne[::-1]).astype(np.float32)
    pos = np.array([0, 5, 17, 40], np.int32)
    ff = (rng.random(12) * 3 + 0.5).astype(np.float32)
    out = ctx.op(Op.ROPE, T.F32, ne, ctx.new(T.F32, ne, x), ctx.new(T.I32, (4,), pos),
                 ctx.new(T.F32, (12,), ff), params=params(24, 2))
    ctx.compute()
    assert_close(ctx.read(out), rope_ref(x.astype(np.float64), pos, 24, 2, ff=ff.astype(np.float64)), 1e-11)


@pytest.mark.parametrize("mode, sections", [(8, (4, 2, 2, 0)), (40, (3, 3, 2, 0)), (24, (4, 4, 0, 0))],
                         ids=["mrope", "imrope", "vision"])
def test_rope_multi_section(ctx, rng, mode, sections):
    ne0 = 32 if mode == 24 else 24
    n_dims = 16 if mode == 24 else 16
    ne = (ne0, 2, 3, 1)
    x = rng.standard_normal(ne[::-1]).astype(np.float32)
    pos = rng.integers(0, 30, 4 * ne[2]).astype(np.int32)
    out = ctx.op(Op.ROPE, T.F32, ne, ctx.new(T.F32, ne, x), ctx.new(T.I32, (4 * ne[2],), pos),
                 params=params(n_dims, mode, sections=sections))
    ctx.compute()
    assert_close(ctx.read(out), rope_ref(x.astype(np.float64), pos, n_dims, mode, sections=sections), 1e-11)


def test_rope_f16(ctx, rng):
    ne = (32, 2, 3, 1)
    x = rng.standard_normal(ne[::-1]).astype(np.float16)
    pos = np.array([3, 9, 27], np.int32)
    out = ctx.op(Op.ROPE, T.F16, ne, ctx.new(T.F16, ne, x), ctx.new(T.I32, (3,), pos), params=params(32, 2))
    ctx.compute()
    ref = rope_ref(x.astype(np.float64), pos, 32, 2).astype(np.float16)
    assert_close(ctx.read(out).astype(np.float64), ref.astype(np.float64), 1e-6)


def test_rope_strided_input(ctx, rng):
    """The llama pattern: rope of a reshaped view into a wider projection output."""
    heads, hd, tokens = 4, 16, 3
    proj = rng.standard_normal((tokens, heads * hd + 8)).astype(np.float32)
    tp = ctx.new(T.F32, (heads * hd + 8, tokens), proj)
    row = (heads * hd + 8) * 4
    v = ctx.view(tp, (hd, heads, tokens, 1), (4, hd * 4, row, row * tokens), offset=8 * 4)
    pos = np.array([1, 2, 3], np.int32)
    out = ctx.op(Op.ROPE, T.F32, (hd, heads, tokens, 1), v, ctx.new(T.I32, (3,), pos), params=params(hd, 0))
    ctx.compute()
    x = proj[:, 8:].reshape(1, tokens, heads, hd).astype(np.float64)
    assert_close(ctx.read(out), rope_ref(x, pos, hd, 0), 1e-11)
