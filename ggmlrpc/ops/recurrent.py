"""State-space and linear-attention recurrences: SSM_CONV, SSM_SCAN, RWKV_WKV6,
GATED_LINEAR_ATTN, RWKV_WKV7, GATED_DELTA_NET, and SOLVE_TRI (their triangular
solve)."""
from __future__ import annotations

from ..ggml import GGMLOp as Op
from .base import accept, contiguous, invalid, nelements, same_shape, sources


def ssm_conv(node, srcs, admit=accept):
    """A window (d_conv - 1 + n_t, d_inner, n_s) and a kernel (d_conv, d_inner) ->
    (d_inner, n_t, n_s)."""
    sx, c = sources(node, srcs, 2)
    admit(node, srcs)
    d_conv, d_inner = c.ne[0], c.ne[1]
    n_t = sx.ne[0] - d_conv + 1
    if (c.ne[2] != 1 or c.ne[3] != 1 or sx.ne[3] != 1 or n_t < 0 or sx.ne[1] != d_inner
            or tuple(node.ne) != (d_inner, n_t, sx.ne[2], 1)):
        raise invalid(node, srcs, "shapes of window, kernel and result do not agree")
    if sx.nb[0] != 4 or sx.nb[1] != sx.ne[0] * 4 or c.nb[0] != 4:
        raise invalid(node, srcs, "the window and kernel rows must be contiguous")
    return [sx, c]


def ssm_scan(node, srcs, admit=accept):
    """Sources: state, x, dt, A, B, C, ids; op_params[0]: K, the states kept per
    sequence after the outputs in the result."""
    s, x, dt, a, b, c, sel = sources(node, srcs, 7)
    admit(node, srcs)
    K = node.op_params[0]
    d_state, head_dim, n_head = s.ne[0], s.ne[1], s.ne[2]
    n_t, n_s = x.ne[2], x.ne[3]
    ok = (K >= 1 and contiguous(s) and contiguous(dt) and contiguous(a) and contiguous(sel)
          and x.ne[0] == head_dim and x.ne[1] == n_head and x.nb[0] == 4 and x.nb[1] == head_dim * 4
          and tuple(dt.ne[:3]) == (n_head, n_t, n_s) and dt.ne[3] == 1
          and a.ne[1] == n_head and a.ne[2] == a.ne[3] == 1 and (a.ne[0] == 1 or (a.ne[0] == d_state and K == 1))
          and same_shape(b, c) and b.ne[0] == d_state and b.ne[2] == n_t and b.ne[3] == n_s
          and n_head % b.ne[1] == 0 and all(t.nb[0] == 4 and t.nb[1] == t.ne[0] * 4 for t in (b, c))
          and sel.ne[0] == n_s and sel.ne[1] == sel.ne[2] == sel.ne[3] == 1
          and contiguous(node) and nelements(node) == nelements(x) + K * d_state * head_dim * n_head * n_s)
    if not ok:
        raise invalid(node, srcs, "shapes of states, inputs and result do not agree")
    return [s, x, dt, a, b, c, sel]


# op -> (sources, index of the state)
_RECURRENCES = {Op.RWKV_WKV6: (6, 5), Op.GATED_LINEAR_ATTN: (5, 4), Op.RWKV_WKV7: (7, 6)}


def recurrence(node, srcs, admit=accept):
    """The linear-attention recurrences: all contiguous, sources (S, H, T) except the
    state (S*S*H*n_seqs elements; RWKV_WKV6's time_faaaa has S*H), result
    (S*H, T + S*n_seqs)."""
    n_src, state_i = _RECURRENCES[node.op]
    used = sources(node, srcs, n_src)
    admit(node, srcs)
    state = used[state_i]
    S, H, n_t = used[0].ne[0], used[0].ne[1], used[0].ne[2]
    n_seqs = state.ne[1]
    if not all(contiguous(t) for t in used) or not contiguous(node):
        raise invalid(node, srcs, "sources and result must be contiguous")
    ok = (all(tuple(t.ne[:3]) == (S, H, n_t) and t.ne[3] == 1 for i, t in enumerate(used) if i != state_i
              and not (node.op == Op.RWKV_WKV6 and i == 3))
          and n_seqs > 0 and n_t % n_seqs == 0 and nelements(state) == S * S * H * n_seqs
          and tuple(node.ne) == (S * H, n_t + S * n_seqs, 1, 1))
    if node.op == Op.RWKV_WKV6:
        ok = ok and nelements(used[3]) == S * H
    if not ok:
        raise invalid(node, srcs, "shapes of inputs, state and result do not agree")
    return used


def solve_tri(node, srcs, admit=accept):
    """A (n, n, ...) triangular, B (k, n, ...) -> X of B's shape."""
    a, b = sources(node, srcs, 2)
    admit(node, srcs)
    if not (contiguous(a) and contiguous(b) and contiguous(node)):
        raise invalid(node, srcs, "sources and result must be contiguous")
    if (a.ne[0] != a.ne[1] or a.ne[1] != b.ne[1] or tuple(a.ne[2:]) != tuple(b.ne[2:])
            or not same_shape(node, b)):
        raise invalid(node, srcs, "A must be square and match B and the result")
    return [a, b]


def gated_delta_net(node, srcs, admit=accept):
    """Sources q, k, v (S, H, T, n_s), gate, beta, state; op_params[0]: K, the states
    kept per sequence."""
    q, k, v, g, beta, state = sources(node, srcs, 6)
    admit(node, srcs)
    S, H, n_t, n_s = v.ne
    K = node.op_params[0]
    rows_ok = all(t.nb[0] == 4 for t in (q, k, v))
    heads_ok = all(t.ne[0] == S and t.ne[2] == n_t and n_s % t.ne[3] == 0 for t in (q, k))
    ok = (K >= 1 and rows_ok and heads_ok and contiguous(g) and contiguous(beta) and contiguous(state)
          and g.ne[0] in (1, S) and tuple(g.ne[1:]) == (H, n_t, n_s)
          and tuple(beta.ne) == (1, H, n_t, n_s) and tuple(state.ne) == (S, S, H, n_s)
          and contiguous(node) and tuple(node.ne) == (S * H, n_t * n_s + K * S * n_s, 1, 1))
    if not ok:
        raise invalid(node, srcs, "shapes of q, k, v, gate, beta, state and result do not agree")
    return [q, k, v, g, beta, state]


CHECKS = {
    Op.SSM_CONV: ssm_conv,
    Op.SSM_SCAN: ssm_scan,
    Op.RWKV_WKV6: recurrence,
    Op.GATED_LINEAR_ATTN: recurrence,
    Op.RWKV_WKV7: recurrence,
    Op.SOLVE_TRI: solve_tri,
    Op.GATED_DELTA_NET: gated_delta_net,
}
