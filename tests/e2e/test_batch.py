"""Several sequences in one KV cache (Model.new_sequence, Model.decode): sequences of
different lengths decoded together, in one graph per device, give each the greedy
tokens it gets alone; one closed mid-way, or one started mid-way with its prompt
in the same steps as the others' decodes, leaves the others unchanged; the same
with sliding-window layers whose ring wraps, and with recurrent layers (a state
slot per sequence). A divergence is accepted only at a
near-tie, found from the logits (the top two closer than the two runs' logits
differ) and reported as a warning."""
from __future__ import annotations

import random
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


@pytest.mark.parametrize("arch", ["gemma2", "gemma3", "gemma4-e2b"])
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


@pytest.mark.parametrize("arch", ["qwen3next", "qwen35moe"])
def test_recurrent_sequences(tmp_path, servers, arch):
    """Delta-net layers keep a state slot per sequence (beside the layers, on the
    servers): sequences of different lengths in the same steps, one closed mid-way,
    two joining late (their prompts cut to the others' token counts, llama.cpp's
    equal split), in-process and over two servers; micro-batches of 8 tokens cut
    the prompts that run together."""
    path = synth.write_model(tmp_path / f"{arch}.gguf", arch, arch_shape(arch, 64), "f32", seed=3)
    with Model.load(path, n_gpu_layers=0, n_seq=4) as m:
        check(m, start=[0, 0, 2, 4], stop={1: 7})
    with Model.load(path, rpc=servers, tensor_split=[1, 1], n_seq=4, n_ubatch=8) as m:
        assert all(len(t) == 2 and t[0].ne[1] == 4 for st in m.stages for t in st.state.values() if t)
        check(m, start=[0, 0, 2, 4], stop={1: 7})
        assert m.kv.slots.of == {}        # every slot freed


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


# -- random interleavings ---------------------------------------------------------

def plan(rng: random.Random, n_vocab: int, n_seq: int, n_steps: int, cap: int) -> list[list[tuple]]:
    """Each sequence's requests, one after the other, as a server's slot runs them:
    (first step, tokens kept from the previous request, tokens, the chunks they
    run in). A request starts fresh, keeps part or all of the previous one
    (a prefix cache hit), or waits a few steps; prompts run whole or in pieces."""
    plans = []
    for _ in range(n_seq):
        jobs, prev, step = [], [], rng.randrange(4)
        while step < n_steps:
            n_prompt, n_gen = rng.randrange(1, 48), rng.randrange(1, 16)
            keep = rng.choice([0, 0, len(prev) // 2, len(prev)])
            keep = keep if keep + n_prompt + n_gen <= cap else 0
            n_prompt = min(n_prompt, cap - keep - n_gen)
            toks = prev[:keep] + [rng.randrange(1, n_vocab) for _ in range(n_prompt + n_gen)]
            chunks, rest = [], n_prompt
            while rest:
                chunks.append(rng.choice([rest, rng.randrange(1, rest + 1)]))
                rest -= chunks[-1]
            jobs.append((step, keep, toks, chunks + [1] * n_gen))
            step += len(chunks) + n_gen + rng.randrange(3)
            prev = toks
        plans.append(jobs)
    return plans


def interleaved(m: Model, plans: list[list[tuple]]) -> dict[tuple, np.ndarray]:
    """Every request's chunks, the sequences' in the same Model.decode steps: the
    logits after each chunk, by (sequence, request, tokens so far)."""
    seqs = [m.new_sequence() for _ in plans]
    at = [0] * len(plans)         # each sequence's current request
    run = [None] * len(plans)     # (next chunk, tokens so far) of a started request
    got, step = {}, 0
    while any(a < len(p) for a, p in zip(at, plans)):
        parts, rows = [], []
        for s, jobs in enumerate(plans):
            if at[s] == len(jobs) or run[s] is None and jobs[at[s]][0] > step:
                continue
            _, keep, toks, chunks = jobs[at[s]]
            if run[s] is None:
                seqs[s].truncate(keep) if keep else seqs[s].reset()
                run[s] = (0, keep)
            c, n = run[s]
            parts.append((seqs[s], toks[n:n + chunks[c]]))
            rows.append((s, at[s], n + chunks[c]))
            run[s] = (c + 1, n + chunks[c])
            if c + 1 == len(chunks):
                at[s], run[s] = at[s] + 1, None
        for key, lg in zip(rows, m.decode(parts) if parts else []):
            got[key] = lg
        step += 1
    for q in seqs:
        q.close()
    return got


def by_itself(m: Model, plans: list[list[tuple]]) -> dict[tuple, np.ndarray]:
    """The same logits with each request run alone, in an otherwise empty cache."""
    want = {}
    for s, jobs in enumerate(plans):
        for j, (_, keep, toks, chunks) in enumerate(jobs):
            q = m.new_sequence()
            if keep:
                q.eval(toks[:keep])
            n = keep
            for c in chunks:
                want[(s, j, n + c)] = q.eval(toks[n:n + c])
                n += c
            q.close()
    return want


@pytest.fixture(scope="module")
def local4(llama):
    with Model.load(llama, n_gpu_layers=0, n_seq=4, n_ctx=256) as m:
        yield m


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), n_seq=st.integers(2, 4))
def test_random_interleavings_give_each_sequence_its_own_logits(local4, seed, n_seq):
    """Sequences starting and ending at different steps, prompts whole or in pieces
    beside the others' decodes, cells freed and taken again by another sequence, a
    request keeping the cells of the previous one: every chunk's logits are the
    ones the request gets alone, within the kernels' noise (the attention's F16
    sums run over other cell orders and other tile shapes in a batch)."""
    m = local4
    plans = plan(random.Random(seed), m.hp.n_vocab, n_seq, 40, m.n_ctx // n_seq)
    got = interleaved(m, plans)
    assert (m.kv.full.pos < 0).all()      # every cell freed
    want = by_itself(m, plans)
    assert got.keys() == want.keys()
    for key, lg in want.items():
        noise = float(np.abs(got[key] - lg).max())
        assert noise < 1e-2, f"seed {seed}: sequence {key[0]}, request {key[1]}, {key[2]} tokens: logits differ by {noise}"
