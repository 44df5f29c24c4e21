"""The token embedding on this host, a lookup of rows: each token's row is kept after
its first step, and a later step of kept tokens reads them instead of running the
embedding graph (a decode step's host work between two servers' answers)."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlrpc.llm import model as model_mod, synth
from ggmlrpc.llm.model import Model
from ggmlrpc.local import LocalBackend
from tests.conftest import start_server

PROMPT = [(5 * i + 7) % 200 + 3 for i in range(24)]
AFTER = [PROMPT[3], PROMPT[9], 211, PROMPT[9], 211]     # kept, kept, new, kept, kept (by then)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    d = tmp_path_factory.mktemp("rows")
    return synth.write_llama(d / "llama.gguf", synth.LlamaShape(n_layer=2, n_embd=64, n_ff=128, n_head=4,
                                                                 n_head_kv=2, n_ctx=256), "q8_0", seed=11)


def steps(path, eps, runs: list[int]) -> list[np.ndarray]:
    """The prompt's logits, then those of each AFTER token one step at a time; `runs`
    gets, for each of those steps, the graphs this host ran for it."""
    with Model.load(path, rpc=eps, n_ctx=256) as m:
        assert isinstance(m.stages[0].device.backend, LocalBackend) and m.stages[0].embed
        out = [m.eval(PROMPT)]
        for t in AFTER:
            before = len(ran)
            out.append(m.eval([t]))
            runs.append(len(ran) - before)
    return out


ran: list[int] = []


def test_a_kept_row_gives_the_same_logits_without_a_graph_on_this_host(model_path, monkeypatch):
    srv = start_server()
    try:
        eps = [f"127.0.0.1:{srv.port}"]
        for name in ("graph_compute", "graph_recompute"):
            orig = getattr(LocalBackend, name)
            monkeypatch.setattr(LocalBackend, name,
                                lambda self, *a, _o=orig, **k: (ran.append(1), _o(self, *a, **k))[1])
        with monkeypatch.context() as mp:      # every step runs the embedding graph
            mp.setattr(model_mod, "_row_wise", lambda st, g: False)
            runs_off: list[int] = []
            want = steps(model_path, eps, runs_off)
        runs_on: list[int] = []
        got = steps(model_path, eps, runs_on)
    finally:
        srv.close()
    assert runs_off == [1] * len(AFTER)
    assert runs_on == [0, 0, 1, 0, 0]      # only the token no step had before
    assert len(got) == len(want)
    for x, y in zip(want, got):
        assert np.array_equal(x, y)


def test_the_kept_rows_are_bounded(model_path, monkeypatch):
    """ROWS_KEPT_BYTES bounds them: past it the oldest row goes; the logits stay the same."""
    row = 64 * 4
    monkeypatch.setattr(model_mod, "ROWS_KEPT_BYTES", 5 * row)
    srv = start_server()
    try:
        with Model.load(model_path, rpc=[f"127.0.0.1:{srv.port}"], n_ctx=256) as m:
            a = m.eval(PROMPT[:8])
            assert list(m._token_rows) == PROMPT[3:8]
            assert all(len(v) == row for v in m._token_rows.values())
            b = m.eval([PROMPT[0]])          # gone: the graph runs again, and keeps it
            assert list(m._token_rows) == PROMPT[4:8] + [PROMPT[0]]
    finally:
        srv.close()
    srv = start_server()
    try:
        monkeypatch.setattr(model_mod, "_row_wise", lambda st, g: False)
        with Model.load(model_path, rpc=[f"127.0.0.1:{srv.port}"], n_ctx=256) as m:
            assert np.array_equal(m.eval(PROMPT[:8]), a)
            assert np.array_equal(m.eval([PROMPT[0]]), b)
    finally:
        srv.close()
