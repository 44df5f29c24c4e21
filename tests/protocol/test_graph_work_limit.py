"""The graph work limit (ggmlrpc.compute.work, --max-graph-work) over the wire: a graph
whose logical shape is astronomically larger than the bytes behind it (stride 0) is
refused before it runs, costing only its own connection."""
from __future__ import annotations

import time

import pytest

from tests.protocol.rawclient import FLAG_COMPUTE, GRAPH_COMPUTE, HELLO_ANSWER, OP_ADD, frame, graph, wait_for
from tests.protocol.test_hostile import Arena

HUGE = (1 << 24, 1 << 24, 1, 1)   # 2^48 elements over 4 bytes: hours of additions


@pytest.fixture
def arena(server, caplog):
    a = Arena(server, caplog)
    yield a
    a.bystander.close()


def test_stride0_broadcast_refused(arena):
    def attack(a):
        x = a.t(id=1, ne=HUGE, nb=(0, 0, 0, 0))
        y = a.t(id=2, ne=HUGE, nb=(0, 0, 0, 0), data=a.base + 64, op=OP_ADD, src=(1, 1),
                flags=FLAG_COMPUTE, name=b"sum")
        a.send(frame(GRAPH_COMPUTE, graph(0, [2], [x, y])))
    t0 = time.monotonic()
    arena.run(attack, "over the limit")
    assert time.monotonic() - t0 < 10


def test_work_limit_off(server, caplog):
    """With the limit off (None), a graph is judged by the op rules alone: the planner
    accepts the same shape (it is valid ggml), so the refusal above is the limit's."""
    from ggmlrpc.compute import work
    from ggmlrpc.protocol import RpcTensor
    node = RpcTensor(op=OP_ADD, ne=HUGE, nb=(0, 0, 0, 0))
    assert work.node_work(node, [node, node]) > 1 << 48


OP_MUL_MAT = 29
# 2^63 - 1 = 3577 * 42799 * 92737 * 649657: the most elements a tensor may have
WRAP = (3577, 42799, 92737, 649657)


def test_scratch_size_cannot_wrap(server_proc):
    """A stride-0 F32 activation of 2^63 - 1 elements times F16 weights: converting it
    to F16 takes 2^64 - 2 bytes of scratch, a size that wraps to 0 when rounded up
    unchecked (the conversion then writes over the heap). With the work limit off the
    graph is still refused, and only its connection pays."""
    from tests.protocol.rawclient import F16, F32, Raw
    from tests.protocol.test_hostile import Attacker
    proc = server_proc("--max-graph-work", "0")
    a = Attacker(proc.port)
    w = a.t(id=1, type=F16, ne=(WRAP[0], 1, 1, 1))
    x = a.t(id=2, type=F32, ne=WRAP, nb=(4, 0, 0, 0), data=a.base + 8192)
    y = a.t(id=3, type=F32, ne=(1,) + WRAP[1:], nb=(4, 0, 0, 0), data=a.base + 32768,
            op=OP_MUL_MAT, src=(1, 2), flags=FLAG_COMPUTE, name=b"y")
    a.send(frame(GRAPH_COMPUTE, graph(0, [3], [w, x, y])))
    a.raw.expect_closed()
    a.raw.close()
    assert proc.proc.poll() is None, proc.output()[1][-2000:]
    with Raw(proc.port) as other:          # the server goes on serving
        assert other.hello() == HELLO_ANSWER
    # the reason reaches stderr from the server's log; the reader thread may be behind
    wait_for(lambda: "elements" in proc.output()[1], what="the logged reason")
