"""Op tests: graphs built with ggmlrpc.client, run by our server's CPU executor,
checked against NumPy (and gguf-py for quantized weights).

`ctx` gives a fresh connection and one server buffer: inputs and results are
placed in it as they are created (like ggml-alloc would), views point into it,
`ctx.compute()` sends the graph of every node made so far and `ctx.read(t)`
returns a result as a NumPy array (numpy order: ne reversed, strides honoured).
Errors are judged like ggml's test-backend-ops: normalized mean squared error.
"""
from __future__ import annotations

import contextlib
import os
import struct

import numpy as np
import pytest

from ggmlrpc import ggml, protocol
from ggmlrpc.client import RemoteBackend, Tensor, op as make_op
from ggmlrpc.devices.cpu import CpuDevice
from ggmlrpc.errors import ServerClosed
from ggmlrpc.ggml import GGMLOp, GGMLType as T
from ggmlrpc.server import Server
from tests.conftest import nmse

N_THREADS = 3   # more threads than this host's cores, and splits that do not divide evenly

NP_TYPES = {T.F32: np.float32, T.F16: np.float16, T.I32: np.int32, T.I64: np.int64,
            T.I8: np.int8, T.I16: np.int16, T.F64: np.float64}


def f32_bits(x: float) -> int:
    """A float op param as the int32 ggml stores."""
    return struct.unpack("<i", struct.pack("<f", x))[0]


def assert_close(ours, ref, max_nmse=1e-7):
    ours = np.asarray(ours)
    ref = np.asarray(ref)
    assert ours.size == ref.size, (ours.shape, ref.shape)
    ref = ref.reshape(ours.shape)   # read() gives all four dims
    fo, fr = np.isfinite(ours), np.isfinite(ref)
    np.testing.assert_array_equal(fo, fr, err_msg="non-finite entries differ")
    np.testing.assert_array_equal(ours[~fo], ref[~fr])
    err = nmse(ours[fo], ref[fr])
    assert err <= max_nmse, f"NMSE {err:.3g} > {max_nmse:g}"


def to_bf16(x) -> np.ndarray:
    """float32 -> bfloat16 bits, round to nearest even (ggml's conversion)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(h) -> np.ndarray:
    return (np.asarray(h, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def encode(t: int, x) -> bytes:
    """Host bytes of a (contiguous) tensor of type t from a NumPy array."""
    if t == T.BF16:
        return to_bf16(x).tobytes()
    if t in NP_TYPES:
        return np.ascontiguousarray(x, dtype=NP_TYPES[t]).tobytes()
    from gguf import quants as gq
    return gq.quantize(np.asarray(x, dtype=np.float32), t).tobytes()


class Ctx:
    """One connection and one buffer in which a test builds and runs its graph."""

    def __init__(self, endpoint: str, size: int = 32 << 20):
        self.rb = RemoteBackend(endpoint)
        self.buf = self.rb.alloc_buffer(size)
        self.off = 0
        self.nodes: list[Tensor] = []

    def close(self):
        self.rb.close()

    def _place(self, t: Tensor) -> Tensor:
        self.off = (self.off + 31) // 32 * 32
        if self.off + t.nbytes > self.buf.size:
            raise MemoryError("test buffer full")
        t.buffer = self.buf
        t.data = self.buf.base + self.off
        self.off += t.nbytes
        return t

    def new(self, type: int, ne, data=None, name: str = "") -> Tensor:
        """A contiguous tensor in the buffer, filled with `data` (NumPy, ne reversed)."""
        t = self._place(Tensor(type, ne, name=name or f"in{self.off}"))
        if data is not None:
            self.rb.set_tensor(t, encode(type, data))
        return t

    def op(self, opcode: int, type: int, ne, *src, params=(), name: str = "") -> Tensor:
        """A compute node whose result is placed (contiguous) in the buffer."""
        t = self._place(make_op(opcode, type, ne, *src, params=params, name=name or ggml.op_name(opcode)))
        self.nodes.append(t)
        return t

    def view(self, t: Tensor, ne, nb=None, offset: int = 0) -> Tensor:
        return t.view(ne, nb, offset)

    def permute(self, t: Tensor, a0: int, a1: int, a2: int, a3: int) -> Tensor:
        """ggml_permute: dimension i of t becomes dimension a_i of the result."""
        axes = (a0, a1, a2, a3)
        ne = [0] * 4
        nb = [0] * 4
        for i, a in enumerate(axes):
            ne[a] = t.ne[i]
            nb[a] = t.nb[i]
        return Tensor(t.type, ne, nb=nb, op=GGMLOp.PERMUTE, src=[t], op_params=axes,
                      view_src=t, buffer=t.buffer, data=t.data, name=f"{t.name} (permuted)")

    def transpose(self, t: Tensor) -> Tensor:
        return self.permute(t, 1, 0, 2, 3)

    def compute(self, *nodes: Tensor):
        self.rb.graph_compute(list(nodes) or self.nodes)
        self.rb.synchronize()

    def recompute(self):
        self.rb.graph_recompute()
        self.rb.synchronize()

    def read(self, t: Tensor) -> np.ndarray:
        """t's elements as NumPy (shape ne reversed), read through t's strides."""
        raw = bytes(self.rb.get_tensor(t))
        dt = np.uint16 if t.type == T.BF16 else NP_TYPES[t.type]
        pad = bytes(-len(raw) % np.dtype(dt).itemsize)
        arr = np.lib.stride_tricks.as_strided(np.frombuffer(raw + pad, dtype=dt),
                                              shape=t.ne[::-1], strides=t.nb[::-1])
        arr = np.array(arr)
        return from_bf16(arr) if t.type == T.BF16 else arr

    def write(self, t: Tensor, data):
        self.rb.set_tensor(t, encode(t.type, data))


@contextlib.contextmanager
def rejected(server, caplog, *expect: str):
    """A fresh Ctx for the with-block to build a graph in; on leaving, the graph is
    sent and the server must close the connection with a log line holding every
    `expect` string (a run-time error or a rejected graph)."""
    c = Ctx(f"127.0.0.1:{server.port}")
    try:
        yield c
        c.rb.graph_compute(c.nodes)
        closed(c, caplog, *expect)
    finally:
        c.close()


def closed(c, caplog, *expect: str):
    """The server closes c's connection (seen at the next synchronize) with a log
    line holding every `expect` string."""
    with pytest.raises(ServerClosed):
        c.rb.synchronize()
    for e in expect:
        assert e in caplog.text


@pytest.fixture(scope="module")
def server():
    """Our server with one CPU device of N_THREADS executor threads (native codec)."""
    srv = Server([CpuDevice(N_THREADS)], "127.0.0.1", 0, codec=protocol.codec("native"),
                 out=open(os.devnull, "w"))
    srv.start()
    yield srv
    srv.close()


@pytest.fixture
def ctx(server):
    c = Ctx(f"127.0.0.1:{server.port}")
    yield c
    c.close()


@pytest.fixture
def rng(seed):
    return np.random.default_rng(seed)
