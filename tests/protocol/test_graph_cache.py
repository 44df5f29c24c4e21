"""Our server keeps the graphs a connection computed (compiled, by their payload)
so that one sent again byte for byte is not checked and compiled again: the graphs
of a connection that alternates between them still compute their new inputs, and
once a buffer is freed a graph naming it is checked again and refused."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlrpc.client import RemoteBackend, op
from ggmlrpc.errors import ServerClosed
from ggmlrpc.ggml import GGMLOp, GGMLType
from tests.interop.test_client_vs_reference import place


def test_alternating_graphs_and_a_freed_buffer(endpoint, seed):
    rng = np.random.default_rng(seed)
    with RemoteBackend(endpoint) as rb:
        buf = rb.alloc_buffer(65536)
        a = buf.tensor(GGMLType.F32, (64, 4), offset=0, name="a")
        b = buf.tensor(GGMLType.F32, (64, 4), offset=1024, name="b")
        s = place(op(GGMLOp.ADD, GGMLType.F32, (64, 4), a, b, name="s"), buf, 2048)
        p = place(op(GGMLOp.MUL, GGMLType.F32, (64, 4), a, b, name="p"), buf, 3072)
        for _ in range(3):
            xa, xb = (rng.standard_normal((4, 64), dtype=np.float32) for _ in range(2))
            rb.set_tensor(a, xa)
            rb.set_tensor(b, xb)
            rb.graph_compute([s])
            rb.graph_compute([p])
            np.testing.assert_array_equal(rb.get_array(s), xa + xb)
            np.testing.assert_array_equal(rb.get_array(p), xa * xb)
            rb.graph_recompute(0)           # the last graph computed is the one kept
            np.testing.assert_array_equal(rb.get_array(p), xa * xb)
        buf.free()
        rb.alloc_buffer(65536)
        rb.graph_compute([s])               # the same bytes, naming the freed buffer
        with pytest.raises(ServerClosed):
            rb.synchronize()


def test_a_graph_sent_again_logs_as_llama_cpp_does(server, endpoint, capfd):
    """GGML_RPC_DEBUG prints llama.cpp's line for every GRAPH_COMPUTE, compiled
    again or not: device, nodes and tensors of the payload."""
    server.debug = True
    try:
        with RemoteBackend(endpoint) as rb:
            buf = rb.alloc_buffer(65536)
            a = buf.tensor(GGMLType.F32, (64, 4), offset=0, name="a")
            b = buf.tensor(GGMLType.F32, (64, 4), offset=1024, name="b")
            s = place(op(GGMLOp.ADD, GGMLType.F32, (64, 4), a, b, name="s"), buf, 2048)
            for _ in range(2):
                rb.graph_compute([s])
            rb.synchronize()
    finally:
        server.debug = False
    lines = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("[graph_compute]")]
    assert lines == ["[graph_compute] device: 0, n_nodes: 1, n_tensors: 3"] * 2
