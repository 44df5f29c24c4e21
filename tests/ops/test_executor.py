"""The executor as a whole: unsupported ops close only their connection and say which
op and types; GRAPH_RECOMPUTE reruns the stored plan on new inputs; FREE_BUFFER
drops it; clients compute concurrently; the SIMD and portable kernels agree bit for
bit."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from ggmlrpc.ggml import GGMLGluOp as G, GGMLOp as Op, GGMLType as T, GGMLUnaryOp as U
from tests.ops.conftest import Ctx, assert_close, closed, f32_bits, rejected


@pytest.mark.parametrize("what, expect", [
    ("FLASH_ATTN_BACK", "op FLASH_ATTN_BACK (F32 <- F32, F32)"),
    ("Q4_0 + F16", "op ADD (Q4_0 <- Q4_0, F16)"),
    ("unknown unary", "op UNARY (F32 <- F32)"),
    ("F64 add", "op ADD (F64 <- F64, F64)")], ids=["FLASH_ATTN_BACK", "Q4_0+F16", "unknown-unary", "F64-add"])
def test_unsupported_closes_and_names_op(server, caplog, what, expect):
    with rejected(server, caplog, expect) as c:
        x = c.new(T.F32, (16, 4), np.ones((4, 16), np.float32))
        if what == "FLASH_ATTN_BACK":
            c.op(Op.FLASH_ATTN_BACK, T.F32, (16, 4), x, x)
        elif what == "Q4_0 + F16":
            q = c.new(T.Q4_0, (32, 4), np.ones((4, 32), np.float32))
            c.op(Op.ADD, T.Q4_0, (32, 4), q, c.new(T.F16, (32, 4), np.ones((4, 32), np.float16)))
        elif what == "unknown unary":
            c.op(Op.UNARY, T.F32, (16, 4), x, params=[99])
        else:
            y = c.new(T.F64, (16, 4), np.ones((4, 16)))
            c.op(Op.ADD, T.F64, (16, 4), y, y)
    with Ctx(f"127.0.0.1:{server.port}").rb as rb:   # the server carries on
        assert rb.device_count() == 1


def test_recompute_uses_new_inputs(ctx, rng):
    x0 = rng.standard_normal((3, 32)).astype(np.float32)
    w = rng.standard_normal((8, 32)).astype(np.float32)
    tx = ctx.new(T.F32, (32, 3), x0)
    out = ctx.op(Op.MUL_MAT, T.F32, (8, 3), ctx.new(T.F32, (32, 8), w), tx)
    act = ctx.op(Op.UNARY, T.F32, (8, 3), out, params=[U.TANH])
    ctx.compute()
    assert_close(ctx.read(act), np.tanh(x0.astype(np.float64) @ w.T), 1e-12)
    for _ in range(3):
        x1 = rng.standard_normal((3, 32)).astype(np.float32)
        ctx.write(tx, x1)
        ctx.recompute()
        assert_close(ctx.read(act), np.tanh(x1.astype(np.float64) @ w.T), 1e-12)


def test_free_buffer_drops_the_plan(server, caplog):
    c = Ctx(f"127.0.0.1:{server.port}")
    try:
        x = c.new(T.F32, (8,), np.arange(8, dtype=np.float32))
        out = c.op(Op.SCALE, T.F32, (8,), x, params=[f32_bits(2.0)])
        c.compute()
        np.testing.assert_array_equal(c.read(out).ravel(), np.arange(8) * 2.0)
        other = c.rb.alloc_buffer(64)
        other.free()                       # any successful FREE_BUFFER drops stored graphs
        c.rb.graph_recompute()
        closed(c, caplog, "GRAPH_RECOMPUTE on device 0 without a stored graph")
    finally:
        c.close()


def test_node_without_buffer_is_rejected(server, caplog):
    with rejected(server, caplog, "has no buffer on this server") as c:
        x = c.new(T.F32, (8,), np.ones(8, np.float32))
        node = c.op(Op.SCALE, T.F32, (8,), x, params=[f32_bits(2.0)])
        node.buffer, node.data = None, 0


def test_concurrent_clients(server, seed):
    """Several connections compute different graphs at the same time on one device."""
    errors = []

    def client(k):
        rng = np.random.default_rng(seed + k)
        c = Ctx(f"127.0.0.1:{server.port}", size=4 << 20)
        try:
            for _ in range(5):
                a = rng.standard_normal((16, 48)).astype(np.float32)
                b = rng.standard_normal((48,)).astype(np.float32)
                c.nodes.clear()
                out = c.op(Op.SOFT_MAX, T.F32, (48, 16),
                           c.op(Op.ADD, T.F32, (48, 16), c.new(T.F32, (48, 16), a), c.new(T.F32, (48,), b)),
                           params=[f32_bits(1.0), 0])
                c.compute()
                z = a.astype(np.float64) + b
                e = np.exp(z - z.max(axis=1, keepdims=True))
                assert_close(c.read(out), e / e.sum(axis=1, keepdims=True), 1e-12)
        except Exception as e:  # reported below
            errors.append(e)
        finally:
            c.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors


@pytest.fixture
def portable():
    from ggmlrpc._native import executor, quants
    old = executor.set_simd(False), quants.simd()
    yield
    executor.set_simd(bool(old[0]))
    quants.simd(old[1])


def graph_zoo(c, rng):
    """Ops that use the vector primitives: dot products in both orders, exp, silu,
    F16 conversion, fused multiply-adds."""
    outs = []
    x = c.new(T.F32, (70, 6), rng.standard_normal((6, 70)).astype(np.float32))
    for wt, n in ((T.F32, 1), (T.F32, 6), (T.F16, 1), (T.F16, 6)):
        w = c.new(wt, (70, 12), rng.standard_normal((12, 70)).astype(np.float16 if wt == T.F16 else np.float32))
        xs = c.view(x, (70, n), (4, 280, 280 * n, 280 * n))
        outs.append(c.op(Op.MUL_MAT, T.F32, (12, n), w, xs))
    # the prompt-time GEMM's order (K a multiple of every family's width), 9 columns: a
    # whole tile of columns and a short one in either family
    x64 = c.new(T.F32, (64, 9), rng.standard_normal((9, 64)).astype(np.float32))
    for wt in (T.F32, T.F16):
        w = c.new(wt, (64, 12), rng.standard_normal((12, 64)).astype(np.float16 if wt == T.F16 else np.float32))
        outs.append(c.op(Op.MUL_MAT, T.F32, (12, 9), w, x64))
    # BF16 products (VDPBF16PS in the AVX512-BF16 families): vec_dot's blocks of 64 and
    # tail, tinyBLAS's steps of 32
    for K, n in ((100, 1), (96, 6)):
        wb = c.new(T.BF16, (K, 12))
        c.write(wb, rng.standard_normal((12, K)).astype(np.float32))
        xb = c.new(T.F32, (K, n), rng.standard_normal((n, K)).astype(np.float32))
        outs.append(c.op(Op.MUL_MAT, T.F32, (12, n), wb, xb))
    outs.append(c.op(Op.SOFT_MAX, T.F32, (70, 6), x, params=[f32_bits(0.7), 0]))
    outs.append(c.op(Op.UNARY, T.F32, (70, 6), x, params=[U.SILU]))
    outs.append(c.op(Op.GLU, T.F32, (35, 6), x, params=[G.SWIGLU, 1]))
    outs.append(c.op(Op.CPY, T.F16, (70, 6), x, c.new(T.F16, (70, 6))))
    from tests.ops.test_quants import random_blocks
    for qt in (T.Q4_K, T.Q6_K):     # ggml's tiled K-quant order (9 activation rows)
        wq = c.new(qt, (256, 8))
        c.rb.set_tensor(wq, random_blocks(rng, qt, 256 * 8).tobytes())
        outs.append(c.op(Op.MUL_MAT, T.F32, (8, 9), wq,
                         c.new(T.F32, (256, 9), rng.standard_normal((9, 256)).astype(np.float32))))
    # decode products, four weight rows at a time (two per register on AVX-512 VNNI),
    # ten rows (a remainder of two); Q8_0 activations given as they are, with -128 in
    # every other block (where the sign trick of ggml's x86 kernels wraps around)
    for qt in (T.Q8_0, T.Q4_0, T.Q5_0):
        wq = c.new(qt, (128, 10))
        c.rb.set_tensor(wq, random_blocks(rng, qt, 128 * 10).tobytes())
        outs.append(c.op(Op.MUL_MAT, T.F32, (10, 1), wq,
                         c.new(T.F32, (128, 1), rng.standard_normal((1, 128)).astype(np.float32))))
        act = random_blocks(rng, T.Q8_0, 128 * 2).reshape(-1, 34)
        act[::2, 7] = 0x80
        aq = c.new(T.Q8_0, (128, 2))
        c.rb.set_tensor(aq, act.tobytes())
        outs.append(c.op(Op.MUL_MAT, T.F32, (10, 2), wq, aq))
    q = c.new(T.F32, (32, 3, 4), rng.standard_normal((4, 3, 32)).astype(np.float32))
    kv = c.new(T.F16, (32, 20, 2), rng.standard_normal((2, 20, 32)).astype(np.float16))
    outs.append(c.op(Op.FLASH_ATTN_EXT, T.F32, (32, 4, 3, 1), q, kv, kv, params=[f32_bits(0.2), 0, 0, 0]))
    # heads of 136: the F16 accumulator's blocks of 128 (half-precision arithmetic in the
    # AVX512-FP16 family) and a tail
    q = c.new(T.F32, (136, 2, 2), rng.standard_normal((2, 2, 136)).astype(np.float32))
    kv = c.new(T.F16, (136, 24, 2), rng.standard_normal((2, 24, 136)).astype(np.float16))
    outs.append(c.op(Op.FLASH_ATTN_EXT, T.F32, (136, 2, 2, 1), q, kv, kv, params=[f32_bits(0.1), 0, 0, 0]))
    # heads of 64 and 128 over a KV cache's rows (every head's row of a key side by side):
    # several heads of a query at once, keys outer (fa_heads_f16), 20 heads over 4 KV
    # heads (a group of 16 and one of 4), a mask with whole blocks of -inf, scattered
    # -inf and a short last block; three queries (the row path), one query over 600
    # keys (the split path)
    for dk, nq, nkv in ((64, 3, 90), (128, 2, 40), (64, 1, 600), (128, 1, 600)):
        q = c.new(T.F32, (dk, nq, 20), rng.standard_normal((20, nq, dk)).astype(np.float32))
        k, v = (c.new(T.F16, (dk * 4, nkv), rng.standard_normal((nkv, dk * 4)).astype(np.float16)) for _ in "kv")
        k, v = (c.view(t, (dk, nkv, 4), (2, dk * 8, dk * 2, dk * 8 * nkv)) for t in (k, v))
        m = np.zeros((nq, nkv), np.float32)
        m[:, 16:48] = -np.inf
        m[:, 5::7] = -np.inf
        m[:, nkv - 3:] = rng.standard_normal((nq, 3))
        mk = c.new(T.F16, (nkv, nq), m.astype(np.float16))
        outs.append(c.op(Op.FLASH_ATTN_EXT, T.F32, (dk, 20, nq, 1), q, k, v, mk, params=[f32_bits(0.125), 0, 0, 0]))
    return outs


@pytest.fixture(params=["x86-avx2", "x86-avx2-zen", "x86-avx512", "x86-avx512-bf16", "x86-avx512-fp16"])
def family(request):
    """Each ggml build whose orders the executor reproduces, in turn."""
    from ggmlrpc._native import executor
    old = executor.set_kernel_family(request.param)
    yield request.param
    executor.set_kernel_family(old)


def test_simd_and_portable_kernels_agree(server, seed, family, portable):
    """The portable kernels and the SIMD ones, with the AVX2 quant kernels and with
    the AVX-512 VNNI decode kernels where this CPU has them: the same bits. (The
    quant kernels' own portable level sums in ggml's generic order, which no x86
    build uses: the AVX2 ones stand for it here.)"""
    from ggmlrpc._native import executor, quants
    results = []
    levels = [(False, 1), (True, 1)] + ([(True, 2)] if quants.simd(2) == 2 else [])
    for simd, qlevel in levels:
        executor.set_simd(simd)
        quants.simd(qlevel)
        c = Ctx(f"127.0.0.1:{server.port}")
        try:
            outs = graph_zoo(c, np.random.default_rng(seed))
            c.compute()
            results.append([bytes(c.rb.get_tensor(t)) for t in outs])
        finally:
            c.close()
    if executor.simd_level() == 0:
        pytest.skip(f"this CPU cannot run the {family} SIMD kernels: only their portable twins exist")
    for r in results[1:]:
        assert r == results[0]
