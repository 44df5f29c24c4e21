"""The graph work limit (ggmlrpc.compute.work, --max-graph-work) over the wire: a graph
whose logical shape is astronomically larger than the bytes behind it (stride 0) is
refused before it runs, costing only its own connection."""
from __future__ import annotations

import time

import pytest

from tests.protocol.rawclient import FLAG_COMPUTE, GRAPH_COMPUTE, OP_ADD, frame, graph
from tests.protocol.test_hostile import Arena

HUGE = (1 << 31, 1 << 31, 1, 1)   # 2^62 elements over 4 bytes: years of additions


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
    assert work.node_work(node, [node, node]) > 1 << 62
