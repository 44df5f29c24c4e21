"""`Model.warm_up`: llama.cpp's warm-up step (the vocabulary's BOS and EOS), run and
forgotten, leaves no trace: the logits after it are those of a cold start, bit for
bit, and it refuses to run over a context."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlrpc.llm import synth
from ggmlrpc.llm.model import Model


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return synth.write_llama(tmp_path_factory.mktemp("warm") / "m.gguf",
                             synth.LlamaShape(n_layer=2, n_embd=128, n_ff=256, n_head=4, n_head_kv=2, n_ctx=256),
                             "f32", seed=1)


def test_the_logits_after_a_warm_up_are_a_cold_starts(model_path):
    runs = []
    for warm in (False, True):
        with Model.load(model_path, n_ctx=256) as m:
            if warm:
                m.warm_up()
                assert m.seq.n_past == 0 and (m.kv.full.seq == -1).all()     # every cell free again
            runs.append((m.eval(list(range(5, 40))).copy(), m.eval([7]).copy()))
    (a0, a1), (b0, b1) = runs
    assert np.array_equal(a0, b0) and np.array_equal(a1, b1)


def test_a_warm_up_over_a_context_is_refused(model_path):
    with Model.load(model_path, n_ctx=256) as m:
        m.eval([3, 4, 5])
        with pytest.raises(ValueError, match="empty sequence 0"):
            m.warm_up()
        assert m.seq.n_past == 3
