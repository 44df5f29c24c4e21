"""Raw-socket helpers for the protocol tests: frames built by hand with struct.

Nothing here uses ggmlrpc's encoders, so the tests check our server against the
byte layouts of docs/protocol.md rather than against our own codec.

    request  : | cmd u8 | size u64 | payload |
    response : | size u64 | payload |
"""
from __future__ import annotations

import logging
import os
import socket
import struct
import time

# command ids (docs/protocol.md "Commands")
ALLOC_BUFFER, GET_ALIGNMENT, GET_MAX_SIZE, BUFFER_GET_BASE, FREE_BUFFER, BUFFER_CLEAR = range(6)
SET_TENSOR, SET_TENSOR_HASH, GET_TENSOR, COPY_TENSOR, GRAPH_COMPUTE, GET_DEVICE_MEMORY = range(6, 12)
INIT_TENSOR, GET_ALLOC_SIZE, HELLO, DEVICE_COUNT, GRAPH_RECOMPUTE, MEMSET_TENSOR = range(12, 18)

F32, F16, Q4_0 = 0, 1, 2
OP_NONE, OP_DUP, OP_ADD, OP_VIEW = 0, 1, 2, 37
FLAG_COMPUTE = 16

HELLO_ANSWER = struct.pack("<Q", 28) + bytes([7, 0, 0, 0]) + bytes(24)
DEVICE_COUNT_ANSWER = struct.pack("<QI", 4, 1)  # one device


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def frame(cmd: int, payload: bytes = b"", size: int | None = None) -> bytes:
    """| cmd u8 | size u64 | payload |; `size` overrides the length field."""
    return struct.pack("<B", cmd) + struct.pack("<Q", len(payload) if size is None else size) + payload


def tensor(id: int = 1, type: int = F32, buffer: int = 0, ne=(1, 1, 1, 1), nb=None, op: int = OP_NONE,
           op_params=(), flags: int = 0, src=(), view_src: int = 0, view_offs: int = 0,
           data: int = 0, name: bytes = b"", use_count: int = 0) -> bytes:
    """One rpc_tensor (296 bytes), field by field at the offsets of docs/protocol.md."""
    ne = tuple(ne) + (1,) * (4 - len(ne))
    if nb is None:  # contiguous F32/F16 (block size 1) or Q4_0 (32 elements in 18 bytes)
        row = {F32: 4 * ne[0], F16: 2 * ne[0], Q4_0: 18 * (ne[0] // 32)}[type]
        nb = ({F32: 4, F16: 2, Q4_0: 18}[type], row, row * ne[1], row * ne[1] * ne[2])
    out = (struct.pack("<Q", id) + struct.pack("<I", type) + struct.pack("<Q", buffer)
           + struct.pack("<4I", *ne) + struct.pack("<4I", *nb) + struct.pack("<I", op)
           + struct.pack("<16i", *(tuple(op_params) + (0,) * (16 - len(op_params))))
           + struct.pack("<i", flags)
           + struct.pack("<10Q", *(tuple(src) + (0,) * (10 - len(src))))
           + struct.pack("<Q", view_src) + struct.pack("<Q", view_offs) + struct.pack("<Q", data)
           + name[:63].ljust(64, b"\0") + struct.pack("<i", use_count))
    assert len(out) == 296
    return out


def graph(device: int, node_ids, tensors: list[bytes]) -> bytes:
    """| device u32 | n_nodes u32 | node_ids u64[] | n_tensors u32 | rpc_tensor[] |"""
    return (struct.pack("<II", device, len(node_ids)) + struct.pack(f"<{len(node_ids)}Q", *node_ids)
            + struct.pack("<I", len(tensors)) + b"".join(tensors))


def fnv1a(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


class Raw:
    """A TCP connection to a server that speaks raw bytes. Reads time out (a hang fails)."""

    def __init__(self, port: int, timeout: float = 10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_exact(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError(f"closed after {len(out)} of {n} bytes")
            out += chunk
        return bytes(out)

    def call(self, cmd: int, payload: bytes = b"", rsp_size: int | None = None) -> bytes:
        """Send one request; return the whole response, size prefix included. The prefix
        must announce rsp_size bytes when given."""
        self.send(frame(cmd, payload))
        head = self.recv_exact(8)
        (n,) = struct.unpack("<Q", head)
        if rsp_size is not None:
            assert n == rsp_size, f"command {cmd}: response of {n} bytes, expected {rsp_size}"
        return head + self.recv_exact(n)

    def hello(self) -> bytes:
        return self.call(HELLO, bytes(24))

    def expect_no_response(self) -> None:
        """Prove the previous command answered nothing: the next bytes on the socket are
        exactly DEVICE_COUNT's answer."""
        assert self.call(DEVICE_COUNT) == DEVICE_COUNT_ANSWER

    def expect_closed(self, timeout: float = 10.0) -> None:
        """The server closes the connection without sending anything."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 16)
        except ConnectionResetError:
            return
        except socket.timeout:
            raise AssertionError("the server kept the connection open") from None
        assert data == b"", f"unexpected bytes from the server: {data[:32].hex()}"

    # -- typed shortcuts (layouts by hand) ---------------------------------------
    def alloc(self, size: int, device: int = 0) -> tuple[int, int]:
        """ALLOC_BUFFER then BUFFER_GET_BASE: (handle, base)."""
        rsp = self.call(ALLOC_BUFFER, struct.pack("<IQ", device, size), 16)
        handle, remote_size = struct.unpack("<QQ", rsp[8:])
        assert handle != 0 and remote_size == size
        rsp = self.call(BUFFER_GET_BASE, struct.pack("<Q", handle), 8)
        return handle, struct.unpack("<Q", rsp[8:])[0]

    def set_tensor(self, t: bytes, data: bytes, offset: int = 0) -> None:
        self.send(frame(SET_TENSOR, t + b"\0" + struct.pack("<Q", offset) + data))

    def get_tensor(self, t: bytes, offset: int, size: int) -> bytes:
        return self.call(GET_TENSOR, t + struct.pack("<QQ", offset, size), size)[8:]


class Bystander:
    """A well-behaved client: one buffer with known bytes, checked after someone else
    misbehaved on the same server."""

    SIZE = 4096

    def __init__(self, port: int):
        self.raw = Raw(port)
        assert self.raw.hello() == HELLO_ANSWER
        self.handle, self.base = self.raw.alloc(self.SIZE)
        self.data = os.urandom(self.SIZE)
        self.raw.set_tensor(self.whole(), self.data)

    def whole(self) -> bytes:
        return tensor(id=7, type=F32, buffer=self.handle, ne=(self.SIZE // 4,), data=self.base,
                      name=b"bystander")

    def check(self) -> None:
        """Its bytes are intact, and a fresh write/read round trip works."""
        assert self.raw.get_tensor(self.whole(), 0, self.SIZE) == self.data
        fresh = os.urandom(256)
        self.raw.set_tensor(self.whole(), fresh, offset=1024)
        self.data = self.data[:1024] + fresh + self.data[1280:]
        assert self.raw.get_tensor(self.whole(), 1000, 300) == self.data[1000:1300]

    def close(self) -> None:
        self.raw.close()


def wait_for(pred, timeout: float = 10.0, what: str = "condition"):
    """Poll pred() until it returns something truthy (session threads end asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def wait_stats(server, timeout: float = 10.0, **want) -> dict:
    """Wait until server.stats() shows the wanted sessions/buffers/buffer_bytes."""
    last = {}

    def ok():
        last.update(server.stats())
        return all(last[k] == v for k, v in want.items())

    try:
        wait_for(ok, timeout)
    except AssertionError:
        raise AssertionError(f"server stats {last}, wanted {want}") from None
    return last


def logged(caplog, text: str, level: int = logging.ERROR, timeout: float = 10.0):
    """Wait for a record from ggmlrpc.server at `level` or above that mentions `text`."""
    def find():
        return [r for r in list(caplog.records)
                if r.name.startswith("ggmlrpc.server") and r.levelno >= level
                and text.lower() in r.getMessage().lower()]
    try:
        return wait_for(find, timeout)
    except AssertionError:
        msgs = [r.getMessage() for r in caplog.records]
        raise AssertionError(f"no log record mentioning {text!r}; got {msgs}") from None


class Watch:
    """A server under attack: a bystander client on it, and its log records.

    aftermath() checks what every misbehaving connection must leave behind once it is
    gone: only the bystander's session and buffer, no internal error logged, and the
    bystander's bytes intact with a working connection."""

    def __init__(self, server, caplog):
        self.server = server
        self.caplog = caplog
        caplog.set_level(logging.INFO, logger="ggmlrpc")
        self.bystander = Bystander(server.port)
        wait_stats(server, sessions=1, buffers=1)

    def aftermath(self) -> None:
        wait_stats(self.server, sessions=1, buffers=1, buffer_bytes=Bystander.SIZE)
        internal = [r.getMessage() for r in self.caplog.records
                    if r.levelno >= logging.ERROR and "internal error" in r.getMessage()]
        assert not internal, internal
        self.bystander.check()
