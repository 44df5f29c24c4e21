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

from ggmlrpc.compute.cpu import CpuExecutor, cancel_token
from ggmlrpc.errors import ConnectionLost
from ggmlrpc.ggml import GGMLOp as Op, GGMLType as T
from tests.ops.test_quants import random_blocks
from tests.unit.test_cpu_executor import Builder

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
        sb, out = small_product()
        small_plan = ex.compile(sb.graph())
        small_run, small_got = start(lambda: ex.run(small_plan))
        small_run.join(GENEROUS)
        assert not small_run.is_alive() and "error" not in small_got
        assert long_run.is_alive() and not long_got, "the long graph ended first"
        np.testing.assert_array_equal(sb.read(out).reshape(2, 3), np.full((2, 3), 16.0, np.float32))
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
