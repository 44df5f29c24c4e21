"""The sliding-window KV cache's cells, filled as llama.cpp fills them: a ring that
reuses cells whose positions left the window, the cells a step attends, the mask."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ggmlrpc.llm.gguf_file import ModelError
from ggmlrpc.llm.model import SwaCells


def test_cells_fill_in_order_then_wrap_into_the_window():
    c = SwaCells(256, 8)
    assert list(c.place(np.arange(0, 200))) == list(range(200))
    assert c.n_kv() == 256
    assert list(c.place(np.arange(200, 256))) == list(range(200, 256))
    # full: the next token takes cell 0, whose position 0 is far out of the window
    assert list(c.place(np.array([256]))) == [0]
    assert c.pos[0] == 256 and c.pos[1] == 1
    assert list(c.place(np.array([257, 258]))) == [1, 2]


def test_mask_keeps_the_window_and_causality():
    c = SwaCells(256, 4)
    c.place(np.arange(0, 6))
    m = c.mask(np.array([5]), 8)
    assert list(np.isfinite(m[0])) == [False, False, True, True, True, True, False, False]
    c.reset()
    assert c.n_kv() == 256 and (c.pos == -1).all()


def test_a_batch_larger_than_the_cache_fails():
    with pytest.raises(ModelError):
        SwaCells(4, 2).place(np.arange(5))


def test_overwriting_drops_older_positions():
    """After position p is overwritten every position up to p is gone, so the positions
    left in the cache stay contiguous."""
    c = SwaCells(8, 2)
    c.place(np.arange(0, 8))
    c.head = 3                       # a head left mid-ring (after a freed range)
    idx = c.place(np.array([8]))
    assert list(idx) == [3]
    assert list(c.pos) == [-1, -1, -1, 8, 4, 5, 6, 7]


def test_sequences_attend_only_their_own_cells():
    c = SwaCells(16, 0)              # full attention: no window
    a = c.place(np.arange(0, 3), np.zeros(3))
    b = c.place(np.arange(0, 2), np.ones(2))
    assert list(a) == [0, 1, 2] and list(b) == [3, 4]
    m = c.mask(np.array([2, 1]), 8, np.array([0, 1]))
    assert list(np.isfinite(m[0])) == [True, True, True, False, False, False, False, False]
    assert list(np.isfinite(m[1])) == [False, False, False, True, True, False, False, False]


def test_removing_a_sequence_frees_its_cells_and_moves_the_head_back():
    c = SwaCells(16, 0)
    c.place(np.arange(0, 3), np.zeros(3))
    c.place(np.arange(0, 2), np.ones(2))
    c.place(np.array([3]), np.zeros(1))
    c.remove(0, 1)                       # sequence 0 keeps position 0
    assert list(c.pos[:6]) == [0, -1, -1, 0, 1, -1] and c.head == 1
    assert list(c.place(np.arange(2, 5), np.ones(3))) == [1, 2, 5]   # first fit from the head
    c.remove(0)
    c.remove(1)
    assert c.head == 0 and (c.pos < 0).all()


def test_each_sequence_slides_its_own_window():
    """A cell is reused once the window of its own sequence has left it behind."""
    c = SwaCells(8, 2)
    c.place(np.arange(0, 4), np.zeros(4))          # cells 0-3: sequence 0 at 0..3
    c.place(np.arange(0, 4), np.ones(4))           # cells 4-7: sequence 1 at 0..3
    c.remove(1, 2)                                 # sequence 1 back to 0..1: cells 6, 7 free, head 6
    assert c.head == 6
    # cells 6, 7 are free; then cell 0 (position 0 of sequence 0, out of its window)
    assert list(c.place(np.array([4, 5, 2]), np.array([0, 0, 1]))) == [6, 7, 0]
    assert list(c.pos) == [2, 1, 2, 3, 0, 1, 4, 5] and list(c.seq) == [1, 0, 0, 0, 1, 1, 0, 0]
    # from the head (cell 1): sequence 0's position 1, out of its window (newest 5)
    assert list(c.place(np.array([6]), np.array([0]))) == [1]
    assert list(c.pos) == [2, 6, 2, 3, 0, 1, 4, 5]


def test_chunked_window_keeps_the_chunk_and_reuses_the_last_ones():
    """llama4's chunks of n_swa positions: a token attends its own chunk only, and a
    full cache reuses the cells of the chunks before the newest position's."""
    c = SwaCells(16, 4, chunked=True)
    c.place(np.arange(0, 10))
    m = c.mask(np.array([5, 8, 9]), 16)
    assert [list(np.nonzero(np.isfinite(r))[0]) for r in m] == [[4, 5], [8], [8, 9]]
    c.place(np.arange(10, 16))
    # newest position 15 (+1 = 16): chunk 16.. has begun, every cell is reusable, first the head's
    assert list(c.place(np.array([16, 17]))) == [0, 1]


@settings(max_examples=200, deadline=None)
@given(size=st.sampled_from([8, 16, 64]), n_swa=st.sampled_from([0, 3, 8]), chunked=st.booleans(),
       ops=st.lists(st.tuples(st.sampled_from(["place", "remove", "cut"]), st.integers(0, 3),
                              st.integers(1, 6)), max_size=40))
def test_place_finds_the_cells_the_whole_search_finds(size, n_swa, chunked, ops):
    """place()'s shortcut (the cells from the head on are empty) takes the same cells
    as the search through the whole cache, over any run of steps, removals and cuts."""
    fast, slow = SwaCells(size, n_swa, chunked), SwaCells(size, n_swa, chunked)
    nxt = {}
    for op, s, n in ops:
        if op == "place":
            p0 = nxt.get(s, 0)
            positions, seqs = np.arange(p0, p0 + n), np.full(n, s)
            try:
                got = fast.place(positions, seqs)
            except ModelError:
                with pytest.raises(ModelError):
                    slow.search(positions, seqs)
                continue
            assert list(got) == list(slow.search(positions, seqs))
            nxt[s] = p0 + n
        elif op == "remove":
            fast.remove(s), slow.remove(s)
            nxt.pop(s, None)
        else:      # drop the newest n positions of sequence s
            p1 = max(0, nxt.get(s, 0) - n)
            fast.remove(s, p1), slow.remove(s, p1)
            nxt[s] = p1
        assert (fast.pos == slow.pos).all() and (fast.seq == slow.seq).all() and fast.head == slow.head


def test_regions_give_each_sequence_one_run_of_cells():
    """With regions (a flash-attention cache of several sequences) each sequence's
    tokens take the cells of a region of its own, side by side in position order,
    whatever the other sequences do in the same steps."""
    c = SwaCells(1024, regions=4)
    nxt = {3: 0, 5: 0, 8: 0, 9: 0}
    rng = np.random.default_rng(0)
    for _ in range(60):
        chosen = [s for s in nxt if rng.random() < 0.7] or [5]
        parts = [(s, int(rng.integers(1, 9))) for s in chosen]
        pos = np.concatenate([np.arange(nxt[s], nxt[s] + k) for s, k in parts])
        seqs = np.concatenate([np.full(k, s) for s, k in parts])
        cells = c.place(pos, seqs)
        assert (c.pos[cells] == pos).all() and (c.seq[cells] == seqs).all()
        for s, k in parts:
            nxt[s] += k
    starts = []
    for s, n in nxt.items():
        mine = np.nonzero(c.seq == s)[0]
        assert (c.pos[mine] == np.arange(n)).all() and (np.diff(mine) == 1).all()
        assert mine[0] % 256 == 0
        starts.append(int(mine[0]))
    assert sorted(starts) == [0, 256, 512, 768]


def test_regions_lend_their_cells_when_one_is_full():
    """A sequence whose region is full takes cells elsewhere, so one sequence can still
    fill the whole cache; a cut frees its newest cells for its next tokens, and a
    sequence that forgets everything frees its region for the next one."""
    c = SwaCells(64, regions=4)
    cells = c.place(np.arange(40), np.full(40, 7))
    assert len(set(cells.tolist())) == 40 and list(cells[:16]) == list(range(16))
    c.place(np.arange(24), np.full(24, 2))
    assert (c.pos >= 0).all()
    with pytest.raises(ModelError):
        c.place(np.array([40]), np.array([7]))
    c.remove(7, 10)
    assert list(c.place(np.arange(10, 13), np.full(3, 7))) == [10, 11, 12]
    c.remove(7)
    assert 7 not in c.region_of
    assert c.place(np.array([0]), np.array([11]))[0] == 0


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["place", "remove", "cut"]), st.integers(0, 5),
                              st.integers(1, 9)), max_size=50))
def test_regions_mask_what_the_sequences_hold(ops):
    """Over any run of steps, removals and cuts: no two tokens in one cell, and each
    token's mask row opens exactly its own sequence's cells at positions up to its own."""
    c = SwaCells(96, regions=3)
    held: dict[int, dict[int, int]] = {}      # sequence -> position -> cell
    for op, s, n in ops:
        if op == "place":
            p0 = len(held.get(s, {}))
            pos, seqs = np.arange(p0, p0 + n), np.full(n, s)
            try:
                cells = c.place(pos, seqs)
            except ModelError:
                assert sum(map(len, held.values())) + n > 96
                continue
            held.setdefault(s, {}).update(zip(pos.tolist(), cells.tolist()))
            n_kv = c.n_kv()
            m = c.mask(pos, n_kv, seqs, np.float16)
            for i, p in enumerate(pos.tolist()):
                open_ = {cell for q, cell in held[s].items() if q <= p}
                assert set(np.nonzero(m[i] == 0)[0].tolist()) == open_
        elif op == "remove":
            c.remove(s)
            held.pop(s, None)
        else:
            p1 = max(0, len(held.get(s, {})) - n)
            c.remove(s, p1)
            held[s] = {q: cell for q, cell in held.get(s, {}).items() if q < p1}
        taken = [cell for d in held.values() for cell in d.values()]
        assert len(taken) == len(set(taken)) == int((c.pos >= 0).sum())


def test_a_sequence_past_its_region_goes_on_in_one_run():
    """One sequence of a cache with regions, longer than its region: past the region's
    end its tokens go on in the cells after its last one while they are free."""
    c = SwaCells(256, regions=4)
    for p in range(100):
        c.place(np.array([p]), np.array([3]))
    mine = np.nonzero(c.seq == 3)[0]
    assert list(mine) == list(range(100)) and list(c.pos[mine]) == list(range(100))
    assert c.place(np.array([0]), np.array([4]))[0] == 100      # the next free cell for another sequence
    assert c.place(np.array([100]), np.array([3]))[0] == 101
