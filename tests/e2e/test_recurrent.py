"""Architectures with a recurrent state beside their layers (qwen3next): the state
starts from zero with every sequence, carries over from step to step wherever the
layers run, each sequence has its own slot of it, and it cannot go back, so a
context cut short is refused with a clear error."""
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


def test_a_slot_per_sequence(model_path):
    """n_seq sequences hold a state slot each; one more is refused until one is
    closed, and the next takes the freed slot from a zero state (its tokens are the
    first sequence's). The state cannot go back: truncating into the past is
    refused as llama.cpp's recurrent memory refuses it (to 0 only), and prefill
    starts over."""
    with Model.load(model_path, n_gpu_layers=0, n_seq=2) as m:
        ids = m.tokenize(PROMPT)
        first = greedy(m)
        a, b = m.new_sequence(), m.new_sequence()
        a.eval(ids)
        with pytest.raises(ModelError, match="every recurrent state slot is taken"):
            b.eval(ids)
        assert b.n_past == 0 and m.kv.slots.of == {0: 0, a.id: 1}
        a.close()
        assert [t for t, _ in b.stream(ids, 8, Sampler(temp=0))] == first
        with pytest.raises(ModelError, match="recurrent state cannot drop"):
            b.truncate(2)
        b.truncate(0)
        assert b.n_past == 0 and b.id not in m.kv.slots.of
        m.reset()
        assert m.kv.slots.of == {}


def test_missing_delta_net_sizes(tmp_path, capsys, monkeypatch):
    """A file without its delta net's state size: one error line from the runner."""
    import gguf

    from ggmlrpc.cli.main import main

    monkeypatch.setattr(gguf.GGUFWriter, "add_ssm_state_size", lambda self, n: None)
    bad = synth.write_model(tmp_path / "bad.gguf", "qwen3next", arch_shape("qwen3next", 64), "f32", seed=3)
    assert main(["run", "-m", str(bad), "-p", "x", "-n", "1"]) != 0
    err = capsys.readouterr().err
    assert err.startswith("error:") and "ssm" in err and "Traceback" not in err
