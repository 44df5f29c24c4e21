"""Reductions, shape ops, masks, sorting, MoE and the rest: ADD1, CLAMP, ACC, SET, SUM,
SUM_ROWS, MEAN, CUMSUM, ARGMAX, COUNT_EQUAL, REPEAT, REPEAT_BACK, CONCAT, PAD, ARANGE,
TRI, FILL, DIAG_MASK_INF/ZERO, DIAG, ARGSORT, TOP_K, MUL_MAT_ID, ADD_ID, OUT_PROD."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlrpc.ggml import GGMLOp as Op, GGMLType as T
from tests.ops.conftest import assert_close, f32_bits, rejected


@pytest.mark.parametrize("t", [T.F32, T.F16], ids=lambda t: t.name)
def test_add1_and_clamp(ctx, rng, t):
    dt = np.float32 if t == T.F32 else np.float16
    x = (rng.standard_normal((3, 40)) * 3).astype(dt)
    tx = ctx.new(t, (40, 3), x)
    a = ctx.op(Op.ADD1, t, (40, 3), tx, ctx.new(T.F32, (1,), np.array([0.25], np.float32)))
    c = ctx.op(Op.CLAMP, t, (40, 3), tx, params=[f32_bits(-1.5), f32_bits(2.0)])
    ctx.compute()
    xf = x.astype(np.float32)
    np.testing.assert_array_equal(ctx.read(a).reshape(3, 40), (xf + np.float32(0.25)).astype(dt))
    np.testing.assert_array_equal(ctx.read(c).reshape(3, 40), np.clip(xf, -1.5, 2.0).astype(dt))


@pytest.mark.parametrize("opcode", [Op.ACC, Op.SET], ids=lambda o: o.name)
def test_acc_set(ctx, rng, opcode):
    a = rng.standard_normal((4, 6, 10)).astype(np.float32)       # ne (10, 6, 4)
    b = rng.standard_normal((2, 3, 5)).astype(np.float32)        # ne (5, 3, 2)
    nb1, nb2, off = 40, 240, (1 * 240 + 2 * 40 + 3 * 4)          # view at [1, 2, 3]
    out = ctx.op(opcode, T.F32, (10, 6, 4), ctx.new(T.F32, (10, 6, 4), a), ctx.new(T.F32, (5, 3, 2), b),
                 params=[nb1, nb2, nb2 * 4, off, 0])
    ctx.compute()
    ref = a.copy()
    if opcode == Op.ACC:
        ref[1:3, 2:5, 3:8] += b
    else:
        ref[1:3, 2:5, 3:8] = b
    np.testing.assert_array_equal(ctx.read(out).reshape(ref.shape), ref)


def test_acc_view_outside_is_rejected(server, caplog):
    with rejected(server, caplog, "view lies outside the result") as c:
        a = c.new(T.F32, (10, 6), np.zeros((6, 10), np.float32))
        b = c.new(T.F32, (5, 3), np.ones((3, 5), np.float32))
        c.op(Op.ACC, T.F32, (10, 6), a, b, params=[40, 240, 240, 5 * 40 + 8, 0])


@pytest.mark.parametrize("t", [T.F32, T.F16], ids=lambda t: t.name)
def test_sum(ctx, rng, t):
    x = rng.standard_normal((2, 3, 5, 30)).astype(np.float32 if t == T.F32 else np.float16)
    out = ctx.op(Op.SUM, t, (1,), ctx.new(t, (30, 5, 3, 2), x))
    ctx.compute()
    assert_close(ctx.read(out).astype(np.float64).ravel(), [x.astype(np.float64).sum()],
                 1e-12 if t == T.F32 else 1e-6)


def test_sum_of_permuted_view_as_ggml(ctx, rng):
    """ggml's SUM reads ne0 packed elements from each row's start whatever nb[0]
    is; a transposed view is summed as ggml sums it, inside the view's memory."""
    x = rng.standard_normal((16, 33)).astype(np.float32)                        # ne (33, 16)
    t = ctx.transpose(ctx.new(T.F32, (33, 16), x))                               # ne (16, 33), nb0 132
    out = ctx.op(Op.SUM, T.F32, (1,), t)
    ctx.compute()
    flat = x.reshape(-1).astype(np.float64)
    want = sum(flat[r:r + 16].sum() for r in range(33))                          # row r starts at element r
    assert_close(ctx.read(out).ravel(), [want], 1e-12)


def test_sum_of_broadcast_view_is_rejected(server, caplog):
    """A zero element stride would make SUM's packed row reads leave the view."""
    with rejected(server, caplog, "SUM", "non-contiguous rows") as c:
        t = c.new(T.F32, (4, 4), np.ones((4, 4), np.float32))
        c.op(Op.SUM, T.F32, (1,), c.view(t, (64, 4), (0, 16, 64, 64)))


@pytest.mark.parametrize("opcode", [Op.SUM_ROWS, Op.MEAN], ids=lambda o: o.name)
def test_row_reductions(ctx, rng, opcode):
    x = rng.standard_normal((2, 3, 5, 37)).astype(np.float32)
    out = ctx.op(opcode, T.F32, (1, 5, 3, 2), ctx.new(T.F32, (37, 5, 3, 2), x))
    ctx.compute()
    xd = x.astype(np.float64)
    ref = xd.sum(axis=-1, keepdims=True) if opcode == Op.SUM_ROWS else xd.mean(axis=-1, keepdims=True)
    assert_close(ctx.read(out), ref, 1e-13)


def test_cumsum(ctx, rng):
    x = rng.standard_normal((3, 4, 50)).astype(np.float32)
    out = ctx.op(Op.CUMSUM, T.F32, (50, 4, 3), ctx.new(T.F32, (50, 4, 3), x))
    ctx.compute()
    np.testing.assert_array_equal(ctx.read(out).reshape(x.shape), np.cumsum(x, axis=-1, dtype=np.float32))


def test_argmax(ctx, rng):
    x = rng.standard_normal((7, 33)).astype(np.float32)
    x[2, [5, 20]] = 9.0                  # ties: ggml answers the last one
    out = ctx.op(Op.ARGMAX, T.I32, (7,), ctx.new(T.F32, (33, 7), x))
    ctx.compute()
    ref = np.argmax(x, axis=1)
    ref[2] = 20
    np.testing.assert_array_equal(ctx.read(out).ravel(), ref)


def test_count_equal(ctx, rng):
    a = rng.integers(0, 4, (3, 5, 20)).astype(np.int32)
    b = rng.integers(0, 4, (3, 5, 20)).astype(np.int32)
    out = ctx.op(Op.COUNT_EQUAL, T.I64, (1,), ctx.new(T.I32, (20, 5, 3), a), ctx.new(T.I32, (20, 5, 3), b))
    ctx.compute()
    assert int(ctx.read(out).ravel()[0]) == int(np.sum(a == b))


@pytest.mark.parametrize("t", [T.F32, T.F16, T.I32], ids=lambda t: t.name)
def test_repeat(ctx, rng, t):
    x = (rng.standard_normal((1, 2, 3, 5)) * 10).astype({T.F32: np.float32, T.F16: np.float16, T.I32: np.int32}[t])
    out = ctx.op(Op.REPEAT, t, (10, 6, 4, 3), ctx.new(t, (5, 3, 2, 1), x))
    ctx.compute()
    np.testing.assert_array_equal(ctx.read(out), np.tile(x, (3, 2, 2, 2)))


def test_repeat_back(ctx, rng):
    x = rng.standard_normal((2, 4, 6, 10)).astype(np.float32)
    out = ctx.op(Op.REPEAT_BACK, T.F32, (5, 3, 2, 1), ctx.new(T.F32, (10, 6, 4, 2), x))
    ctx.compute()
    ref = x.astype(np.float64).reshape(2, 1, 2, 2, 2, 3, 2, 5).sum(axis=(0, 2, 4, 6))
    assert_close(ctx.read(out), ref, 1e-12)


@pytest.mark.parametrize("dim", [0, 1, 2, 3])
def test_concat(ctx, rng, dim):
    sa, sb = [6, 3, 2, 2], [6, 3, 2, 2]
    sb[dim] = 4
    a = rng.standard_normal(sa[::-1]).astype(np.float32)
    b = rng.standard_normal(sb[::-1]).astype(np.float32)
    ne = list(sa)
    ne[dim] = sa[dim] + sb[dim]
    out = ctx.op(Op.CONCAT, T.F32, ne, ctx.new(T.F32, sa, a), ctx.new(T.F32, sb, b), params=[dim])
    ctx.compute()
    np.testing.assert_array_equal(ctx.read(out), np.concatenate([a, b], axis=3 - dim))


@pytest.mark.parametrize("t, dt", [(T.F32, np.float32), (T.F16, np.float16), (T.I32, np.int32),
                                   (T.I8, np.int8)], ids=lambda v: getattr(v, "name", ""))
@pytest.mark.parametrize("dim", [0, 1, 2, 3])
def test_concat_of_transposed(ctx, rng, t, dt, dim):
    """ggml concatenates 1-, 2- and 4-byte elements through every stride: a
    transposed source (a hybrid model's conv input) is read element by element."""
    sa, sb = [5, 6, 2, 2], [5, 6, 2, 2]
    sb[dim] = 3
    a = (rng.standard_normal(sa[::-1]) * 50).astype(dt)
    b = (rng.standard_normal([sb[1], sb[0], sb[2], sb[3]][::-1]) * 50).astype(dt)  # stored transposed
    ta = ctx.new(t, sa, a)
    tb = ctx.transpose(ctx.new(t, (sb[1], sb[0], sb[2], sb[3]), b))
    ne = list(sa)
    ne[dim] += sb[dim]
    out = ctx.op(Op.CONCAT, t, ne, ta, tb, params=[dim])
    ctx.compute()
    want = np.concatenate([a, b.swapaxes(2, 3)], axis=3 - dim)
    np.testing.assert_array_equal(ctx.read(out).reshape(want.shape), want)


@pytest.mark.parametrize("dim", [0, 1, 2, 3])
@pytest.mark.parametrize("empty_first", [True, False])
def test_concat_with_an_empty_source(ctx, rng, dim, empty_first):
    """An empty source (a cache of no tokens joined to the new ones) adds nothing."""
    sx, se = [6, 3, 2, 2], [6, 3, 2, 2]
    se[dim] = 0
    x = rng.standard_normal(sx[::-1]).astype(np.float32)
    tx, te = ctx.new(T.F32, sx, x), ctx.new(T.F32, se, np.zeros(se[::-1], np.float32))
    out = ctx.op(Op.CONCAT, T.F32, sx, *((te, tx) if empty_first else (tx, te)), params=[dim])
    ctx.compute()
    np.testing.assert_array_equal(ctx.read(out).ravel(), x.ravel())


@pytest.mark.parametrize("qt", [T.Q4_0, T.Q4_K], ids=lambda t: t.name)
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_concat_quantized(ctx, rng, qt, dim):
    """Quantized rows are concatenated as bytes, along dim 0 by whole blocks."""
    from tests.ops.test_quants import random_blocks
    from ggmlrpc.ggml import TYPE_TRAITS
    blck, size = TYPE_TRAITS[qt]
    sa, sb = [2 * blck, 3, 2, 1], [2 * blck, 3, 2, 1]
    sb[dim] = blck if dim == 0 else 2
    ra, rb = (random_blocks(rng, qt, int(np.prod(v))) for v in (sa, sb))
    a, b = ctx.new(qt, sa), ctx.new(qt, sb)
    ctx.rb.set_tensor(a, ra.tobytes())
    ctx.rb.set_tensor(b, rb.tobytes())
    ne = list(sa)
    ne[dim] += sb[dim]
    out = ctx.op(Op.CONCAT, qt, ne, a, b, params=[dim])
    ctx.compute()
    # blocks as a NumPy array (dims reversed, dim 0 counted in blocks)
    shape = lambda v: (v[3], v[2], v[1], v[0] // blck, size)
    want = np.concatenate([ra.reshape(shape(sa)), rb.reshape(shape(sb))], axis=3 - dim)
    assert bytes(ctx.rb.get_tensor(out)) == want.tobytes()


@pytest.mark.parametrize("circular", [0, 1])
def test_pad_of_permuted(ctx, rng, circular):
    """PAD reads its source through the strides (a permuted view)."""
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)                    # ne (5, 4, 3, 2)
    p = ctx.permute(ctx.new(T.F32, (5, 4, 3, 2), x), 1, 0, 2, 3)                # ne (4, 5, 3, 2)
    lr = [(1, 2), (0, 1), (2, 0), (0, 0)]
    params = [v for q in lr for v in q] + [circular]
    out = ctx.op(Op.PAD, T.F32, [4 + 3, 5 + 1, 3 + 2, 2], p, params=params)
    ctx.compute()
    ref = np.pad(np.swapaxes(x, -1, -2), [lr[3], lr[2], lr[1], lr[0]], mode="wrap" if circular else "constant")
    np.testing.assert_array_equal(ctx.read(out), ref)


@pytest.mark.parametrize("circular", [0, 1])
def test_pad(ctx, rng, circular):
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    lr = [(1, 2), (0, 1), (2, 0), (0, 0)]
    params = [v for p in lr for v in p] + [circular]
    ne = [5 + 3, 4 + 1, 3 + 2, 2]
    out = ctx.op(Op.PAD, T.F32, ne, ctx.new(T.F32, (5, 4, 3, 2), x), params=params)
    ctx.compute()
    ref = np.pad(x, [lr[3], lr[2], lr[1], lr[0]], mode="wrap" if circular else "constant")
    np.testing.assert_array_equal(ctx.read(out), ref)


def test_arange(ctx):
    start, stop, step = 0.5, 7.0, 0.75
    n = int(np.ceil(np.float32((stop - start) / step)))
    out = ctx.op(Op.ARANGE, T.F32, (n,), params=[f32_bits(start), f32_bits(stop), f32_bits(step)])
    ctx.compute()
    assert_close(ctx.read(out).ravel(), start + step * np.arange(n), 1e-14)


@pytest.mark.parametrize("tri", [0, 1, 2, 3])
def test_tri(ctx, rng, tri):
    x = rng.standard_normal((2, 6, 6)).astype(np.float32)
    out = ctx.op(Op.TRI, T.F32, (6, 6, 2), ctx.new(T.F32, (6, 6, 2), x), params=[tri])
    ctx.compute()
    r, c = np.indices((6, 6))
    keep = [c >= r, c > r, c <= r, c < r][tri]
    np.testing.assert_array_equal(ctx.read(out).reshape(2, 6, 6), np.where(keep, x, 0))


@pytest.mark.parametrize("t", [T.F32, T.F16], ids=lambda t: t.name)
def test_fill(ctx, t):
    out = ctx.op(Op.FILL, t, (9, 4), ctx.new(t, (9, 4)), params=[f32_bits(-2.5)])
    ctx.compute()
    np.testing.assert_array_equal(ctx.read(out).astype(np.float32), np.full((1, 1, 4, 9), -2.5, np.float32))


@pytest.mark.parametrize("opcode", [Op.DIAG_MASK_INF, Op.DIAG_MASK_ZERO], ids=lambda o: o.name)
def test_diag_mask(ctx, rng, opcode):
    n_past = 3
    x = rng.standard_normal((2, 5, 9)).astype(np.float32)
    out = ctx.op(opcode, T.F32, (9, 5, 2), ctx.new(T.F32, (9, 5, 2), x), params=[n_past])
    ctx.compute()
    j, i = np.indices((5, 9))
    ref = np.where(i > n_past + j, -np.inf if opcode == Op.DIAG_MASK_INF else 0.0, x)
    np.testing.assert_array_equal(ctx.read(out).reshape(2, 5, 9), ref.astype(np.float32))


def test_diag(ctx, rng):
    x = rng.standard_normal((2, 1, 7)).astype(np.float32)
    out = ctx.op(Op.DIAG, T.F32, (7, 7, 2), ctx.new(T.F32, (7, 1, 2), x))
    ctx.compute()
    ref = np.stack([np.diag(v[0]) for v in x])
    np.testing.assert_array_equal(ctx.read(out).reshape(2, 7, 7), ref)


@pytest.mark.parametrize("order", [0, 1], ids=["asc", "desc"])
def test_argsort(ctx, rng, order):
    x = rng.standard_normal((3, 4, 45)).astype(np.float32)
    out = ctx.op(Op.ARGSORT, T.I32, (45, 4, 3), ctx.new(T.F32, (45, 4, 3), x), params=[order])
    ctx.compute()
    ref = np.argsort(-x if order else x, axis=-1, kind="stable")
    np.testing.assert_array_equal(ctx.read(out).reshape(ref.shape), ref)


def test_top_k(ctx, rng):
    x = rng.standard_normal((5, 60)).astype(np.float32)
    out = ctx.op(Op.TOP_K, T.I32, (8, 5), ctx.new(T.F32, (60, 5), x))
    ctx.compute()
    got = ctx.read(out).reshape(5, 8)
    ref = np.argsort(-x, axis=-1, kind="stable")[:, :8]
    np.testing.assert_array_equal(np.sort(got, axis=1), np.sort(ref, axis=1))
    np.testing.assert_array_equal(got[:, 2:], ref[:, 2:])     # ggml swaps the first two


@pytest.mark.parametrize("wt", [T.F32, T.F16, T.Q8_0], ids=lambda t: t.name)
def test_mul_mat_id(ctx, rng, wt):
    K, M, n_as, n_used, tokens = 64, 10, 4, 2, 5
    w = rng.standard_normal((n_as, M, K)).astype(np.float32)
    if wt == T.F16:
        w = w.astype(np.float16).astype(np.float32)
    tw = ctx.new(wt, (K, M, n_as), w.astype(np.float16) if wt == T.F16 else w)
    if wt == T.Q8_0:
        from gguf import quants as gq
        w = gq.dequantize(gq.quantize(w.reshape(-1, K), wt), wt).reshape(n_as, M, K)
    x = rng.standard_normal((tokens, 1, K)).astype(np.float32)             # one row shared by the slots
    sel = np.stack([rng.permutation(n_as)[:n_used] for _ in range(tokens)]).astype(np.int32)
    out = ctx.op(Op.MUL_MAT_ID, T.F32, (M, n_used, tokens), tw, ctx.new(T.F32, (K, 1, tokens), x),
                 ctx.new(T.I32, (n_used, tokens), sel))
    ctx.compute()
    xr = x.astype(np.float16).astype(np.float64) if wt == T.F16 else x.astype(np.float64)
    ref = np.stack([[w[sel[t, e]].astype(np.float64) @ xr[t, 0] for e in range(n_used)] for t in range(tokens)])
    assert_close(ctx.read(out), ref, 5e-4 if wt == T.Q8_0 else 1e-12)


def test_mul_mat_id_bad_expert_closes(server, rng, caplog):
    with rejected(server, caplog, "MUL_MAT_ID expert 3 out of range [0, 3)") as c:
        w = c.new(T.F32, (32, 4, 3), rng.standard_normal((3, 4, 32)).astype(np.float32))
        x = c.new(T.F32, (32, 1, 2), rng.standard_normal((2, 1, 32)).astype(np.float32))
        sel = c.new(T.I32, (2, 2), np.array([[0, 1], [2, 3]], np.int32))
        c.op(Op.MUL_MAT_ID, T.F32, (4, 2, 2), w, x, sel)


def test_add_id(ctx, rng):
    a = rng.standard_normal((4, 3, 16)).astype(np.float32)       # (ne0 16, ne1 3, ne2 4)
    b = rng.standard_normal((5, 16)).astype(np.float32)
    sel = rng.integers(0, 5, (4, 3)).astype(np.int32)
    out = ctx.op(Op.ADD_ID, T.F32, (16, 3, 4), ctx.new(T.F32, (16, 3, 4), a), ctx.new(T.F32, (16, 5), b),
                 ctx.new(T.I32, (3, 4), sel))
    ctx.compute()
    np.testing.assert_array_equal(ctx.read(out).reshape(a.shape), a + b[sel])


@pytest.mark.parametrize("at", [T.F32, T.F16], ids=lambda t: t.name)
def test_out_prod(ctx, rng, at):
    batch = 1 if at == T.F32 else 3        # F32 src0 broadcasts over src1's batches
    a = rng.standard_normal((batch, 20, 12)).astype(np.float32)   # (12, 20, batch)
    if at == T.F16:
        a = a.astype(np.float16).astype(np.float32)
    b = rng.standard_normal((3, 20, 7)).astype(np.float32)        # (7, 20, 3)
    out = ctx.op(Op.OUT_PROD, T.F32, (12, 7, 3), ctx.new(at, (12, 20, batch), a), ctx.new(T.F32, (7, 20, 3), b))
    ctx.compute()
    ref = np.einsum("bkn,bkm->bmn", np.broadcast_to(a, (3, 20, 12)).astype(np.float64), b.astype(np.float64))
    assert_close(ctx.read(out), ref, 1e-12)
