"""The KV cache of one sequence as llama.cpp fills it (its llama-kv-cache): a cell
per context position in full-attention layers, a ring of cells in sliding-window
layers (SwaCells), and each step's cache inputs: the cells the new tokens take and
the masks of what they may attend."""
from __future__ import annotations

import numpy as np

from .gguf_file import ModelError
from .hparams import HParams

KV_PAD = 256          # llama.cpp pads the attended cache cells to a multiple of this


class SwaCells:
    """The cells of a sliding-window layer's KV cache, filled as llama.cpp fills them
    for one sequence: `size` cells (n_swa + a micro-batch, rounded up to 256, at most
    the context) used as a ring. A new token takes the next cell from the head that
    is empty or holds a position the window has left behind (measured from the
    newest position before the batch); overwriting a position also drops every
    older one still in the cache. The attention reads the cells in cell order, so
    the same layout gives llama.cpp's sums."""

    def __init__(self, size: int, n_swa: int):
        self.size, self.n_swa = size, n_swa
        self.pos = np.full(size, -1, np.int64)    # the position in each cell (-1: empty)
        self.head = 0

    def reset(self) -> None:
        self.pos[:] = -1
        self.head = 0

    def place(self, positions: np.ndarray) -> np.ndarray:
        """The cells of the new tokens (they take them at once)."""
        pos, n = self.pos, len(positions)
        full = pos >= 0
        newest = int(pos.max())
        head = 0 if self.head > int(full.sum()) + 2 * n else self.head
        cells: list[int] = []
        for _ in range(self.size):
            if head >= self.size:
                head = 0
            if pos[head] < 0 or newest + 1 - pos[head] >= self.n_swa:
                cells.append(head)
                if len(cells) == n:
                    break
            head += 1
        else:
            raise ModelError(f"no room for {n} tokens in a sliding-window cache of {self.size} cells")
        idx = np.asarray(cells, np.int64)
        dropped = int(pos[idx].max())
        pos[idx] = positions
        if dropped >= 0:      # keep the positions in the cache contiguous
            pos[(pos >= 0) & (pos <= dropped)] = -1
        self.head = cells[-1] + 1
        return idx

    def n_kv(self) -> int:
        """The cells a step attends: up to the last used one, rounded up to KV_PAD."""
        used = np.nonzero(self.pos >= 0)[0]
        last = int(used[-1]) + 1 if used.size else 0
        return min(self.size, max(KV_PAD, -(-last // KV_PAD) * KV_PAD))

    def mask(self, positions: np.ndarray, n_kv: int) -> np.ndarray:
        """0 where a token may attend a cell, -inf elsewhere: (tokens, n_kv)."""
        cell = self.pos[:n_kv][None, :]
        p = positions.astype(np.int64)[:, None]
        keep = (cell >= 0) & (cell <= p) & (p - cell < self.n_swa)
        return np.where(keep, 0.0, -np.inf)


class KVCache:
    """The cells of every layer (F16 K and V rows of n_embd_kv): full-attention
    layers one per context position, sliding-window layers the window plus a
    micro-batch, rounded up to KV_PAD (llama.cpp's SWA cache, `swa`). Without flash
    attention the V cache is transposed (llama.cpp's layout)."""

    def __init__(self, hp: HParams, n_ctx: int, n_ubatch: int, flash_attn: bool):
        self.hp, self.n_ctx, self.flash_attn = hp, n_ctx, flash_attn
        self.swa = (SwaCells(min(n_ctx, -(-min(n_ctx, hp.n_swa + n_ubatch) // KV_PAD) * KV_PAD), hp.n_swa)
                    if hp.n_swa else None)

    def cells(self, il: int) -> int:
        """The KV cache cells of layer il."""
        return self.swa.size if self.swa is not None and self.hp.is_swa(il) else self.n_ctx

    def largest(self, n_ubatch: int) -> tuple:
        """The graph key of the largest step: a full micro-batch attending every cell."""
        return (n_ubatch, self.n_ctx, 1, self.swa.size if self.swa else 0)

    def reset(self) -> None:
        if self.swa is not None:
            self.swa.reset()

    def save(self):
        """What a failed step must put back (the ring's cells: a step takes them first)."""
        return (self.swa.pos.copy(), self.swa.head) if self.swa is not None else None

    def restore(self, saved) -> None:
        if saved is not None:
            self.swa.pos[:], self.swa.head = saved

    def inputs(self, tokens: list[int], n_past: int) -> tuple[tuple, dict]:
        """A step's graph key (new tokens, attended cells, output rows, attended
        sliding-window cells) and input values: positions, cache cells, masks."""
        T, p0 = len(tokens), n_past
        n_kv = min(self.n_ctx, max(KV_PAD, -(-(p0 + T) // KV_PAD) * KV_PAD))
        pos = np.arange(p0, p0 + T, dtype=np.int32)
        mask_type = np.float16 if self.flash_attn else np.float32
        values = {"inp_tokens": np.asarray(tokens, np.int32), "inp_pos": pos,
                  "out_ids": np.asarray([T - 1], np.int32)}

        def cells(prefix: str, idx: np.ndarray, n_cells: int, mask: np.ndarray, suffix: str = ""):
            values["k_idxs" + suffix] = idx
            if self.flash_attn:
                values["v_idxs" + suffix] = idx
            else:   # one index per element of the transposed V cache, token-major
                chan = np.arange(self.hp.n_embd_kv, dtype=np.int64) * n_cells
                values["v_idxs" + suffix] = (chan[None, :] + idx[:, None]).reshape(-1)
            values[prefix + suffix] = mask.astype(mask_type)

        cells("kq_mask", pos.astype(np.int64), self.n_ctx,
              np.where(np.arange(n_kv)[None, :] <= pos[:, None], 0.0, -np.inf))
        n_kv_swa = 0
        if self.swa is not None:
            idx = self.swa.place(pos)
            n_kv_swa = self.swa.n_kv()
            cells("kq_mask", idx, self.swa.size, self.swa.mask(pos, n_kv_swa), "_swa")
        return (T, n_kv, 1, n_kv_swa), values
