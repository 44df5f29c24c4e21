"""Client deadlines: RemoteBackend(timeout=T) bounds a whole request and its response,
not each wait, so a server that trickles its answer (or reads our request a byte at
a time) cannot hold a client for longer than T.

The servers here are fakes over loopback that answer correctly, only slowly.
"""
from __future__ import annotations

import socket
import struct
import threading
import time

import numpy as np
import pytest

from ggmlrpc import transport
from ggmlrpc.client import RemoteBackend, RemoteBuffer
from ggmlrpc.errors import RpcTimeout
from ggmlrpc.ggml import GGMLType
from tests.conftest import start_server

HELLO, GET_TENSOR, DEVICE_COUNT = 14, 8, 15
DRIP = 0.2       # seconds between two bytes of a slow answer
TIMEOUT = 1.0    # the client's timeout
BOUND = 4.0      # a generous bound for "returned about when the timeout said"


@pytest.fixture(params=["native", "python"])
def io_path(request, monkeypatch):
    """Run the client on the native socket loops and on the pure-Python ones."""
    if request.param == "python":
        monkeypatch.setattr(transport, "_wire", None)
    return request.param


class SlowServer:
    """Answers HELLO, DEVICE_COUNT and GET_TENSOR; the commands in `drip` are answered
    one byte every DRIP seconds; with `read_slowly`, requests are read 16 bytes at a
    time, as slowly."""

    def __init__(self, drip=(), read_slowly=False):
        self.drip = set(drip)
        self.read_slowly = read_slowly
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stop = threading.Event()
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def recv(self, c: socket.socket, n: int) -> bytes:
        out = b""
        while len(out) < n and not self.stop.is_set():
            chunk = c.recv(min(n - len(out), 16 if self.read_slowly else 1 << 20))
            if not chunk:
                raise ConnectionError
            out += chunk
            if self.read_slowly:
                time.sleep(DRIP)
        return out

    def serve(self) -> None:
        try:
            c, _ = self.listener.accept()
        except OSError:
            return
        self.conns.append(c)
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            while not self.stop.is_set():
                cmd, size = struct.unpack("<BQ", self.recv(c, 9))
                payload = self.recv(c, size)
                if cmd == HELLO:
                    rsp = bytes([7, 0, 0, 0]) + bytes(24)
                elif cmd == DEVICE_COUNT:
                    rsp = struct.pack("<I", 1)
                elif cmd == GET_TENSOR:
                    rsp = bytes(struct.unpack_from("<Q", payload, 296 + 8)[0])
                else:
                    continue
                msg = struct.pack("<Q", len(rsp)) + rsp
                if cmd not in self.drip:
                    c.sendall(msg)
                    continue
                for i in range(len(msg)):
                    if self.stop.wait(DRIP):
                        return
                    c.sendall(msg[i:i + 1])
        except OSError:
            pass

    def close(self) -> None:
        self.stop.set()
        self.listener.close()
        for c in self.conns:
            c.close()
        self.thread.join(10)


@pytest.fixture
def slow():
    servers = []

    def make(**kw):
        s = SlowServer(**kw)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()


def timed(fn):
    t0 = time.monotonic()
    with pytest.raises(RpcTimeout):
        fn()
    return time.monotonic() - t0


def test_dripped_hello(slow, io_path):
    """36 bytes at DRIP each would take 7 s; the client gives up after its timeout."""
    s = slow(drip={HELLO})
    assert timed(lambda: RemoteBackend(s.endpoint, timeout=TIMEOUT)) < BOUND


def test_dripped_get_tensor(slow, io_path):
    s = slow(drip={GET_TENSOR})
    rb = RemoteBackend(s.endpoint, timeout=TIMEOUT)
    assert rb.device_count() == 1                 # a prompt answer is unaffected
    buf = RemoteBuffer(rb, 0x10, 64, 0x1000, 0)
    t = buf.tensor(GGMLType.I8, (64,))
    assert timed(lambda: rb.get_tensor(t)) < BOUND
    assert not rb.connected                       # the stream is out of step: closed
    rb.close()


def test_slowly_read_request(slow, io_path):
    """A server that reads 16 bytes every DRIP: a 16 MiB write cannot go through in
    time, and the client does not wait for it."""
    s = slow(read_slowly=True)
    rb = RemoteBackend(s.endpoint, timeout=30)    # HELLO is read slowly too: 33 bytes
    rb.timeout = TIMEOUT
    buf = RemoteBuffer(rb, 0x10, 16 << 20, 0x1000, 0)
    t = buf.tensor(GGMLType.I8, (16 << 20,))
    data = np.zeros(16 << 20, np.uint8)
    assert timed(lambda: rb.set_tensor(t, data)) < BOUND
    rb.close()


def test_each_request_gets_its_own_deadline(io_path):
    """The deadline is per request: a client that keeps working far longer than its
    timeout in total is never cut off."""
    srv = start_server("native")
    try:
        with RemoteBackend(f"127.0.0.1:{srv.port}", timeout=0.5) as rb:
            t0 = time.monotonic()
            while time.monotonic() - t0 < 1.5:
                assert rb.device_count() == 1
                time.sleep(0.05)
    finally:
        srv.close()
