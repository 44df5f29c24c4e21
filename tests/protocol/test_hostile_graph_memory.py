"""Hostile graphs, round 2: what a stored graph costs is counted and small.

A graph may carry half a million tensors that need no buffer, or hundreds of
thousands of cheap runnable nodes. What the server keeps of such a graph (its plan,
per-node records, scratch) is charged to the device's ledger and to the
connection's share, so --mem-limit bounds it like a buffer; the graph is decoded
into flat records, so that neither decoding nor storing nor freeing it makes one
Python object per tensor (the cyclic collector would then pause every session).
"""
from __future__ import annotations

import gc
import os
import struct

import numpy as np
import pytest

from ggmlrpc.server import Limits
from tests.conftest import start_server
from tests.protocol.rawclient import (GRAPH_COMPUTE, HELLO_ANSWER, OP_ADD, Raw, Watch,
                                      frame, logged, tensor, wait_stats)

BUF = 1 << 16


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def payload(handle: int, base: int, n_nodes: int, n_fillers: int) -> bytes:
    """A valid graph: n_nodes ADD nodes (each writing 16 floats from two leaves) and
    n_fillers tensors without a buffer that nothing uses. Built from templates with
    numpy (half a million struct.pack calls would take the test seconds)."""
    leaf = lambda id: tensor(id=id, buffer=handle, data=base, ne=(16,), name=b"leaf")  # noqa: E731
    node = tensor(id=0, buffer=handle, data=base + 1024, ne=(16,), op=OP_ADD, src=(1, 2),
                  flags=16, name=b"add")
    filler = tensor(id=0, ne=(16,), name=b"filler")
    rows = np.frombuffer(leaf(1) + leaf(2) + node * n_nodes + filler * n_fillers,
                         np.uint8).reshape(-1, 296).copy()
    ids = np.arange(1, len(rows) + 1, dtype="<u8")
    rows[:, :8] = ids.view(np.uint8).reshape(-1, 8)
    node_ids = ids[2:2 + n_nodes]
    return (struct.pack("<II", 0, n_nodes) + node_ids.tobytes() + struct.pack("<I", len(rows))
            + rows.tobytes())


class Attacker:
    def __init__(self, port: int):
        self.raw = Raw(port, timeout=60)
        assert self.raw.hello() == HELLO_ANSWER
        self.handle, self.base = self.raw.alloc(BUF)

    def graph(self, n_nodes: int, n_fillers: int) -> bytes:
        return frame(GRAPH_COMPUTE, payload(self.handle, self.base, n_nodes, n_fillers))


def held(server) -> list[int]:
    """Per session, the bytes it holds on device 0."""
    return [h[0] for h in server.memory()["held"]]


@pytest.fixture
def watched(caplog, request):
    limits = getattr(request, "param", None)
    srv = start_server("native", limits=limits)
    w = Watch(srv, caplog)
    yield w
    w.bystander.close()
    srv.close()


def test_stored_graph_memory_is_counted(watched):
    """A connection holding one 64 KiB buffer and a stored graph of half a million
    unused tensors: the process grows by no more than the ledger counts for it (the
    code before kept ~400 MiB of Python objects, counted nowhere)."""
    a = Attacker(watched.server.port)
    msg = a.graph(1, (1 << 19) - 3)   # the most tensors a graph may have
    gc.collect()
    before = rss()
    a.raw.send(msg)
    del msg
    a.raw.expect_no_response()       # the graph was decoded, compiled, run and stored
    grown = rss() - before
    mine = max(held(watched.server))
    assert grown <= mine + (16 << 20), f"process grew {grown >> 20} MiB, ledger counts {mine >> 10} KiB"
    a.raw.close()
    wait_stats(watched.server, sessions=1, buffers=1)
    assert watched.server.memory()["used"] == [watched.bystander.SIZE]
    watched.bystander.check()


def test_stored_plan_is_charged(watched):
    """Many runnable nodes: their plan is in the connection's part of the ledger while
    stored, and returned when the connection ends."""
    a = Attacker(watched.server.port)
    n = 4096
    a.raw.send(a.graph(n, 0))
    a.raw.expect_no_response()
    mine = max(held(watched.server))
    assert mine >= BUF + n * 64, f"{n} stored nodes counted as {mine - BUF} bytes"
    a.raw.close()
    wait_stats(watched.server, sessions=1, buffers=1)
    assert watched.server.memory()["used"] == [watched.bystander.SIZE]


@pytest.mark.parametrize("watched", [Limits(mem_limit=8 << 20)], indirect=True)
def test_plan_over_the_client_share_is_refused(watched):
    """A graph whose stored plan would pass what one client may hold closes that
    connection with a reason; the bystander is unharmed and the ledger is whole."""
    a = Attacker(watched.server.port)
    try:
        a.raw.send(a.graph(10_000, 0))   # decoded within the share, its plan is not
    except (BrokenPipeError, ConnectionResetError):
        pass  # refused before all of it arrived
    a.raw.expect_closed(timeout=20)
    a.raw.close()
    logged(watched.caplog, "its plan")
    watched.aftermath()
    assert watched.server.memory()["used"] == [watched.bystander.SIZE]


def test_unused_tensors_make_no_python_objects(watched):
    """Half a million tensors that need no buffer: decoding, storing and freeing the
    graph runs (almost) no cyclic collection and leaves no per-tensor objects."""
    a = Attacker(watched.server.port)
    msg = a.graph(1, (1 << 19) - 3)   # the most tensors a graph may have
    runs = []

    def count(phase, info):
        if phase == "start":
            runs.append(info["generation"])

    gc.collect()
    objects = len(gc.get_objects())
    gc.callbacks.append(count)
    try:
        a.raw.send(msg)
        a.raw.expect_no_response()
        stored = len(gc.get_objects()) - objects
        a.raw.close()
        wait_stats(watched.server, sessions=1, buffers=1)
    finally:
        gc.callbacks.remove(count)
    assert stored < 5000, f"{stored} more Python objects while the graph is stored"
    assert len(runs) < 50, f"{len(runs)} collections ({runs.count(2)} full) for one graph"
    watched.bystander.check()


def test_cached_graphs_are_charged(watched):
    """Every compiled graph a connection keeps for a repeat of its payload is charged,
    its plan and the payload it is kept under: distinct graphs add up in the ledger."""
    a = Attacker(watched.server.port)
    held = []
    for n in (1024, 1025, 1026):
        msg = a.graph(n, 0)
        a.raw.send(msg)
        a.raw.expect_no_response()
        held.append(max(h[0] for h in watched.server.memory()["held"]))
    for before, after, n in zip([BUF] + held, held, (1024, 1025, 1026)):
        assert after - before >= n * (64 + 296), f"a cached graph of {n} nodes counted as {after - before} bytes"
    a.raw.send(a.graph(1024, 0))           # a repeat: served from the cache, nothing added
    a.raw.expect_no_response()
    assert max(h[0] for h in watched.server.memory()["held"]) == held[-1]
    a.raw.close()
    wait_stats(watched.server, sessions=1, buffers=1)
    assert watched.server.memory()["used"] == [watched.bystander.SIZE]
