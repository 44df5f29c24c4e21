"""Fuzzing a live server with random and mutated frames (hypothesis, bounded).

Each example opens a connection, says HELLO, sends its frames and half-closes; the
server must then answer or close within a timeout (never hang), log no internal
error, free everything the connection held, and keep serving a second client whose
buffer and bytes survive every example.
"""
from __future__ import annotations

import socket
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.protocol.rawclient import (
    ALLOC_BUFFER, BUFFER_CLEAR, BUFFER_GET_BASE, COPY_TENSOR, DEVICE_COUNT, F32, FLAG_COMPUTE,
    FREE_BUFFER, GET_ALIGNMENT, GET_ALLOC_SIZE, GET_DEVICE_MEMORY, GET_MAX_SIZE, GET_TENSOR,
    GRAPH_COMPUTE, GRAPH_RECOMPUTE, HELLO, HELLO_ANSWER, INIT_TENSOR, MEMSET_TENSOR, OP_ADD,
    OP_VIEW, Q4_0, SET_TENSOR, SET_TENSOR_HASH, Raw, Watch, frame, graph, tensor, u32, u64)

FUZZ_BUFFER = 4096
FUZZ = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                  HealthCheck.too_slow])


class Fuzzer(Watch):
    def connect(self, alloc: bool = False) -> tuple[Raw, int, int]:
        self.caplog.clear()
        raw = Raw(self.server.port)
        assert raw.hello() == HELLO_ANSWER
        handle, base = raw.alloc(FUZZ_BUFFER) if alloc else (0, 0)
        return raw, handle, base

    def finish(self, raw: Raw, payload: bytes) -> None:
        """Send, half-close, and read until the server closes; then check the aftermath."""
        try:
            raw.send(payload)
            raw.sock.shutdown(socket.SHUT_WR)
            raw.sock.settimeout(10)
            while raw.sock.recv(1 << 16):
                pass
        except socket.timeout:
            raise AssertionError("the server neither answered nor closed") from None
        except OSError:
            pass  # the server closed first (EPIPE, ECONNRESET, ENOTCONN)
        finally:
            raw.close()
        self.aftermath()


@pytest.fixture
def fuzzer(server, caplog):
    f = Fuzzer(server, caplog)
    yield f
    f.bystander.close()


# -- random frames ---------------------------------------------------------------------

U64_EDGES = st.sampled_from([0, 1, 8, 296, 305, 312, 3260, (1 << 32) - 1, 1 << 32, 1 << 40,
                             (1 << 63) - 1, 1 << 63, (1 << 64) - 1])


@st.composite
def random_frame(draw):
    cmd = draw(st.one_of(st.integers(0, 17), st.integers(0, 255)))
    payload = draw(st.binary(max_size=700))
    size = draw(st.one_of(st.just(len(payload)), st.integers(0, len(payload) + 16), U64_EDGES))
    return frame(cmd, payload, size=size)


@settings(max_examples=60, **FUZZ)
@given(frames=st.lists(random_frame(), min_size=1, max_size=3))
def test_random_frames(fuzzer, frames):
    raw, _, _ = fuzzer.connect()
    fuzzer.finish(raw, b"".join(frames))


# -- mutated valid frames ----------------------------------------------------------------

def valid_requests(handle: int, base: int) -> dict[str, bytes]:
    """One well-formed request per command, on a 4 KiB buffer at `base`."""
    a = tensor(id=1, type=F32, buffer=handle, ne=(16, 2), data=base, name=b"a")
    b = tensor(id=2, type=F32, buffer=handle, ne=(16, 2), data=base + 128, name=b"b")
    q = tensor(id=3, type=Q4_0, buffer=handle, ne=(64, 2), data=base + 1024, name=b"q")
    add = tensor(id=4, type=F32, buffer=handle, ne=(16, 2), data=base + 256, op=OP_ADD,
                 src=(1, 2), flags=FLAG_COMPUTE, name=b"add")
    view = tensor(id=5, type=F32, buffer=handle, ne=(8, 2), nb=(4, 64, 128, 128), data=base + 4,
                  op=OP_VIEW, src=(1,), view_src=1, view_offs=4, name=b"view")
    return {
        "alloc": frame(ALLOC_BUFFER, u32(0) + u64(256)),
        "alignment": frame(GET_ALIGNMENT, u32(0)),
        "max_size": frame(GET_MAX_SIZE, u32(0)),
        "base": frame(BUFFER_GET_BASE, u64(handle)),
        "free": frame(FREE_BUFFER, u64(handle)),
        "clear": frame(BUFFER_CLEAR, u64(handle) + b"\x3c"),
        "set": frame(SET_TENSOR, a + b"\0" + u64(16) + bytes(range(100))),
        "set_q": frame(SET_TENSOR, q + b"\0" + u64(0) + bytes(72)),
        "set_hash": frame(SET_TENSOR_HASH, a + u64(0) + u64(0x0123456789ABCDEF)),
        "get": frame(GET_TENSOR, b + u64(4) + u64(64)),
        "copy": frame(COPY_TENSOR, a + b),
        "graph_view": frame(GRAPH_COMPUTE, graph(0, [5], [a, view])),
        "graph_add": frame(GRAPH_COMPUTE, graph(0, [4], [a, b, add])),
        "memory": frame(GET_DEVICE_MEMORY, u32(0)),
        "init": frame(INIT_TENSOR, q),
        "alloc_size": frame(GET_ALLOC_SIZE, u32(0) + add + a + b + bytes(296 * 8)),
        "hello": frame(HELLO, bytes(24)),
        "device_count": frame(DEVICE_COUNT),
        "recompute": frame(GRAPH_RECOMPUTE, u32(0)),
        "memset": frame(MEMSET_TENSOR, b + u64(8) + u64(32) + b"\x5e"),
    }


@st.composite
def mutation(draw, req: bytes) -> bytes:
    """Flip, insert or delete bytes, or patch the size field or a payload integer."""
    out = bytearray(req)
    for _ in range(draw(st.integers(1, 3))):
        # in-place changes reach the deeper checks; length changes mostly hit framing
        kind = draw(st.sampled_from(["flip", "flip", "field32", "field64", "field64",
                                     "insert", "delete", "size"]))
        n = len(out)
        if kind == "flip" and n:
            i = draw(st.integers(0, n - 1))
            out[i] ^= draw(st.integers(1, 255))
        elif kind == "insert":
            i = draw(st.integers(0, n))
            out[i:i] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete" and n > 1:
            i = draw(st.integers(0, n - 1))
            del out[i:i + draw(st.integers(1, 16))]
        elif kind == "size" and n >= 9:
            size = struct.unpack_from("<Q", out, 1)[0]
            new = draw(st.one_of(st.integers(max(0, size - 8), min(size + 8, (1 << 64) - 1)), U64_EDGES))
            struct.pack_into("<Q", out, 1, new)
        elif kind in ("field32", "field64") and n > 17:
            w = 4 if kind == "field32" else 8
            i = draw(st.integers(9, n - w))
            v = draw(st.one_of(U64_EDGES, st.integers(0, (1 << 64) - 1))) & ((1 << (8 * w)) - 1)
            out[i:i + w] = v.to_bytes(w, "little")
    return bytes(out)


@settings(max_examples=90, **FUZZ)
@given(data=st.data())
def test_mutated_frames(fuzzer, data):
    raw, handle, base = fuzzer.connect(alloc=True)
    reqs = valid_requests(handle, base)
    names = data.draw(st.lists(st.sampled_from(sorted(reqs)), min_size=1, max_size=3), label="requests")
    victim = data.draw(st.integers(0, len(names) - 1), label="mutated")
    frames = [data.draw(mutation(reqs[n]), label=f"mutated {n}") if i == victim else reqs[n]
              for i, n in enumerate(names)]
    fuzzer.finish(raw, b"".join(frames))


def test_valid_requests_are_valid(fuzzer):
    """The seeds of the mutations are themselves accepted: each is answered (or not) and
    the connection stays open."""
    raw, handle, base = fuzzer.connect(alloc=True)
    for name, req in valid_requests(handle, base).items():
        if name in ("hello", "free", "recompute", "graph_add"):
            continue  # these end the connection or depend on kernels / a kept graph
        raw.send(req)
        if name in ("set", "set_q", "clear", "init", "memset", "graph_view"):
            raw.expect_no_response()
        else:
            (n,) = struct.unpack("<Q", raw.recv_exact(8))
            raw.recv_exact(n)
    raw.send(valid_requests(handle, base)["recompute"])
    raw.expect_no_response()
    fuzzer.finish(raw, valid_requests(handle, base)["free"])
