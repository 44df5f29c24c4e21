"""Copies and row indexing: CPY/DUP/CONT across types, shapes and strides; GET_ROWS and
SET_ROWS, including indices out of range (the connection closes, nothing is written
outside the tensors, other clients keep working)."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlrpc.errors import ServerClosed
from ggmlrpc.ggml import GGMLOp as Op, GGMLType as T
from tests.ops.conftest import Ctx, assert_close, closed, from_bf16, rejected, to_bf16

CONV = [(T.F32, T.F16), (T.F16, T.F32), (T.F32, T.BF16), (T.BF16, T.F32), (T.F16, T.BF16),
        (T.F32, T.F32), (T.F16, T.F16), (T.I32, T.I32), (T.F32, T.I32), (T.I32, T.F32)]


def as_type(x, t):
    if t == T.F16:
        return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)
    if t == T.BF16:
        return from_bf16(to_bf16(x))
    if t == T.I32:
        return np.trunc(np.asarray(x, np.float32))
    return np.asarray(x, np.float32)


@pytest.mark.parametrize("src_t, dst_t", CONV, ids=lambda t: t.name)
def test_cpy_types(ctx, rng, src_t, dst_t):
    ne = (19, 4, 3, 1)
    x = as_type(rng.standard_normal(ne[::-1]) * 50, src_t)
    dst = ctx.new(dst_t, ne)
    node = ctx.op(Op.CPY, dst_t, ne, ctx.new(src_t, ne, x), dst)
    node.data, node.view_src = dst.data, dst          # CPY's result is a view of its target
    ctx.compute()
    np.testing.assert_array_equal(ctx.read(dst).astype(np.float32), as_type(x, dst_t).reshape(1, 3, 4, 19))


def test_cont_of_permuted(ctx, rng):
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)     # ne (5, 4, 3, 2)
    p = ctx.permute(ctx.new(T.F32, (5, 4, 3, 2), x), 0, 2, 1, 3)  # ne (5, 3, 4, 2)
    out = ctx.op(Op.CONT, T.F32, p.ne, p)
    ctx.compute()
    np.testing.assert_array_equal(ctx.read(out), x.transpose(0, 2, 1, 3))


def test_cont_of_transposed_f16(ctx, rng):
    x = rng.standard_normal((6, 33)).astype(np.float16)
    tp = ctx.transpose(ctx.new(T.F16, (33, 6), x))                 # nb0 = 66
    out = ctx.op(Op.CONT, T.F16, tp.ne, tp)
    ctx.compute()
    np.testing.assert_array_equal(ctx.read(out).reshape(33, 6), x.T)


def test_dup_reshapes_in_element_order(ctx, rng):
    """Different shapes, same element count: elements follow logical row-major order,
    through the source's strides (a transposed source)."""
    x = rng.standard_normal((10, 12)).astype(np.float32)
    tp = ctx.transpose(ctx.new(T.F32, (12, 10), x))               # logical (10, 12) in numpy: x.T
    out = ctx.op(Op.DUP, T.F16, (8, 15, 1, 1), tp)
    ctx.compute()
    ref = x.T.reshape(-1).astype(np.float16).reshape(15, 8)
    np.testing.assert_array_equal(ctx.read(out).reshape(15, 8), ref)


def test_cpy_into_strided_view(ctx, rng):
    """The KV-cache pattern: rows written into a view of a bigger tensor."""
    cache = ctx.new(T.F16, (64, 16), np.zeros((16, 64), np.float16))
    x = rng.standard_normal((3, 64)).astype(np.float32)
    view = ctx.view(cache, (64, 3), (2, 128, 128 * 3, 128 * 3), offset=5 * 128)
    node = ctx.op(Op.CPY, T.F16, (64, 3), ctx.new(T.F32, (64, 3), x), view)
    node.data, node.view_src = view.data, cache
    ctx.compute()
    got = ctx.read(cache).reshape(16, 64)
    ref = np.zeros((16, 64), np.float16)
    ref[5:8] = x.astype(np.float16)
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("src_t", [T.F32, T.F16, T.BF16, T.I32], ids=lambda t: t.name)
def test_get_rows(ctx, rng, src_t):
    nc, nr, ne2 = 24, 10, 3
    x = as_type(rng.standard_normal((ne2, nr, nc)) * 10, src_t)
    idx = rng.integers(0, nr, (ne2, 5)).astype(np.int32)           # (5, ne2) in ggml order
    dst_t = T.I32 if src_t == T.I32 else T.F32
    out = ctx.op(Op.GET_ROWS, dst_t, (nc, 5, ne2, 1), ctx.new(src_t, (nc, nr, ne2), x),
                 ctx.new(T.I32, (5, ne2), idx))
    ctx.compute()
    ref = np.stack([x[k][idx[k]] for k in range(ne2)])
    np.testing.assert_array_equal(ctx.read(out).reshape(ref.shape).astype(np.float32), ref)


@pytest.mark.parametrize("idx_t", [T.I64, T.I32], ids=lambda t: t.name)
@pytest.mark.parametrize("dst_t", [T.F16, T.F32, T.BF16], ids=lambda t: t.name)
def test_set_rows(ctx, rng, dst_t, idx_t):
    nc, n_dst, n_src, ne2 = 32, 12, 4, 2
    base = as_type(rng.standard_normal((ne2, n_dst, nc)), dst_t)
    dst = ctx.new(dst_t, (nc, n_dst, ne2), base)
    x = rng.standard_normal((ne2, n_src, nc)).astype(np.float32)
    idx = np.array([[7, 0, 11, 3]], dtype=np.int64 if idx_t == T.I64 else np.int32)   # broadcast over ne2
    node = ctx.op(Op.SET_ROWS, dst_t, dst.ne, ctx.new(T.F32, (nc, n_src, ne2), x),
                  ctx.new(idx_t, (n_src, 1), idx), dst)
    node.data, node.view_src = dst.data, dst
    ctx.compute()
    ref = base.copy()
    ref[:, idx[0]] = as_type(x, dst_t)
    np.testing.assert_array_equal(ctx.read(dst).reshape(ref.shape).astype(np.float32), ref)


@pytest.mark.parametrize("bad", [-1, 10, 0x7FFFFFFF])
def test_get_rows_index_out_of_range_closes(server, rng, caplog, bad):
    with rejected(server, caplog, f"GET_ROWS index {bad} out of range [0, 10)") as c:
        x = rng.standard_normal((10, 8)).astype(np.float32)
        idx = np.array([1, 2, bad], dtype=np.int32)
        c.op(Op.GET_ROWS, T.F32, (8, 3), c.new(T.F32, (8, 10), x), c.new(T.I32, (3,), idx))
    # the server still serves everyone else
    ok = Ctx(f"127.0.0.1:{server.port}")
    try:
        assert ok.rb.device_count() == 1
    finally:
        ok.close()


def test_set_rows_index_out_of_range_closes(server, caplog):
    """Index 4 into a 4-row view of an 8-row tensor would land inside the buffer, so
    only the check stops it (the next test runs the same graph with index 3)."""
    c = Ctx(f"127.0.0.1:{server.port}")
    try:
        big = c.new(T.F32, (16, 8), np.full((8, 16), 7.0, np.float32))
        dst = c.view(big, (16, 4), (64, 64 * 4, 64 * 4, 64 * 4))   # rows 0..3 of 8
        node = c.op(Op.SET_ROWS, T.F32, dst.ne, c.new(T.F32, (16, 2), np.ones((2, 16), np.float32)),
                    c.new(T.I64, (2,), np.array([1, 4], np.int64)), dst)
        node.data, node.view_src = dst.data, big
        c.rb.graph_compute(c.nodes)
        with pytest.raises(ServerClosed):
            c.read(big)
        assert "SET_ROWS index 4 out of range [0, 4)" in caplog.text
    finally:
        c.close()


def test_set_rows_in_range_leaves_the_rest(server):
    """The graph above with index 3: rows 1 and 3 written, rows 4..7 untouched."""
    c = Ctx(f"127.0.0.1:{server.port}")
    try:
        big = c.new(T.F32, (16, 8), np.full((8, 16), 7.0, np.float32))
        dst = c.view(big, (16, 4), (64, 64 * 4, 64 * 4, 64 * 4))
        node = c.op(Op.SET_ROWS, T.F32, dst.ne, c.new(T.F32, (16, 2), np.ones((2, 16), np.float32)),
                    c.new(T.I64, (2,), np.array([1, 3], np.int64)), dst)
        node.data, node.view_src = dst.data, big
        c.compute()
        got = c.read(big).reshape(8, 16)
        ref = np.full((8, 16), 7.0, np.float32)
        ref[[1, 3]] = 1.0
        np.testing.assert_array_equal(got, ref)
    finally:
        c.close()


def test_get_rows_in_recompute_checks_new_indices(server, rng, caplog):
    """Indices are checked when the graph runs: a recompute after the client wrote
    a bad index closes the connection."""
    c = Ctx(f"127.0.0.1:{server.port}")
    try:
        x = rng.standard_normal((10, 8)).astype(np.float32)
        idx = c.new(T.I32, (2,), np.array([3, 4], np.int32))
        out = c.op(Op.GET_ROWS, T.F32, (8, 2), c.new(T.F32, (8, 10), x), idx)
        c.compute()
        assert_close(c.read(out), x[[3, 4]], 0)
        c.write(idx, np.array([9, 0], np.int32))
        c.recompute()
        assert_close(c.read(out), x[[9, 0]], 0)
        c.write(idx, np.array([0, 10], np.int32))
        c.rb.graph_recompute()
        closed(c, caplog, "GET_ROWS index 10 out of range [0, 10)")
    finally:
        c.close()


QTYPES = [T.Q8_0, T.Q4_0, T.Q4_K, T.IQ2_XXS, T.IQ3_S, T.IQ1_M]


def dequant(t, raw, n):
    from gguf import quants as gq
    from ggmlrpc import ggml
    blck, size = ggml.TYPE_TRAITS[t]
    return gq.dequantize(np.frombuffer(raw, np.uint8).reshape(-1, n // blck * size), t)


@pytest.mark.parametrize("qt", QTYPES, ids=lambda t: t.name)
def test_get_rows_quantized(ctx, rng, qt):
    from tests.ops.test_quants import random_blocks
    nc, nr = 256, 6
    raw = random_blocks(rng, qt, nc * nr)
    src = ctx.new(qt, (nc, nr))
    ctx.rb.set_tensor(src, raw.tobytes())
    idx = np.array([5, 0, 3, 3], np.int32)
    out = ctx.op(Op.GET_ROWS, T.F32, (nc, 4), src, ctx.new(T.I32, (4,), idx))
    ctx.compute()
    np.testing.assert_array_equal(ctx.read(out).reshape(4, nc), dequant(qt, raw.tobytes(), nc)[idx])


@pytest.mark.parametrize("qt", [T.Q8_0, T.Q4_0], ids=lambda t: t.name)
def test_set_rows_and_cpy_quantize(ctx, rng, qt):
    """Rows written into a quantized KV cache (SET_ROWS) and a CPY to a quantized
    tensor: the blocks gguf-py's quantizer makes of the inputs."""
    nc = 64
    cache = ctx.new(qt, (nc, 8))
    x = rng.standard_normal((3, nc)).astype(np.float32)
    tx = ctx.new(T.F32, (nc, 3), x)
    node = ctx.op(Op.SET_ROWS, qt, cache.ne, tx, ctx.new(T.I64, (3,), np.array([6, 1, 2], np.int64)), cache)
    node.data, node.view_src = cache.data, cache
    q = ctx.new(qt, (nc, 3))
    c = ctx.op(Op.CPY, qt, (nc, 3), tx, q)
    c.data, c.view_src = q.data, q
    back = ctx.op(Op.CPY, T.F32, (nc, 3), q, ctx.new(T.F32, (nc, 3)))   # dequantize on the server
    ctx.compute()
    rows = dequant(qt, bytes(ctx.rb.get_tensor(cache)), nc)
    # ggml's quantizer is gguf-py's: the same blocks, so the same values back
    from gguf import quants as gq
    ref = gq.dequantize(gq.quantize(x, qt), qt)
    np.testing.assert_array_equal(rows[[6, 1, 2]], ref)
    np.testing.assert_array_equal(dequant(qt, bytes(ctx.rb.get_tensor(q)), nc), ref)
    np.testing.assert_array_equal(ctx.read(back).reshape(3, nc), dequant(qt, bytes(ctx.rb.get_tensor(q)), nc))


def test_cont_quantized_rows(ctx, rng):
    """Same-type copies of quantized data move whole rows of blocks (a strided view)."""
    from tests.ops.test_quants import random_blocks
    raw = random_blocks(rng, T.Q8_0, 64 * 6)
    full = ctx.new(T.Q8_0, (64, 6))
    ctx.rb.set_tensor(full, raw.tobytes())
    every_other = ctx.view(full, (64, 3), (34, 136, 408, 408))   # rows 0, 2, 4
    out = ctx.op(Op.CONT, T.Q8_0, (64, 3), every_other)
    ctx.compute()
    rows = raw.reshape(6, 68)
    assert bytes(ctx.rb.get_tensor(out)) == rows[[0, 2, 4]].tobytes()


def test_cpy_quantized_reshape_moves_blocks(ctx, rng):
    """A same-type copy of quantized data into another shape moves whole blocks in
    logical order (ggml's dup_bytes): Q4_0 (64, 3) -> (32, 6), from a permuted view."""
    from tests.ops.test_quants import random_blocks
    raw = random_blocks(rng, T.Q4_0, 64 * 3 * 2).reshape(2, 3, 2, 18)          # ne (64, 3, 2)
    full = ctx.new(T.Q4_0, (64, 3, 2))
    ctx.rb.set_tensor(full, raw.tobytes())
    p = ctx.permute(full, 0, 2, 1, 3)                                            # ne (64, 2, 3)
    out = ctx.op(Op.CPY, T.Q4_0, (32, 6, 2), p, ctx.new(T.Q4_0, (32, 6, 2)))
    ctx.compute()
    blocks = np.swapaxes(raw, 0, 1).reshape(-1, 18)                              # logical order of p
    assert bytes(ctx.rb.get_tensor(out)) == blocks.tobytes()


@pytest.mark.parametrize("qt", [T.Q1_0, T.Q2_0, T.NVFP4, T.TQ1_0, T.TQ2_0, T.Q2_K, T.Q3_K, T.Q4_K,
                                T.Q5_K, T.Q6_K, T.IQ4_XS], ids=lambda t: t.name)
def test_set_rows_quantizes_with_the_row_quantizer(ctx, rng, qt):
    """SET_ROWS into every quantized cache type writes the blocks of csrc's row
    quantizer (checked against ggml's own in tests/interop/test_quants_vs_ggml.py)."""
    from ggmlrpc._native import quants
    nc = 256
    cache = ctx.new(qt, (nc, 4))
    x = rng.standard_normal((2, nc)).astype(np.float32)
    node = ctx.op(Op.SET_ROWS, qt, cache.ne, ctx.new(T.F32, (nc, 2), x),
                  ctx.new(T.I64, (2,), np.array([3, 1], np.int64)), cache)
    node.data, node.view_src = cache.data, cache
    ctx.compute()
    rows = np.frombuffer(bytes(ctx.rb.get_tensor(cache)), np.uint8).reshape(4, -1)
    assert rows[3].tobytes() == quants.quantize(qt, x[0]).tobytes()
    assert rows[1].tobytes() == quants.quantize(qt, x[1]).tobytes()


@pytest.mark.parametrize("ne", [(32, 6), (48, 4), (192, 1)])
def test_cpy_dequantizes_into_another_shape(ctx, rng, ne):
    """Quantized -> F32 into another shape: blocks dequantized in logical order (a
    block may run over a row end of a contiguous result, as in ggml's dup_from_q)."""
    from tests.ops.test_quants import random_blocks
    raw = random_blocks(rng, T.Q8_0, 64 * 3)
    q = ctx.new(T.Q8_0, (64, 3))
    ctx.rb.set_tensor(q, raw.tobytes())
    out = ctx.op(Op.CPY, T.F32, ne, q, ctx.new(T.F32, ne))
    ctx.compute()
    np.testing.assert_array_equal(ctx.read(out).reshape(-1), dequant(T.Q8_0, raw.tobytes(), 64).reshape(-1))


def test_cpy_dequantizing_across_rows_of_a_strided_result_is_rejected(server, caplog):
    """A block that would straddle two rows of a non-contiguous result is refused, as ggml asserts."""
    with rejected(server, caplog, "CPY", "straddle") as c:
        q = c.new(T.Q8_0, (64, 3))
        wide = c.new(T.F32, (50, 4))
        view = c.view(wide, (48, 4), (4, 200, 800, 800))
        node = c.op(Op.CPY, T.F32, (48, 4), q, view)
        node.data, node.nb, node.view_src = view.data, view.nb, wide
