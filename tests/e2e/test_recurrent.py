"""Architectures with a recurrent state beside their layers (qwen3next): the state
starts from zero with every sequence, carries over from step to step wherever the
layers run, and cannot go back, so what needs it to (a second sequence, a context
cut short) is refused with a clear error."""
from __future__ import annotations

import pytest

from ggmlrpc.llm import synth
from ggmlrpc.llm.archs import ARCHS
from ggmlrpc.llm.gguf_file import ModelError
from ggmlrpc.llm.model import Model
from ggmlrpc.llm.sampling import Sampler
from tests.conftest import start_server
from tests.e2e.test_runner import arch_shape

RECURRENT = [a.name for a in ARCHS.values() if a.state]
PROMPT = "the old fisherman lived in a small village by the sea"


def greedy(m: Model, n: int = 8) -> list[int]:
    return [t for t, _ in m.stream(m.tokenize(PROMPT), n, Sampler(temp=0))]


@pytest.fixture(params=RECURRENT)
def model_path(request, tmp_path):
    return synth.write_model(tmp_path / "m.gguf", request.param, arch_shape(request.param, 64), "f32", seed=3)


def test_state_restarts_and_carries_over(model_path):
    """A second generation gives the first one's tokens (the state was zeroed); a
    prompt run token by token gives the tokens of the prompt run at once; a server
    holding the recurrent layers gives the same."""
    with Model.load(model_path, n_gpu_layers=0) as m:
        first = greedy(m)
        assert greedy(m) == first
        ids = m.tokenize(PROMPT)
        m.reset()
        for t in ids:
            logits = m.eval([t])
        assert int(logits.argmax()) == first[0]
        # prefill keeps a context it extends; a divergent one starts over
        m.prefill(ids + first[:2])
        assert m.n_past == len(ids) + 2
        assert int(m.prefill(ids[:3] + [first[0]]).argmax()) >= 0 and m.n_past == 4
    srv = start_server()
    try:
        with Model.load(model_path, rpc=[f"127.0.0.1:{srv.port}"], n_gpu_layers=99) as m:
            assert greedy(m) == first
    finally:
        srv.close()


def test_one_sequence_only(model_path):
    with pytest.raises(ModelError, match="one sequence only"):
        Model.load(model_path, n_gpu_layers=0, n_seq=2)
    with Model.load(model_path, n_gpu_layers=0) as m:
        with pytest.raises(ModelError, match="one sequence only"):
            m.new_sequence()
        m.eval(m.tokenize(PROMPT))
        with pytest.raises(ModelError, match="recurrent state cannot drop"):
            m.truncate(2)



def test_missing_delta_net_sizes(tmp_path, capsys, monkeypatch):
    """A file without its delta net's state size: one error line from the runner."""
    import gguf

    from ggmlrpc.cli.main import main

    monkeypatch.setattr(gguf.GGUFWriter, "add_ssm_state_size", lambda self, n: None)
    bad = synth.write_model(tmp_path / "bad.gguf", "qwen3next", arch_shape("qwen3next", 64), "f32", seed=3)
    assert main(["run", "-m", str(bad), "-p", "x", "-n", "1"]) != 0
    err = capsys.readouterr().err
    assert err.startswith("error:") and "ssm" in err and "Traceback" not in err
