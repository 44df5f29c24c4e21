"""Token sampling over a row of logits with the semantics of llama.cpp's default
sampler chain (llama-completion's `--top-k --top-p --min-p --temp --seed`):

    top-k -> top-p -> min-p -> temperature -> draw

The samplers that llama.cpp's defaults leave disabled (penalties, DRY, top-n-sigma,
typical, XTC, dynamic temperature) are not applied. Each stage works on a list of
candidates (token ids with F32 logits) that is either in token order or sorted by
falling logit, and keeps llama.cpp's arithmetic: F32 soft-max sums in list order, a
top-p cut where the F32 running sum first reaches p, a min-p cut at
`max + log(p)` on the logits, and a draw that accumulates the F32 probabilities in
F64 up to `sum * u`, with `u` a double made from two outputs of a 32-bit
Mersenne Twister seeded with the 32-bit seed (the C++ standard library's
`uniform_real_distribution<double>` over `mt19937`). One draw per token, greedy
or not, so a seed gives llama.cpp's tokens as long as the logits are the same
bits (ties between equal logits and last-bit differences of exp aside).
A temperature <= 0 keeps only the first highest logit: greedy.
"""
from __future__ import annotations

import numpy as np


def mt19937(seed: int) -> np.random.MT19937:
    """numpy's Mersenne Twister in the state the C++ `std::mt19937(seed)` starts in."""
    key = np.empty(624, np.uint32)
    x = seed & 0xFFFFFFFF
    for i in range(624):
        key[i] = x
        x = (1812433253 * (x ^ (x >> 30)) + i + 1) & 0xFFFFFFFF
    bg = np.random.MT19937()
    bg.state = {"bit_generator": "MT19937", "state": {"key": key, "pos": 624}}
    return bg


class Sampler:
    def __init__(self, temp: float = 0.8, top_k: int = 40, top_p: float = 0.95,
                 min_p: float = 0.05, seed: int | None = None, banned=(), min_keep: int = 0):
        self.temp, self.top_k, self.top_p, self.min_p = temp, top_k, top_p, min_p
        self.min_keep = min_keep
        if seed is None:
            seed = int(np.random.SeedSequence().generate_state(1)[0])
        self.rng = mt19937(seed)
        self.banned = np.asarray(sorted(banned), dtype=np.int64)

    def uniform(self) -> float:
        """A double in [0, 1) from two 32-bit outputs, low word first."""
        lo, hi = (float(v) for v in self.rng.random_raw(2))
        u = (lo + hi * 4294967296.0) / 18446744073709551616.0
        return u if u < 1.0 else float(np.nextafter(1.0, 0.0))

    def __call__(self, logits: np.ndarray) -> int:
        return self._greedy(logits) if self.temp <= 0.0 else self.chain(logits)

    def chain(self, logits: np.ndarray) -> int:
        """The whole chain (the reference the greedy shortcut is tested against)."""
        x = np.array(logits, dtype=np.float32)      # a copy: the stages change it
        if self.banned.size:
            x[self.banned] = -np.inf
        ids = np.arange(x.size)
        ordered = False              # candidates sorted by falling logit
        # top-k
        if self.top_k > 0:
            k = min(self.top_k, x.size)
            top = np.argpartition(-x, k - 1)[:k] if k < x.size else ids
            top = top[np.lexsort((top, -x[top]))]
            ids, x, ordered = ids[top], x[top], True
        # top-p: the F32 soft-max of the candidates in list order, then the shortest
        # prefix of the sorted ones whose F32 running sum reaches p
        if self.top_p < 1.0:
            p = self._softmax(x, ordered)
            if not ordered:
                order = np.lexsort((ids, -x))
                ids, x, p, ordered = ids[order], x[order], p[order], True
            cum = np.cumsum(p, dtype=np.float32)
            hit = np.nonzero((cum >= np.float32(self.top_p)) & (np.arange(1, x.size + 1) >= self.min_keep))[0]
            n = int(hit[0]) + 1 if hit.size else x.size
            ids, x = ids[:n], x[:n]
        # min-p: logits at least max + log(p)
        if self.min_p > 0.0 and x.size:
            floor = np.float32(x.max() if not ordered else x[0]) + np.float32(np.log(np.float32(self.min_p)))
            keep = x >= floor
            if ordered or not keep.any() or keep.sum() < self.min_keep:
                if not ordered:
                    order = np.lexsort((ids, -x))
                    ids, x, ordered = ids[order], x[order], True
                keep = x >= floor
                n = max(1, int(np.argmin(keep)) if not keep.all() else x.size, self.min_keep)
                ids, x = ids[:n], x[:n]
            else:
                ids, x = ids[keep], x[keep]
        # temperature (<= 0: the first highest logit only)
        if self.temp <= 0.0:
            best = int(np.argmax(x))
            x = np.full_like(x, -np.inf)
            x[best] = 0.0
        else:
            x = x / np.float32(self.temp)
        # the draw
        u = self.uniform()
        if x.size == 1:
            return int(ids[0])
        p = np.exp(x - (x[0] if ordered else x.max()), dtype=np.float32).astype(np.float64)
        run = np.cumsum(p)
        i = int(np.searchsorted(run, run[-1] * u, side="left"))
        return int(ids[min(i, x.size - 1)])

    def _greedy(self, logits: np.ndarray) -> int:
        """What the chain gives at temperature <= 0, without it: every stage keeps
        the highest logit first (ties: the lowest id, unless more tie than top-k
        keeps, where the chain's pick is arbitrary), so it is the first highest
        one; the draw still happens, to keep the seeded sequence. A step of
        several sequences samples each, so this is on its critical path: the
        chain's sorts over a 150k vocabulary take milliseconds."""
        x = np.asarray(logits, dtype=np.float32)
        if self.banned.size:
            x = x.copy()
            x[self.banned] = -np.inf
        self.uniform()
        return int(np.argmax(x))

    @staticmethod
    def _softmax(x: np.ndarray, ordered: bool) -> np.ndarray:
        """F32 probabilities of `x`, the sum taken in list order as llama.cpp does."""
        e = np.exp(x - (x[0] if ordered else x.max()), dtype=np.float32)
        return e / np.cumsum(e, dtype=np.float32)[-1]
