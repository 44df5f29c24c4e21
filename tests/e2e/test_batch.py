"""Several sequences in one KV cache (Model.new_sequence, Model.decode): sequences of
different lengths decoded together, in one graph per device, give each the greedy
tokens it gets alone; one closed mid-way, or one started mid-way with its prompt
in the same steps as the others' decodes, leaves the others unchanged; the same
with sliding-window layers whose ring wraps. A divergence is accepted only at a
near-tie, found from the logits (the top two closer than the two runs' logits
differ) and reported as a warning."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from ggmlrpc.llm import synth
from ggmlrpc.llm.gguf_file import ModelError
from ggmlrpc.llm.model import Model
from tests.conftest import start_server
from tests.e2e.test_runner import arch_shape

PROMPTS = ["the old fisherman lived in a small village by the sea",
           "once upon a time",
           "a b c d e f g h i j k l m n o p q r s t u v w x y z and then some more words",
           "hello"]
N = 16


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return synth.write_llama(tmp_path_factory.mktemp("batch") / "llama.gguf",
                             synth.LlamaShape(n_layer=4, n_embd=64, n_ff=128, n_head=4, n_head_kv=2, n_ctx=512))


@pytest.fixture(scope="module")
def servers():
    srvs = [start_server(), start_server()]
    yield [f"127.0.0.1:{s.port}" for s in srvs]
    for s in srvs:
        s.close()


def alone(m: Model, ids: list[int], n: int) -> tuple[list[int], list[np.ndarray]]:
    """Greedy tokens of `ids` run by a sequence on its own, and the logits of each."""
    q = m.new_sequence()
    toks, logits = [], []
    lg = q.prefill(ids)
    for _ in range(n):
        toks.append(int(np.argmax(lg)))
        logits.append(lg)
        lg = q.eval([toks[-1]])
    q.close()
    return toks, logits


def together(m: Model, prompts: list[list[int]], n: int, start: list[int], stop: dict[int, int]):
    """Greedy tokens of every prompt run together: prompt i joins at step start[i]
    (its prompt in the same step as the others' decodes), and sequence i is closed
    after stop[i] tokens. One Model.decode per step."""
    seqs = [m.new_sequence() for _ in prompts]
    toks: list[list[int]] = [[] for _ in prompts]
    logits: list[list[np.ndarray]] = [[] for _ in prompts]
    step = 0
    while True:
        live = [i for i in range(len(prompts))
                if start[i] <= step and len(toks[i]) < min(n, stop.get(i, n))]
        if not live:
            break
        parts = [(seqs[i], [toks[i][-1]] if toks[i] else prompts[i]) for i in live]
        for i, lg in zip(live, m.decode(parts)):
            toks[i].append(int(np.argmax(lg)))
            logits[i].append(lg)
        for i in live:
            if len(toks[i]) == stop.get(i, n + 1):
                seqs[i].close()
        step += 1
    for q in seqs:
        q.close()
    return toks, logits


def same_or_near_tie(name: str, a: tuple, b: tuple) -> None:
    """b's tokens equal a's up to where b stops; a divergence passes only where the
    top two logits are closer than the runs' logits differ there (reported)."""
    (ta, la), (tb, lb) = a, b
    assert len(tb) <= len(ta)
    for k, (x, y) in enumerate(zip(ta, tb)):
        noise = float(np.abs(la[k] - lb[k]).max())
        assert noise < 1e-2, f"{name}: logits at token {k} differ by {noise}"
        if x != y:
            top2 = np.sort(la[k])[-2:]
            gap = float(top2[1] - top2[0])
            assert gap <= 2 * noise, f"{name}: token {k} differs ({x} vs {y}) with a top-2 gap of {gap}"
            warnings.warn(f"{name}: near-tie at token {k} (top-2 gap {gap:.2e}, logits differ by {noise:.2e})")
            return


def check(m: Model, start: list[int], stop: dict[int, int], n: int = N) -> None:
    prompts = [m.tokenize(p) for p in PROMPTS]
    ref = [alone(m, p, n) for p in prompts]
    toks, logits = together(m, prompts, n, start, stop)
    for i, p in enumerate(PROMPTS):
        assert len(toks[i]) == min(n, stop.get(i, n))
        same_or_near_tie(p, ref[i], (toks[i], logits[i]))


def test_sequences_together_through_servers(llama, servers):
    with Model.load(llama, rpc=servers, tensor_split=[1, 1], n_seq=4) as m:
        check(m, start=[0, 0, 0, 0], stop={})
        # one closed mid-way, one joining late: its prompt in the others' decode steps
        check(m, start=[0, 0, 3, 5], stop={1: 6})
        assert m.n_past == 0 and (m.kv.full.pos < 0).all()   # every cell freed


def test_sequences_together_local_without_flash_attention(llama):
    with Model.load(llama, n_gpu_layers=0, flash_attn=False, n_seq=4) as m:
        check(m, start=[0, 1, 2, 0], stop={0: 9})


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_sliding_window_sequences(tmp_path, servers, arch):
    """A window of 8 and a ring of 256 cells (micro-batch 32): the ring wraps while
    four sequences share it."""
    path = synth.write_model(tmp_path / f"{arch}.gguf", arch, arch_shape(arch, 64))
    with Model.load(path, rpc=servers, n_seq=4, n_ubatch=32) as m:
        assert m.swa is not None and m.swa.size == 256
        check(m, start=[0, 0, 2, 4], stop={2: 10}, n=48)


@pytest.mark.parametrize("model,fa", [("deepseek2-v3", True), ("deepseek2", False), ("deepseek2-wkv_b", False)])
def test_latent_attention_sequences(tmp_path, servers, model, fa):
    """deepseek2's compressed K-only cache (or, from a file with wkv_b, K and V
    caches of different head sizes), on the servers beside its layers, shared by
    four sequences as the full cache is."""
    path = synth.write_model(tmp_path / f"{model}.gguf", model, arch_shape("deepseek2", 64))
    with Model.load(path, rpc=servers, tensor_split=[1, 1], n_seq=4, flash_attn=fa) as m:
        assert all((v is None) == m.hp.is_mla for st in m.stages for _, v in st.kv.values())
        check(m, start=[0, 0, 2, 4], stop={1: 7})


def test_the_model_s_own_sequence_is_untouched(llama):
    """Model.eval/prefill act on sequence 0; other sequences do not change its logits."""
    with Model.load(llama, n_gpu_layers=0, n_seq=2) as m:
        ids = m.tokenize(PROMPTS[0])
        want = m.prefill(ids).copy()
        m.reset()
        other = m.new_sequence()
        other.prefill(m.tokenize(PROMPTS[2]))
        assert np.array_equal(m.prefill(ids), want)
        other.truncate(3)
        assert other.n_past == 3 and m.n_past == len(ids)
        other.close()
        with pytest.raises(ValueError, match="closed"):
            other.eval([1])
        with pytest.raises(ValueError, match="twice"):
            m.decode([(m.seq, [1]), (m.seq, [2])])


def test_a_full_cache_fails_and_leaves_the_cells(llama):
    with Model.load(llama, n_gpu_layers=0, n_ctx=256) as m:
        a, b = m.new_sequence(), m.new_sequence()
        a.eval(list(range(1, 200)))
        with pytest.raises(ModelError, match="KV cache full"):
            b.eval(list(range(1, 100)))
        assert b.n_past == 0 and int((m.kv.full.pos >= 0).sum()) == 199
        b.eval([1, 2, 3])     # what fits still runs
