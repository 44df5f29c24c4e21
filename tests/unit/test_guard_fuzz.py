"""The guard-page fuzzer, short (tests/guardfuzz.py; bench/fuzz.py runs it long).

Mutated single-node graphs of every op the CPU executor accepts, each tensor flush
against a PROT_NONE page, run in forked children: a kernel that touches a byte
outside what the planner approved kills its child, and the test fails with the
graph's reproducer (replay it with bench/fuzz.py --seed S --replay I)."""
from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import time

import pytest

from ggmlrpc.ggml import GGMLOp as Op
from tests import guardfuzz

GRAPHS = 40_000      # about 10-20 s on a busy two-core host
BUDGET_S = 45        # stop early rather than slow the suite down


def test_guard_pages_fault():
    """The harness itself: a read one byte before a slot, or one byte past it, kills the child."""
    slot = guardfuzz._Slot()
    for addr in (slot.addr - 1, slot.addr + guardfuzz.SLOT):
        pid = os.fork()
        if pid == 0:
            faulthandler.disable()      # the fault is expected: no stack dump from the child
            ctypes.c_char.from_address(addr).value     # noqa: B018 (the read is the point)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) in (signal.SIGSEGV, signal.SIGBUS)
    ctypes.c_char.from_address(slot.addr).value = b"x"    # inside: fine
    ctypes.c_char.from_address(slot.addr + guardfuzz.SLOT - 1).value = b"x"


def test_canaries_catch_a_write_beside_a_tensor(monkeypatch):
    """The open side of each tensor (away from its guard page) is watched too."""
    runner = guardfuzz.Runner(1)
    f32x8 = [0, [8, 1, 1, 1], [4, 32, 32, 32]]
    case = guardfuzz.Case(Op.ADD, [f32x8] * 3, [0] * 16, [False, True, True], 1, 1)
    assert runner.run(case) == "run"
    executor = runner.executors[1]
    real = executor.run

    def stray(plan, cancel=None):
        real(plan, cancel)
        ctypes.c_char.from_address(runner.slots[0].addr + 32).value = b"x"   # just past dst
    monkeypatch.setattr(executor, "run", stray)
    with pytest.raises(guardfuzz.CanaryError):
        runner.run(case)


def test_every_seeded_op_is_known():
    from ggmlrpc.compute import cpu_rules
    seeded = {s["op"] for s in guardfuzz.load_seeds()}
    assert seeded == set(cpu_rules.RULES), "run scripts/fuzz_seeds.py to record seeds of new ops"


def test_guard_page_fuzz(seed):
    t0 = time.monotonic()
    counts, failures = guardfuzz.fuzz(seed, GRAPHS, deadline=t0 + BUDGET_S)
    rate = counts["graphs"] / (time.monotonic() - t0)
    print(f"[guard fuzz] seed {seed}: {counts} ({rate:.0f} graphs/s)")
    assert not failures, f"seed {seed}, {failures[0]}"
    assert counts["graphs"] >= min(GRAPHS, 2000)
    assert counts["run"] > counts["graphs"] // 5       # the mutations still reach the kernels


def test_chains_tie_their_nodes():
    """Multi-node graphs: each link kind does what it says (the layout the runner builds)."""
    mut = guardfuzz.Mutator(guardfuzz.load_seeds())
    runner = guardfuzz.Runner(1)
    seen = set()
    for i in range(400):
        chain = mut.make_chain(7, i)
        got = runner.layout(chain)
        if got is None:
            continue
        _, tensors = got
        nodes = {t[4][0]: t for t in tensors if t[4] is not None}
        by_id = {t[0]: t for t in tensors}
        for j, s, i_, kind, at in chain.links:
            earlier, node = nodes[i_], nodes[j]
            if kind == "inplace":
                assert node[2] == earlier[2]                    # the same slot
            else:
                src = by_id[node[5][s - 1]]
                if kind == "reuse":
                    assert src[0] == earlier[0]                 # the earlier node itself
                else:
                    assert src[2] == earlier[2] and src[3] >= earlier[3] or not src[6]
                    assert src[6] in (0, earlier[0])            # a view of it (or a plain alias)
            seen.add(kind)
    assert seen == set(guardfuzz.LINKS)


def test_guard_page_fuzz_chains(seed):
    """Two- and three-node graphs: outputs reused, viewed and partly overwritten."""
    t0 = time.monotonic()
    counts, failures = guardfuzz.fuzz(seed, GRAPHS // 2, deadline=t0 + BUDGET_S // 2, chains=True)
    print(f"[guard fuzz, chains] seed {seed}: {counts}")
    assert not failures, f"seed {seed}, {failures[0]}"
    assert counts["graphs"] >= 1000
    assert counts["run"] > counts["graphs"] // 10
