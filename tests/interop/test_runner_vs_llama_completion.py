"""`ggml-rpc-cli run` prints what llama.cpp's llama-completion prints (greedy, the
prompt echoed, the closing blank line), token for token, on generated llama models:
in-process on our CPU executor (-ngl 0) against llama.cpp's CPU backend, and with
the layers on RPC servers (ours, llama.cpp's, and both at once with -ts 1,1)
against llama-completion driving the same servers."""
from __future__ import annotations

import itertools
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from ggmlrpc.cli.main import main
from ggmlrpc.llm import synth
from ggmlrpc.llm.archs import ARCHS
from ggmlrpc.llm.model import Model
from tests.e2e.test_batch import alone
from tests.interop.backend_ops import tool_env
from tests.e2e.test_runner import OTHER_ARCHS, arch_shape
from tests.e2e.test_serve import rpc  # noqa: F401 (two of our servers, a fixture)

pytestmark = pytest.mark.interop

PROMPT = "Once upon a time, in a small village by the sea, there lived an old fisherman who"
N = 16
LOGIT_TIE = 2e-2      # a divergence passes as a near-tie only where our top two are this close
RECURRENT = [a.name for a in ARCHS.values() if a.state]


@pytest.fixture(scope="module")
def models(tmp_path_factory, ref_bin):
    d = tmp_path_factory.mktemp("runner-models")
    shape = synth.LlamaShape(n_layer=3, n_embd=128, n_ff=256, n_head=4, n_head_kv=2)
    out = {"f32": synth.write_llama(d / "f32.gguf", shape, "f32", seed=1),
           "f16": synth.write_llama(d / "f16.gguf", shape, "f16", seed=2),
           "f16-tied": synth.write_llama(d / "tied.gguf", shape, "f16", seed=3, tied=True)}
    for q in ("Q8_0", "Q4_0"):
        out[q.lower()] = synth.quantize(ref_bin / "llama-quantize", out["f32"], d / f"{q}.gguf", q)
    return out


def completion(ref_bin: Path, model: Path, args: list[str], prompt: str = PROMPT,
               expect: bytes | None = None) -> bytes:
    """llama-completion's stdout. Its logger (which prints the text) is a thread that
    is never joined: a run shorter than the thread's first turn can exit with nothing
    printed. The preloaded shim (`tool_env`) drains it at exit. Belt and braces (a
    build without the shim): a run whose output does not end in its closing blank
    line, or differs from `expect`, is repeated (up to eight runs), and where every
    run lost its tail the longest is returned (`same_text` takes it as a prefix).
    --no-repack: llama.cpp's CPU backend would otherwise repack Q4_0/Q8_0 weights into
    its interleaved layouts, which sum in another order than ggml's plain kernels."""
    argv = [str(ref_bin / "llama-completion"), "-m", str(model), "--temp", "0", "-s", "1",
            "-no-cnv", "--simple-io", "--no-repack", "-p", prompt, "-n", str(N), *args]
    env = tool_env(ref_bin)
    whole, longest = None, b""
    for _ in range(8):
        r = subprocess.run(argv, capture_output=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr.decode(errors="replace")[-3000:]
        if r.stdout.endswith(b"\n\n"):
            whole = r.stdout
            if expect is None or r.stdout == expect:
                break
        elif len(r.stdout) > len(longest):
            longest = r.stdout
    return whole if whole is not None else longest


def same_text(mine: bytes, ref: bytes) -> bool:
    """Our output equals llama-completion's; where every run of llama-completion lost
    the tail of its output (no closing blank line), what it did print must be a
    prefix of ours, past the prompt."""
    if ref.endswith(b"\n\n"):
        return mine == ref
    return mine.startswith(ref) and len(ref) > len(PROMPT) + 1


def ours(model: Path, args: list[str], capfdbinary, prompt: str = PROMPT) -> bytes:
    capfdbinary.readouterr()
    rc = main(["run", "-m", str(model), "--temp", "0", "-p", prompt, "-n", str(N), *args])
    sys.stdout.flush()
    out, err = capfdbinary.readouterr()
    assert rc == 0, err.decode(errors="replace")
    return out


LAYER_LINE = re.compile(rb"layer +(\d+) assigned to device (\S+?),")


def llama_placement(ref_bin: Path, model: Path, args: list[str]) -> list[int]:
    """Where llama-completion puts each layer and then the output layer (its -v log's
    "assigned to device" lines, the last load's): -1 for its CPU, else the index of
    the RPC device in --rpc's order."""
    argv = [str(ref_bin / "llama-completion"), "-m", str(model), "-no-cnv", "--simple-io", "--no-warmup",
            "-p", "hi", "-n", "1", "-v", *args]
    r = subprocess.run(argv, capture_output=True, env=tool_env(ref_bin), timeout=300)
    assert r.returncode == 0, r.stderr.decode(errors="replace")[-3000:]
    where = {int(il): -1 if dev.startswith(b"CPU") else int(dev[3:]) for il, dev in LAYER_LINE.findall(r.stderr)}
    assert where and sorted(where) == list(range(len(where))), r.stderr.decode(errors="replace")[-3000:]
    return [where[i] for i in range(len(where))]


def our_placement(model: Path, rpc: str, ngl: int, ts: list[float]) -> list[int]:
    """The same from our Model's stages."""
    eps = rpc.split(",")
    with Model.load(model, rpc=eps, n_gpu_layers=ngl, tensor_split=ts, n_ctx=64) as m:
        where = {}
        for st in m.stages:
            dev = -1 if st.device.local else eps.index(st.device.backend.endpoint)
            where.update({il: dev for il in st.layers})
            if st.output:
                where[m.hp.n_layer] = dev
        return [where[i] for i in range(m.hp.n_layer + 1)]


@pytest.mark.parametrize("ngl,ts", [(99, "1,1"), (99, "3,1"), (99, "1,3"), (99, "0,1"), (3, "1,1"), (2, "1,1"),
                                    (1, "1,1"), (0, "1,1")])
def test_layer_placement_equals_llama_completion(ref_bin, models, rpc, ngl, ts):  # noqa: F811
    """-ngl and -ts put every layer, and the output layer, on the device llama.cpp
    puts it on (it counts the output layer as one more layer, in both): read from
    llama-completion's own log over the same two servers."""
    model = models["f32"]
    ref = llama_placement(ref_bin, model, ["--rpc", rpc, "-ngl", str(ngl), "-ts", ts])
    assert our_placement(model, rpc, ngl, [float(x) for x in ts.split(",")]) == ref, (ngl, ts, ref)


@pytest.mark.parametrize("kind", ["f32", "f16", "f16-tied", "q8_0", "q4_0"])
def test_in_process_equals_llama_cpu(ref_bin, models, kind, capfdbinary):
    model = models[kind]
    mine = ours(model, ["-ngl", "0", "-t", "2"], capfdbinary)
    ref = completion(ref_bin, model, ["-ngl", "0", "-t", "2"], expect=mine)
    assert mine.startswith(b" " + PROMPT.encode()) and len(mine) > len(PROMPT) + N
    assert same_text(mine, ref)


@pytest.mark.parametrize("kind", ["f16", "q8_0"])
def test_through_servers_equals_llama_completion(ref_bin, models, kind, server_proc, ref_server,
                                                 capfdbinary):
    model = models[kind]
    a, b = server_proc("-t", "2"), ref_server("-t", "2")
    for rpc, extra in ((a.endpoint, []), (b.endpoint, []),
                       (f"{a.endpoint},{b.endpoint}", ["-ts", "1,1"]),
                       (a.endpoint, ["-ngl", "2"])):         # two layers stay on the CPU
        args = ["--rpc", rpc, *(extra if "-ngl" in extra else ["-ngl", "99", *extra])]
        mine = ours(model, args, capfdbinary)
        # llama.cpp's client through the reference server only (it serves one client at a time)
        assert same_text(mine, completion(ref_bin, model, args, expect=mine)), (rpc, extra)


@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_pipelined_prompt_equals_llama_completion(ref_bin, models, kind, server_proc, ref_server,
                                                  capfdbinary):
    """The prompt in micro-batches of 4 flowing through our server and llama.cpp's
    at once (-sm layer's pipeline), and through three servers with unequal shares:
    llama-completion's text, and our one-by-one run's."""
    model = models[kind]
    a, b, c = server_proc("-t", "1"), ref_server("-t", "1"), server_proc("-t", "1")
    for rpc, ts in ((f"{a.endpoint},{b.endpoint}", "1,1"), (f"{a.endpoint},{c.endpoint},{b.endpoint}", "2,1,1")):
        args = ["--rpc", rpc, "-ngl", "99", "-ts", ts, "-ub", "4"]
        mine = ours(model, args, capfdbinary)
        assert ours(model, [*args, "--no-pipeline"], capfdbinary) == mine
        assert same_text(mine, completion(ref_bin, model, args, expect=mine)), rpc


@pytest.mark.parametrize("kind", ["f32", "q4_0"])
def test_without_flash_attention(ref_bin, models, kind, server_proc, ref_server, capfdbinary):
    """-fa off: soft_max attention over a transposed V cache, as llama.cpp builds it."""
    model = models[kind]
    mine = ours(model, ["-ngl", "0", "-fa", "off"], capfdbinary)
    assert same_text(mine, completion(ref_bin, model, ["-ngl", "0", "-fa", "off"], expect=mine))
    srv = ref_server("-t", "2")
    args = ["--rpc", srv.endpoint, "-ngl", "99", "-fa", "off"]
    assert ours(model, args, capfdbinary) == mine
    assert same_text(mine, completion(ref_bin, model, args, expect=mine))


VOCAB_PROMPT = "Hello world! 12345 caf\u00e9 \u65e5\u672c\u8a9e def f(x):\n\treturn x**2 <|endoftext|>It's"


@pytest.mark.parametrize("vocab", ["llama-bpe", "qwen2", "llama-spm"])
def test_real_vocabularies(ref_bin, tmp_path, vocab, server_proc, capfdbinary):
    """Random weights under a real vocabulary (llama.cpp's vocab files), a prompt that
    exercises the pre-tokenizer (digits, accents, CJK, code, a special token)."""
    src = ref_bin.parent.parent / "src" / "vendor" / "llama.cpp" / "models" / f"ggml-vocab-{vocab}.gguf"
    model = synth.write_llama(tmp_path / f"{vocab}.gguf",
                              synth.LlamaShape(n_layer=2, n_embd=64, n_ff=128, n_head=4, n_head_kv=2),
                              "f16", seed=7, vocab_from=src)
    argv = ["run", "-m", str(model), "--temp", "0", "-p", VOCAB_PROMPT, "-n", str(N)]
    capfdbinary.readouterr()
    assert main([*argv, "-ngl", "0"]) == 0
    sys.stdout.flush()
    mine = capfdbinary.readouterr()[0]
    assert same_text(mine, completion(ref_bin, model, ["-ngl", "0"], VOCAB_PROMPT, expect=mine))
    assert main([*argv, "--rpc", server_proc("-t", "2").endpoint]) == 0
    sys.stdout.flush()
    assert capfdbinary.readouterr()[0] == mine and len(mine) > len(VOCAB_PROMPT)


@pytest.mark.parametrize("arch", OTHER_ARCHS)
def test_other_architectures(ref_bin, tmp_path, arch, ref_server, capfdbinary):
    """Every architecture but llama (what each graph adds: its module in
    ggmlrpc.llm.archs; gemma2 and gpt-oss have a window of 8 on every other layer, so
    a 60-token prompt crosses it): in-process with and without flash attention, and
    split over our process and llama.cpp's server."""
    model = synth.write_model(tmp_path / f"{arch}.gguf", arch,
                              arch_shape(arch, 128),
                              "f16", seed=4)
    for fa in ("on", "off"):
        mine = ours(model, ["-ngl", "0", "-fa", fa], capfdbinary)
        assert same_text(mine, completion(ref_bin, model, ["-ngl", "0", "-fa", fa], expect=mine)), fa
    if arch == "phi3":     # a context within the original one takes the short factors
        short = ours(model, ["-c", "256"], capfdbinary)
        assert same_text(short, completion(ref_bin, model, ["-ngl", "0", "-c", "256"], expect=short))
    srv = ref_server("-t", "2")
    args = ["--rpc", srv.endpoint, "-ngl", "1"]
    split = ours(model, args, capfdbinary)
    assert same_text(split, completion(ref_bin, model, args, expect=split))


def test_prompt_longer_than_a_micro_batch(ref_bin, tmp_path, capfdbinary):
    """A prompt of ~1400 tokens runs in micro-batches of 512 as llama.cpp runs it,
    attending 1024, then 1536 cache cells."""
    model = synth.write_llama(tmp_path / "long.gguf",
                              synth.LlamaShape(n_layer=2, n_embd=64, n_ff=128, n_head=4, n_head_kv=2,
                                               n_ctx=2048), "f32", seed=9)
    prompt = " ".join(["the old man went to the sea and"] * 90)
    capfdbinary.readouterr()
    assert main(["run", "-m", str(model), "--temp", "0", "-p", prompt, "-n", str(N)]) == 0
    sys.stdout.flush()
    mine = capfdbinary.readouterr()[0]
    assert len(mine) > len(prompt)
    assert same_text(mine, completion(ref_bin, model, ["-ngl", "0"], prompt, expect=mine))


@pytest.mark.parametrize("opts", [["--temp", "0.8", "-s", "42"],                 # llama.cpp's defaults
                                  ["--temp", "1", "--top-k", "0", "--top-p", "1", "--min-p", "0", "-s", "7"],
                                  ["--temp", "1.5", "--top-k", "0", "--top-p", "0.9", "--min-p", "0.1", "-s", "3"],
                                  ["--temp", "1", "--top-k", "0", "--top-p", "1", "--min-p", "0.2", "-s", "5"]])
def test_sampling_with_a_seed_equals_llama_completion(ref_bin, models, opts, capfdbinary):
    """The sampler chain (top-k, top-p, min-p, temperature, a draw from the seeded
    Mersenne Twister) picks llama-completion's tokens for the same seed."""
    for kind in ("f32", "f16"):
        mine = ours(models[kind], ["-ngl", "0", "-t", "2", *opts], capfdbinary)
        assert same_text(mine, completion(ref_bin, models[kind], ["-ngl", "0", "-t", "2", *opts],
                                          expect=mine)), (kind, opts)


@pytest.mark.parametrize("scaling,factor", [("yarn", 4.0), ("linear", 2.0)])
def test_rope_scaling_from_the_file(ref_bin, tmp_path, scaling, factor, server_proc, capfdbinary):
    """rope.scaling.type/factor/original_context_length: YaRN's extrapolation mix and
    its attention factor, or linear interpolation, as llama.cpp reads them."""
    shape = synth.LlamaShape(n_layer=3, n_embd=128, n_ff=256, n_head=4, n_head_kv=2, n_ctx=512,
                             rope_scaling=scaling, rope_factor=factor, rope_orig_ctx=128)
    model = synth.write_llama(tmp_path / f"{scaling}.gguf", shape, "f32", seed=4)
    srv = server_proc("-t", "2")
    for args in (["-ngl", "0", "-t", "2"], ["--rpc", srv.endpoint, "-ngl", "99"]):
        mine = ours(model, args, capfdbinary)
        assert same_text(mine, completion(ref_bin, model, ["-ngl", "0", "-t", "2"], expect=mine)), args


@pytest.mark.parametrize("arch", [a.name for a in ARCHS.values() if a.swa_pattern] + ["gemma4", "gemma4-e2b"])
def test_sliding_window_cache_wraps_like_llama(ref_bin, tmp_path, arch, capfdbinary):
    """Sliding-window layers keep n_swa + a micro-batch cells (rounded up to 256):
    with -ub 16 and a window of 8 that is 256 cells, which 300 new tokens wrap
    around; the cells are reused in llama.cpp's order, with and without flash
    attention."""
    model = synth.write_model(tmp_path / f"{arch}.gguf", arch, arch_shape(arch, 128), "f16", seed=4)
    for fa in ("on", "off"):
        args = ["-ngl", "0", "-c", "512", "-ub", "16", "-fa", fa, "--ignore-eos", "-n", "300"]
        mine = ours(model, args, capfdbinary)
        assert len(mine) > 300 + len(PROMPT)
        assert same_text(mine, completion(ref_bin, model, args, expect=mine)), fa


# the families people split over machines (issue 22), each in F32 and quantized by
# llama-quantize (synth's model names); 256 wide, so that Q4_K_M quantizes every matrix
SPLIT_FAMILIES = ["glm4moe", "minimax-m2", "gemma4", "gemma4-moe", "gemma4-e2b"]
FAMILY_WEIGHTS = ("F32", "Q8_0", "Q4_K_M")


@pytest.fixture(scope="module")
def family_model(tmp_path_factory, ref_bin):
    """Factory: (synth model, weights) -> a three-layer model, written once per module."""
    d = tmp_path_factory.mktemp("families")
    made: dict[tuple[str, str], Path] = {}

    def get(arch: str, weights: str) -> Path:
        if (arch, weights) not in made:
            if weights == "F32":
                shape = synth.ModelShape(**{**vars(arch_shape(synth.ARCHS[arch][0], 256)), "n_layer": 3})
                made[arch, weights] = synth.write_model(d / f"{arch}-F32.gguf", arch, shape, "f32", seed=5)
            else:
                made[arch, weights] = synth.quantize(ref_bin / "llama-quantize", get(arch, "F32"),
                                                     d / f"{arch}-{weights}.gguf", weights)
        return made[arch, weights]

    return get


def same_text_or_near_tie(name: str, model: Path, mine: bytes, ref: bytes, prompt: str = PROMPT, *,
                          bit_exact: bool = False, relative_tie: float | None = None, **load) -> None:
    """Our text equals llama-completion's (`same_text`), or, unless this host's llama.cpp
    sums in the orders of the kernels we reproduce (`bit_exact`), parts from it only at
    a near-tie of our greedy logits, reported as a warning: at the token where the
    texts part, our top two lie within LOGIT_TIE, or with `relative_tie` within that
    fraction of the row's largest magnitude. Our greedy run of the same model
    (Model.load(**load), in-process unless told) says which token that is."""
    if same_text(mine, ref):
        return
    assert not bit_exact, f"{name}: {mine!r}\nllama-completion: {ref!r}"
    load.setdefault("n_gpu_layers", 0)
    with Model.load(model, **load) as m:
        ids = m.tokenize(prompt)
        toks, logits = alone(m, ids, N)
        echo = b"".join(m.tokenizer.token_to_piece(t) for t in ids)
        # as printed: each piece a C string (nothing from a NUL byte on)
        pieces = [m.tokenizer.token_to_piece(t).split(b"\0", 1)[0] for t in toks]
    gen = b"".join(pieces)
    # where the generated text starts: before its closing blank line, or (ended at
    # end-of-text) after the prompt's echo
    at = len(mine) - len(gen) - 2 if mine.endswith(gen + b"\n\n") else len(echo)
    for k, piece in enumerate(pieces):
        at += len(piece)
        if ref[:at] != mine[:at]:
            top = np.sort(logits[k])[-2:]
            gap = float(top[1] - top[0])
            if relative_tie is not None:
                gap /= float(np.max(np.abs(logits[k])))
            assert gap < (LOGIT_TIE if relative_tie is None else relative_tie), (
                f"{name}: token {k} differs from llama-completion's with a top-2 gap of {gap:.3g}\n"
                f"ours:             {mine!r}\nllama-completion: {ref!r}")
            warnings.warn(f"{name}: near-tie at token {k} (top-2 logit gap {gap:.2e})")
            return
    raise AssertionError(f"{name}: {mine!r}\nllama-completion: {ref!r}")


def refused_away_from_a_tie(model: Path, capfdbinary) -> None:
    """Our text with one generated byte changed is refused at that token."""
    mine = ours(model, ["-ngl", "0"], capfdbinary)
    at = len(b" " + PROMPT.encode()) + 3
    other = mine[:at] + bytes([mine[at] ^ 1]) + mine[at + 1:]
    with Model.load(model, n_gpu_layers=0) as m:
        toks, logits = alone(m, m.tokenize(PROMPT), N)
        ends = list(itertools.accumulate(len(m.tokenizer.token_to_piece(t)) for t in toks))
    k = next(i for i, end in enumerate(ends) if len(PROMPT) + 1 + end > at)
    top = np.sort(logits[k])[-2:]
    if top[1] - top[0] < LOGIT_TIE:
        pytest.skip("this model's token there is itself a near-tie")
    with pytest.raises(AssertionError, match=f"token {k} differs"):
        same_text_or_near_tie("changed", model, mine, other)


def test_a_divergence_away_from_a_tie_is_refused(models, capfdbinary):
    """The near-tie rule passes only a real near-tie: llama-completion's text with
    one generated byte changed is refused at that token."""
    refused_away_from_a_tie(models["f32"], capfdbinary)


@pytest.mark.parametrize("arch", RECURRENT)
def test_the_near_tie_rule_reads_recurrent_models_logits(tmp_path, arch, capfdbinary):
    """The near-tie rule computes the logits of a model with a recurrent state too
    (in a sequence of its own, beside the model's: a state slot each), so a
    divergence there is judged at its token, not an error."""
    model = synth.write_model(tmp_path / "m.gguf", arch, arch_shape(arch, 64), "f32", seed=5)
    refused_away_from_a_tie(model, capfdbinary)


@pytest.mark.parametrize("weights", FAMILY_WEIGHTS)
@pytest.mark.parametrize("arch", SPLIT_FAMILIES)
def test_split_families_equal_llama_completion(ref_bin, family_model, arch, weights, server_proc, capfdbinary):
    """In-process against llama.cpp's CPU (-ngl 0, no repacking), and over two of our
    servers with -ts 1,1 against llama-completion driving the same two servers."""
    model = family_model(arch, weights)
    mine = ours(model, ["-ngl", "0", "-t", "2"], capfdbinary)
    ref = completion(ref_bin, model, ["-ngl", "0", "-t", "2"], expect=mine)
    same_text_or_near_tie(f"{arch} {weights} in-process", model, mine, ref, n_gpu_layers=0)
    eps = [server_proc("-t", "2").endpoint for _ in range(2)]
    args = ["--rpc", ",".join(eps), "-ngl", "99", "-ts", "1,1"]
    split = ours(model, args, capfdbinary)
    ref = completion(ref_bin, model, args, expect=split)
    same_text_or_near_tie(f"{arch} {weights} over two servers", model, split, ref, rpc=eps,
                          tensor_split=[1, 1])


@pytest.mark.parametrize("kind", ["F32", "Q8_0", "Q4_K_M"])
@pytest.mark.parametrize("arch", RECURRENT)
def test_recurrent_state_equals_llama_completion(ref_bin, tmp_path, arch, kind, server_proc, bit_exact,
                                                 capfdbinary):
    """Architectures with a recurrent state beside their layers (qwen3next's delta-net
    layers between attention layers), F32 and quantized by llama-quantize (256 wide:
    K-quants take every matrix they can): in-process, and split over two of our
    servers with -ts 1,1 (the recurrent layer on one, the attention layer and the
    output on the other), and F32 in micro-batches of 7, as llama-completion prints
    them, its state carried from the prompt through every decode step."""
    f32 = synth.write_model(tmp_path / "f32.gguf", arch, arch_shape(arch, 256), "f32", seed=5)
    model = f32 if kind == "F32" else synth.quantize(ref_bin / "llama-quantize", f32, tmp_path / f"{kind}.gguf",
                                                     kind)
    a, b = server_proc("-t", "1"), server_proc("-t", "1")
    texts = []
    runs = [["-ngl", "0", "-t", "2"], ["--rpc", f"{a.endpoint},{b.endpoint}", "-ngl", "99", "-ts", "1,1"]]
    if kind == "F32":     # the prompt in micro-batches of 7: the state carries across them
        runs.append(["-ngl", "0", "-t", "2", "-ub", "7"])
    for args in runs:
        mine = ours(model, args, capfdbinary)
        assert mine.startswith(b" " + PROMPT.encode()) and len(mine) > len(PROMPT) + N
        same_text_or_near_tie(f"{kind} {' '.join(args)}", model, mine, completion(ref_bin, model, args, expect=mine),
                              bit_exact=bit_exact)
        texts.append(mine)
    for text in texts[1:]:
        same_text_or_near_tie(f"{kind} vs in-process", model, text, texts[0], bit_exact=bit_exact)


# the families people split over machines, each model of them as F32 and quantized
# (256 wide so that K-quants quantize the large matrices; three blocks so that -ts 1,1
# gives each server some, the output layer counting as one)
SPLIT_MODELS = ["deepseek2", "deepseek2-v3", "deepseek2-lite", "deepseek2-wkv_b"]
SPLIT_SHAPE = synth.ModelShape(n_layer=3, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, n_expert=8)


@pytest.mark.parametrize("weights", ["F32", "Q8_0", "Q4_K_M"])
@pytest.mark.parametrize("model", SPLIT_MODELS)
def test_split_families_in_process_and_over_two_servers(ref_bin, tmp_path, model, weights, rpc,
                                                        capfdbinary):
    """Greedy text equal to llama-completion's: in-process (llama.cpp on its CPU,
    --no-repack) and with the layers split over two of our servers (-ts 1,1, the same
    servers for llama-completion)."""
    path = synth.write_model(tmp_path / f"{model}.gguf", model, SPLIT_SHAPE, "f32", seed=5)
    if weights != "F32":
        path = synth.quantize(ref_bin / "llama-quantize", path, tmp_path / f"{model}-{weights}.gguf", weights)
    for args in (["-ngl", "0", "-t", "2"], ["--rpc", rpc, "-ngl", "99", "-ts", "1,1"]):
        mine = ours(path, args, capfdbinary)
        assert mine.startswith(b" " + PROMPT.encode()) and len(mine) > len(PROMPT) + N
        same_text_or_near_tie(f"{model} {weights} {' '.join(args)}", path,
                              mine, completion(ref_bin, path, args, expect=mine), n_gpu_layers=0)
