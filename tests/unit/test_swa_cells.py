"""The sliding-window KV cache's cells, filled as llama.cpp fills them: a ring that
reuses cells whose positions left the window, the cells a step attends, the mask."""
from __future__ import annotations

import numpy as np
import pytest

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
