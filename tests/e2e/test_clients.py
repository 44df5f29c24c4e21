"""Several clients at once, clients that vanish, lost and refused connections, timeouts.

Each client mirrors its buffers in a NumPy model and checks every read against it,
so a write that lands in the wrong buffer, the wrong place or the wrong session
shows up as a mismatch.
"""
from __future__ import annotations

import logging
import os
import socket
import struct
import threading
import time

import numpy as np
import pytest

from ggmlrpc import protocol
from ggmlrpc.client import RemoteBackend
from ggmlrpc.devices.cpu import CpuDevice
from ggmlrpc.errors import ConnectionLost, RpcTimeout, ServerClosed
from ggmlrpc.ggml import GGMLType
from ggmlrpc.protocol import Cmd, RpcTensor
from ggmlrpc.server import Server

BUF = 64 << 10


def wait_stats(server, want: dict, timeout: float = 10.0) -> dict:
    """Poll server.stats() until it equals `want` (sessions end asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        got = server.stats()
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(0.02)


class Mirror:
    """A remote buffer and its local model; every operation applied to both."""

    def __init__(self, rb: RemoteBackend, size: int):
        self.rb = rb
        self.buf = rb.alloc_buffer(size)
        assert self.buf is not None and self.buf.size == size
        self.model = np.zeros(size, dtype=np.uint8)  # fresh buffers are zero-filled
        self.whole = self.buf.tensor(GGMLType.I8, (size,), name="whole")

    def set(self, off: int, data: np.ndarray) -> None:
        raw = data.view(np.uint8)
        self.rb.set_tensor(self.whole, raw, offset=off)
        self.model[off:off + len(raw)] = raw

    def memset(self, off: int, n: int, value: int) -> None:
        self.rb.memset_tensor(self.whole, value, offset=off, size=n)
        self.model[off:off + n] = value

    def clear(self, value: int) -> None:
        self.buf.clear(value)
        self.model[:] = value

    def check(self, off: int = 0, n: int | None = None) -> None:
        n = len(self.model) - off if n is None else n
        got = np.frombuffer(self.rb.get_tensor(self.whole, offset=off, size=n), dtype=np.uint8)
        bad = np.flatnonzero(got != self.model[off:off + n])
        assert not len(bad), f"{len(bad)} bytes differ, first at {off + bad[0]}"


def copy(src: Mirror, s_off: int, dst: Mirror, d_off: int, n: int) -> None:
    ts = src.buf.tensor(GGMLType.F32, (n // 4,), offset=s_off)
    td = dst.buf.tensor(GGMLType.F32, (n // 4,), offset=d_off)
    assert src.rb.copy_tensor(ts, td)
    dst.model[d_off:d_off + n] = src.model[s_off:s_off + n].copy()


def region(rng, size: int, max_n: int = 8192) -> tuple[int, int]:
    n = 4 * int(rng.integers(1, max_n // 4))
    return 4 * int(rng.integers(0, (size - n) // 4 + 1)), n


def client_work(rb: RemoteBackend, a: Mirror, b: Mirror, seed: int, rounds: int, start: threading.Barrier):
    rng = np.random.default_rng(seed)
    start.wait()
    for _ in range(rounds):
        m = a if rng.integers(2) else b
        op = rng.integers(10)
        if op < 4:
            off, n = region(rng, BUF)
            m.set(off, rng.standard_normal(n // 4).astype(np.float32))
        elif op < 6:
            off, n = region(rng, BUF)
            m.check(off, n)
        elif op < 8:
            (s_off, n), d_off = region(rng, BUF), 0
            d_off = 4 * int(rng.integers(0, (BUF - n) // 4 + 1))
            copy(m, s_off, b if m is a else a, d_off, n)
        elif op < 9:
            off, n = region(rng, BUF)
            m.memset(off, n, int(rng.integers(256)))
        else:
            m.clear(int(rng.integers(256)))
    a.check()
    b.check()


def test_concurrent_clients(server, endpoint, seed):
    n_clients = 4
    clients = [RemoteBackend(endpoint, timeout=30) for _ in range(n_clients)]
    mirrors = [(Mirror(rb, BUF), Mirror(rb, BUF)) for rb in clients]
    assert server.stats() == {"sessions": n_clients, "buffers": 2 * n_clients,
                              "buffer_bytes": 2 * n_clients * BUF}
    # handles are distinct across sessions
    assert len({m.buf.handle for pair in mirrors for m in pair}) == 2 * n_clients

    start = threading.Barrier(n_clients)
    errors = []

    def run(i):
        try:
            client_work(clients[i], *mirrors[i], seed + i, 150, start)
        except BaseException as e:  # reported by the main thread
            errors.append((i, e))
            start.abort()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    for rb, (a, b) in zip(clients, mirrors):
        a.buf.free()
        rb.synchronize()
    assert server.stats()["buffers"] == n_clients
    for rb in clients:
        rb.close()
    assert wait_stats(server, {"sessions": 0, "buffers": 0, "buffer_bytes": 0}) == \
        {"sessions": 0, "buffers": 0, "buffer_bytes": 0}


def test_foreign_handle_costs_only_that_connection(server, endpoint, seed):
    rng = np.random.default_rng(seed)
    owner = RemoteBackend(endpoint)
    thief = RemoteBackend(endpoint)
    mine = Mirror(owner, BUF)
    mine.set(0, rng.standard_normal(BUF // 4).astype(np.float32))
    # the thief names the owner's buffer and address: unknown in its session
    stolen = mine.buf.tensor(GGMLType.F32, (16,))
    with pytest.raises(ServerClosed):
        thief.get_tensor(stolen)
    assert not thief.connected
    mine.check()
    assert wait_stats(server, {"sessions": 1, "buffers": 1, "buffer_bytes": BUF})["sessions"] == 1


# -- a client that vanishes in the middle of SET_TENSOR ------------------------------------

def raw_call(sock: socket.socket, cmd: int, payload: bytes, rsp: int | None) -> bytes | None:
    sock.sendall(protocol.HEADER.pack(cmd, len(payload)) + payload)
    if rsp is None:
        return None
    got = b""
    while len(got) < 8 + rsp:
        chunk = sock.recv(8 + rsp - len(got))
        assert chunk, "server closed the connection"
        got += chunk
    assert struct.unpack_from("<Q", got)[0] == rsp
    return got[8:]


@pytest.mark.parametrize("cut", ["in-header", "after-header", "mid-data"])
def test_disconnect_mid_set_tensor_frees_buffers(server, endpoint, seed, cut):
    rng = np.random.default_rng(seed)
    keeper = RemoteBackend(endpoint)
    kept = Mirror(keeper, BUF)
    kept.set(0, rng.standard_normal(BUF // 4).astype(np.float32))

    size = 1 << 20
    sock = socket.create_connection(("127.0.0.1", int(endpoint.rsplit(":", 1)[1])))
    assert raw_call(sock, Cmd.HELLO, bytes(24), 28)[:3] == bytes([7, 0, 0])
    handle, got_size = struct.unpack("<QQ", raw_call(sock, Cmd.ALLOC_BUFFER, struct.pack("<IQ", 0, size), 16))
    assert handle and got_size == size
    (base,) = struct.unpack("<Q", raw_call(sock, Cmd.BUFFER_GET_BASE, struct.pack("<Q", handle), 8))
    t = RpcTensor(id=1, type=GGMLType.I8, buffer=handle, ne=(size, 1, 1, 1),
                  nb=(1, size, size, size), data=base, name=b"big")
    header = protocol.encode_tensor(t) + struct.pack("<BQ", 0, 0)
    frame = protocol.HEADER.pack(Cmd.SET_TENSOR, len(header) + size)
    sent = {"in-header": frame + header[:100], "after-header": frame + header,
            "mid-data": frame + header + os.urandom(size // 3)}[cut]
    sock.sendall(sent)
    # the stalled session holds its buffer; the other client is served meanwhile
    assert wait_stats(server, {"sessions": 2, "buffers": 2, "buffer_bytes": BUF + size}) == \
        {"sessions": 2, "buffers": 2, "buffer_bytes": BUF + size}
    kept.set(BUF // 2, rng.standard_normal(1024).astype(np.float32))
    kept.check()
    sock.close()
    want = {"sessions": 1, "buffers": 1, "buffer_bytes": BUF}
    assert wait_stats(server, want) == want
    kept.check()
    keeper.close()


# -- lost connections and refused requests ------------------------------------------------

def test_reconnect_after_lost_connection(server, endpoint):
    rb = RemoteBackend(endpoint)
    old = rb.alloc_buffer(4096)
    rb.conn.sock.shutdown(socket.SHUT_RDWR)  # the link dies under the client
    with pytest.raises(ConnectionLost):
        rb.device_count()
    assert not rb.connected
    with pytest.raises(ConnectionLost, match="not connected"):
        rb.device_count()
    # the server noticed and freed what the lost session held
    assert wait_stats(server, {"sessions": 0, "buffers": 0, "buffer_bytes": 0})["buffers"] == 0
    rb.reconnect()
    assert rb.connected and rb.version == (7, 0, 0)
    assert rb.device_count() == 1
    buf = rb.alloc_buffer(4096)
    x = buf.tensor(GGMLType.F32, (1024,))
    rb.set_tensor(x, np.arange(1024, dtype=np.float32))
    np.testing.assert_array_equal(rb.get_array(x), np.arange(1024, dtype=np.float32))
    # handles of the lost session mean nothing to the new one
    with pytest.raises(ServerClosed):
        rb.get_tensor(old.tensor(GGMLType.F32, (4,)))
    rb.close()


def test_reconnect_to_a_restarted_server(codec_name, caplog):
    from ggmlrpc import protocol as proto
    devnull = open(os.devnull, "w")
    first = Server([CpuDevice(1)], "127.0.0.1", 0, codec=proto.codec(codec_name), out=devnull)
    first.start()
    port = first.port
    rb = RemoteBackend(f"127.0.0.1:{port}", timeout=10)
    rb.alloc_buffer(1024)
    first.close()  # ends the session under its blocked reader: no internal error
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    with pytest.raises(ConnectionLost):
        rb.device_count()
    second = Server([CpuDevice(1)], "127.0.0.1", port, codec=proto.codec(codec_name), out=devnull)
    second.start()
    try:
        rb.reconnect()
        assert rb.device_count() == 1
        assert second.stats() == {"sessions": 1, "buffers": 0, "buffer_bytes": 0}
        rb.close()
    finally:
        second.close()
        devnull.close()


def bad_requests(rb: RemoteBackend):
    """Requests our server (and llama.cpp's) answer by closing the connection."""
    buf = rb.alloc_buffer(4096)
    yield "tensor past its buffer", lambda: rb.get_tensor(buf.tensor(GGMLType.F32, (2048,)))
    buf = rb.alloc_buffer(4096)
    yield "invalid device", lambda: rb.alloc_buffer(16, device=7)
    buf = rb.alloc_buffer(4096)
    yield "recompute without a graph", lambda: (rb.graph_recompute(), rb.device_count())
    buf = rb.alloc_buffer(4096)
    yield "second HELLO", lambda: rb._call(Cmd.HELLO, bytes(24))
    buf = rb.alloc_buffer(4096)
    t = buf.tensor(GGMLType.F32, (1024,))
    yield "write past the tensor", lambda: (rb.set_tensor(t, np.zeros(16, np.float32), offset=4096 - 32),
                                            rb.device_count())
    del buf


def test_server_closed_on_bad_requests(server, endpoint):
    rb = RemoteBackend(endpoint)
    other = RemoteBackend(endpoint)
    keep = Mirror(other, 4096)
    keep.set(0, np.arange(1024, dtype=np.float32))
    for what, bad in bad_requests(rb):
        with pytest.raises(ServerClosed):
            bad()
        assert not rb.connected, what
        keep.check()
        rb.reconnect()
    rb.close()
    # every closed session took its buffers with it; the bystander kept its own
    want = {"sessions": 1, "buffers": 1, "buffer_bytes": 4096}
    assert wait_stats(server, want) == want


# -- timeouts -----------------------------------------------------------------------------

def test_timeout_on_silent_listener():
    """Something listens (the kernel completes the handshake) but never answers."""
    with socket.socket() as lst:
        lst.bind(("127.0.0.1", 0))
        lst.listen(4)
        port = lst.getsockname()[1]
        with pytest.raises(RpcTimeout):
            RemoteBackend(f"127.0.0.1:{port}", timeout=0.3)


def test_timeout_after_hello():
    """A server that does the handshake and then stops answering."""
    with socket.socket() as lst:
        lst.bind(("127.0.0.1", 0))
        lst.listen(1)
        port = lst.getsockname()[1]
        done = threading.Event()

        def serve():
            conn, _ = lst.accept()
            with conn:
                head = b""
                while len(head) < 9 + 24:
                    head += conn.recv(9 + 24 - len(head))
                conn.sendall(struct.pack("<Q", 28) + bytes([7, 0, 0, 0]) + bytes(24))
                done.wait(10)

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        rb = RemoteBackend(f"127.0.0.1:{port}", timeout=0.3)
        try:
            with pytest.raises(RpcTimeout):
                rb.device_count()
            assert not rb.connected
        finally:
            done.set()
            t.join(5)


def test_refused_connection():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConnectionLost, match="cannot connect"):
        RemoteBackend(f"127.0.0.1:{port}", timeout=2)
