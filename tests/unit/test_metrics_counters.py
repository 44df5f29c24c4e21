"""The per-command counters of ggmlrpc.metrics: native and pure-Python twins alike."""
from __future__ import annotations

import pytest

from ggmlrpc.metrics import LATENCY_BUCKETS, PyCommandCounters, command_counters
from ggmlrpc.protocol import CMD_COUNT, HEADER

NB = len(LATENCY_BUCKETS) + 1


@pytest.fixture(params=["native", "python"])
def make(request):
    def make(dispatch):
        c = command_counters(dispatch, native=request.param == "native")
        assert isinstance(c, PyCommandCounters) == (request.param == "python")
        return c
    return make


def test_counts_what_dispatch_ran(make, seed):
    import random
    rng = random.Random(seed)
    ran = []
    c = make(lambda cmd, size: ran.append((cmd, size)))
    calls = [(rng.randrange(CMD_COUNT), rng.randrange(1 << 40)) for _ in range(500)]
    for cmd, size in calls:
        c.dispatch(cmd, size)
    assert ran == calls                                  # arguments passed through unchanged
    count, rx, _, hist = c.snapshot()
    for cmd in range(CMD_COUNT):
        mine = [size for k, size in calls if k == cmd]
        assert count[cmd] == len(mine)
        assert rx[cmd] == len(mine) * HEADER.size + sum(mine)
        assert sum(hist[cmd * NB:(cmd + 1) * NB]) == len(mine)   # one bucket each
    assert len(hist) == CMD_COUNT * NB


def test_a_command_that_raises_is_not_counted(make):
    def dispatch(cmd, size):
        if cmd == 3:
            raise ValueError("bad request")
    c = make(dispatch)
    c.dispatch(2, 10)
    with pytest.raises(ValueError, match="bad request"):
        c.dispatch(3, 10)
    count, rx, _, hist = c.snapshot()
    assert count[2] == 1 and count[3] == 0 and rx[3] == 0 and sum(hist) == 1


def test_native_limits():
    from ggmlrpc._native.counters import CommandCounters
    with pytest.raises(ValueError):
        CommandCounters(print, 33, [1], 9)
    with pytest.raises(ValueError):
        CommandCounters(print, 4, list(range(1, 33)), 9)
