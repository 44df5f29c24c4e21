"""Token sampling over a row of logits, in llama.cpp's default order:
top-k, top-p, min-p, temperature, then a draw (greedy when temp <= 0).

Greedy picks the first highest logit, as llama.cpp does, so greedy text is
reproducible across implementations; random draws use numpy's generator and are
reproducible for one seed here, not equal to llama.cpp's draws.
"""
from __future__ import annotations

import numpy as np


class Sampler:
    def __init__(self, temp: float = 0.8, top_k: int = 40, top_p: float = 0.95,
                 min_p: float = 0.05, seed: int | None = None, banned=()):
        self.temp, self.top_k, self.top_p, self.min_p = temp, top_k, top_p, min_p
        self.rng = np.random.default_rng(seed)
        self.banned = np.asarray(sorted(banned), dtype=np.int64)

    def __call__(self, logits: np.ndarray) -> int:
        logits = np.asarray(logits, dtype=np.float32)
        if self.banned.size:
            logits = logits.copy()
            logits[self.banned] = -np.inf
        if self.temp <= 0:
            return int(np.argmax(logits))
        ids = np.argsort(-logits, kind="stable")
        if self.top_k > 0:
            ids = ids[:self.top_k]
        x = logits[ids].astype(np.float64)
        p = np.exp(x - x[0])
        p /= p.sum()
        if self.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(p), self.top_p) + 1)
            ids, x, p = ids[:keep], x[:keep], p[:keep]
        if self.min_p > 0:
            keep = p >= self.min_p * p[0]
            ids, x = ids[keep], x[keep]
        z = x / self.temp
        q = np.exp(z - z.max())
        q /= q.sum()
        return int(ids[self.rng.choice(len(ids), p=q)])
