"""The sampler chain's pieces: the C++ Mersenne Twister and its doubles, greedy
ties, and the cuts of top-k, top-p and min-p (the whole chain against
llama-completion is in tests/interop/test_runner_vs_llama_completion.py)."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlrpc.llm.sampling import Sampler, mt19937


def test_mersenne_twister_is_the_cpp_one():
    bg = mt19937(5489)              # std::mt19937's default seed
    assert list(bg.random_raw(3)) == [3499211612, 581869302, 3890346734]
    bg.random_raw(9996)
    assert bg.random_raw() == 4123659995   # the 10000th output, as the C++ standard requires
    # uniform_real_distribution<double>(0, 1) over std::mt19937(42), printed by a C++ program
    s = Sampler(seed=42)
    assert [s.uniform() for _ in range(3)] == [0.796542984287846, 0.18343478789336848, 0.7796909976126613]


def test_greedy_takes_the_first_highest_and_skips_banned():
    logits = np.array([0.5, 2.0, 2.0, -1.0], np.float32)
    assert Sampler(temp=0, seed=1)(logits) == 1
    assert Sampler(temp=0, seed=1, banned=[1])(logits) == 2
    assert Sampler(temp=0.8, top_k=1, seed=1)(logits) == 1


def test_cuts_leave_only_likely_tokens():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=1000).astype(np.float32)
    logits[[10, 20]] = 30.0, 29.0       # two tokens hold almost all the probability
    picks = {Sampler(temp=1.0, top_k=0, top_p=0.9, min_p=0.0, seed=s)(logits) for s in range(50)}
    assert picks <= {10, 20} and 10 in picks
    picks = {Sampler(temp=1.0, top_k=0, top_p=1.0, min_p=0.5, seed=s)(logits) for s in range(50)}
    assert picks <= {10, 20}
    picks = {Sampler(temp=1.0, top_k=3, top_p=1.0, min_p=0.0, seed=s)(logits) for s in range(200)}
    assert len(picks) <= 3


def test_one_draw_per_token():
    """llama.cpp draws once per sampled token, greedy or not: the stream stays aligned."""
    a, b = Sampler(temp=0, seed=9), Sampler(temp=1.0, seed=9)
    x = np.zeros(8, np.float32)
    a(x)
    b(x)
    assert a.uniform() == b.uniform()


@pytest.mark.parametrize("seed", range(20))
def test_greedy_shortcut_is_the_chain(seed):
    """At temperature 0 the sampler skips the chain's sorts; it picks what the chain
    picks (three tied highest logits: the lowest id, as long as top-k keeps them
    all) and draws as often."""
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal(3000).round(1).astype(np.float32)
    logits[rng.choice(3000, 3, replace=False)] = logits.max()
    banned = np.flatnonzero(logits == logits.max())[:1] if seed % 2 else ()
    for top_k, top_p, min_p in ((40, 0.95, 0.05), (0, 1.0, 0.0), (10, 0.5, 0.9)):
        a = Sampler(0.0, top_k, top_p, min_p, seed=seed, banned=banned)
        b = Sampler(0.0, top_k, top_p, min_p, seed=seed, banned=banned)
        assert [a(logits) for _ in range(3)] == [b.chain(logits) for _ in range(3)]
        assert a.uniform() == b.uniform()
