"""RemoteBackend against llama.cpp's ggml-rpc-server, and the same assertions against ours.

Every test body runs twice through the `peer` fixture: once on the reference
server built from llama.cpp, once on our `ggml-rpc-server` command. Whatever the
reference does is the contract; our server must give the same answers.

The reference serves one client at a time, so each test holds at most one
connection to it and closes it before opening the next.
"""
from __future__ import annotations

import os
import re

import numpy as np
import pytest

from ggmlrpc import protocol
from ggmlrpc.client import RemoteBackend, op
from ggmlrpc.errors import ServerClosed
from ggmlrpc.ggml import GGMLOp, GGMLType

pytestmark = pytest.mark.interop

MiB = 1 << 20
SIZE_MAX = (1 << 64) - 1


@pytest.fixture(params=["reference", "ours"])
def peer(request, server_proc):
    """Factory starting the server under test; `.kind` says which one it is."""
    start = request.getfixturevalue("ref_server") if request.param == "reference" else server_proc

    def run(*args, env=None):
        p = start("-t", "1", *args, env=env)
        p.kind = request.param
        return p

    return run


def executor_supports(op_id: int) -> bool:
    """Whether our CPU executor has a kernel for `op_id` (the capability the graph
    tests flip on: where the executor lacks it, our server must refuse the graph).
    The executor's op table: compute.cpu_rules.RULES, or the older compute.cpu.KERNELS."""
    from ggmlrpc.compute import cpu

    table = getattr(cpu, "KERNELS", None)
    if table is None:
        from ggmlrpc.compute import cpu_rules
        table = cpu_rules.RULES
    return op_id in table


def place(t, buf, offset: int):
    """Give a graph result a home in a remote buffer (what ggml-alloc does)."""
    t.buffer = buf
    t.data = buf.base + offset
    return t


def test_handshake_and_device_queries(peer):
    p = peer()
    with RemoteBackend(p.endpoint) as rb:
        assert rb.version == (7, 0, 0)
        assert rb.server_caps == bytes(protocol.CONN_CAPS_SIZE)  # TCP only
        assert rb.device_count() == 1
        free, total = rb.get_device_memory(0)
        assert free == total == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        assert rb.get_alignment(0) == 32
        assert rb.get_max_size(0) == SIZE_MAX


def test_alloc_buffer_and_base(peer):
    p = peer()
    with RemoteBackend(p.endpoint) as rb:
        a = rb.alloc_buffer(MiB)
        b = rb.alloc_buffer(3000)
        assert a.handle and b.handle and a.handle != b.handle
        assert (a.size, b.size) == (MiB, 3000)
        assert a.base and b.base and a.base % 32 == 0 and b.base % 32 == 0
        assert a.base + a.size <= b.base or b.base + b.size <= a.base  # disjoint
        assert rb.buffer_get_base(a.handle) == a.base
        empty = rb.alloc_buffer(0)
        assert empty.handle and empty.size == 0 and empty.base == 0
        # an allocation no host can back answers remote_ptr 0 and keeps the connection
        assert rb.alloc_buffer(1 << 50) is None
        assert rb.device_count() == 1


def test_set_get_tensor_roundtrip(peer, seed):
    rng = np.random.default_rng(seed)
    p = peer()
    with RemoteBackend(p.endpoint) as rb:
        buf = rb.alloc_buffer(MiB)
        x = buf.tensor(GGMLType.F32, (256, 8), offset=4096, name="x")
        data = rng.standard_normal((8, 256), dtype=np.float32)
        rb.set_tensor(x, data)
        np.testing.assert_array_equal(rb.get_array(x), data)

        # a write at an offset into the tensor, read back through an offset
        patch = rng.standard_normal(100, dtype=np.float32)
        rb.set_tensor(x, patch, offset=4 * 300)
        expect = data.copy().reshape(-1)
        expect[300:400] = patch
        got = rb.get_tensor(x, offset=4 * 250, size=4 * 200)
        np.testing.assert_array_equal(np.frombuffer(got, np.float32), expect[250:450])

        # into a preallocated array, no intermediate buffer
        out = np.empty((8, 256), np.float32)
        assert rb.get_tensor(x, out=out) is out
        np.testing.assert_array_equal(out.reshape(-1), expect)

        # a quantized tensor travels as opaque bytes
        q = buf.tensor(GGMLType.Q8_0, (64, 5), offset=65536, name="q")
        raw = rng.integers(0, 256, q.nbytes, dtype=np.uint8)
        rb.set_tensor(q, raw)
        assert bytes(rb.get_tensor(q)) == raw.tobytes()


def test_copy_memset_clear(peer, seed):
    rng = np.random.default_rng(seed)
    p = peer()
    with RemoteBackend(p.endpoint) as rb:
        src_buf = rb.alloc_buffer(8192)
        dst_buf = rb.alloc_buffer(8192)
        src = src_buf.tensor(GGMLType.I32, (512,), offset=1024)
        dst = dst_buf.tensor(GGMLType.I32, (512,), offset=2048)
        values = rng.integers(-2**31, 2**31, 512, dtype=np.int32)
        rb.set_tensor(src, values)
        assert rb.copy_tensor(src, dst) is True
        np.testing.assert_array_equal(rb.get_array(dst), values)

        rb.memset_tensor(dst, 0xAB, offset=16, size=100)
        got = np.frombuffer(rb.get_tensor(dst), np.uint8)
        expect = values.view(np.uint8).copy()
        expect[16:116] = 0xAB
        np.testing.assert_array_equal(got, expect)

        dst_buf.clear(0x5A)
        whole = dst_buf.tensor(GGMLType.I8, (8192,))
        assert bytes(rb.get_tensor(whole)) == b"\x5a" * 8192
        np.testing.assert_array_equal(rb.get_array(src), values)  # other buffers untouched


def test_init_tensor_and_alloc_size(peer, seed):
    rng = np.random.default_rng(seed)
    p = peer()
    with RemoteBackend(p.endpoint) as rb:
        buf = rb.alloc_buffer(65536)
        # quantized, ne[0] % 512 != 0: the only tensors llama.cpp asks about
        q = buf.tensor(GGMLType.Q4_0, (160, 3), offset=512, name="q4")
        assert q.nbytes == 160 // 32 * 18 * 3
        assert rb.get_alloc_size(q) == q.nbytes
        k = buf.tensor(GGMLType.Q8_0, (96, 7), offset=4096, name="q8")
        assert rb.get_alloc_size(k) == k.nbytes
        # not placed yet: the device's default buffer type answers
        loose = op(GGMLOp.MUL_MAT, GGMLType.F32, (3, 7), q, k, name="mm")
        assert rb.get_alloc_size(loose) == loose.nbytes

        raw = rng.integers(0, 256, q.nbytes, dtype=np.uint8)
        rb.set_tensor(q, raw)
        rb.init_tensor(q)  # no answer; a CPU device leaves the bytes alone
        assert bytes(rb.get_tensor(q)) == raw.tobytes()


def test_free_buffer(peer):
    p = peer()
    with RemoteBackend(p.endpoint) as rb:
        keep = rb.alloc_buffer(4096)
        gone = rb.alloc_buffer(4096)
        gone.free()
        assert rb.buffer_get_base(keep.handle) == keep.base
        with pytest.raises(ServerClosed):  # the freed handle is unknown now
            rb.buffer_get_base(gone.handle)
        assert not rb.connected


@pytest.mark.parametrize("bad", ["unknown_buffer", "read_past_buffer", "recompute_without_graph"])
def test_bad_request_closes_connection_and_reconnect_works(peer, bad):
    p = peer()
    rb = RemoteBackend(p.endpoint)
    try:
        buf = rb.alloc_buffer(4096)
        with pytest.raises(ServerClosed):
            if bad == "unknown_buffer":
                rb.buffer_get_base(buf.handle ^ 0x10)
            elif bad == "read_past_buffer":
                t = buf.tensor(GGMLType.F32, (16,), offset=4096 - 64)
                rb.get_tensor(t, offset=0, size=128)
            else:
                rb.graph_recompute(0)
                rb.synchronize()
        assert not rb.connected
        rb.reconnect()
        assert rb.device_count() == 1
        fresh = rb.alloc_buffer(4096)  # the closed connection's buffers are gone, new ones work
        assert fresh is not None
    finally:
        rb.close()


@pytest.mark.parametrize("cache", [False, True], ids=["no-cache", "cache"])
def test_set_tensor_hash_and_cache(peer, tmp_path, seed, cache):
    """Weights above 10 MiB go hash first. With -c the server stores them under
    $LLAMA_CACHE/rpc and a later client's hash hits; without, nothing is stored."""
    rng = np.random.default_rng(seed)
    size = protocol.HASH_THRESHOLD + MiB
    data = rng.integers(0, 256, size, dtype=np.uint8)
    h = protocol.codec().fnv1a(data)
    cache_dir = tmp_path / "rpc"
    env = dict(os.environ, LLAMA_CACHE=str(tmp_path))
    p = peer(*(["-c"] if cache else []), env=env)

    with RemoteBackend(p.endpoint) as rb:
        buf = rb.alloc_buffer(size + 4096)
        t = buf.tensor(GGMLType.I8, (size,), offset=4096, name="w")
        assert rb.set_tensor_hash(t, h) is False  # nothing cached yet
        assert rb.set_tensor(t, data, weights=True) is False  # hash missed, bytes sent
        assert bytes(rb.get_tensor(t)) == data.tobytes()
    if cache:
        stored = cache_dir / f"{h:016x}"
        assert stored.read_bytes() == data.tobytes()
    else:
        assert not cache_dir.exists() or not any(cache_dir.iterdir())

    with RemoteBackend(p.endpoint) as rb:  # a second client, fresh buffers
        buf = rb.alloc_buffer(size)
        t = buf.tensor(GGMLType.I8, (size,), name="w")
        assert rb.set_tensor_hash(t, h) is cache
        if cache:  # the server filled the tensor from its file
            assert bytes(rb.get_tensor(t)) == data.tobytes()
        buf.clear(0)
        assert rb.set_tensor(t, data, weights=True) is cache
        assert bytes(rb.get_tensor(t)) == data.tobytes()


@pytest.mark.parametrize("op_id", [GGMLOp.ADD, GGMLOp.MUL], ids=["ADD", "MUL"])
def test_graph_compute_and_recompute(peer, seed, op_id):
    rng = np.random.default_rng(seed)
    ref = {GGMLOp.ADD: np.add, GGMLOp.MUL: np.multiply}[op_id]
    p = peer()
    # The reference always runs the graph; ours does once the executor has the op.
    # Until then our server must refuse it: close this connection, log the op, live on.
    computes = p.kind == "reference" or executor_supports(op_id)
    rb = RemoteBackend(p.endpoint)
    try:
        buf = rb.alloc_buffer(65536)
        a = buf.tensor(GGMLType.F32, (64, 4), offset=0, name="a")
        b = buf.tensor(GGMLType.F32, (64, 4), offset=1024, name="b")
        c = place(op(op_id, GGMLType.F32, (64, 4), a, b, name="c"), buf, 2048)
        xa = rng.standard_normal((4, 64), dtype=np.float32)
        xb = rng.standard_normal((4, 64), dtype=np.float32)
        rb.set_tensor(a, xa)
        rb.set_tensor(b, xb)
        rb.graph_compute([c])
        if not computes:
            with pytest.raises(ServerClosed):
                rb.synchronize()
            rb.reconnect()
            assert rb.device_count() == 1  # the server lives on
            rb.close()
            _, err = p.stop()
            name = GGMLOp(op_id).name
            assert re.search(rf"\b{name}\b.*not supported", err), err[-2000:]
            return
        np.testing.assert_array_equal(rb.get_array(c), ref(xa, xb))
        # new input, same graph: GRAPH_RECOMPUTE reruns the kept graph
        xa2 = rng.standard_normal((4, 64), dtype=np.float32)
        rb.set_tensor(a, xa2)
        rb.graph_recompute(0)
        np.testing.assert_array_equal(rb.get_array(c), ref(xa2, xb))
        # freeing any buffer drops the kept graph: recompute now closes the connection
        rb.alloc_buffer(64).free()
        rb.graph_recompute(0)
        with pytest.raises(ServerClosed):
            rb.synchronize()
    finally:
        rb.close()


def test_issue_step_is_the_three_requests(peer, seed):
    """issue_step (headers encoded once) sends the bytes set_tensor,
    graph_compute_serialized and request_tensor send, corked commands first; the
    server computes the same, with GRAPH_COMPUTE the first time and GRAPH_RECOMPUTE
    after."""
    from ggmlrpc.client import serialize_graph

    rng = np.random.default_rng(seed)
    p = peer()
    rb = RemoteBackend(p.endpoint)
    try:
        buf = rb.alloc_buffer(65536)
        span = buf.tensor(GGMLType.I8, (2048,), offset=0, name="inputs")
        a = buf.tensor(GGMLType.F32, (64, 4), offset=0, name="a")
        b = buf.tensor(GGMLType.F32, (64, 4), offset=1024, name="b")
        c = place(op(GGMLOp.ADD, GGMLType.F32, (64, 4), a, b, name="c"), buf, 4096)
        wire = serialize_graph(0, [c])
        req = rb.step_requests(span, wire, c, 0)
        sent = []
        real = rb.conn.send
        rb.conn.send = lambda *parts: (sent.append(b"".join(bytes(x) for x in parts)), real(*parts))[1]
        image = np.zeros(2048, np.uint8)
        out = bytearray(c.nbytes)
        for again in (False, True, True):
            xa, xb = (rng.standard_normal((4, 64), dtype=np.float32) for _ in range(2))
            image[:1024], image[1024:] = xa.view(np.uint8).reshape(-1), xb.view(np.uint8).reshape(-1)
            with rb.corked():
                rb.memset_tensor(c, 0)          # corked: goes first, in the same write
                wait = rb.issue_step(req, image, again, out)
            assert wait() is out
            np.testing.assert_array_equal(np.frombuffer(out, np.float32).reshape(4, 64), xa + xb)
        step = sent[-1]
        # the same write through the one-by-one calls
        sent.clear()
        with rb.corked():
            rb.memset_tensor(c, 0)
            rb.set_tensor(span, image)
            rb.graph_recompute(0)
            rb.request_tensor(c, out=out)()
        assert sent == [step]
        sent.clear()
        rb.graph_compute_serialized(wire)
        rb.synchronize()
        assert sent[0].startswith(req.compute)
    finally:
        rb.close()
