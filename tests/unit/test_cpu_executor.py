"""The CPU executor without sockets: plans compiled from Graph objects directly.

A plan holds the host memory it points into: freeing the buffer (as FREE_BUFFER
does) while a plan still exists must leave the plan's memory valid. Thread pools
of any size run the same plan to the same bytes.
"""
from __future__ import annotations

import struct

import numpy as np
import pytest

from ggmlrpc import ggml
from ggmlrpc.compute.cpu import CpuExecutor
from ggmlrpc.devices.cpu import HostBuffer
from ggmlrpc.errors import UnsupportedError, ValidationError
from ggmlrpc.ggml import GGMLOp as Op, GGMLType as T, TensorFlag
from ggmlrpc.graph import Graph, Placement
from ggmlrpc.protocol import RpcTensor
from ggmlrpc.buffers import ServerBuffer

_ids = iter(range(1, 1 << 30))


class Builder:
    """Tensors laid out one after another in one host buffer."""

    def __init__(self, size=1 << 20):
        self.buf = ServerBuffer(1, 0x1000, size, 0, HostBuffer(size))
        self.off = 0
        self.tensors = {}
        self.placement = {}
        self.nodes = []

    def tensor(self, type, ne, op=Op.NONE, src=(), params=(), data=None):
        ne = tuple(ne) + (1,) * (4 - len(ne))
        nb = ggml.contiguous_strides(type, ne)
        t = RpcTensor(id=next(_ids), type=type, buffer=1, ne=ne, nb=nb, op=op,
                      op_params=tuple(params) + (0,) * (16 - len(params)),
                      flags=TensorFlag.COMPUTE if op != Op.NONE else 0,
                      src=tuple(s.id for s in src) + (0,) * (10 - len(src)), data=0x1000 + self.off,
                      name=b"t")
        self.tensors[t.id] = t
        self.placement[t.id] = Placement(self.buf, self.off)
        if data is not None:
            self.buf.mem.write(self.off, np.ascontiguousarray(data).tobytes())
        self.off += (ggml.nbytes(type, ne, nb) + 31) // 32 * 32
        if op != Op.NONE:
            self.nodes.append(t)
        return t

    def graph(self):
        return Graph(0, self.nodes, self.tensors, self.placement)

    def read(self, t, dtype=np.float32):
        p = self.placement[t.id]
        return np.frombuffer(p.buffer.mem.read(p.offset, ggml.nbytes(t.type, t.ne, t.nb)), dtype=dtype)


def f32(x):
    return struct.unpack("<i", struct.pack("<f", x))[0]


def build_softmax_matmul(b, rng):
    x = b.tensor(T.F32, (40, 7), data=rng.standard_normal((7, 40)).astype(np.float32))
    w = b.tensor(T.F16, (40, 24), data=rng.standard_normal((24, 40)).astype(np.float16))
    y = b.tensor(T.F32, (24, 7), Op.MUL_MAT, (w, x))
    return b.tensor(T.F32, (24, 7), Op.SOFT_MAX, (y,), (f32(0.5), 0))


def test_plan_keeps_freed_memory_alive(seed):
    rng = np.random.default_rng(seed)
    b = Builder()
    out = build_softmax_matmul(b, rng)
    ex = CpuExecutor(2)
    plan = ex.compile(b.graph())
    ex.run(plan)
    before = b.read(out).copy()
    mem = b.buf.mem
    host = mem.mem
    mem.free()                # what FREE_BUFFER does: the buffer lets go of its mapping
    assert mem.size == 0
    ex.run(plan)              # the plan still owns the mapping: same result, no crash
    got = np.frombuffer(bytes(memoryview(host)[b.placement[out.id].offset:][:out.ne[0] * out.ne[1] * 4]),
                        dtype=np.float32)
    np.testing.assert_array_equal(got, before)


@pytest.mark.parametrize("n_threads", [1, 2, 5, 16])
def test_thread_counts_give_the_same_bytes(seed, n_threads):
    rng = np.random.default_rng(seed)
    b = Builder()
    out = build_softmax_matmul(b, rng)
    ref = CpuExecutor(1)
    ref.run(ref.compile(b.graph()))
    want = b.read(out).copy()
    b.buf.mem.fill(b.placement[out.id].offset, 24 * 7 * 4, 0)
    ex = CpuExecutor(n_threads)
    ex.run(ex.compile(b.graph()))
    np.testing.assert_array_equal(b.read(out), want)


@pytest.mark.parametrize("wtype", [T.Q4_0, T.Q8_0, T.Q4_K])
@pytest.mark.parametrize("n_cols", [1, 3, 5, 13])
def test_decode_matmul_chunks_give_each_row_its_dot(seed, wtype, n_cols):
    """Decode-shaped products (few activation columns, 1000 weight rows) hand out
    weight rows in chunks and quantize a lone column in block runs per thread;
    Q4_0/Q8_0 rows meet four activation rows at once (5, 13 columns): every
    output is still the one dot product of its row, for any thread count."""
    from ggmlrpc._native import quants
    if wtype == T.Q4_K and n_cols >= 8:
        pytest.skip("8+ activation rows of K-quants follow ggml's tiled order, not vec_dot's")
    rng = np.random.default_rng(seed)
    K, M = 512, 1000
    if wtype == T.Q4_K:   # no quantizer here: random blocks with sane scales (d, dmin)
        wq = rng.integers(0, 256, (M * K // 256, 144), dtype=np.uint8)
        wq[:, :4] = rng.uniform(0.001, 0.1, (len(wq), 2)).astype(np.float16).view(np.uint8)
        wq = wq.ravel()
    else:
        w = rng.standard_normal((M, K)).astype(np.float32)
        wq = np.concatenate([quants.quantize(int(wtype), r) for r in w])
    x = rng.standard_normal((n_cols, K)).astype(np.float32)
    if n_cols in (3, 5):   # an infinite activation quantizes to -128s: Q4_0's lane-sum kernel steps aside
        x[1, 70] = np.inf
    act = quants.vec_dot_type(int(wtype))
    want = np.array([[quants.vec_dot(int(wtype), wq[i * len(wq) // M:(i + 1) * len(wq) // M].tobytes(),
                                     quants.quantize(act, x[j]).tobytes()) for i in range(M)]
                     for j in range(n_cols)], np.float32)
    for n_threads in (1, 2, 3, 7):
        b = Builder(4 << 20)
        wt = b.tensor(wtype, (K, M), data=wq)
        xt = b.tensor(T.F32, (K, n_cols), data=x)
        out = b.tensor(T.F32, (M, n_cols), Op.MUL_MAT, (wt, xt))
        ex = CpuExecutor(n_threads)
        plan = ex.compile(b.graph())
        for _ in range(3):   # the chunk counter starts over on every run
            ex.run(plan)
            np.testing.assert_array_equal(b.read(out).view(np.uint32), want.ravel().view(np.uint32))


def _matmul_runs(wtype, wq, x, M, n_threads, simd_at_plan, simd_at_run, runs=1):
    """MUL_MAT of weights wq (M rows) with activations x (B, N, K): the plan made
    with SIMD kernels on or off, then run `runs` times with them on or off (the
    result zeroed before each run); the outputs of every run. simd_at_*: a bool (all
    the SIMD kernels this CPU has, or none) or a quant kernel level (0, 1 or 2, the
    executor's SIMD on from 1)."""
    from ggmlrpc._native import executor as native
    from ggmlrpc._native import quants
    level = lambda v: (2 if v else 0) if isinstance(v, bool) else v  # noqa: E731
    B, N, K = x.shape
    b = Builder(8 << 20)
    wt = b.tensor(wtype, (K, M), data=wq)
    xt = b.tensor(T.F32, (K, N, B), data=x)
    out = b.tensor(T.F32, (M, N, B), Op.MUL_MAT, (wt, xt))
    ex = CpuExecutor(n_threads)
    before, qbefore = native.simd_level(), quants.simd()
    got = []
    try:
        native.set_simd(bool(simd_at_plan))
        quants.simd(level(simd_at_plan))
        plan = ex.compile(b.graph())
        native.set_simd(bool(simd_at_run))
        quants.simd(level(simd_at_run))
        for _ in range(runs):
            b.buf.mem.fill(b.placement[out.id].offset, M * N * B * 4, 0)
            ex.run(plan)
            got.append(b.read(out).copy())
    finally:
        native.set_simd(bool(before))
        quants.simd(qbefore)
    return got


@pytest.mark.parametrize("wtype", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0])
def test_prompt_matmul_panels_give_each_row_its_dot(seed, wtype):
    """Prompt-shaped Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 products take runs of eight
    activation columns of one src1 batch at once (panels) and the columns left
    over one by one; with two batches of 19 columns, an infinite activation (Q8_0
    -128s, where the offset-free Q4_0/Q5_0 kernel steps aside), every thread
    count, and a plan made without SIMD kernels run with them: every output is
    the one dot product of its row."""
    from ggmlrpc._native import quants
    rng = np.random.default_rng(seed)
    K, M, N, B = 256, 41, 19, 2   # M: chunks of 16 weight rows, the last of 9 (odd)
    w = rng.standard_normal((M, K)).astype(np.float32)
    wq = np.concatenate([quants.quantize(int(wtype), r) for r in w])
    x = rng.standard_normal((B, N, K)).astype(np.float32)
    x[1, 10, 70] = np.inf   # in the second batch's second panel
    x[0, 17, 3] = -np.inf   # in the first batch's leftover columns
    act = quants.vec_dot_type(int(wtype))
    rb = len(wq) // M
    want = np.array([[[quants.vec_dot(int(wtype), wq[i * rb:(i + 1) * rb].tobytes(),
                                      quants.quantize(act, x[b, j]).tobytes()) for i in range(M)]
                      for j in range(N)] for b in range(B)], np.float32)
    # (2, 2, 1): planned where Q4_0 keeps no activation sums, run where it does
    for n_threads, at_plan, at_run in ((1, True, True), (2, True, True), (3, True, True), (2, False, True),
                                       (2, 2, 1), (2, 1, 2)):
        for got in _matmul_runs(wtype, wq, x, M, n_threads, at_plan, at_run, runs=2):
            np.testing.assert_array_equal(got.view(np.uint32), want.ravel().view(np.uint32))


@pytest.mark.parametrize("wtype", [T.Q4_0, T.Q5_0, T.Q8_0])
def test_decode_matmul_levels_give_each_row_its_dot(seed, wtype):
    """Decode products (1 and 3 activation rows) take four weight rows at a time
    where the quant level has such a kernel (AVX2: Q8_0; AVX-512 VNNI: Q8_0, Q4_0 and
    Q5_0, two rows per register), and Q4_0 keeps its activations' lane sums where it has
    none. Plans made at one level and run at another, weight rows in chunks shared by
    two threads with a remainder of two: every output is the one dot product of its
    row."""
    from ggmlrpc._native import quants
    rng = np.random.default_rng(seed)
    K, M = 1024, 602
    w = rng.standard_normal((M, K)).astype(np.float32)
    wq = np.concatenate([quants.quantize(int(wtype), r) for r in w])
    act = quants.vec_dot_type(int(wtype))
    rb = len(wq) // M
    top = quants.simd()
    for N in (1, 3):
        x = rng.standard_normal((1, N, K)).astype(np.float32)
        want = np.array([[quants.vec_dot(int(wtype), wq[i * rb:(i + 1) * rb].tobytes(),
                                         quants.quantize(act, x[0, j]).tobytes()) for i in range(M)]
                         for j in range(N)], np.float32)
        # (level 0's portable vec_dot sums in ggml's generic order, no x86 build's)
        for plan, run in ((1, 1), (top, top), (1, top), (top, 1), (0, top)):
            for n_threads in (1, 2):
                got = _matmul_runs(wtype, wq, x, M, n_threads, plan, run)[0]
                np.testing.assert_array_equal(got.view(np.uint32), want.ravel().view(np.uint32))


@pytest.mark.parametrize("wtype", [T.Q8_0, T.Q4_0, T.Q5_0, T.Q4_K, T.Q5_K, T.Q6_K])
def test_small_batch_matmul_gives_each_row_its_dot(seed, wtype):
    """Small batches (2 to 7 activation columns; Q8_0/Q4_0/Q5_0 up to 11 on AVX-512
    VNNI, instead of column panels) take four weight rows against up to eight columns
    of one src1 batch at a time (ggmlrpc_vec_dot_4xn) at both SIMD kernel levels
    (AVX2, and AVX-512 VNNI where this CPU has it), plans made at one level and run at
    the other: with 2, 3, 5, 7 (and 9, 11) columns, and one (where the type has no
    rows4 kernel, Q5_K, the 4xn kernel takes it too), in two src1 batches, weight
    rows not a multiple of four (a short last quad), in chunks shared by threads or
    one share each, an infinite activation (Q8_0 -128s, the sign trick's
    wrap-around, where the VNNI kernel's offset form with the activations' lane sums
    steps aside for that block): every output is the one vec_dot of its row."""
    from ggmlrpc._native import quants
    from tests.ops.test_quants import random_blocks
    rng = np.random.default_rng(seed)
    K, B = 512, 2
    act = quants.vec_dot_type(int(wtype))
    top = quants.simd()
    runs = sorted({(1, 1), (top, top), (1, top), (top, 1)})   # (level at plan, at run)
    kquant = wtype in (T.Q4_K, T.Q5_K, T.Q6_K)   # from 8 columns in ggml's tiled order
    for M in (150, 30):   # 150: chunks of 16 rows handed out (the last of 6); 30: a share per thread
        if kquant:
            wq = random_blocks(rng, int(wtype), K * M)
        else:
            wq = np.concatenate([quants.quantize(int(wtype), r)
                                 for r in rng.standard_normal((M, K)).astype(np.float32)])
        rb = len(wq) // M
        for N in (1, 2, 3, 5, 7) if kquant else (1, 2, 3, 5, 7, 9, 11):
            x = rng.standard_normal((B, N, K)).astype(np.float32)
            if not kquant:
                x[1, N - 1, 40] = np.inf
            want = np.array([[[quants.vec_dot(int(wtype), wq[i * rb:(i + 1) * rb].tobytes(),
                                              quants.quantize(act, x[b, j]).tobytes()) for i in range(M)]
                              for j in range(N)] for b in range(B)], np.float32)
            for plan, run in runs:
                for n_threads in (1, 2):
                    got = _matmul_runs(wtype, wq, x, M, n_threads, plan, run)[0]
                    np.testing.assert_array_equal(got.view(np.uint32), want.ravel().view(np.uint32),
                                                  err_msg=f"M={M} N={N} levels={plan, run} threads={n_threads}")


@pytest.mark.parametrize("blocks", [64, 65])
def test_small_batch_q4_k_rows_either_side_of_the_kept_sums(seed, blocks):
    """Q4_K's small-batch kernel works the activations' block sums out once for its
    four weight rows, kept on the stack for rows of up to 64 blocks, and row by row
    for longer ones: on either side of that bound every output is its vec_dot."""
    from ggmlrpc._native import quants
    from tests.ops.test_quants import random_blocks
    rng = np.random.default_rng(seed)
    K, M, wtype = 256 * blocks, 10, T.Q4_K
    act = quants.vec_dot_type(int(wtype))
    wq = random_blocks(rng, int(wtype), K * M)
    rb = len(wq) // M
    for N in (2, 5):
        x = rng.standard_normal((1, N, K)).astype(np.float32)
        want = np.array([[quants.vec_dot(int(wtype), wq[i * rb:(i + 1) * rb].tobytes(),
                                         quants.quantize(act, x[0, j]).tobytes()) for i in range(M)]
                         for j in range(N)], np.float32)
        for level in sorted({1, quants.simd()}):
            got = _matmul_runs(wtype, wq, x, M, 1, level, level)[0]
            np.testing.assert_array_equal(got.view(np.uint32), want.ravel().view(np.uint32),
                                          err_msg=f"N={N} level={level}")


@pytest.mark.parametrize("wtype", [T.Q8_0, T.Q4_0, T.Q4_K, T.Q5_K, T.Q6_K])
def test_small_batch_experts_give_each_row_its_dot(seed, wtype):
    """MUL_MAT_ID of a small batch: experts routed 7, 6 and 2 rows take the same
    small-batch kernels (expert runs of 30 weight rows: chunks of 16 and 14, a short
    last quad), and an expert with one row (Q5_K: the 4xn kernel too), at both SIMD
    kernel levels and 1 or 2 threads: every output is the one vec_dot of its row."""
    from ggmlrpc._native import quants
    from tests.ops.test_quants import random_blocks
    rng = np.random.default_rng(seed)
    K, M, n_as, T_ = 512, 30, 4, 8
    ids = np.array([[0, 1]] * 5 + [[0, 2]] * 2 + [[1, 3]], np.int32)   # (T, n_used): 7, 6, 2 and 1 rows
    if wtype in (T.Q4_K, T.Q5_K, T.Q6_K):
        wq = random_blocks(rng, int(wtype), K * M * n_as)
    else:
        wq = np.concatenate([quants.quantize(int(wtype), r)
                             for r in rng.standard_normal((n_as * M, K)).astype(np.float32)])
    rb = len(wq) // (M * n_as)
    x = rng.standard_normal((T_, 1, K)).astype(np.float32)
    act = quants.vec_dot_type(int(wtype))
    want = np.array([[[quants.vec_dot(int(wtype), wq[(a * M + i) * rb:(a * M + i + 1) * rb].tobytes(),
                                      quants.quantize(act, x[t, 0]).tobytes()) for i in range(M)]
                      for a in ids[t]] for t in range(T_)], np.float32)
    b = Builder(4 << 20)
    wt = b.tensor(wtype, (K, M, n_as), data=wq)
    xt = b.tensor(T.F32, (K, 1, T_), data=x)
    st = b.tensor(T.I32, (2, T_), data=ids)
    out = b.tensor(T.F32, (M, 2, T_), Op.MUL_MAT_ID, (wt, xt, st))
    top = quants.simd()
    try:
        for level in sorted({1, top}):
            quants.simd(level)
            for n_threads in (1, 2):
                ex = CpuExecutor(n_threads)
                b.buf.mem.fill(b.placement[out.id].offset, M * 2 * T_ * 4, 0)
                ex.run(ex.compile(b.graph()))
                np.testing.assert_array_equal(b.read(out).view(np.uint32), want.ravel().view(np.uint32),
                                              err_msg=f"level={level} threads={n_threads}")
    finally:
        quants.simd(top)


@pytest.mark.parametrize("wtype", [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS])
def test_prompt_k_quant_panels_match_the_one_row_path(seed, wtype):
    """K-quant products with 8+ activation rows take runs of eight rows at once (K
    panels) and the rows left over one by one; with two src1 batches, 1-3 threads:
    every output equals the one-row tiled path's (a plan made without SIMD kernels
    has no room for panels and takes that path, SIMD on or off at run time)."""
    from tests.ops.test_quants import random_blocks
    rng = np.random.default_rng(seed)
    K, M, N, B = 512, 36, 19, 2
    wq = random_blocks(rng, int(wtype), K * M)
    x = rng.standard_normal((B, N, K)).astype(np.float32)

    def run(n_threads, simd_at_plan, simd_at_run):
        return _matmul_runs(wtype, wq, x, M, n_threads, simd_at_plan, simd_at_run)[0]

    want = run(1, False, False)
    assert np.isfinite(want).all()
    np.testing.assert_array_equal(run(2, False, True).view(np.uint32), want.view(np.uint32))
    for n_threads in (1, 2, 3):
        np.testing.assert_array_equal(run(n_threads, True, True).view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("K", [256, 1024, 2816], ids=lambda k: f"K{k}")
@pytest.mark.parametrize("wtype", [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS])
def test_prompt_k_quant_weight_panels_match_the_other_paths(seed, wtype, K):
    """On AVX-512 VNNI CPUs the K-quants' prompt products take sixteen weight rows at
    a time (weight panels, every column read in place); the AVX2 family's K panels
    and the one-row tiled path must give the same bits, for 8 to 64 columns (runs
    of four and single ones) and chunks of 16 rows with a short one at the end."""
    from ggmlrpc._native import executor as native
    from tests.ops.test_quants import random_blocks
    rng = np.random.default_rng(seed)
    M = 37
    wq = random_blocks(rng, int(wtype), K * M)
    for N in (8, 16, 17, 37, 64):
        x = rng.standard_normal((1, N, K)).astype(np.float32)
        x[0, N - 1] *= 1e3   # one column of another scale

        def run(n_threads, simd):
            return _matmul_runs(wtype, wq, x, M, n_threads, simd, simd)[0]

        want = run(1, False)
        assert np.isfinite(want).all()
        for n_threads in (1, 2):
            np.testing.assert_array_equal(run(n_threads, True).view(np.uint32), want.view(np.uint32))
        old = native.set_kernel_family("x86-avx2")
        try:
            np.testing.assert_array_equal(run(2, True).view(np.uint32), want.view(np.uint32))
        finally:
            native.set_kernel_family(old)


def test_unsupported_and_invalid_are_typed(seed):
    b = Builder()
    x = b.tensor(T.F32, (8,), data=np.ones(8, np.float32))
    b.tensor(T.F32, (8,), Op.FLASH_ATTN_BACK, (x, x))
    with pytest.raises(UnsupportedError, match=r"op FLASH_ATTN_BACK \(F32 <- F32, F32\)"):
        CpuExecutor(1).compile(b.graph())
    b = Builder()
    x = b.tensor(T.F32, (8,), data=np.ones(8, np.float32))
    b.tensor(T.F32, (4,), Op.ADD, (x, x))
    with pytest.raises(ValidationError, match="differ in shape"):
        CpuExecutor(1).compile(b.graph())


def test_many_runs_of_one_plan(seed):
    """The pool and its barriers survive many runs of one plan (decode loops)."""
    rng = np.random.default_rng(seed)
    b = Builder()
    x = b.tensor(T.F32, (16, 3), data=rng.standard_normal((3, 16)).astype(np.float32))
    y = x
    for _ in range(20):
        y = b.tensor(T.F32, (16, 3), Op.SCALE, (y,), (f32(1.0), f32(0.5)))
    ex = CpuExecutor(3)
    plan = ex.compile(b.graph())
    for _ in range(300):
        ex.run(plan)
    want = b.read(x).copy()
    for _ in range(20):
        want = want + np.float32(0.5)
    np.testing.assert_array_equal(b.read(y), want)


@pytest.mark.parametrize("n_threads", [2, 3, 8])
def test_failures_stop_every_thread_at_one_barrier(seed, n_threads):
    """A node failing in its second phase (MUL_MAT_ID with an expert out of range),
    then more nodes: every run must end with the error, whichever thread fails
    and however late the others look (a thread leaving one barrier early would
    leave the rest waiting forever)."""
    from ggmlrpc.compute.cpu import CpuExecutor
    rng = np.random.default_rng(seed)
    b = Builder()
    w = b.tensor(T.F32, (32, 4, 3), data=rng.standard_normal((3, 4, 32)).astype(np.float32))
    x = b.tensor(T.F32, (32, 1, 8), data=rng.standard_normal((8, 1, 32)).astype(np.float32))
    sel = b.tensor(T.I32, (2, 8), data=np.tile(np.array([0, 1], np.int32), 8))
    y = b.tensor(T.F32, (4, 2, 8), Op.MUL_MAT_ID, (w, x, sel))
    for _ in range(3):
        y = b.tensor(T.F32, y.ne, Op.SCALE, (y,), (f32(2.0), 0))
    ex = CpuExecutor(n_threads)
    plan = ex.compile(b.graph())
    ex.run(plan)
    p = b.placement[sel.id]
    for k in range(300):
        bad = np.tile(np.array([0, 1], np.int32), 8)
        bad[k % 16] = 3 + k % 5
        p.buffer.mem.write(p.offset, bad.tobytes())
        with pytest.raises(ValidationError, match="MUL_MAT_ID expert"):
            ex.run(plan)
    p.buffer.mem.write(p.offset, np.tile(np.array([0, 1], np.int32), 8).tobytes())
    ex.run(plan)    # and the pool still works


def test_scratch_sizes_saturate_instead_of_wrapping(monkeypatch):
    """The planner's own line of defence, with the element bound (compute.work) lifted:
    a stride-0 F32 activation of 2^63 - 1 elements times F16 weights needs 2^64 - 2
    bytes to convert, which rounded up without checks wraps to 0 (the conversion then
    writes past the scratch). The C size rules saturate and the plan is refused."""
    from ggmlrpc.compute import work
    monkeypatch.setattr(work, "MAX_ELEMENTS", (1 << 63) - 1)
    wrap = (3577, 42799, 92737, 649657)          # their product: 2^63 - 1
    b = Builder()
    w = b.tensor(T.F16, (wrap[0], 1))
    x = b.tensor(T.F32, (wrap[0], 1))
    x.ne, x.nb = wrap, (4, 0, 0, 0)
    y = b.tensor(T.F32, (1, 1), Op.MUL_MAT, src=(w, x))
    y.ne, y.nb = (1,) + wrap[1:], (4, 0, 0, 0)
    with pytest.raises(ValidationError, match="scratch"):
        CpuExecutor(1).compile(b.graph())


@pytest.mark.parametrize("d", [64, 128, 256, 80], ids=lambda d: f"d{d}")
def test_flash_attn_decode_loop_matches_the_portable_steps(seed, d):
    """FLASH_ATTN_EXT over an F16 cache, a few query rows (the per-row path): the
    AVX-512 families keep VKQ in registers (gr_vec_ops.fa_keys_f16; d 80, and 128 and
    256 in the AVX512-FP16 family, take the loop of vector calls); in every family this CPU runs (and the others on their
    portable twins) the outputs are the portable steps' bit for bit: causal masks with
    -inf, keys of other sequences interleaved and whole blocks masked (skipped by one
    compare per block), a running maximum that moves (scores growing along the keys), ALiBi slopes,
    grouped-query heads, two thread counts."""
    from ggmlrpc._native import executor as native
    rng = np.random.default_rng(seed)
    nq, nkv, heads, kv_heads = 5, 300, 4, 2
    q = rng.standard_normal((heads, nq, d)).astype(np.float32)
    k = (rng.standard_normal((kv_heads, nkv, d)) * np.linspace(0.2, 2, nkv)[:, None]).astype(np.float16)
    v = (rng.standard_normal((kv_heads, nkv, d)) * 30).astype(np.float16)
    m = np.zeros((8, nkv), np.float16)
    for i in range(nq):
        m[i, nkv - nq + i + 1:] = -np.inf
        m[i, : 7 * i] = -np.inf
    m[:nq, 40:60] = -3.5
    for i in range(nq):    # several sequences' cells interleaved: row i's every fourth
        m[i, 100:200][np.arange(100) % 4 != i % 4] = -np.inf
    m[:nq, 208:240] = -np.inf     # whole blocks of keys masked

    def run(family, simd, n_threads, max_bias):
        b = Builder(8 << 20)
        tq = b.tensor(T.F32, (d, nq, heads), data=q)
        tk = b.tensor(T.F16, (d, nkv, kv_heads), data=k)
        tv = b.tensor(T.F16, (d, nkv, kv_heads), data=v)
        tm = b.tensor(T.F16, (nkv, 8), data=m)
        params = [struct.unpack("<i", struct.pack("<f", x))[0] for x in (1 / np.sqrt(d), max_bias, 0.0)] + [10]
        out = b.tensor(T.F32, (d, heads, nq), Op.FLASH_ATTN_EXT, (tq, tk, tv, tm), params=params)
        old, before = native.set_kernel_family(family), native.simd_level()
        try:
            native.set_simd(simd)
            CpuExecutor(n_threads).run(CpuExecutor(n_threads).compile(b.graph()))
        finally:
            native.set_simd(bool(before))
            native.set_kernel_family(old)
        return b.read(out)

    for family in ("x86-avx512", "x86-avx512-fp16", "x86-avx2"):
        for max_bias in (0.0, 8.0):
            want = run(family, False, 1, max_bias)
            assert np.isfinite(want).all()
            for n_threads in (1, 2):
                got = run(family, True, n_threads, max_bias)
                np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32),
                                              err_msg=f"{family} bias={max_bias} threads={n_threads}")
