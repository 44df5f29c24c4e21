"""State-space ops: SSM_CONV (Mamba's depthwise causal conv, LFM2's short conv) and
SSM_SCAN (Mamba 1 and 2 selective scan, with per-sequence state ids and K state
snapshots), against NumPy models of the recurrences; a state id out of range
closes the connection."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlrpc.ggml import GGMLOp as Op, GGMLType as T
from tests.ops.conftest import assert_close, rejected


def test_ssm_conv(ctx, rng):
    d_conv, d_inner, n_t, n_s = 4, 20, 6, 3
    sx = rng.standard_normal((n_s, d_inner, d_conv - 1 + n_t)).astype(np.float32)
    w = rng.standard_normal((d_inner, d_conv)).astype(np.float32)
    out = ctx.op(Op.SSM_CONV, T.F32, (d_inner, n_t, n_s), ctx.new(T.F32, (d_conv - 1 + n_t, d_inner, n_s), sx),
                 ctx.new(T.F32, (d_conv, d_inner), w))
    ctx.compute()
    ref = np.stack([[[np.dot(sx[s, i, t:t + d_conv], w[i]) for i in range(d_inner)] for t in range(n_t)]
                    for s in range(n_s)])
    assert_close(ctx.read(out), ref.astype(np.float64), 1e-12)


def scan_ref(s, x, dt, a, b, c, ids, K):
    """NumPy model: per sequence, per token, state = state*exp(dt*A) + B*x*dt, y = state . C."""
    s = s.astype(np.float64)
    n_s, n_t, n_head, head_dim = x.shape
    n_group = b.shape[2]
    ys = np.zeros(x.shape)
    finals = np.zeros((K, n_s) + s.shape[1:])
    for q in range(n_s):
        st = s[ids[q]].copy()                      # (n_head, head_dim, d_state)
        for t in range(n_t):
            for h in range(n_head):
                v = dt[q, t, h]
                sp = v if v > 20 else np.log1p(np.exp(v))
                g = h // (n_head // n_group)
                decay = np.exp(sp * a[h])            # (1,) or (d_state,)
                st[h] = st[h] * decay + np.outer(x[q, t, h] * sp, b[q, t, g])
                ys[q, t, h] = st[h] @ c[q, t, g]
            slot = n_t - 1 - t
            if 0 < slot < K:
                finals[slot, q] = st
        finals[0, q] = st
    return np.concatenate([ys.ravel(), finals.ravel()])


@pytest.mark.parametrize("kind, d_state, K", [("mamba2", 64, 1), ("mamba2", 40, 3), ("mamba1", 16, 1)])
def test_ssm_scan(ctx, rng, kind, d_state, K):
    head_dim, n_head, n_group, n_t, n_s, pool = 6, 4, 2, 4, 2, 3
    s = (rng.standard_normal((pool, n_head, head_dim, d_state)) * 0.5).astype(np.float32)
    x = rng.standard_normal((n_s, n_t, n_head, head_dim)).astype(np.float32)
    dt = rng.standard_normal((n_s, n_t, n_head)).astype(np.float32)
    a = (-np.abs(rng.standard_normal((n_head, d_state if kind == "mamba1" else 1)))).astype(np.float32)
    b = rng.standard_normal((n_s, n_t, n_group, d_state)).astype(np.float32)
    c = rng.standard_normal((n_s, n_t, n_group, d_state)).astype(np.float32)
    ids = np.array([2, 0], np.int32)
    n = x.size + K * d_state * head_dim * n_head * n_s
    out = ctx.op(Op.SSM_SCAN, T.F32, (n,), ctx.new(T.F32, (d_state, head_dim, n_head, pool), s),
                 ctx.new(T.F32, (head_dim, n_head, n_t, n_s), x), ctx.new(T.F32, (n_head, n_t, n_s), dt),
                 ctx.new(T.F32, (a.shape[1], n_head), a), ctx.new(T.F32, (d_state, n_group, n_t, n_s), b),
                 ctx.new(T.F32, (d_state, n_group, n_t, n_s), c), ctx.new(T.I32, (n_s,), ids), params=[K])
    ctx.compute()
    assert_close(ctx.read(out).ravel(), scan_ref(s, x, dt, a, b, c, ids, K), 1e-10)


def test_ssm_scan_bad_state_id_closes(server, rng, caplog):
    with rejected(server, caplog, "SSM_SCAN state 1 out of range [0, 1)") as c:
        f = lambda *ne: c.new(T.F32, ne, rng.standard_normal(ne[::-1]).astype(np.float32))
        c.op(Op.SSM_SCAN, T.F32, (4 + 16 * 2,), f(16, 2, 1, 1), f(2, 1, 2, 1), f(1, 2, 1),
             f(1, 1), f(16, 1, 2, 1), f(16, 1, 2, 1), c.new(T.I32, (1,), np.array([1], np.int32)), params=[1])
