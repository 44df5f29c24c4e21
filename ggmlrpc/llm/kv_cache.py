"""The KV cache of several sequences as llama.cpp's unified cache fills it (its
llama-kv-cache): every cell holds one token's K and V rows, tagged with its
sequence and position. Full-attention layers have a cell per context position,
shared by all sequences; sliding-window layers a ring of cells (Cells with a
window). Each step's cache inputs: the cells the new tokens take and the masks of
what they may attend (cells of their own sequence at positions up to their own,
within the window where there is one). A model with a recurrent state keeps
one state slot per sequence (RecurrentSlots)."""
from __future__ import annotations

import numpy as np

from .gguf_file import ModelError
from .hparams import HParams

KV_PAD = 256          # llama.cpp pads the attended cache cells to a multiple of this


class Cells:
    """The cells of one kind of layer, filled as llama.cpp fills them: a new token
    takes the first usable cell from the head on (wrapping), one that is empty or,
    with a window (`n_swa` > 0), holds a position the window of its sequence has
    left behind (measured from that sequence's newest position before the batch);
    overwriting a sequence's position also drops its older ones still in the cache.
    Removing a sequence's cells moves the head back to the first freed one. The
    attention reads the cells in cell order, so the same layout gives llama.cpp's
    sums."""

    def __init__(self, size: int, n_swa: int = 0, chunked: bool = False, regions: int = 1):
        self.size, self.n_swa, self.chunked = size, n_swa, chunked
        self.pos = np.full(size, -1, np.int64)    # the position in each cell (-1: empty)
        self.seq = np.full(size, -1, np.int64)    # the sequence of each cell (-1: empty)
        self.head = 0
        # regions > 1 (full attention only): each sequence's cells in a region of its
        # own (see place_regions)
        self.span = size // regions // 16 * 16 if regions > 1 and not n_swa else 0
        self.regions = regions if self.span else 1
        self.region_of: dict[int, int] = {}      # sequence -> its region
        self.last_of: dict[int, int] = {}        # sequence -> its last cell (the next go on from it)

    def reset(self) -> None:
        self.pos[:] = -1
        self.seq[:] = -1
        self.head = 0
        self.region_of.clear()
        self.last_of.clear()

    def save(self):
        return self.pos.copy(), self.seq.copy(), self.head, dict(self.region_of), dict(self.last_of)

    def restore(self, saved) -> None:
        self.pos[:], self.seq[:], self.head, self.region_of, self.last_of = saved

    def place(self, positions: np.ndarray, seqs: np.ndarray | None = None) -> np.ndarray:
        """The cells of the new tokens (they take them at once)."""
        pos, seq, n = self.pos, self.seq, len(positions)
        seqs = np.zeros(n, np.int64) if seqs is None else np.asarray(seqs, np.int64)
        if self.regions > 1:
            return self.place_regions(np.asarray(positions, np.int64), seqs)
        h = self.head
        if h + n <= self.size and (pos[h:h + n] < 0).all() and h <= np.count_nonzero(pos >= 0) + 2 * n:
            # a decode step's usual case: the cells from the head on are empty, so
            # they are the first usable ones, as search() finds them
            pos[h:h + n], seq[h:h + n] = positions, seqs
            self.head = h + n
            return np.arange(h, h + n, dtype=np.int64)
        return self.search(positions, seqs)

    def place_regions(self, positions: np.ndarray, seqs: np.ndarray) -> np.ndarray:
        """place() with the cells cut into one region a sequence (llama.cpp's KV cache
        without `kv_unified` gives each sequence a stream of its own): a sequence's
        new tokens take the first empty cells of its region, from its last one on,
        so its cells lie side by side in position order, and the attention of its
        tokens reads one run of the cache rather than every few rows of all of them
        (rows that memory then serves with their neighbours). The masks are the
        unified cache's, so the sums are those of the same cells anywhere in order.
        A sequence takes the first region no other one holds (else its id's); where
        its region is full it takes cells wherever search() finds them, and goes on
        from the last of those while the cells after it are free."""
        idx = np.empty(len(positions), np.int64)
        for s in dict.fromkeys(seqs.tolist()):
            mine = np.nonzero(seqs == s)[0]
            r = self.region_of.get(s)
            if r is None:
                held = set(self.region_of.values())
                r = next((k for k in range(self.regions) if k not in held), s % self.regions)
                self.region_of[s] = r
            lo = r * self.span
            hi = lo + self.span if r < self.regions - 1 else self.size
            last = self.last_of.get(s, -1)
            if not (last >= 0 and self.seq[last] == s):    # not known: the last cell of s
                own = np.nonzero(self.seq == s)[0]
                last = int(own[-1]) if own.size else lo - 1
            # on from its last cell: to its region's end, or, once past it, anywhere
            start, k = last + 1, len(mine)
            stop = hi if last < hi else self.size
            if start + k <= stop and (self.pos[start:start + k] < 0).all():
                cells = np.arange(start, start + k, dtype=np.int64)
            else:
                free = np.nonzero(self.pos[lo:hi] < 0)[0]
                if len(free) < k:
                    cells = self.search(positions[mine], seqs[mine])
                    idx[mine] = cells
                    self.last_of[s] = int(cells.max())
                    continue
                cells = lo + free[:k].astype(np.int64)
            self.pos[cells], self.seq[cells] = positions[mine], s
            idx[mine] = cells
            self.last_of[s] = max(int(cells[-1]), last)
        return idx

    def search(self, positions: np.ndarray, seqs: np.ndarray) -> np.ndarray:
        """place() through the whole cache: every cell's usability, then the first."""
        pos, seq, n = self.pos, self.seq, len(positions)
        full = pos >= 0
        usable = ~full
        if self.n_swa and full.any():
            last = np.full(self.size, -1, np.int64)    # each cell's sequence's newest position
            for s in np.unique(seq[full]):
                mine = seq == s
                last[mine] = pos[mine].max()
            usable |= full & self._left(pos, last + 1)
        head = 0 if self.head > int(full.sum()) + 2 * n else self.head
        order = np.r_[head:self.size, 0:head]
        idx = order[usable[order]][:n]
        if len(idx) < n:
            raise ModelError(f"KV cache full: no room for {n} tokens in {self.size} cells")
        old, old_seq = pos[idx], seq[idx]
        for s in np.unique(old_seq[old >= 0]):   # keep each sequence's positions contiguous
            drop = (seq == s) & (pos <= old[old_seq == s].max())
            pos[drop], seq[drop] = -1, -1
        pos[idx], seq[idx] = positions, seqs
        self.head = int(idx[-1]) + 1
        return idx.astype(np.int64)

    def remove(self, s: int, p0: int = 0) -> None:
        """Free sequence s's cells at positions >= p0."""
        gone = np.nonzero((self.seq == s) & (self.pos >= p0))[0]
        self.pos[gone], self.seq[gone] = -1, -1
        if s in self.region_of and not (self.seq == s).any():
            del self.region_of[s]
            self.last_of.pop(s, None)
        if not (self.pos >= 0).any():
            self.head = 0
        elif gone.size:
            self.head = min(self.head, int(gone[0]))

    def n_kv(self) -> int:
        """The cells a step attends: up to the last used one, rounded up to KV_PAD."""
        used = np.nonzero(self.pos >= 0)[0]
        last = int(used[-1]) + 1 if used.size else 0
        return min(self.size, max(KV_PAD, -(-last // KV_PAD) * KV_PAD))

    def mask(self, positions: np.ndarray, n_kv: int, seqs: np.ndarray | None = None,
             dtype=np.float64) -> np.ndarray:
        """0 where a token may attend a cell, -inf elsewhere: (tokens, n_kv) of `dtype`
        (made in it: a prompt's micro-batch over a full cache is millions of cells)."""
        cell, cseq = self.pos[:n_kv][None, :], self.seq[:n_kv][None, :]
        p = positions.astype(np.int64)[:, None]
        s = np.zeros_like(p) if seqs is None else np.asarray(seqs, np.int64)[:, None]
        keep = (cseq == s) & (cell >= 0) & (cell <= p)
        if self.n_swa:
            keep &= ~self._left(cell, p)
        return np.where(keep, dtype(0), dtype(-np.inf))

    def _left(self, p0: np.ndarray, p1) -> np.ndarray:
        """Whether position p0 is out of the window of position p1: n_swa or more
        before it, or (chunked) before p1's chunk of n_swa positions."""
        if self.chunked:
            return p0 < p1 // self.n_swa * self.n_swa
        return p1 - p0 >= self.n_swa


SwaCells = Cells


class RecurrentSlots:
    """Which of the `n_seq` recurrent state slots each sequence holds (llama.cpp's
    recurrent memory keeps one state cell per sequence too): a sequence takes the
    first free slot with its first token, and frees it when it forgets its context.
    A micro-batch of several sequences gives each the same number of tokens, one
    sequence after the other (llama.cpp's equal split), so that the recurrent layers
    see (tokens, sequences); its graph reads and writes the slots it names."""

    def __init__(self, n_seq: int):
        self.n_seq = n_seq
        self.of: dict[int, int] = {}      # sequence -> its slot

    def take(self, seqs: np.ndarray, pos: np.ndarray) -> tuple[tuple, list[int], list[int]]:
        """The key part of a micro-batch (its number of sequences, and the slot when it
        is one: that graph uses the slot in place), the slot of each of its
        sequences, and the slots whose sequence starts here (to be zeroed)."""
        order = [int(seqs[0])] if seqs[0] == seqs[-1] else list(dict.fromkeys(seqs.tolist()))
        n_t = len(seqs) // len(order)
        if n_t * len(order) != len(seqs) or len(seqs) > 1 and (seqs != np.repeat(order, n_t)).any():
            raise ValueError("a micro-batch of a recurrent model gives each sequence as many tokens, in turn")
        for s in order:
            if s not in self.of:
                free = sorted(set(range(self.n_seq)) - set(self.of.values()))
                if not free:
                    raise ModelError(f"every recurrent state slot is taken ({self.n_seq} sequences at most: "
                                     "load the model with a larger n_seq, llama.cpp's -np)")
                self.of[s] = free[0]
        slots = [self.of[s] for s in order]
        zero = [slots[k] for k in range(len(order)) if pos[k * n_t] == 0]
        return (len(order), slots[0] if len(order) == 1 else -1), slots, zero

    def remove(self, s: int, p0: int) -> None:
        if p0 == 0:
            self.of.pop(s, None)


class KVCache:
    """The cells of every layer (F16 K and V rows of n_embd_kv): full-attention
    layers one per context position, sliding-window layers the window of each of
    `n_seq` sequences plus a micro-batch, rounded up to KV_PAD (llama.cpp's unified
    SWA cache, `swa`). Without flash attention the V cache is transposed
    (llama.cpp's layout). `recurrent`: the model keeps a recurrent state, one slot
    per sequence (`slots`)."""

    def __init__(self, hp: HParams, n_ctx: int, n_ubatch: int, flash_attn: bool, n_seq: int = 1,
                 recurrent: bool = False):
        self.hp, self.n_ctx, self.flash_attn, self.n_seq = hp, n_ctx, flash_attn, n_seq
        self.slots = RecurrentSlots(n_seq) if recurrent else None
        # with flash attention, each sequence's cells in a region of its own: its keys
        # one run of the cache (without it every step's products span all the cells
        # attended, so the unified cache's packing is cheaper)
        self.full = Cells(n_ctx, regions=n_seq if flash_attn else 1)
        swa = min(n_ctx, hp.n_swa * n_seq + n_ubatch)
        self.swa = (Cells(min(n_ctx, -(-swa // KV_PAD) * KV_PAD), hp.n_swa, hp.swa_chunked)
                    if hp.n_swa else None)
        self._all = [c for c in (self.full, self.swa) if c is not None]

    def cells(self, il: int) -> int:
        """The KV cache cells of layer il."""
        return self.swa.size if self.swa is not None and self.hp.is_swa(il) else self.n_ctx

    def largest(self, n_ubatch: int) -> tuple:
        """The graph key of the largest step: a full micro-batch attending every cell
        (of one sequence, where the model has a recurrent state)."""
        return (n_ubatch, self.n_ctx, min(self.n_seq, n_ubatch), self.swa.size if self.swa else 0,
                (1, 0) if self.slots else ())

    def reset(self) -> None:
        for c in self._all:
            c.reset()
        if self.slots:
            self.slots.of.clear()

    def remove(self, s: int, p0: int = 0) -> None:
        """Free sequence s's cells at positions >= p0 (and its state slot with p0 = 0)."""
        for c in self._all:
            c.remove(s, p0)
        if self.slots:
            self.slots.remove(s, p0)

    def save(self):
        """What a failed step must put back (a step takes its cells first)."""
        return [c.save() for c in self._all], self.slots and dict(self.slots.of)

    def restore(self, saved) -> None:
        cells, slots = saved
        for c, s in zip(self._all, cells):
            c.restore(s)
        if self.slots:
            self.slots.of = slots

    def inputs(self, tokens, pos, seqs, out) -> tuple[tuple, dict]:
        """A step's graph key (new tokens, attended cells, output rows, attended
        sliding-window cells, RecurrentSlots.take's key part) and input values:
        positions, cache cells, masks, state slots. Token i is sequence seqs[i]'s at
        position pos[i]; `out`: the rows whose logits come back."""
        T = len(tokens)
        pos = np.asarray(pos, np.int32)
        seqs = np.asarray(seqs, np.int64)
        mask_type = np.float16 if self.flash_attn else np.float32
        values = {"inp_tokens": np.asarray(tokens, np.int32), "inp_pos": pos,
                  "out_ids": np.asarray(out, np.int32),
                  # M-RoPE's four positions of text tokens: three times each position, then zeros
                  "inp_pos_4": np.concatenate([pos, pos, pos, np.zeros_like(pos)])}

        def cells(c: Cells, suffix: str = "") -> int:
            idx = c.place(pos, seqs)
            n_kv = c.n_kv()
            values["k_idxs" + suffix] = idx
            if self.flash_attn:
                values["v_idxs" + suffix] = idx
            else:   # one index per element of the transposed V cache, token-major
                chan = np.arange(self.hp.v_width(c is self.swa), dtype=np.int64) * c.size
                values["v_idxs" + suffix] = (chan[None, :] + idx[:, None]).reshape(-1)
            values["kq_mask" + suffix] = c.mask(pos, n_kv, seqs, mask_type)
            return n_kv

        rs: tuple = ()
        if self.slots:
            rs, slots, values["rs_zero"] = self.slots.take(seqs, pos)
            values["rs_slots"] = np.asarray(slots, np.int32)
        n_kv = cells(self.full)
        n_kv_swa = cells(self.swa, "_swa") if self.swa is not None else 0
        if self.hp.attn_temp_scale:
            values["inp_attn_scale"] = attn_scale(self.hp, pos)
        return (T, n_kv, len(out), n_kv_swa, rs), values


def attn_scale(hp: HParams, pos: np.ndarray) -> np.ndarray:
    """The temperature tuning's query scale of each position, (1, 1, T) F32, as
    llama.cpp computes it (the quotient in F32, the logarithm in double)."""
    f32 = np.float32
    q = np.floor((pos.astype(f32) + f32(hp.attn_temp_offset)) / f32(hp.attn_temp_floor))
    s = np.log(q.astype(np.float64) + 1.0) * float(f32(hp.attn_temp_scale)) + 1.0
    return s.astype(f32).reshape(1, 1, -1)
