"""Every recorded llama.cpp session (tests/data/traces) replayed in full against our server.

The graphs run on our CPU executor: the prompt graph, then decoding with
GRAPH_RECOMPUTE, with the logits compared to what llama.cpp's own server answered
(NMSE well under 1e-4, the same top token). Our kernels follow ggml's rounding and
summation order, and the sessions were recorded on an AVX2 build of llama.cpp: with
the executor reproducing that build (whatever this CPU is), the logits are bit for
bit the recorded ones; the strict tests hold that, with one thread and several, and
with the portable kernels as well as the SIMD ones.
"""
from __future__ import annotations

import os

import pytest

from ggmlrpc import protocol
from ggmlrpc.devices.cpu import CpuDevice
from ggmlrpc.protocol import Cmd
from ggmlrpc.server import Server
from ggmlrpc.trace import Replayer, load_connection
from tests.conftest import TRACES

SESSIONS = sorted(p.name for p in TRACES.iterdir() if (p / "conn-00.trc").exists())


@pytest.fixture
def threaded_server():
    """Our server with one CPU device of three executor threads (rows split unevenly)."""
    srv = Server([CpuDevice(3)], "127.0.0.1", 0, codec=protocol.codec("native"),
                 out=open(os.devnull, "w"))
    srv.start()
    yield srv
    srv.close()


@pytest.fixture
def avx2_family():
    """The executor reproduces ggml's AVX2 build, the one the sessions were recorded with."""
    from ggmlrpc._native import executor
    old = executor.set_kernel_family("x86-avx2")
    yield
    executor.set_kernel_family(old)


@pytest.fixture
def portable_kernels():
    """The executor's portable kernels. The quant kernels keep their level: their
    portable level sums in ggml's generic order, which no x86 build (and so no
    recorded session) uses. (This fixture used to set that level too, but each module
    then had its own copy of it and the executor never saw it; with one core library
    it would.)"""
    from ggmlrpc._native import executor
    old_exec = executor.set_simd(False)
    yield
    executor.set_simd(bool(old_exec))


def replay(endpoint: str, session: str, max_nmse: float = 1e-4):
    results = Replayer(endpoint, timeout=60, max_nmse=max_nmse).replay_session(TRACES / session)
    diffs = [f"{r.name} {d}" for r in results for d in r.differences]
    assert not diffs, "\n".join(diffs)
    # the model connection ran its graphs and had its logits compared
    model = results[-1]
    trace = load_connection(TRACES / session / model.name)
    cmds = [e.cmd for e in trace.exchanges]
    assert Cmd.GRAPH_COMPUTE in cmds and Cmd.GRAPH_RECOMPUTE in cmds
    reads = sum(1 for c in cmds if c == Cmd.GET_TENSOR)
    assert model.stopped_before is None and model.sent == len(trace.exchanges)
    assert model.compared >= reads > 0
    return results


def test_traces_present():
    assert len(SESSIONS) >= 4, f"expected the recorded sessions in {TRACES}"


@pytest.mark.parametrize("session", SESSIONS)
def test_whole_session_replays(server, endpoint, session):
    replay(endpoint, session)


@pytest.mark.parametrize("session", SESSIONS)
def test_logits_bit_exact_threaded(threaded_server, avx2_family, session):
    # an NMSE bound of 1e-30 admits only identical logits
    replay(f"127.0.0.1:{threaded_server.port}", session, max_nmse=1e-30)


@pytest.mark.parametrize("session", SESSIONS)
def test_logits_bit_exact_portable(threaded_server, avx2_family, portable_kernels, session):
    replay(f"127.0.0.1:{threaded_server.port}", session, max_nmse=1e-30)
