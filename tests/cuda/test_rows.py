"""rows.cu: GET_ROWS for every type, SET_ROWS and CPY into quant blocks, scalar CPY."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlrpc import ggml
from ggmlrpc.cuda import ops
from ggmlrpc.ggml import GGMLType as T

from .conftest import assert_close, dequantize, random_weights

ALL = list(ops.TYPES)


@pytest.mark.parametrize("type_", ALL, ids=lambda t: t.name)
def test_get_rows(k, rng, type_):
    ncols = 256 if ggml.blck_size(type_) == 256 else 96
    n_rows, n_slices = 5, 2
    w = random_weights(rng, type_, n_rows * n_slices, ncols)       # (ne02=2, ne01=5) rows
    ids = rng.integers(0, n_rows, (n_slices, 3)).astype(np.int32)  # (ne11=2, ne10=3)
    rb = w.shape[1]
    out = k.empty(n_slices * 3 * ncols * 4)
    ops.get_rows(k, type_, out, k.dev(w), k.dev(ids), ncols, (3, n_slices, 1), (0, rb, rb * n_rows, rb * n_rows * n_slices))
    full = dequantize(type_, w).reshape(n_slices, n_rows, ncols)
    ref = np.stack([full[s][ids[s]] for s in range(n_slices)])
    assert_close(k.read(out, ref.shape), ref, 0)


def _quantize_ref(type_, x):
    from gguf import GGMLQuantizationType as Q, quants
    if type_ == T.F32:
        return x.view(np.uint8)
    return np.ascontiguousarray(quants.quantize(x, Q[type_.name])).view(np.uint8)


@pytest.mark.parametrize("type_", ops.STORE_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("ids_i32", [False, True])
def test_set_rows(k, rng, type_, ids_i32):
    ne00, ne01, ne02, n_dst_rows = 64, 3, 2, 7
    src = rng.standard_normal((ne02, ne01, ne00)).astype(np.float32)
    ids = np.stack([rng.permutation(n_dst_rows)[:ne01] for _ in range(ne02)]).astype(np.int32 if ids_i32 else np.int64)
    rb = ops.row_bytes(type_, ne00)
    dst0 = np.full((ne02, n_dst_rows, rb), 0x3C, np.uint8)
    dst = k.dev(dst0)
    ops.set_rows(k, type_, dst, (0, rb, rb * n_dst_rows, rb * n_dst_rows * ne02), k.dev(src), (ne00, ne01, ne02),
                 k.dev(ids), (ne01, ne02, 1), ids_i32=ids_i32, max_blocks=2)
    got = k.read(dst, dst0.shape, np.uint8)
    want = dst0.copy()
    for s in range(ne02):
        want[s, ids[s]] = _quantize_ref(type_, src[s]).reshape(ne01, rb)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("type_", ops.STORE_TYPES[3:], ids=lambda t: t.name)
def test_cpy_blocks_round_trip(k, rng, type_):
    ne00, nrows = 64, 3
    x = rng.standard_normal((nrows, ne00 + 8)).astype(np.float32)       # strided source rows
    rb = ops.row_bytes(type_, ne00)
    q = k.empty(nrows * rb)
    ops.cpy_to_blocks(k, type_, q, k.dev(x), ne00, nrows, 4 * (ne00 + 8), rb)
    qb = k.read(q, (nrows, rb), np.uint8)
    assert np.array_equal(qb, _quantize_ref(type_, np.ascontiguousarray(x[:, :ne00])).reshape(nrows, rb))
    back = k.empty(nrows * ne00 * 4)
    ops.cpy_from_blocks(k, type_, back, q, ne00, nrows, rb, 4 * ne00)
    assert_close(k.read(back, (nrows, ne00)), dequantize(type_, qb), 0)


NP_SCALAR = {T.F32: np.float32, T.F16: np.float16}


@pytest.mark.parametrize("stype", [T.F32, T.F16, T.BF16], ids=lambda t: t.name)
@pytest.mark.parametrize("dtype", [T.F32, T.F16, T.BF16], ids=lambda t: t.name)
def test_cpy_scalar_transposed(k, rng, stype, dtype):
    x = rng.standard_normal((2, 5, 7)).astype(np.float32)
    x[0, 0, :3] = [np.inf, -np.inf, np.nan]

    def enc(a, t):
        if t == T.BF16:
            u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
            b = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
            return np.where(np.isnan(a), (u >> 16).astype(np.uint16) | 64, b).astype(np.uint16)
        return a.astype(NP_SCALAR[t])

    def dec(a, t):
        return (a.astype(np.uint32) << 16).view(np.float32) if t == T.BF16 else a.astype(np.float32)

    src = enc(x, stype)
    es = src.itemsize
    # read src transposed in its last two dims (ggml_cont(ggml_transpose(x)))
    ne = (5, 7, 2)
    src_nb = (7 * es, es, 35 * es)
    de = 4 if dtype == T.F32 else 2
    out = k.empty(2 * 5 * 7 * de)
    ops.cpy_scalar(k, out, dtype, (de, 5 * de, 35 * de), k.dev(src), stype, src_nb, ne, max_blocks=1)
    got = dec(k.read(out, (2, 7, 5), np.float32 if dtype == T.F32 else np.uint16 if dtype == T.BF16 else np.float16), dtype)
    want = dec(enc(dec(src, stype).transpose(0, 2, 1), dtype), dtype)
    np.testing.assert_array_equal(got, want)
