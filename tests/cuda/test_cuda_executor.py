"""The CUDA graph executor on the CPU: a server whose device is a CUDA device on a fake
driver (host memory) with the package's .cu kernels in the SIMT emulator. Each graph
runs on that server and on our CPU server; results agree within test-backend-ops'
NMSE thresholds (1e-7; 5e-4 for quantized matmul and flash attention)."""
from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from ggmlrpc import protocol
from ggmlrpc.devices.cpu import CpuDevice
from ggmlrpc.devices.cuda import CudaDevice
from ggmlrpc.errors import ServerClosed
from ggmlrpc.ggml import GGMLGluOp as G
from ggmlrpc.ggml import GGMLOp as Op
from ggmlrpc.ggml import GGMLType as T
from ggmlrpc.ggml import GGMLUnaryOp as U
from ggmlrpc.server import Server
from tests.ops.conftest import Ctx, f32_bits

from .conftest import EmulatedKernels, assert_close, have_toolkit
from .fake_pycuda import make_pycuda

pytestmark = pytest.mark.skipif(not have_toolkit(), reason="no CUDA toolkit headers or g++ for the emulator")


def start(device):
    srv = Server([device], "127.0.0.1", 0, codec=protocol.codec("native"), out=open(os.devnull, "w"))
    srv.start()
    return srv


def emulated_gpu(order="shuffled"):
    """CUDA0 on the fake driver, its kernels in the emulator."""
    _, drv = make_pycuda(devices=(("Emulated GPU", 1 << 30),))
    return CudaDevice(drv, 0, kernels=EmulatedKernels(order))


@pytest.fixture(scope="module")
def servers():
    gpu, cpu = start(emulated_gpu()), start(CpuDevice(1))
    yield gpu, cpu
    gpu.close()
    cpu.close()


def run_both(servers, build):
    """build(ctx) -> result tensors, on the CUDA server and on the CPU server: the
    results of each as NumPy arrays, (cuda, cpu) pairs."""
    outs = []
    for srv in servers:
        c = Ctx(f"127.0.0.1:{srv.port}")
        try:
            ts = build(c)
            c.compute()
            outs.append([c.read(t) for t in ts])
        finally:
            c.close()
    return list(zip(*outs))


def check(servers, build, max_nmse=1e-7):
    for ours, ref in run_both(servers, build):
        assert_close(ours, ref, max_nmse)


@pytest.fixture
def rng(seed):
    return np.random.default_rng(seed)


# ---- single ops ----

@pytest.mark.parametrize("op", [Op.ADD, Op.SUB, Op.MUL, Op.DIV], ids=lambda o: o.name)
def test_binary_broadcast_and_views(servers, rng, op):
    a = rng.standard_normal((3, 5, 40)).astype(np.float32)
    b = rng.standard_normal((3, 1, 33)).astype(np.float32) + 3

    def build(c):
        ta = c.new(T.F32, (40, 5, 3), a)
        va = c.view(ta, (33, 5, 3), (4, 160, 800, 2400))          # strided rows
        return [c.op(op, T.F32, (33, 5, 3), va, c.new(T.F32, (33, 1, 3), b))]
    check(servers, build)


# ggml's CPU GELU reads an F16 table: 1e-7 from the exact function, as the CUDA kernel is
GELU_NMSE = 1e-6


@pytest.mark.parametrize("u", [U.SILU, U.GELU, U.NEG, U.EXP], ids=lambda o: o.name)
def test_unary(servers, rng, u):
    x = rng.standard_normal((4, 50)).astype(np.float32)
    check(servers, lambda c: [c.op(Op.UNARY, T.F32, (50, 4), c.new(T.F32, (50, 4), x), params=[u])],
          GELU_NMSE if u == U.GELU else 1e-7)


def test_scale_sqr_clamp(servers, rng):
    x = rng.standard_normal((3, 65)).astype(np.float32)

    def build(c):
        t = c.new(T.F32, (65, 3), x)
        return [c.op(Op.SCALE, T.F32, (65, 3), t, params=[f32_bits(1.25), f32_bits(0.5)]),
                c.op(Op.SQR, T.F32, (65, 3), t),
                c.op(Op.CLAMP, T.F32, (65, 3), t, params=[f32_bits(-0.5), f32_bits(0.7)])]
    check(servers, build)


@pytest.mark.parametrize("split", [False, True])
def test_glu(servers, rng, split):
    nc, rows = 48, 5
    x = rng.standard_normal((rows, 2 * nc)).astype(np.float32)

    def build(c):
        if split:
            t = c.new(T.F32, (2 * nc, rows), x)
            nb = (4, 8 * nc, 8 * nc * rows, 8 * nc * rows)
            a, b = c.view(t, (nc, rows), nb), c.view(t, (nc, rows), nb, 4 * nc)
            return [c.op(Op.GLU, T.F32, (nc, rows), a, b, params=[G.SWIGLU, 0])]
        return [c.op(Op.GLU, T.F32, (nc, rows), c.new(T.F32, (2 * nc, rows), x), params=[G.SWIGLU, 1]),
                c.op(Op.GLU, T.F32, (nc, rows), c.new(T.F32, (2 * nc, rows), x), params=[G.GEGLU, 0])]
    check(servers, build, GELU_NMSE)


@pytest.mark.parametrize("op", [Op.RMS_NORM, Op.NORM], ids=lambda o: o.name)
def test_norm_of_permuted(servers, rng, op):
    x = rng.standard_normal((6, 4, 64)).astype(np.float32)

    def build(c):
        p = c.permute(c.new(T.F32, (64, 4, 6), x), 0, 2, 1, 3)     # rows at uneven strides
        return [c.op(op, T.F32, tuple(p.ne), p, params=[f32_bits(1e-5)])]
    check(servers, build)


@pytest.mark.parametrize("mask_t", [None, T.F32, T.F16])
def test_soft_max(servers, rng, mask_t):
    cols, rows, heads = 37, 5, 3
    x = rng.standard_normal((heads, rows, cols)).astype(np.float32)
    m = np.where(rng.random((rows + 2, cols + 3)) < 0.3, -np.inf, 0.0)
    m[:, 0] = 0

    def build(c):
        srcs = [c.new(T.F32, (cols, rows, heads), x)]
        if mask_t is not None:
            srcs.append(c.new(mask_t, (cols + 3, rows + 2), m.astype(np.float16 if mask_t == T.F16 else np.float32)))
        return [c.op(Op.SOFT_MAX, T.F32, (cols, rows, heads), *srcs, params=[f32_bits(0.3), f32_bits(0.0)])]
    check(servers, build)


@pytest.mark.parametrize("mode", [0, 2])
def test_rope_of_view(servers, rng, mode):
    hd, heads, tokens = 32, 3, 4
    x = rng.standard_normal((tokens, heads * hd + 8)).astype(np.float32)
    pos = np.array([3, 0, 7, 100], np.int32)
    p = [0, hd, mode, 0, 512, f32_bits(10000.0), f32_bits(1.0), f32_bits(0.0), f32_bits(1.0),
         f32_bits(32.0), f32_bits(1.0), 0, 0, 0, 0, 0]

    def build(c):
        t = c.new(T.F32, (heads * hd + 8, tokens), x)
        row = 4 * (heads * hd + 8)
        v = c.view(t, (hd, heads, tokens), (4, 4 * hd, row, row * tokens))
        return [c.op(Op.ROPE, T.F32, (hd, heads, tokens), v, c.new(T.I32, (tokens,), pos), params=p)]
    check(servers, build)


@pytest.mark.parametrize("wt", [T.F32, T.F16, T.Q8_0])
def test_get_rows(servers, rng, wt):
    w = rng.standard_normal((10, 64)).astype(np.float32)
    ids = np.array([3, 0, 9, 3], np.int32)
    check(servers, lambda c: [c.op(Op.GET_ROWS, T.F32, (64, 4), c.new(wt, (64, 10), w), c.new(T.I32, (4,), ids))])


@pytest.mark.parametrize("dt", [T.F16, T.F32, T.Q8_0], ids=lambda t: t.name)
def test_set_rows(servers, rng, dt):
    x = rng.standard_normal((3, 64)).astype(np.float32)
    ids = np.array([5, 1, 2], np.int64)

    def build(c):
        cache = c.new(dt, (64, 8), np.zeros((8, 64), np.float32))
        node = c.op(Op.SET_ROWS, dt, (64, 8), c.new(T.F32, (64, 3), x), c.new(T.I64, (3,), ids))
        node.view_src = cache
        node.data = cache.data
        if dt == T.Q8_0:     # read back as F32 in the same graph
            return [c.op(Op.GET_ROWS, T.F32, (64, 8), node, c.new(T.I32, (8,), np.arange(8, dtype=np.int32)))]
        return [node]
    check(servers, build)


@pytest.mark.parametrize("st,dt", [(T.F32, T.F16), (T.F16, T.F32), (T.F32, T.F32)])
def test_cpy_transposed(servers, rng, st, dt):
    x = rng.standard_normal((6, 20)).astype(np.float32)

    def build(c):
        tr = c.transpose(c.new(st, (20, 6), x))
        dst = c.new(dt, (6, 20))
        return [c.op(Op.CPY, dt, (6, 20), tr, dst), c.op(Op.CONT, st, (6, 20), tr)]
    check(servers, build)


@pytest.mark.parametrize("wt", [T.F32, T.F16, T.Q4_0, T.Q8_0])
@pytest.mark.parametrize("N", [1, 5, 40])
def test_mul_mat(servers, rng, wt, N):
    K, M = 64, 24
    w = rng.standard_normal((M, K)).astype(np.float32)
    x = rng.standard_normal((N, K)).astype(np.float32)
    quant = wt in (T.Q4_0, T.Q8_0)
    check(servers, lambda c: [c.op(Op.MUL_MAT, T.F32, (M, N), c.new(wt, (K, M), w), c.new(T.F32, (K, N), x))],
          5e-4 if quant else 1e-7 if wt == T.F32 else 5e-4 if N > 8 else 1e-6)


def test_mul_mat_attention_pattern(servers, rng):
    """KQ and KQV as llama builds them: K a permuted cache view, q permuted, GQA."""
    hd, n_kv, tokens, q_heads, kv_heads = 32, 12, 3, 4, 2
    k = rng.standard_normal((n_kv, kv_heads, hd)).astype(np.float32)
    q = rng.standard_normal((tokens, q_heads, hd)).astype(np.float32)

    def build(c):
        kp = c.permute(c.new(T.F16, (hd, kv_heads, n_kv), k), 0, 2, 1, 3)
        qp = c.permute(c.new(T.F32, (hd, q_heads, tokens), q), 0, 2, 1, 3)
        return [c.op(Op.MUL_MAT, T.F32, (n_kv, tokens, q_heads, 1), kp, qp)]
    check(servers, build, 1e-6)


@pytest.mark.parametrize("kv_t", [T.F16, T.Q8_0])
@pytest.mark.parametrize("nq", [1, 5])
def test_flash_attn(servers, rng, kv_t, nq):
    hd, heads, kv_heads, nkv = 64, 4, 2, 24
    q = rng.standard_normal((heads, nq, hd)).astype(np.float32)
    k = rng.standard_normal((kv_heads, nkv, hd)).astype(np.float32)
    v = rng.standard_normal((kv_heads, nkv, hd)).astype(np.float32)
    m = np.zeros((8, nkv), np.float32)
    for i in range(nq):
        m[i, nkv - nq + i + 1:] = -np.inf

    def build(c):
        srcs = [c.new(T.F32, (hd, nq, heads), q), c.new(kv_t, (hd, nkv, kv_heads), k),
                c.new(kv_t, (hd, nkv, kv_heads), v), c.new(T.F16, (nkv, 8), m.astype(np.float16))]
        return [c.op(Op.FLASH_ATTN_EXT, T.F32, (hd, heads, nq, 1), *srcs,
                     params=[f32_bits(0.125), f32_bits(0.0), f32_bits(0.0), 10])]
    check(servers, build, 5e-4)


@pytest.mark.parametrize("wt", [T.F32, T.F16, T.Q8_0], ids=lambda t: t.name)
@pytest.mark.parametrize("ne11", [1, 2])
def test_mul_mat_id(servers, rng, wt, ne11):
    K, M, n_as, n_used, tokens = 64, 16, 4, 2, 3
    w = rng.standard_normal((n_as, M, K)).astype(np.float32)
    x = rng.standard_normal((tokens, ne11, K)).astype(np.float32)
    ids = np.array([[0, 3], [2, 2], [1, 0]], np.int32)
    check(servers, lambda c: [c.op(Op.MUL_MAT_ID, T.F32, (M, n_used, tokens), c.new(wt, (K, M, n_as), w),
                                   c.new(T.F32, (K, ne11, tokens), x), c.new(T.I32, (n_used, tokens), ids))],
          1e-7 if wt == T.F32 else 1e-6)


def test_add_id(servers, rng):
    ne0, n_used, tokens, n_as = 40, 2, 3, 4
    a = rng.standard_normal((tokens, n_used, ne0)).astype(np.float32)
    y = rng.standard_normal((n_as, ne0)).astype(np.float32)
    ids = np.array([[0, 3], [2, 2], [1, 0]], np.int32)
    check(servers, lambda c: [c.op(Op.ADD_ID, T.F32, (ne0, n_used, tokens), c.new(T.F32, (ne0, n_used, tokens), a),
                                   c.new(T.F32, (ne0, n_as), y), c.new(T.I32, (n_used, tokens), ids))])


def test_mul_mat_broadcast_4d(servers, rng):
    """src0 broadcast over src1's dims 2 and 3 (dim 3 is a loop of launches)."""
    K, M, N = 64, 8, 3
    w = rng.standard_normal((1, 2, M, K)).astype(np.float32)
    x = rng.standard_normal((2, 6, N, K)).astype(np.float32)
    check(servers, lambda c: [c.op(Op.MUL_MAT, T.F32, (M, N, 6, 2), c.new(T.F32, (K, M, 2, 1), w),
                                   c.new(T.F32, (K, N, 6, 2), x))])


@pytest.mark.parametrize("qt", [T.Q8_0, T.Q4_0], ids=lambda t: t.name)
def test_cpy_quantize_and_back(servers, rng, qt):
    x = rng.standard_normal((3, 64)).astype(np.float32)

    def build(c):
        q = c.op(Op.CPY, qt, (64, 3), c.new(T.F32, (64, 3), x), c.new(qt, (64, 3)))
        return [c.op(Op.CPY, T.F32, (64, 3), q, c.new(T.F32, (64, 3)))]
    check(servers, build)


def test_cpy_reshaping(servers, rng):
    """CPY keeps element order between shapes: a transposed source into a flat result."""
    x = rng.standard_normal((6, 20)).astype(np.float32)
    check(servers, lambda c: [c.op(Op.CPY, T.F16, (120,), c.transpose(c.new(T.F32, (20, 6), x)), c.new(T.F16, (120,)))])


def test_concat_repeat_mean_l2(servers, rng):
    a = rng.standard_normal((2, 3, 5)).astype(np.float32)
    b = rng.standard_normal((2, 4, 5)).astype(np.float32)

    def build(c):
        ta, tb = c.new(T.F32, (5, 3, 2), a), c.new(T.F32, (5, 4, 2), b)
        return [c.op(Op.CONCAT, T.F32, (5, 7, 2), ta, tb, params=[1]),
                c.op(Op.REPEAT, T.F32, (10, 6, 2), ta),
                c.op(Op.MEAN, T.F32, (1, 3, 2), ta),
                c.op(Op.L2_NORM, T.F32, (5, 3, 2), ta, params=[f32_bits(1e-6)])]
    check(servers, build)


def test_soft_max_sinks_alibi(servers, rng):
    cols, rows, heads = 20, 3, 4
    x = rng.standard_normal((heads, rows, cols)).astype(np.float32)
    m = rng.standard_normal((rows, cols)).astype(np.float16)
    sk = rng.standard_normal(heads).astype(np.float32)
    check(servers, lambda c: [c.op(Op.SOFT_MAX, T.F32, (cols, rows, heads), c.new(T.F32, (cols, rows, heads), x),
                                   c.new(T.F16, (cols, rows), m), c.new(T.F32, (heads,), sk),
                                   params=[f32_bits(0.5), f32_bits(8.0)])])


def test_top_k(servers, rng):
    x = rng.permutation(2 * 50).astype(np.float32).reshape(2, 50)
    for ours, ref in run_both(servers, lambda c: [c.op(Op.TOP_K, T.I32, (5, 2), c.new(T.F32, (50, 2), x))]):
        np.testing.assert_array_equal(np.sort(ours, axis=-1), np.sort(ref, axis=-1))


def test_argsort_and_sum_rows(servers, rng):
    x = rng.permutation(3 * 40).astype(np.float32).reshape(3, 40)

    def build(c):
        t = c.new(T.F32, (40, 3), x)
        return [c.op(Op.ARGSORT, T.I32, (40, 3), t, params=[1]), c.op(Op.SUM_ROWS, T.F32, (1, 3), t)]
    for ours, ref in run_both(servers, build):
        np.testing.assert_allclose(ours, ref, rtol=1e-6)


@pytest.mark.parametrize("op", ["GET_ROWS", "SET_ROWS", "MUL_MAT_ID"])
@pytest.mark.parametrize("bad", [-1, 8])
def test_index_out_of_range_closes_the_connection(servers, caplog, rng, op, bad):
    """A hostile index reads or writes nothing outside its tensor: the kernel skips it and
    flags it, the run fails with a log line, the connection closes, the server serves on."""
    c = Ctx(f"127.0.0.1:{servers[0].port}")
    try:
        rows = c.new(T.F32, (64, 8), rng.standard_normal((8, 64)).astype(np.float32))
        if op == "GET_ROWS":
            c.op(Op.GET_ROWS, T.F32, (64, 2), rows, c.new(T.I32, (2,), np.array([1, bad], np.int32)))
        elif op == "MUL_MAT_ID":       # 8 rows as 4 experts of 2
            experts = c.view(rows, (64, 2, 4), (4, 256, 512, 2048))
            c.op(Op.MUL_MAT_ID, T.F32, (2, 1, 2), experts, c.new(T.F32, (64, 1, 2), np.ones((2, 1, 64), np.float32)),
                 c.new(T.I32, (1, 2), np.array([[0], [bad // 2 if bad > 0 else bad]], np.int32)))
        else:
            node = c.op(Op.SET_ROWS, T.F32, (64, 8), c.new(T.F32, (64, 2), np.ones((2, 64), np.float32)),
                        c.new(T.I64, (2,), np.array([bad, 0], np.int64)))
            node.view_src, node.data = rows, rows.data
        with caplog.at_level(logging.WARNING):
            c.rb.graph_compute(c.nodes)
            with pytest.raises(ServerClosed):
                c.rb.synchronize()
        assert "row index is out of range" in caplog.text
    finally:
        c.close()
    check(servers, lambda c: [c.op(Op.SQR, T.F32, (4,), c.new(T.F32, (4,), np.arange(4, dtype=np.float32)))])


def test_unsupported_op_closes_the_connection(servers, caplog):
    c = Ctx(f"127.0.0.1:{servers[0].port}")
    try:
        x = c.new(T.F32, (8, 4, 2), np.zeros((2, 4, 8), np.float32))
        c.op(Op.GROUP_NORM, T.F32, (8, 4, 2), x, params=[2, f32_bits(1e-5)])
        with caplog.at_level(logging.WARNING):
            c.rb.graph_compute(c.nodes)
            with pytest.raises(ServerClosed):
                c.rb.synchronize()
        assert "GROUP_NORM" in caplog.text and "not supported by the CUDA executor" in caplog.text
    finally:
        c.close()


# ---- whole transformer graphs ----

# what a CUDA device answers differently from the recorded CPU server, by design:
# ggml's CUDA buffer alignment (128) and quantized rows padded to 512 elements
DEVICE_FACTS = ("GET_ALIGNMENT", "GET_ALLOC_SIZE")
# the logits' NMSE against llama.cpp's CPU: 1e-4 as the replayer, 5e-4 (test-backend-ops'
# quantized matmul threshold) for quantized weights
SESSIONS = {"llama-f32": 1e-4, "llama-f16-fa": 1e-4, "llama-q4_0-nofa": 5e-4, "llama-q8_0": 5e-4}


def real_gpu():
    from ggmlrpc.devices.cuda import cuda_devices
    found = cuda_devices()
    if not found:
        pytest.skip("no CUDA device (PyCUDA, driver or GPU missing)")
    return found[0]


@pytest.mark.parametrize("where", ["emulator", pytest.param("device", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("session", list(SESSIONS))
def test_recorded_session_on_cuda(session, where):
    """A whole recorded llama.cpp session (prompt, decoding, GRAPH_RECOMPUTE) replayed on a
    server whose device is CUDA0 (in the emulator, or a real GPU through PyCUDA): every
    logits row as the recorded CPU server's, within SESSIONS[session], the same top token."""
    from ggmlrpc.protocol import Cmd
    from ggmlrpc.trace import Replayer, load_connection
    from tests.conftest import TRACES

    srv = start(emulated_gpu("forward") if where == "emulator" else real_gpu())
    try:
        results = Replayer(f"127.0.0.1:{srv.port}", timeout=300, max_nmse=SESSIONS[session]).replay_session(
            TRACES / session)
    finally:
        srv.close()
    diffs = [f"{r.name} {d}" for r in results for d in r.differences if d.command not in DEVICE_FACTS]
    assert not diffs, "\n".join(diffs)
    model = load_connection(TRACES / session / results[-1].name)
    assert results[-1].sent == len(model.exchanges)
    assert sum(e.cmd == Cmd.GET_TENSOR for e in model.exchanges) >= 16     # the logits of every token


def test_run_stops_when_cancelled_and_reports_launch_failures():
    from ggmlrpc.compute.cpu import cancel_token
    from ggmlrpc.compute.cuda import CudaExecutor, CudaPlan
    from ggmlrpc.errors import ConnectionLost, DeviceError

    _, drv = make_pycuda()
    ran = []
    ex = CudaExecutor(lambda: None, drv, lambda: _Current(drv))
    plan = CudaPlan([(0, lambda: ran.append(0)), (1, lambda: ran.append(1))], ["'a' (ADD)", "'b' (MUL)"], [], 0)
    token = cancel_token()
    token.set()
    with pytest.raises(ConnectionLost, match="'a' \\(ADD\\)"):
        ex.run(plan, token)
    assert ran == []
    ex.run(plan, cancel_token())
    assert ran == [0, 1]

    def fail():
        raise RuntimeError("cuLaunchKernel failed: too many resources requested")
    with pytest.raises(DeviceError, match="'b' \\(MUL\\): cuLaunchKernel failed"):
        ex.run(CudaPlan([(0, lambda: None), (1, fail)], plan.names, [], 0))


class _Current:
    """The fake driver's device 0 made current, as CudaDevice.context() does."""

    def __init__(self, drv):
        self.ctx = drv.Device(0).retain_primary_context()
        self.drv = drv

    def __enter__(self):
        self.ctx.push()

    def __exit__(self, *exc):
        self.drv.Context.pop()
