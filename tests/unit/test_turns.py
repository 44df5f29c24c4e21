"""Runs that share a device: a canceled run stops inside a long node (at a work chunk),
and the runs of different clients take turns node by node, so a small graph never
waits for a long one to finish (ggmlrpc.compute.cpu.Turns).

The long node is a product with IQ2_XS weights (among the slowest kernels per
multiply-add, compute/matmul_cost.py): 4096 x 4096 weights by 1024 columns, a minute
or more of two cores.
The tests check orders of events (the long run is still going, its output is
unwritten), not times.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from ggmlrpc.compute.cpu import CpuExecutor, _native as ex_native, cancel_token
from ggmlrpc.errors import ConnectionLost
from ggmlrpc.ggml import GGMLOp as Op, GGMLType as T
from tests.ops.test_quants import random_blocks
from tests.unit.test_cpu_executor import Builder, f32

K, M, N = 4096, 4096, 1024
GENEROUS = 120   # seconds a test thread may take before it counts as stuck


def long_products(n_nodes: int, M: int = M):
    """n_nodes products of IQ2_XS weights by ones, each into its own output."""
    rng = np.random.default_rng(0)
    b = Builder(size=n_nodes * M * N * 4 + K * N * 4 + (8 << 20))
    w = b.tensor(T.IQ2_XS, (K, M), data=random_blocks(rng, T.IQ2_XS, K * M))
    x = b.tensor(T.F32, (K, N), data=np.ones((N, K), np.float32))
    outs = [b.tensor(T.F32, (M, N), op=Op.MUL_MAT, src=(w, x)) for _ in range(n_nodes)]
    return b, outs


def small_product():
    b = Builder()
    x = b.tensor(T.F32, (8, 2), data=np.ones((2, 8), np.float32))
    w = b.tensor(T.F32, (8, 3), data=np.full((3, 8), 2.0, np.float32))
    out = b.tensor(T.F32, (3, 2), op=Op.MUL_MAT, src=(w, x))
    return b, out


def small_product_completes(ex):
    """small_product() runs on ex to its end, with the right result"""
    sb, out = small_product()
    small_plan = ex.compile(sb.graph())
    small_run, small_got = start(lambda: ex.run(small_plan))
    small_run.join(GENEROUS)
    assert not small_run.is_alive() and "error" not in small_got
    np.testing.assert_array_equal(sb.read(out).reshape(2, 3), np.full((2, 3), 16.0, np.float32))


def start(fn):
    got = {}

    def body():
        try:
            got["value"] = fn()
        except BaseException as e:   # noqa: BLE001 - handed to the test
            got["error"] = e
    th = threading.Thread(target=body, daemon=True)
    th.start()
    return th, got


def test_cancel_stops_a_node_at_a_chunk():
    """A run whose token is set while its one long node computes stops inside that
    node: the kernel loop sees the flag, most of the output is never written."""
    b, (out,) = long_products(1)
    ex = CpuExecutor(2)
    plan = ex.compile(b.graph())
    token = cancel_token()
    th, got = start(lambda: ex.run(plan, token))
    first = b.placement[out.id].offset      # thread 0's first output, written early
    computing = threading.Event()
    while not computing.wait(0.01):
        if b.buf.mem.read(first, 4) != bytes(4) or not th.is_alive():
            computing.set()
    token.set()
    th.join(GENEROUS)
    assert not th.is_alive(), "the canceled node ran on"
    assert isinstance(got.get("error"), ConnectionLost)
    written = np.count_nonzero(b.read(out))
    assert written < out.ne[0] * out.ne[1] // 2


def test_bystander_graph_runs_between_the_nodes_of_a_long_one():
    """While a long graph runs, another run on the same executor completes before it
    (its turn comes after the long graph's node in progress); the long run then goes
    on and stops only when canceled."""
    lb, louts = long_products(40, M=256)     # seconds a node
    ex = CpuExecutor(2)
    long_plan = ex.compile(lb.graph())
    long_token = cancel_token()
    long_run, long_got = start(lambda: ex.run(long_plan, long_token))
    try:
        ready = threading.Event()
        while not ready.wait(0.01):     # the long run holds the device
            if ex.turns._holder is long_token:
                ready.set()
        small_product_completes(ex)
        assert long_run.is_alive() and not long_got, "the long graph ended first"
        assert not np.count_nonzero(lb.read(louts[-1])), "the long graph's last node ran"
    finally:
        long_token.set()
        long_run.join(GENEROUS)
    assert isinstance(long_got.get("error"), ConnectionLost)


@pytest.mark.parametrize("n_nodes", [3])
def test_yield_resumes_where_it_stopped(n_nodes):
    """A run asked to yield stops after a node and resumes from the next one: the
    result is the same as one uninterrupted run."""
    b = Builder()
    x = b.tensor(T.F32, (4, 4), data=np.arange(16, dtype=np.float32).reshape(4, 4))
    nodes = [x]
    for _ in range(n_nodes):
        nodes.append(b.tensor(T.F32, (4, 4), op=Op.ADD, src=(nodes[-1], x)))
    ex = CpuExecutor(1)
    plan = ex.compile(b.graph())
    token = cancel_token()
    token.request_yield()
    starts = [0]
    while starts[-1] is not None:
        starts.append(plan.native.run(ex.pool, token, starts[-1]))
    assert starts == [*range(n_nodes), None]
    np.testing.assert_array_equal(b.read(nodes[-1]), (n_nodes + 1) * np.arange(16, dtype=np.float32))


# ---- turns inside a long node ---------------------------------------------------

def mul_mat_case(t, K, M, N):
    def build(rng):
        b = Builder(size=M * N * 4 + K * (M + N) * 4 + (1 << 20))
        w = b.tensor(t, (K, M), data=random_blocks(rng, t, K * M))
        x = b.tensor(T.F32, (K, N), data=rng.standard_normal((N, K)).astype(np.float32))
        return b, b.tensor(T.F32, (M, N), op=Op.MUL_MAT, src=(w, x))
    return build


def mul_mat_id_case(t, K, M, tokens, n_as=4, n_used=2):
    def build(rng):
        b = Builder(size=M * n_used * tokens * 4 + K * (M * n_as + n_used * tokens) * 4 + (1 << 20))
        w = b.tensor(t, (K, M, n_as), data=random_blocks(rng, t, K * M * n_as))
        x = b.tensor(T.F32, (K, n_used, tokens), data=rng.standard_normal((tokens, n_used, K)).astype(np.float32))
        ids = np.stack([rng.permutation(n_as)[:n_used] for _ in range(tokens)]).astype(np.int32)
        sel = b.tensor(T.I32, (n_used, tokens), data=ids)
        return b, b.tensor(T.F32, (M, n_used, tokens), op=Op.MUL_MAT_ID, src=(w, x, sel))
    return build


def flash_attn_case(nq, nkv, masked, heads=4, kv_heads=2, d=64):
    def build(rng):
        b = Builder(size=4 * d * (nq + 2 * nkv) * heads + 8 * nkv * nq + (1 << 20))
        q = b.tensor(T.F32, (d, nq, heads), data=rng.standard_normal((heads, nq, d)).astype(np.float32))
        k = b.tensor(T.F16, (d, nkv, kv_heads), data=rng.standard_normal((kv_heads, nkv, d)).astype(np.float16))
        v = b.tensor(T.F16, (d, nkv, kv_heads), data=rng.standard_normal((kv_heads, nkv, d)).astype(np.float16))
        srcs = [q, k, v]
        if masked:   # causal, rows padded to 8 as llama.cpp pads them
            rows = -(-nq // 8) * 8
            m = np.zeros((rows, nkv), np.float32)
            for i in range(nq):
                m[i, nkv - nq + i + 1:] = -np.inf
            srcs.append(b.tensor(T.F16, (nkv, rows), data=m.astype(np.float16)))
        out = b.tensor(T.F32, (d, heads, nq), op=Op.FLASH_ATTN_EXT, src=srcs,
                       params=(f32(0.125), 0, 0, 10))
        return b, out
    return build


MID_NODE_CASES = {
    **{f"mul_mat-{t.name}-{K}x{M}x{N}": mul_mat_case(t, K, M, N)
       for t in (T.F32, T.F16, T.Q8_0, T.Q4_0, T.Q4_K, T.Q6_K, T.IQ2_XS)
       for K, M, N in ((256, 600, 1), (256, 200, 7), (512, 130, 33), (256, 257, 64))},
    **{f"mul_mat_id-{t.name}-{K}x{M}x{tokens}": mul_mat_id_case(t, K, M, tokens)
       for t in (T.Q8_0, T.Q4_K) for K, M, tokens in ((256, 300, 1), (256, 200, 12))},
    **{f"flash_attn-q{nq}-kv{nkv}{'-mask' if m else ''}": flash_attn_case(nq, nkv, m)
       for nq, nkv, m in ((7, 80, False), (64, 96, True), (130, 300, True), (200, 64, False))},
}


def cleared_after_one_run(b, out, n_threads):
    """(executor, plan, the output bytes of one uninterrupted run, a token asking to
    yield); the output is zeroed again"""
    ex = CpuExecutor(n_threads)
    plan = ex.compile(b.graph())
    assert plan.native.run(ex.pool, cancel_token()) is None
    whole = b.read(out, np.uint8).copy()
    p = b.placement[out.id]
    p.buffer.mem.write(p.offset, bytes(len(whole)))
    token = cancel_token()
    token.request_yield()
    return ex, plan, whole, token


@pytest.mark.parametrize("case", sorted(MID_NODE_CASES))
@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_paused_mid_node_is_bit_identical(case, n_threads):
    """A run asked to yield at every chance pauses inside its one long node (between
    work chunks, or between blocks of a thread's own rows) and goes on where it
    stopped: the output is bit for bit that of one uninterrupted run."""
    b, out = MID_NODE_CASES[case](np.random.default_rng(len(case)))
    ex, plan, whole, token = cleared_after_one_run(b, out, n_threads)
    starts, start = [], 0
    while start is not None:
        start = plan.native.run(ex.pool, token, start, 0.0, bool(starts))
        starts.append(start)
    assert len(starts) > 1 and set(starts[:-1]) == {0}, "no yield inside the node"
    np.testing.assert_array_equal(b.read(out, np.uint8), whole)


def test_bystander_graph_runs_inside_a_long_node():
    """A graph of one long node (a minute of two cores) is in progress; another run on
    the same executor completes while that node is still computing (its turn comes at
    a work chunk of the node), then the long run goes on until canceled."""
    lb, (lout,) = long_products(1)
    ex = CpuExecutor(2)
    long_plan = ex.compile(lb.graph())
    long_token = cancel_token()
    long_run, long_got = start(lambda: ex.run(long_plan, long_token))
    first = lb.placement[lout.id].offset
    try:
        computing = threading.Event()
        while not computing.wait(0.01):   # the long node has written its first outputs
            if lb.buf.mem.read(first, 4) != bytes(4) or not long_run.is_alive():
                computing.set()
        small_product_completes(ex)
        assert long_run.is_alive() and not long_got, "the long node ended first"
        assert np.count_nonzero(lb.read(lout)) < lout.ne[0] * lout.ne[1], "the long node had finished"
    finally:
        long_token.set()
        long_run.join(GENEROUS)
    assert isinstance(long_got.get("error"), ConnectionLost)


def test_cancel_while_paused_mid_node_then_run_again():
    """A run paused inside its node whose client then goes away stops when it goes on
    (canceled), and the plan holds nothing of it: the next run starts afresh
    and writes the whole output as an uninterrupted run does."""
    b, out = MID_NODE_CASES["mul_mat-Q8_0-256x257x64"](np.random.default_rng(1))
    ex, plan, whole, token = cleared_after_one_run(b, out, 2)
    assert plan.native.run(ex.pool, token, 0, 0.0) == 0   # paused inside node 0
    token.set()
    with pytest.raises(ex_native().ExecError) as e:
        plan.native.run(ex.pool, token, 0, 0.0, True)   # goes on from the pause
    assert e.value.code == ex_native().EXEC_ECANCELED
    assert np.count_nonzero(b.read(out)) < out.ne[0] * out.ne[1]
    ex.run(plan)
    np.testing.assert_array_equal(b.read(out, np.uint8), whole)
