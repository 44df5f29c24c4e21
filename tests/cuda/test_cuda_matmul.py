"""matmul.cu: MUL_MAT (dp4a mat-vec, dequantizing mat-vec, tiled GEMM) and MUL_MAT_ID
for every weight type, against dequant(W) @ X in float64 and against our CPU executor."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlrpc import builder as B
from ggmlrpc import ggml
from ggmlrpc.cuda import ops
from ggmlrpc.ggml import GGMLType as T

from .conftest import assert_close, cpu_ref, dequantize, random_weights

ALL = list(ops.TYPES)
QUANT = [t for t in ALL if t not in ops.FLOAT_TYPES]
# weight types whose CPU dot product quantizes the activations as the dp4a path does
SAME_ACTIVATIONS = {T.Q4_0, T.Q5_1, T.Q8_0, T.IQ4_NL, T.MXFP4}


def _weights(rng, type_, nmat, nrows, ncols):
    if type_ in (T.F16, T.BF16):
        w = rng.standard_normal((nmat * nrows, ncols)).astype(np.float32)
        if type_ == T.F16:
            data = w.astype(np.float16).view(np.uint8)
        else:
            data = (w.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)    # truncated: exact in bf16
        ref = data.view(np.float16).astype(np.float64) if type_ == T.F16 else \
            (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        return data, ref.reshape(nmat, nrows, ncols)
    data = random_weights(rng, type_, nmat * nrows, ncols)
    return data, dequantize(type_, data).astype(np.float64).reshape(nmat, nrows, ncols)


def _ncols(type_):
    return 512 if ggml.blck_size(type_) == 256 else 96


@pytest.mark.parametrize("type_", ALL, ids=lambda t: t.name)
@pytest.mark.parametrize("strategy,ncols_y", [("mmvq", 3), ("mmvq", 11), ("vec", 2), ("tiled", 35)])
def test_mul_mat(k, rng, type_, strategy, ncols_y):
    if strategy == "mmvq" and type_ in ops.FLOAT_TYPES:
        pytest.skip("dp4a takes quantized weights")
    ncols, nrows, nz, r2 = _ncols(type_), 37, 2, 2          # one W broadcast over two batches
    w, wf = _weights(rng, type_, 1, nrows, ncols)
    x = rng.standard_normal((nz, ncols_y, ncols)).astype(np.float32)
    out = k.empty(nz * ncols_y * nrows * 4)
    q8 = k.empty(ops.q8_1_bytes(ncols, ncols_y * nz))
    ops.mul_mat(k, type_, out, k.dev(w), k.dev(x), ncols, nrows, ncols_y, nz=nz, r2=r2, strategy=strategy,
                q8_scratch=q8)
    ref = np.einsum("rk,zck->zcr", wf[0], x.astype(np.float64))
    # the device's tiled GEMM multiplies in TF32 on tensor cores (sm_80+): test-backend-ops' bound
    exact = strategy != "mmvq" and not (strategy == "tiled" and k.on_device)
    assert_close(k.read(out, ref.shape), ref, 1e-6 if exact else 5e-4)


@pytest.mark.parametrize("type_", [T.F16, T.Q4_0, T.Q8_0, T.Q4_K, T.Q6_K, T.MXFP4], ids=lambda t: t.name)
@pytest.mark.parametrize("ne11", [1, 2])
def test_mul_mat_id(k, rng, type_, ne11):
    ncols, nrows, n_exp, n_used, n_tok = _ncols(type_), 21, 4, 2, 3
    w, wf = _weights(rng, type_, n_exp, nrows, ncols)
    x = rng.standard_normal((n_tok, ne11, ncols)).astype(np.float32)
    ids = np.stack([rng.permutation(n_exp)[:n_used] for _ in range(n_tok)]).astype(np.int32)
    out = k.empty(n_tok * n_used * nrows * 4)
    q8 = k.empty(ops.q8_1_bytes(ncols, ne11 * n_tok))
    ops.mul_mat_id(k, type_, out, k.dev(w), k.dev(x), k.dev(ids), ncols, nrows, n_used, n_tok, ne11, q8_scratch=q8)
    ref = np.stack([np.stack([wf[ids[t, e]] @ x[t, e % ne11] for e in range(n_used)]) for t in range(n_tok)])
    assert_close(k.read(out, ref.shape), ref, 1e-6 if type_ == T.F16 else 5e-4)


def test_choose_mul_mat():
    assert ops.choose_mul_mat(T.Q4_0, 1) == "mmvq"
    assert ops.choose_mul_mat(T.F16, 4) == "vec"
    assert ops.choose_mul_mat(T.Q4_K, 64) == "tiled"


@pytest.mark.parametrize("type_", [T.Q4_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL,
                                   T.IQ4_XS, T.MXFP4, T.BF16], ids=lambda t: t.name)
@pytest.mark.parametrize("strategy,ncols_y", [("mmvq", 1), ("tiled", 9)])
def test_mul_mat_matches_cpu_executor(k, rng, type_, strategy, ncols_y):
    """The same weights and activations through our CPU executor (which, like ggml,
    quantizes the activations to the weights' dot-product type).

    Where both sides quantize the activations alike (the dp4a path and the CPU's
    Q8_0/Q8_1 dot types) they agree to rounding. Elsewhere they part by two different
    activation errors: the CPU's Q8_K (one scale per 256) against q8_1 (one per 32,
    its sum in f16) or the tiled path's exact f32. With random K-quant blocks, whose
    min offsets are large, that difference is heavy-tailed: over 600 seeds at 64 rows
    its NMSE reached 5.9e-4 (median 6e-5), so the bound there is 2e-3; at 19 rows it
    reached 1.3e-3, hence 64 rows."""
    if strategy == "mmvq" and type_ in ops.FLOAT_TYPES:
        strategy = "vec"
    ncols, nrows = _ncols(type_), 64
    w, _ = _weights(rng, type_, 1, nrows, ncols)
    x = rng.standard_normal((ncols_y, ncols)).astype(np.float32)
    ref = cpu_ref(B.mul_mat, (type_, (ncols, nrows), w), (T.F32, (ncols, ncols_y), x))
    out = k.empty(ncols_y * nrows * 4)
    ops.mul_mat(k, type_, out, k.dev(w), k.dev(x), ncols, nrows, ncols_y, strategy=strategy,
                q8_scratch=k.empty(ops.q8_1_bytes(ncols, ncols_y)))
    alike = strategy == "vec" or (strategy == "mmvq" and type_ in SAME_ACTIVATIONS)
    assert_close(k.read(out, (ncols_y, nrows)), ref, 1e-4 if alike else 2e-3)
