"""The graph builder: shape inference and ggml's checks, views, the allocator, and
small graphs run in-process (LocalBackend) against NumPy."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlrpc import builder as B
from ggmlrpc.ggml import GGMLOp, GGMLType
from ggmlrpc.local import LocalBackend


def leaf(ne, type=GGMLType.F32, name="x"):
    return B.Tensor(type, ne, name=name)


def test_shapes_and_checks():
    w, x = leaf((64, 32), name="w"), leaf((64, 5), name="x")
    y = B.mul_mat(w, x)
    assert y.ne == (32, 5, 1, 1) and y.type == GGMLType.F32
    with pytest.raises(ValueError, match="columns"):
        B.mul_mat(w, leaf((32, 5)))
    q = B.reshape(y, (8, 4, 5))
    assert q.op == GGMLOp.RESHAPE and q.view_src is y and q.ne == (8, 4, 5, 1)
    p = B.permute(q, 0, 2, 1, 3)
    assert p.ne == (8, 5, 4, 1) and p.nb == (4, 128, 32, 640) and p.view_src is y
    with pytest.raises(ValueError, match="non-contiguous"):
        B.reshape(p, (160,))
    k = leaf((8, 16, 2), GGMLType.F16)
    fa = B.flash_attn_ext(p, k, k, leaf((16, 5), GGMLType.F16), 0.5)
    assert fa.ne == (8, 4, 5, 1)
    with pytest.raises(ValueError, match="F16"):
        B.flash_attn_ext(p, k, k, leaf((16, 5)), 0.5)
    assert B.get_rows(w, leaf((3,), GGMLType.I32)).ne == (64, 3, 1, 1)
    assert B.f32_bits(1.0) == 0x3F800000 and B.f32_bits(-2.0) < 0


def test_allocator_reuses_memory_of_dead_tensors():
    x = leaf((256,))
    g = B.Graph()
    cur = x
    for _ in range(6):
        cur = B.scale(cur, 2.0)
    g.expand(cur, output=True)
    alloc = B.Allocator(32)
    size = alloc.plan(g)
    assert size == 2 * 1024      # a chain needs two live buffers at a time
    offs = [alloc.offsets[t.id] for t in g.nodes]
    assert all(a != b for a, b in zip(offs, offs[1:]))


def test_expansion_order_puts_writes_first():
    cache = leaf((4, 8))
    src, idx = leaf((4, 2)), leaf((2,), GGMLType.I64)
    g = B.Graph()
    w = g.expand(B.set_rows(cache, src, idx))
    r = B.view(cache, (4, 3))
    out = g.expand(B.scale(r, 1.0), output=True)
    assert g.nodes.index(w) < g.nodes.index(out)


def test_graph_runs_in_process_like_numpy(seed):
    rng = np.random.default_rng(seed)
    wa = rng.standard_normal((24, 64), dtype=np.float32)   # numpy (rows, cols) = ggml (64, 24)
    xa = rng.standard_normal((5, 64), dtype=np.float32)
    na = rng.standard_normal(64, dtype=np.float32)
    with LocalBackend(1) as be:
        buf = be.alloc_buffer(64 * 1024)
        w = buf.tensor(GGMLType.F32, (64, 24), 0, "w")
        x = buf.tensor(GGMLType.F32, (64, 5), 8192, "x")
        n = buf.tensor(GGMLType.F32, (64,), 16384, "n")
        for t, a in ((w, wa), (x, xa), (n, na)):
            be.set_tensor(t, a)
        h = B.mul(B.rms_norm(x, 1e-5), n)
        y = B.soft_max_ext(B.mul_mat(w, h), None, 0.5)
        g = B.Graph()
        g.expand(y, output=True)
        alloc = B.Allocator()
        comp = be.alloc_buffer(alloc.plan(g))
        alloc.place(comp)
        be.graph_compute(g.nodes)
        got = be.get_array(y)
        be.graph_recompute()
        assert np.array_equal(be.get_array(y), got)
    hn = xa / np.sqrt((xa * xa).mean(-1, keepdims=True) + 1e-5) * na
    z = 0.5 * hn @ wa.T
    want = np.exp(z - z.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
