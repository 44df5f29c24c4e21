"""DeepSeek V4's ops: LIGHTNING_INDEXER and the hyper-connection mixes DSV4_HC_COMB,
DSV4_HC_PRE, DSV4_HC_POST."""
from __future__ import annotations

from ..ggml import GGMLOp as Op
from .base import accept, invalid, need_rows, sources


def lightning_indexer(node, srcs, admit=accept):
    """q (E, H, n_t, S), k (E, 1, n_kv, S), weights (H, n_t, 1, S), mask (n_kv, n_t)
    -> scores (n_kv, n_t, 1, S)."""
    q, k, w, m = sources(node, srcs, 4)
    admit(node, srcs)
    E, H, n_t, S = q.ne
    ok = (k.ne[0] == E and k.ne[1] == 1 and k.ne[3] == S and tuple(w.ne) == (H, n_t, 1, S)
          and m.ne[0] == k.ne[2] and m.ne[1] == n_t and m.ne[2] == 1 and S % m.ne[3] == 0
          and tuple(node.ne) == (k.ne[2], n_t, 1, S))
    if not ok:
        raise invalid(node, srcs, "shapes of q, k, weights, mask and result do not agree")
    need_rows(node, srcs, q, k, w, m, node)
    return [q, k, w, m]


def hc_comb(node, srcs, admit=accept):
    """op_params[1]: n_iter of the Sinkhorn normalisation."""
    mx, sc, bs = sources(node, srcs, 3)
    admit(node, srcs)
    ok = (mx.ne[0] == 24 and mx.ne[2] == mx.ne[3] == 1 and sc.ne[0] >= 3 and bs.ne[0] == 24
          and tuple(node.ne) == (4, 4, mx.ne[1], 1) and node.op_params[1] > 0)
    if not ok:
        raise invalid(node, srcs, "needs 4 streams (24 mixes per token), a scale of 3+ and n_iter > 0")
    return [mx, sc, bs]


def hc_pre(node, srcs, admit=accept):
    """op_params[1]: gated (weights per element rather than per stream)."""
    x, w = sources(node, srcs, 2)
    admit(node, srcs)
    E, hc, n_t = x.ne[:3]
    gated = node.op_params[1] != 0
    ok = (x.ne[3] == 1 and tuple(node.ne) == (E, n_t, 1, 1)
          and (tuple(w.ne) == (E, hc, n_t, 1) if gated else tuple(w.ne) == (hc, n_t, 1, 1)))
    if not ok:
        raise invalid(node, srcs, "shapes of streams, weights and result do not agree")
    return [x, w]


def hc_post(node, srcs, admit=accept):
    used = sources(node, srcs, 3, optional=1)
    x, r, p, cb = used
    admit(node, srcs)
    E, n_t = x.ne[0], x.ne[1]
    hc = r.ne[1]
    ok = (x.ne[2] == x.ne[3] == 1 and tuple(r.ne) == (E, hc, n_t, 1) and tuple(p.ne) == (hc, n_t, 1, 1)
          and (cb is None or tuple(cb.ne) == (hc, hc, n_t, 1)) and tuple(node.ne) == (E, hc, n_t, 1))
    if not ok:
        raise invalid(node, srcs, "shapes of output, residual, post, comb and result do not agree")
    return list(srcs)


CHECKS = {
    Op.LIGHTNING_INDEXER: lightning_indexer,
    Op.DSV4_HC_COMB: hc_comb,
    Op.DSV4_HC_PRE: hc_pre,
    Op.DSV4_HC_POST: hc_post,
}
