"""norm.cu, softmax.cu, rope.cu: row-wise kernels against NumPy and our CPU executor."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlrpc import builder as B
from ggmlrpc.cuda import ops
from ggmlrpc.ggml import GGMLOp, GGMLType as T

from .conftest import assert_close, cpu_ref


@pytest.mark.parametrize("kind", ["rms_norm", "norm", "l2_norm"])
@pytest.mark.parametrize("ncols,block", [(70, 32), (1100, None), (300, 128)])
def test_norm(k, rng, kind, ncols, block):
    nrows, ld = 3, ncols + 5
    x = (rng.standard_normal((nrows, ld)) + 0.5).astype(np.float32)
    out = k.empty(nrows * ncols * 4)
    ops.norm(k, kind, out, k.dev(x), ncols, nrows, ld, 1e-5, block=block)
    xa = x[:, :ncols].astype(np.float64)
    if kind == "rms_norm":
        ref = xa / np.sqrt((xa * xa).mean(-1, keepdims=True) + 1e-5)
    elif kind == "norm":
        c = xa - xa.mean(-1, keepdims=True)
        ref = c / np.sqrt((c * c).mean(-1, keepdims=True) + 1e-5)
    else:
        ref = xa / np.maximum(np.sqrt((xa * xa).sum(-1, keepdims=True)), 1e-5)
    assert_close(k.read(out, (nrows, ncols)), ref)


@pytest.mark.parametrize("mean", [False, True])
@pytest.mark.parametrize("ncols", [5, 1100])
def test_row_sum(k, rng, mean, ncols):
    nrows, ld = 4, ncols + 3
    x = rng.standard_normal((nrows, ld)).astype(np.float32)
    out = k.empty(nrows * 4)
    ops.row_sum(k, out, k.dev(x), ncols, nrows, ld, mean)
    xa = x[:, :ncols].astype(np.float64)
    assert_close(k.read(out, (nrows,)), xa.mean(-1) if mean else xa.sum(-1))


@pytest.mark.parametrize("mask_type", [None, T.F16, T.F32])
@pytest.mark.parametrize("max_bias", [0.0, 8.0])
@pytest.mark.parametrize("sinks", [False, True])
def test_soft_max(k, rng, mask_type, max_bias, sinks):
    if max_bias and mask_type is None:
        pytest.skip("ggml has no ALiBi without a mask")
    ncols, ne01, ne02, ne03 = 45, 3, 4, 2
    x = rng.standard_normal((ne03, ne02, ne01, ncols)).astype(np.float32)
    inputs = [(T.F32, (ncols, ne01, ne02, ne03), x)]
    mask = None
    if mask_type is not None:
        m = rng.standard_normal((1, 2, ne01 + 1, ncols)).astype(np.float32)   # broadcast over heads 2 by 2
        m[..., ::7] = -np.inf
        mask = m.astype(np.float16 if mask_type == T.F16 else np.float32)
        inputs.append((mask_type, (ncols, ne01 + 1, 2, 1), mask))
    sk = rng.standard_normal(ne02).astype(np.float32) if sinks else None
    if sinks:
        inputs.append((T.F32, (ne02,), sk))

    def make(a, *rest):
        m = rest[0] if mask is not None else None
        s = rest[-1] if sinks else None
        return B.soft_max_ext(a, m, 0.7, max_bias, sinks=s)

    ref = cpu_ref(make, *inputs)
    out = k.empty(x.nbytes)
    ops.soft_max(k, out, k.dev(x), ncols, ne01, ne02, ne03, ncols, mask=None if mask is None else k.dev(mask),
                 mask_ne=(ne01 + 1, 2, 1), mask_f16=mask_type == T.F16, sinks=None if sk is None else k.dev(sk),
                 scale=0.7, max_bias=max_bias)
    assert_close(k.read(out, x.shape), ref)


@pytest.mark.parametrize("mode", [0, 2])
@pytest.mark.parametrize("yarn", [False, True])
@pytest.mark.parametrize("freq_factors", [False, True])
def test_rope(k, rng, mode, yarn, freq_factors):
    ne0, n_head, n_tok, n_dims = 24, 3, 5, 16          # partial rotation: the tail is copied
    x = rng.standard_normal((n_tok, n_head, ne0 + 4)).astype(np.float32)   # rows padded: a strided view
    xs = np.ascontiguousarray(x[..., :ne0])
    pos = rng.integers(0, 2000, n_tok).astype(np.int32)
    ff = (1 + rng.random(n_dims // 2)).astype(np.float32)
    kw = dict(freq_base=10000.0, freq_scale=0.25 if yarn else 1.0, ext_factor=1.0 if yarn else 0.0,
              attn_factor=1.0, beta_fast=32.0, beta_slow=1.0)
    inputs = [(T.F32, (ne0, n_head, n_tok), xs), (T.I32, (n_tok,), pos)]
    if freq_factors:
        inputs.append((T.F32, (n_dims // 2,), ff))
    ref = cpu_ref(lambda a, p, *f: B.rope_ext(a, p, f[0] if f else None, n_dims, mode, 4096, **kw), *inputs)
    out = k.empty(xs.nbytes)
    ops.rope(k, out, k.dev(x), k.dev(pos), (ne0, n_head, n_tok), (4, 4 * (ne0 + 4), 4 * (ne0 + 4) * n_head), n_dims,
             mode, n_ctx_orig=4096, freq_factors=k.dev(ff) if freq_factors else None, max_blocks=2, **kw)
    assert_close(k.read(out, xs.shape), ref)


@pytest.mark.parametrize("mode", [8, 40])
def test_rope_multi_section(k, rng, mode):
    ne0, n_head, n_tok, n_dims = 32, 2, 4, 32
    sections = (4, 6, 6, 0)
    x = rng.standard_normal((n_tok, n_head, ne0)).astype(np.float32)
    pos = rng.integers(0, 500, 4 * n_tok).astype(np.int32)

    def make(a, p):
        params = [0, n_dims, mode, 0, 4096] + [B.f32_bits(v) for v in (10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)]
        params += list(sections)
        return B._node(GGMLOp.ROPE, T.F32, a.ne, a, p, None, params=params)

    ref = cpu_ref(make, (T.F32, (ne0, n_head, n_tok), x), (T.I32, (4 * n_tok,), pos))
    out = k.empty(x.nbytes)
    ops.rope(k, out, k.dev(x), k.dev(pos), (ne0, n_head, n_tok), (4, 4 * ne0, 4 * ne0 * n_head), n_dims, mode,
             n_ctx_orig=4096, sections=sections)
    assert_close(k.read(out, x.shape), ref)
