"""A running graph stops when its client goes away or the server closes.

A graph can run for seconds while its session thread sits inside the executor, and
the device runs one graph at a time, so a graph left running would hold every other
client's graph behind it. The server watches the sockets of computing sessions and
cancels a graph whose client hung up (ggmlrpc.graph_watch.GraphWatch); the executor stops
at its next work chunk (tests/unit/test_turns.py checks that inside one long node).
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from ggmlrpc.client import op as make_op
from ggmlrpc.compute.cpu import CpuExecutor, cancel_token
from ggmlrpc.errors import ConnectionLost
from ggmlrpc.ggml import GGMLOp as Op, GGMLType as T
from ggmlrpc.server import Limits
from tests.conftest import start_server
from tests.ops.conftest import Ctx

# one 512 x 512 x 512 product takes a few milliseconds: the chain runs for half a
# minute or more unless it is stopped
D = 512
CHAIN = 15000
GENEROUS = 10.0   # seconds a bystander may wait; the whole chain takes far longer
# the chain is far over the default work limit for its 4 MiB (it would be refused
# before it runs): these servers run it
NO_WORK_LIMIT = Limits(max_graph_work=None)


def long_chain(c: Ctx, n: int = CHAIN):
    """x <- w @ x, n times (the nodes alternate between two result tensors)."""
    rng = np.random.default_rng(0)
    w = c.new(T.F32, (D, D), (rng.standard_normal((D, D)) / 20).astype(np.float32))
    x = c.new(T.F32, (D, D), rng.standard_normal((D, D)).astype(np.float32))
    nodes = [c.op(Op.MUL_MAT, T.F32, (D, D), w, x)]
    nodes.append(c.op(Op.MUL_MAT, T.F32, (D, D), w, nodes[0]))
    for i in range(n - 2):
        src, dst = (nodes[-1], nodes[-2])
        t = make_op(Op.MUL_MAT, T.F32, (D, D), w, src, name=f"mm{i}")
        t.buffer, t.data = dst.buffer, dst.data   # write over the older result
        nodes.append(t)
    return nodes


def small_product(endpoint: str) -> np.ndarray:
    c = Ctx(endpoint, size=1 << 20)
    try:
        x = c.new(T.F32, (8, 2), np.ones((2, 8), np.float32))
        w = c.new(T.F32, (8, 3), np.full((3, 8), 2.0, np.float32))
        out = c.op(Op.MUL_MAT, T.F32, (3, 2), w, x)
        c.compute()
        return c.read(out)
    finally:
        c.close()


@pytest.fixture
def served():
    srv = start_server(limits=NO_WORK_LIMIT)
    yield srv
    srv.close()


def test_token_set_before_a_run_stops_it_at_once():
    from ggmlrpc._native import executor as ex
    srv = start_server()
    try:
        c = Ctx(f"127.0.0.1:{srv.port}", size=4 << 20)
        nodes = long_chain(c, 50)
        c.rb.graph_compute(nodes)
        c.rb.synchronize()
        session = next(iter(srv._sessions))
        plan = session.graphs[0].plan
        run = CpuExecutor(1)
        token = cancel_token()
        token.set()
        with pytest.raises(ConnectionLost, match="graph stopped at node"):
            run.run(plan, token)
        token.clear()
        run.run(plan, token)          # a cleared token lets the whole plan run
        assert isinstance(token, ex.CancelToken)
        c.close()
    finally:
        srv.close()


def test_graph_of_a_departed_client_stops(served, caplog):
    endpoint = f"127.0.0.1:{served.port}"
    c = Ctx(endpoint, size=4 << 20)
    c.rb.graph_compute(long_chain(c))   # no answer expected: GRAPH_COMPUTE is one-way
    time.sleep(0.5)                      # the chain is compiled and running
    c.close()                            # the client hangs up mid-graph
    t0 = time.monotonic()
    got = {}
    worker = threading.Thread(target=lambda: got.setdefault("out", small_product(endpoint)), daemon=True)
    worker.start()
    worker.join(GENEROUS)
    assert not worker.is_alive(), "the bystander waited behind a graph whose client had gone"
    np.testing.assert_array_equal(got["out"].reshape(2, 3), np.full((2, 3), 16.0, np.float32))
    assert time.monotonic() - t0 < GENEROUS


def test_close_stops_a_running_graph():
    srv = start_server(limits=NO_WORK_LIMIT)
    c = Ctx(f"127.0.0.1:{srv.port}", size=4 << 20)
    c.rb.graph_compute(long_chain(c))
    time.sleep(0.5)
    closer = threading.Thread(target=srv.close, kwargs={"timeout": GENEROUS}, daemon=True)
    closer.start()
    closer.join(GENEROUS + 5)
    assert not closer.is_alive()
    with srv._lock:
        assert not srv._threads, "a session thread outlived close()"
    c.close()
