"""The server under load never exits: connection cap, HELLO and idle timeouts,
descriptor and thread exhaustion, per-connection buffer cap, memory limit.

Each test keeps a well-behaved bystander client on the server and checks that it is
answered (within generous bounds) while the load is on and after it.
"""
from __future__ import annotations

import logging
import select
import socket
import struct
import subprocess
import sys
import textwrap
import time

import pytest

from ggmlrpc.errors import ServerClosed
from ggmlrpc.server import Limits
from tests.conftest import free_port, start_server, wait_port
from tests.protocol.rawclient import (
    ALLOC_BUFFER, BUFFER_CLEAR, BUFFER_GET_BASE, DEVICE_COUNT_ANSWER, FREE_BUFFER, HELLO,
    HELLO_ANSWER, Bystander, Raw, Watch, frame, logged, u32, u64, wait_for, wait_stats)

MiB = 1 << 20


def limited(codec_name="native", **kw):
    """A server with the given limits (others at their defaults)."""
    return start_server(codec_name, limits=Limits(**kw))


@pytest.fixture
def closing():
    servers = []
    yield servers.append
    for s in servers:
        s.close()


def refused(raw: Raw, timeout: float = 10.0) -> bool:
    """The server closed this connection without a word (a reset counts)."""
    raw.sock.settimeout(timeout)
    try:
        return raw.sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def alloc_raw(raw: Raw, size: int) -> int:
    """ALLOC_BUFFER; the handle (0: refused)."""
    rsp = raw.call(ALLOC_BUFFER, u32(0) + u64(size), 16)
    return struct.unpack("<QQ", rsp[8:])[0]


# -- connection cap, HELLO and idle timeouts ----------------------------------------------

def test_connections_over_the_cap_are_refused(closing, caplog):
    srv = limited(max_clients=4, hello_timeout=60)
    closing(srv)
    w = Watch(srv, caplog)
    idle = [Raw(srv.port) for _ in range(3)]      # with the bystander: the cap
    wait_stats(srv, sessions=4)
    extra = [Raw(srv.port) for _ in range(5)]
    for r in extra:
        assert refused(r)
    lines = logged(caplog, "refusing connection", logging.WARNING)
    assert len(lines) < 5                          # throttled: no line per connection
    w.bystander.check()                            # served while the cap is reached
    for r in idle + extra:
        r.close()
    wait_stats(srv, sessions=1)
    with Raw(srv.port) as late:                    # room again
        assert late.hello() == HELLO_ANSWER
    w.aftermath()
    w.bystander.close()


@pytest.mark.parametrize("how", ["silent", "dripping"])
def test_hello_deadline(closing, caplog, codec_name, how):
    """A connection that does not complete HELLO in time is closed, however it paces
    its bytes (native and pure-Python socket loops)."""
    srv = limited(codec_name, hello_timeout=0.5)
    closing(srv)
    w = Watch(srv, caplog)
    r = Raw(srv.port)
    if how == "dripping":
        hello = frame(HELLO, bytes(24))
        for i in range(len(hello)):               # 33 bytes: 3.3 s, far over the deadline
            if _readable(r):                      # closed by the server
                break
            try:
                r.send(hello[i:i + 1])
            except OSError:
                break
            time.sleep(0.1)
    assert refused(r)
    logged(caplog, "no complete HELLO", logging.WARNING)
    r.close()
    w.aftermath()
    w.bystander.close()


def _readable(r: Raw) -> bool:
    return bool(select.select([r.sock], [], [], 0)[0])


def test_idle_timeout(closing, caplog, codec_name):
    srv = limited(codec_name, idle_timeout=0.5)
    closing(srv)
    caplog.set_level(logging.INFO, logger="ggmlrpc")
    r = Raw(srv.port)
    assert r.hello() == HELLO_ANSWER
    handle = alloc_raw(r, 4096)
    assert handle
    wait_stats(srv, sessions=1, buffers=1)
    assert refused(r)
    logged(caplog, "idle", logging.WARNING)
    wait_stats(srv, sessions=0, buffers=0)       # what it held is freed
    # a busy client is not idle: requests closer together than the timeout keep it
    with Raw(srv.port) as busy:
        assert busy.hello() == HELLO_ANSWER
        for _ in range(8):
            time.sleep(0.1)
            assert busy.call(15) == DEVICE_COUNT_ANSWER


def test_one_address_cannot_take_every_slot(closing):
    """--max-clients connections held open from one address: the ones past
    --max-per-address are refused, and a client from another address is served."""
    srv = limited(hello_timeout=60)
    closing(srv)
    flood = [Raw(srv.port) for _ in range(Limits().max_clients)]
    served = 0
    for r in flood:
        try:
            served += r.hello() == HELLO_ANSWER
        except OSError:
            pass                                   # refused: closed or reset
    try:
        assert served == Limits().max_per_address < Limits().max_clients
        with Raw(srv.port, source="127.0.0.2") as other:
            assert other.hello() == HELLO_ANSWER
    finally:
        for r in flood:
            r.close()


def test_idle_timeout_off_by_default():
    assert Limits().idle_timeout is None and Limits().hello_timeout


# -- descriptors and threads run out: a child process with low limits -------------------

CHILD = textwrap.dedent("""
    import resource, sys, threading
    from ggmlrpc.devices.cpu import CpuDevice
    from ggmlrpc.server import Limits, Server
    import logging
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    port, mode = int(sys.argv[1]), sys.argv[2]
    srv = Server([CpuDevice(1)], "127.0.0.1", port, out=sys.stdout,
                 limits=Limits(max_clients=10000, max_per_address=None, hello_timeout=120))
    srv.bind()
    if mode == "fds":
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (40, hard))
    else:  # threads: stacks too big for the address space left
        with open("/proc/self/status") as f:
            vm = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:"))
        threading.stack_size(256 << 20)
        resource.setrlimit(resource.RLIMIT_AS, (vm + (900 << 20), resource.RLIM_INFINITY))
    srv.serve_forever()
""")


@pytest.mark.parametrize("mode", ["fds", "threads"])
def test_resource_exhaustion_refuses_and_survives(mode, tmp_path):
    """Idle connections until accept() fails with EMFILE (RLIMIT_NOFILE 40), or until a
    session thread cannot be started (its stack does not fit): each connection beyond
    is refused with a log line, the server keeps serving the bystander, and serves
    new clients once the load is gone."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-P", "-c", CHILD, str(port), mode],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path)  # the installed package, not the source tree
    try:
        wait_port(port, proc)
        by = Bystander(port)
        flood: list[Raw] = []
        n_refused = 0
        while not n_refused and len(flood) < 200:  # batches until one is refused
            for _ in range(5):
                flood.append(Raw(port, timeout=10))
            ready = select.select([r.sock for r in flood], [], [], 1.0)[0]
            n_refused = sum(refused(r, timeout=1) for r in flood if r.sock in ready)
        assert n_refused, "no connection was refused"
        assert proc.poll() is None, "the server exited"
        by.check()
        for r in flood:
            r.close()
        # the load is gone: new clients are served
        def fresh():
            try:
                with Raw(port, timeout=10) as r:
                    return r.hello() == HELLO_ANSWER
            except OSError:
                return False
        wait_for(fresh, 30, "a fresh client served")
        by.check()
        by.close()
        assert proc.poll() is None
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    want = "can't start new thread" if mode == "threads" else "refusing connection"
    assert want in err, err[-2000:]
    assert "Traceback" not in err, err[-4000:]


# -- buffers and memory ------------------------------------------------------------------

def test_buffer_count_per_connection(closing, caplog):
    srv = limited(max_buffers=8)
    closing(srv)
    w = Watch(srv, caplog)
    r = Raw(srv.port)
    assert r.hello() == HELLO_ANSWER
    handles = [alloc_raw(r, 64) for _ in range(8)]
    assert all(handles)
    for _ in range(20):                            # refused, the connection stays
        assert alloc_raw(r, 64) == 0
    warnings = logged(caplog, "buffers held", logging.WARNING)
    assert len(warnings) == 1                      # once per connection, no flood
    r.send(frame(FREE_BUFFER, u64(handles[0])))
    assert alloc_raw(r, 64) != 0
    w.bystander.check()                            # its own count is separate
    r.close()
    w.aftermath()
    w.bystander.close()



def _mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def test_small_buffers_cost_no_mapping_each(closing, caplog):
    """The kernel caps the mappings of a process (vm.max_map_count, 65530 by default):
    one mapping per buffer let one client's tiny buffers exhaust it, after which no
    thread or buffer of anyone could start. Small buffers come from the heap. (Linux
    merges adjacent private anonymous mappings when it can, so one mapping per buffer
    does not always show here; the heap makes the bound hold whatever the layout.)"""
    srv = limited(max_buffers=4000)
    closing(srv)
    w = Watch(srv, caplog)
    r = Raw(srv.port)
    assert r.hello() == HELLO_ANSWER
    before = _mappings()
    handles = [alloc_raw(r, 4096) for _ in range(3000)]
    assert all(handles)
    assert _mappings() - before < 100
    big = alloc_raw(r, 4 * MiB)                    # large ones are still mapped
    assert big
    w.bystander.check()
    r.close()
    w.aftermath()
    w.bystander.close()

def test_memory_limit_over_all_connections(closing, caplog):
    """The sum of every client's buffers stays under the limit; what a client frees or
    leaves behind goes back to the others."""
    srv = limited(mem_limit=64 * MiB)
    closing(srv)
    w = Watch(srv, caplog)                         # holds 4 KiB
    a, b = Raw(srv.port), Raw(srv.port)
    assert a.hello() == b.hello() == HELLO_ANSWER
    ha = alloc_raw(a, 40 * MiB)
    assert ha
    assert alloc_raw(b, 40 * MiB) == 0             # each fits, the sum does not
    logged(caplog, "--mem-limit", logging.WARNING)
    hb = alloc_raw(b, 20 * MiB)
    assert hb
    mem = srv.memory()
    assert mem["used"] == [60 * MiB + Bystander.SIZE] and mem["limit"] == [64 * MiB]
    assert sorted(mem["held"]) == [[Bystander.SIZE], [20 * MiB], [40 * MiB]]
    # BUFFER_CLEAR touches every page of a counted buffer, nothing beyond the limit
    b.send(frame(BUFFER_CLEAR, u64(hb) + b"\x01"))
    assert b.call(15) == DEVICE_COUNT_ANSWER
    assert alloc_raw(b, 8 * MiB) == 0
    a.close()                                      # its 40 MiB come back
    wait_stats(srv, sessions=2)
    assert alloc_raw(b, 30 * MiB) != 0             # b: 50 MiB, under its share of 56
    w.bystander.check()
    b.close()
    w.aftermath()
    assert srv.memory()["used"] == [Bystander.SIZE]
    w.bystander.close()


def test_one_connection_cannot_take_the_whole_limit(closing, caplog):
    """A connection holds at most its share of a device's limit (by default the limit
    less an eighth), buffers and stored-graph scratch together: a small graph that asks
    for the rest of the limit as scratch is refused and closes its own connection,
    and another client still gets memory."""
    from tests.protocol.rawclient import F16, F32, FLAG_COMPUTE, GRAPH_COMPUTE, graph, tensor
    srv = limited(mem_limit=64 * MiB)
    closing(srv)
    a, b = Raw(srv.port), Raw(srv.port)
    assert a.hello() == b.hello() == HELLO_ANSWER
    assert alloc_raw(a, 60 * MiB) == 0             # over the share (56 MiB) of one client
    logged(caplog, "--client-mem-limit", logging.WARNING)
    h = alloc_raw(a, 40 * MiB)
    assert h
    (base,) = struct.unpack("<Q", a.call(BUFFER_GET_BASE, u64(h), 8)[8:])
    # a stride-0 activation of 10240 rows of 1024 converted to F16: 20 MiB of scratch,
    # within the device's limit (40 + 20 < 64 MiB), not within this client's share
    K, N = 1024, 10240
    w = tensor(id=1, type=F16, buffer=h, data=base, ne=(K, 1))
    x = tensor(id=2, type=F32, buffer=h, data=base + 4096, ne=(K, N), nb=(4, 0, 0, 0))
    y = tensor(id=3, type=F32, buffer=h, data=base + 8192, ne=(1, N), op=29, src=(1, 2),
               flags=FLAG_COMPUTE, name=b"y")
    payload = graph(0, [3], [w, x, y])
    assert len(payload) < 1024
    a.send(frame(GRAPH_COMPUTE, payload))
    assert refused(a)
    logged(caplog, "--client-mem-limit", logging.ERROR)
    assert alloc_raw(b, 20 * MiB) != 0
    a.close()
    b.close()


def test_default_memory_limit_stops_overcommit(closing):
    """By default the limit is the device's free memory at start less a margin: buffers
    that each fit but together exceed it are refused (no memory is touched here)."""
    srv = start_server("native")
    closing(srv)
    limit = srv.memory()["limit"][0]
    with Raw(srv.port) as r:
        assert r.hello() == HELLO_ANSWER
        part = limit // 3 + 1
        got = [alloc_raw(r, part) for _ in range(3)]
        assert all(got[:2]) and got[2] == 0
        assert r.call(BUFFER_GET_BASE, u64(got[0]), 8)


def test_graph_counts_and_duplicates_cost_one_connection(closing, caplog):
    """A node id repeated is refused while decoding (it cost gigabytes once), and so is
    a node count over the cap, whatever the payload."""
    from tests.protocol.rawclient import GRAPH_COMPUTE, graph, tensor
    srv = limited()
    closing(srv)
    w = Watch(srv, caplog)
    for ids, reason in (([1] * 200_000, "more than once"), ([1] * 1_000_000, "at most"),
                        ([1, 2, 1], "more than once")):
        r = Raw(srv.port)
        assert r.hello() == HELLO_ANSWER
        t1, t2 = tensor(id=1, ne=(4,)), tensor(id=2, ne=(4,))
        try:
            r.send(frame(GRAPH_COMPUTE, graph(0, ids, [t1, t2])))
        except OSError:
            pass
        assert refused(r)
        logged(caplog, reason)
        r.close()
        w.bystander.check()
    w.aftermath()
    w.bystander.close()


def test_init_tensor_without_buffer_does_not_flood_the_log(closing, caplog):
    from tests.protocol.rawclient import INIT_TENSOR, tensor
    srv = limited()
    closing(srv)
    caplog.set_level(logging.DEBUG, logger="ggmlrpc")
    with Raw(srv.port) as r:
        assert r.hello() == HELLO_ANSWER
        for _ in range(200):
            r.send(frame(INIT_TENSOR, tensor(id=1, ne=(32,))))
        assert r.call(15) == DEVICE_COUNT_ANSWER
    warn = [x for x in caplog.records if x.levelno >= logging.WARNING and "INIT_TENSOR" in x.getMessage()]
    assert len(warn) == 1


# -- the same limits through the command line ----------------------------------------------

def test_limits_from_the_command_line(server_proc):
    p = server_proc("--max-clients", "2", "--mem-limit", "1M", "--max-buffers", "3",
                    "--hello-timeout", "30", "--idle-timeout", "30", "--client-mem-limit", "512K",
                    "--max-per-address", "2")
    first = Raw(p.port)
    assert first.hello() == HELLO_ANSWER
    assert alloc_raw(first, 2 * MiB) == 0                  # over --mem-limit
    assert all(alloc_raw(first, 1024) for _ in range(3))
    assert alloc_raw(first, 1024) == 0                     # over --max-buffers
    second = Raw(p.port)
    assert second.hello() == HELLO_ANSWER
    assert alloc_raw(second, 600 * 1024) == 0              # over --client-mem-limit
    third = Raw(p.port)
    assert refused(third)                                  # over --max-clients
    for r in (first, second, third):
        r.close()
    _, err = p.stop()
    assert "--mem-limit" in err and "buffers held" in err and "--max-clients" in err
    assert "--client-mem-limit" in err


@pytest.mark.parametrize("args", [["--max-clients", "0"], ["--mem-limit", "lots"],
                                  ["--idle-timeout", "-1"], ["--hello-timeout", "x"],
                                  ["--cache-max-size", "1Q"]])
def test_bad_limit_values_exit_1(args):
    from tests.conftest import our_server_argv
    r = subprocess.run(our_server_argv(*args), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "Invalid parameters" in r.stderr



def test_plan_scratch_is_counted_in_the_memory_limit(closing, caplog):
    """A stored plan's scratch (Q8_0 activations of a Q8_0 product) is held in the ledger
    like a buffer: a graph whose scratch would pass the limit is refused, and what a
    stored plan held comes back when it is replaced or its client goes."""
    import numpy as np

    from ggmlrpc.ggml import GGMLOp as Op, GGMLType as T
    from tests.ops.conftest import Ctx

    K, M, N = 1024, 8, 1024                         # activations: 4 MiB of F32
    srv = limited(mem_limit=12 * MiB, client_mem_limit=12 * MiB)
    closing(srv)
    w = Watch(srv, caplog)
    rng = np.random.default_rng(1)

    def product(c: Ctx, n: int):
        wt = c.new(T.Q8_0, (K, M), rng.standard_normal((M, K)).astype(np.float32))
        x = c.new(T.F32, (K, n), rng.standard_normal((n, K)).astype(np.float32))
        return c.op(Op.MUL_MAT, T.F32, (M, n), wt, x)

    c = Ctx(f"127.0.0.1:{srv.port}", size=6 * MiB)
    product(c, N)
    c.compute()
    held = srv.memory()["used"][0]
    scratch = held - 6 * MiB - Bystander.SIZE
    assert scratch >= N * K * 34 // 32             # the activations as Q8_0 blocks
    c.compute()                                    # the same graph again: replaced, not added
    assert srv.memory()["used"][0] == held
    c.close()
    wait_stats(srv, sessions=1)
    assert srv.memory()["used"] == [Bystander.SIZE]

    big = Ctx(f"127.0.0.1:{srv.port}", size=11 * MiB)   # buffers fit, their scratch does not
    product(big, 2 * N)
    with pytest.raises(ServerClosed):
        big.compute()
        big.read(big.nodes[-1])
    logged(caplog, "plan and scratch memory", logging.ERROR)
    w.bystander.check()
    big.close()
    wait_stats(srv, sessions=1)
    assert srv.memory()["used"] == [Bystander.SIZE]
    w.aftermath()
    w.bystander.close()

