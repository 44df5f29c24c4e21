"""Linear-attention recurrences: RWKV_WKV6, GATED_LINEAR_ATTN, RWKV_WKV7 and
GATED_DELTA_NET (with vector gates and state snapshots), plus SOLVE_TRI, against
float64 NumPy models of the recurrences; shapes that do not agree close the
connection."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlrpc.ggml import GGMLOp as Op, GGMLType as T
from tests.ops.conftest import assert_close, f32_bits, rejected


def rand(rng, shape, scale=1.0, offset=0.0):
    return (rng.standard_normal(shape) * scale + offset).astype(np.float32)


def run_wkv(ctx, opcode, srcs, S, H, n_t, n_s, params=()):
    """srcs: NumPy arrays, (T, H, S) per token except time_first (H, S) and the
    state (n_s, H, S, S); returns (outputs (T, H, S), final states (n_s, H, S, S))."""
    ts = [ctx.new(T.F32, a.shape[::-1], a) for a in srcs[:-1]]
    ts.append(ctx.new(T.F32, (S * S * H, n_s), srcs[-1].reshape(n_s, -1)))
    out = ctx.op(opcode, T.F32, (S * H, n_t + S * n_s), *ts, params=list(params))
    ctx.compute()
    res = ctx.read(out).ravel()
    return res[:n_t * H * S].reshape(n_t, H, S), res[n_t * H * S:].reshape(n_s, H, S, S)


def recurrence_ref(state, n_t, n_s, step):
    """Run step(t, h, st) -> (out_h, new_st) over the tokens of each sequence."""
    per = n_t // n_s
    st = state.astype(np.float64).copy()
    H, S = st.shape[1], st.shape[2]
    out = np.zeros((n_t, H, S))
    for t in range(n_t):
        q = t // per
        for h in range(H):
            out[t, h], st[q, h] = step(t, h, st[q, h])
    return out, st


@pytest.mark.parametrize("S", [16, 12])
def test_rwkv_wkv6(ctx, rng, S):
    H, n_t, n_s = 3, 6, 2
    k, v, r = rand(rng, (n_t, H, S)), rand(rng, (n_t, H, S)), rand(rng, (n_t, H, S))
    tf, td = rand(rng, (H, S)), rand(rng, (n_t, H, S), 0.1, 0.9)
    state = rand(rng, (n_s, H, S, S), 0.5)

    def step(t, h, st):        # st[i][j]: key i, value j
        kv = np.outer(k[t, h], v[t, h]).astype(np.float64)
        out = r[t, h] @ (tf[h][:, None] * kv + st)
        return out, st * td[t, h][:, None] + kv
    out, st = run_wkv(ctx, Op.RWKV_WKV6, [k, v, r, tf, td, state], S, H, n_t, n_s)
    ref_out, ref_st = recurrence_ref(state, n_t, n_s, step)
    assert_close(out, ref_out, 1e-10)
    assert_close(st, ref_st, 1e-10)


def test_gated_linear_attn(ctx, rng):
    S, H, n_t, n_s, scale = 16, 2, 4, 2, 0.25
    k, v, q = rand(rng, (n_t, H, S)), rand(rng, (n_t, H, S)), rand(rng, (n_t, H, S))
    g = rand(rng, (n_t, H, S), 0.1, 0.9)
    state = rand(rng, (n_s, H, S, S), 0.5)

    def step(t, h, st):
        st = st * g[t, h][:, None] + np.outer(k[t, h], v[t, h])
        return (q[t, h] * scale) @ st, st
    out, st = run_wkv(ctx, Op.GATED_LINEAR_ATTN, [k, v, q, g, state], S, H, n_t, n_s, [f32_bits(scale)])
    ref_out, ref_st = recurrence_ref(state, n_t, n_s, step)
    assert_close(out, ref_out, 1e-10)
    assert_close(st, ref_st, 1e-10)


@pytest.mark.parametrize("S", [32, 20])
def test_rwkv_wkv7(ctx, rng, S):
    H, n_t, n_s = 2, 4, 2
    r, w, k, v = (rand(rng, (n_t, H, S)), rand(rng, (n_t, H, S), 0.1, 0.9),
                  rand(rng, (n_t, H, S)), rand(rng, (n_t, H, S)))
    a, b = rand(rng, (n_t, H, S), 0.2), rand(rng, (n_t, H, S), 0.2)
    state = rand(rng, (n_s, H, S, S), 0.5)

    def step(t, h, st):        # st[i][j]: value i, key j
        sa = st @ a[t, h]
        st = st * w[t, h] + np.outer(v[t, h], k[t, h]) + np.outer(sa, b[t, h])
        return st @ r[t, h], st
    out, st = run_wkv(ctx, Op.RWKV_WKV7, [r, w, k, v, a, b, state], S, H, n_t, n_s)
    ref_out, ref_st = recurrence_ref(state, n_t, n_s, step)
    assert_close(out, ref_out, 1e-10)
    assert_close(st, ref_st, 1e-10)


def gdn_ref(q, k, v, g, beta, state, K):
    """Gated delta rule. Arrays in NumPy order: q, k (n_sq, n_t, Hq, S), v (n_s, n_t, H, S),
    g (n_s, n_t, H, 1|S), beta (n_s, n_t, H, 1), state (n_s, H, S, S) with M[j][i]."""
    n_s, n_t, H, S = v.shape
    out = np.zeros(v.shape)
    snaps = np.zeros((K, n_s, H, S, S))
    for s in range(n_s):
        for h in range(H):
            M = state[s, h].astype(np.float64).copy()
            qs, ks = s // (n_s // q.shape[0]), s // (n_s // k.shape[0])
            for t in range(n_t):
                qq, kk = q[qs, t, h % q.shape[2]], k[ks, t, h % k.shape[2]]
                M = M * np.exp(g[s, t, h].astype(np.float64))[None, :]
                delta = (v[s, t, h] - M @ kk) * beta[s, t, h, 0]
                M = M + np.outer(delta, kk)
                out[s, t, h] = (M @ qq) / np.sqrt(S)
                slot = n_t - 1 - t
                if slot < K:
                    snaps[slot, s, h] = M
    return np.concatenate([out.ravel(), snaps.ravel()])


@pytest.mark.parametrize("vec_gate, K, S", [(False, 1, 32), (True, 1, 24), (False, 3, 16)],
                         ids=["scalar-gate", "vector-gate", "snapshots"])
def test_gated_delta_net(ctx, rng, vec_gate, K, S):
    H, Hq, n_t, n_s = 4, 2, 3, 2
    q, k = rand(rng, (1, n_t, Hq, S), 0.3), rand(rng, (n_s, n_t, Hq, S), 0.3)
    v = rand(rng, (n_s, n_t, H, S))
    g = rand(rng, (n_s, n_t, H, S if vec_gate else 1), 0.1, -0.2)
    beta = rand(rng, (n_s, n_t, H, 1), 0.2, 0.5)
    state = rand(rng, (n_s, H, S, S), 0.5)
    ts = [ctx.new(T.F32, a.shape[::-1], a) for a in (q, k, v, g, beta, state)]
    out = ctx.op(Op.GATED_DELTA_NET, T.F32, (S * H, n_t * n_s + K * S * n_s), *ts, params=[K])
    ctx.compute()
    assert_close(ctx.read(out).ravel(), gdn_ref(q, k, v, g, beta, state, K), 1e-10)


@pytest.mark.parametrize("k", [1, 5])
def test_solve_tri(ctx, rng, k):
    n = 13
    a = np.tril(rng.standard_normal((2, 3, n, n))).astype(np.float32)
    a[..., np.arange(n), np.arange(n)] = (2.0 + rng.random((2, 3, n))).astype(np.float32)
    b = rand(rng, (2, 3, n, k))
    out = ctx.op(Op.SOLVE_TRI, T.F32, (k, n, 3, 2), ctx.new(T.F32, (n, n, 3, 2), a), ctx.new(T.F32, (k, n, 3, 2), b))
    ctx.compute()
    assert_close(ctx.read(out), np.linalg.solve(a.astype(np.float64), b.astype(np.float64)), 1e-10)


def test_tokens_not_split_evenly_closes(server, rng, caplog):
    with rejected(server, caplog, "op GATED_LINEAR_ATTN (F32 <- F32, F32, F32, F32, F32)") as c:
        S, H, n_t, n_s = 8, 1, 3, 2
        x = [c.new(T.F32, (S, H, n_t), rand(rng, (n_t, H, S))) for _ in range(4)]
        state = c.new(T.F32, (S * S * H, n_s), rand(rng, (n_s, S * S * H)))
        c.op(Op.GATED_LINEAR_ATTN, T.F32, (S * H, n_t + S * n_s), *x, state, params=[f32_bits(1.0)])
