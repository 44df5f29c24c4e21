"""flash_attn.cu against our CPU executor's FLASH_ATTN_EXT; sort.cu against NumPy."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlrpc import builder as B
from ggmlrpc.cuda import ops
from ggmlrpc.ggml import GGMLType as T

from .conftest import cpu_ref, assert_close, random_weights


def _kv(rng, type_, rows, D):
    if type_ == T.F16:
        a = rng.standard_normal((rows, D)).astype(np.float16)
        return a.view(np.uint8).reshape(rows, -1)
    return random_weights(rng, type_, rows, D)


@pytest.mark.parametrize("kv_type", [T.F16, T.Q8_0], ids=lambda t: t.name)
@pytest.mark.parametrize("D,n_q,n_kv", [(64, 1, 45), (128, 3, 20), (320, 2, 9)])
@pytest.mark.parametrize("extras", ["plain", "alibi_sinks", "softcap"])
def test_flash_attn_ext(k, rng, kv_type, D, n_q, n_kv, extras):
    H, H_kv = 4, 2
    q = (rng.standard_normal((H, n_q, D)) * 0.5).astype(np.float32)
    kd = _kv(rng, kv_type, H_kv * n_kv, D)
    vd = _kv(rng, kv_type, H_kv * n_kv, D)
    mask = rng.standard_normal((n_q, n_kv)).astype(np.float16)
    mask[:, ::5] = -np.inf
    sinks = rng.standard_normal(H).astype(np.float32)
    max_bias = 4.0 if extras == "alibi_sinks" else 0.0
    softcap = 20.0 if extras == "softcap" else 0.0
    use_sinks = extras == "alibi_sinks"
    scale = 1.0 / np.sqrt(D)
    inputs = [(T.F32, (D, n_q, H), q), (kv_type, (D, n_kv, H_kv), kd), (kv_type, (D, n_kv, H_kv), vd),
              (T.F16, (n_kv, n_q), mask)]
    if use_sinks:
        inputs.append((T.F32, (H,), sinks))

    def make(qt, kt, vt, mt, *s):
        return B.flash_attn_ext(qt, kt, vt, mt, scale, max_bias, softcap, sinks=s[0] if s else None)

    ref = cpu_ref(make, *inputs)
    out = k.empty(n_q * H * D * 4)
    ops.flash_attn_ext(k, kv_type, out, k.dev(q), k.dev(kd), k.dev(vd), D, D, n_q, H, n_kv, H_kv, mask=k.dev(mask),
                       sinks=k.dev(sinks) if use_sinks else None, scale=scale, max_bias=max_bias, softcap=softcap)
    assert_close(k.read(out, (n_q, H, D)), ref, 5e-4)


@pytest.mark.parametrize("ncols", [1, 7, 32, 100, 1500])
@pytest.mark.parametrize("descending", [False, True])
def test_argsort(k, rng, ncols, descending):
    nrows, ld = 2, ncols + 2
    # distinct values: the order of equal ones is unspecified (float32 normals collide
    # about once in fourteen rows of 1500)
    x = (rng.permutation(nrows * ld).reshape(nrows, ld) - nrows * ld / 2).astype(np.float32) / 7
    out = k.empty(nrows * ncols * 4)
    scratch = k.empty(max(4, ops.argsort_scratch_bytes(ncols, nrows)))
    ops.argsort(k, out, k.dev(x), ncols, nrows, ld, descending, scratch=scratch)
    xs = x[:, :ncols]
    want = np.argsort(-xs if descending else xs, axis=1, kind="stable")
    np.testing.assert_array_equal(k.read(out, (nrows, ncols), np.int32), want)


def test_top_k(k, rng):
    x = rng.standard_normal((2, 50)).astype(np.float32)
    out = k.empty(2 * 5 * 4)
    ops.argsort(k, out, k.dev(x), 50, 2, 50, descending=True, top_k=5)
    np.testing.assert_array_equal(k.read(out, (2, 5), np.int32), np.argsort(-x, axis=1)[:, :5])
