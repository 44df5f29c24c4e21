"""The registry of architectures (ggmlrpc.llm.archs) is the one list: the README's
table is its table, synth writes a model of each architecture, and each such model
loads with every tensor it has placed and read by its graph."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ggmlrpc.llm import archs, synth
from ggmlrpc.llm.gguf_file import ModelError
from ggmlrpc.llm.model import SUPPORTED_ARCHS, Model

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_table_is_the_registry():
    text = README.read_text()
    table = archs.readme_table()
    assert table in text, "README's table of architectures: paste `python -m ggmlrpc.llm.archs`"
    listed = [line.split("`")[1] for line in text.splitlines() if line.startswith("| `")
              and line.split("`")[1] in archs.ARCHS]
    assert listed == list(archs.ARCHS)


def test_every_architecture_is_supported_and_synthesized():
    assert SUPPORTED_ARCHS == tuple(archs.ARCHS)
    for name, arch in archs.ARCHS.items():
        assert arch.name == name and arch.synth, name
        assert all(synth.ARCHS[model] == (name, write) for model, write in arch.synth.items())
    assert {gguf_arch for gguf_arch, _ in synth.ARCHS.values()} == set(archs.ARCHS)


@pytest.mark.parametrize("model", list(synth.ARCHS))
def test_synth_model_loads_and_runs(tmp_path, model):
    shape = synth.ModelShape(**{"n_layer": 2, "n_embd": 64, "n_ff": 128, "n_head": 4, "n_head_kv": 2,
                                **archs.ARCHS[synth.ARCHS[model][0]].test_shape})
    path = synth.write_model(tmp_path / f"{model}.gguf", model, shape, "f32")
    with Model.load(path, n_gpu_layers=0) as m:
        (st,) = m.stages
        # nothing written goes unread, but the NextN/MTP layers after the others
        run = {n for n in m.file.tensors if not n.startswith("blk.") or int(n.split(".")[1]) < m.hp.n_layer}
        assert set(st.weights) == run
        logits = m.eval(m.tokenize("the old man and the sea"))
        assert logits.shape == (m.hp.n_vocab,) and np.isfinite(logits).all()


@pytest.mark.parametrize("arch,keys,what", [
    ("gemma4", {"attention.sliding_window_pattern": [True, False, True], "block_count": 3,
                "attention.shared_kv_layers": 2}, "leave no cache"),
    ("gemma4", {"attention.sliding_window_pattern": [True, True, False], "block_count": 3,
                "attention.shared_kv_layers": 1}, "other attention kind"),
    ("gemma4", {}, "sliding_window_pattern"),
    ("glm4moe", {"expert_gating_func": 4}, "gating function 4"),
    ("minimax-m2", {}, "gating function 0"),
])
def test_what_an_architecture_cannot_run_is_one_model_error(arch, keys, what):
    """Metadata the graph has no code for (gemma4 layers reusing a cache that is not
    there or of the other kind, a gating function
    other than soft-max or sigmoid) is refused by the architecture's hparams."""
    with pytest.raises(ModelError, match=what):
        archs.ARCHS[arch].hparams(lambda name, default: keys.get(name, default))
