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
