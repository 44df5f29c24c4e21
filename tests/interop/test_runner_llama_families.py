"""The families people run split over machines, llama's kin: llama with
Mixtral-style experts, mistral3 and llama4 (and the test-llama-archs models of
deepseek2, glm4moe, minimax-m2, qwen3next and qwen35moe). `ggml-rpc-cli run` prints
llama-completion's greedy text on synth's models of them (F32, and Q8_0 and Q4_K_M
through llama-quantize) and on the models llama.cpp's test-llama-archs writes
(its `test` vocabulary, per-matrix scales, biases, rope factors), in-process against
llama.cpp's CPU and over two of our servers with -ts 1,1 against llama-completion
driving the same servers. Where the texts part, it is accepted only at a near-tie of
our logits, reported as a warning."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ggmlrpc.cli.main import main
from ggmlrpc.llm import synth
from ggmlrpc.llm.archs import ARCHS
from tests.conftest import server_procs
from tests.interop.llama_archs import save_models
from tests.interop.test_runner_vs_llama_completion import N, PROMPT, completion, ours, same_text_or_near_tie

pytestmark = pytest.mark.interop


def near_tie(name: str, model: Path, mine: bytes, ref: bytes, prompt: str = PROMPT) -> None:
    """`same_text_or_near_tie` with the gap relative to the largest logit, the
    in-process runs on two threads (flash attention's split of the cells follows the
    thread count)."""
    same_text_or_near_tie(name, model, mine, ref, prompt, relative_tie=1e-3, n_threads=2)


@pytest.fixture(scope="module")
def two_servers():
    """Two of our servers as processes (llama-completion and our runner share them)."""
    yield from server_procs(2, "-t", "2")


def same_as_llama_completion(ref_bin: Path, name: str, model: Path, two_servers: str, capfdbinary,
                             prompt: str = PROMPT) -> None:
    """In-process against llama.cpp's CPU, and over two of our servers (-ts 1,1)
    against llama-completion driving the same servers."""
    for args in (["-ngl", "0", "-t", "2"], ["--rpc", two_servers, "-ngl", "99", "-ts", "1,1"]):
        capfdbinary.readouterr()
        rc = main(["run", "-m", str(model), "--temp", "0", "-p", prompt, "-n", str(N), *args])
        sys.stdout.flush()
        mine, err = capfdbinary.readouterr()
        assert rc == 0, err.decode(errors="replace")
        assert len(mine) > N + 2, mine     # at least a byte per token (a hex id in the test vocabulary)
        ref = completion(ref_bin, model, args, prompt, expect=mine)
        near_tie(f"{name} {' '.join(args)}", model, mine, ref, prompt)


MULTI_MACHINE = ["llama-moe", "mistral3", "llama4"]      # synth's models of the added architectures


@pytest.mark.parametrize("weights", ["f32", "q8_0", "q4_k_m"])
@pytest.mark.parametrize("name", MULTI_MACHINE)
def test_added_architectures_equal_llama_completion(ref_bin, tmp_path, name, weights, two_servers,
                                                    capfdbinary):
    """synth's random models (256 wide, so that every matrix takes the K-quant; llama4
    with four layers, the fourth without rope) in F32 and through llama-quantize."""
    arch = synth.ARCHS[name][0]
    shape = synth.ModelShape(**{"n_layer": 3, "n_embd": 256, "n_ff": 512, "n_head": 4, "n_head_kv": 2,
                                **ARCHS[arch].test_shape})
    model = synth.write_model(tmp_path / f"{name}.gguf", name, shape, "f32", seed=5)
    if weights != "f32":
        model = synth.quantize(ref_bin / "llama-quantize", model, tmp_path / f"{name}-{weights}.gguf",
                               weights.upper())
    same_as_llama_completion(ref_bin, f"{name} {weights}", model, two_servers, capfdbinary)


@pytest.mark.parametrize("arch", ["llama", "mistral3", "llama4", "deepseek2", "glm4moe", "minimax-m2", "qwen3next",
                                  "qwen35moe"])
def test_test_llama_archs_models_equal_llama_completion(ref_bin, tmp_path, arch, two_servers, capfdbinary):
    """The models test-llama-archs -o writes (dense and MoE; llama.cpp's `test`
    vocabulary, per-matrix scales, biases and rope factors on every layer)."""
    models = save_models(ref_bin, arch, tmp_path)
    assert models, f"test-llama-archs wrote no {arch} model"
    for variant, model in models.items():
        same_as_llama_completion(ref_bin, f"{arch}-{variant}", model, two_servers, capfdbinary)


def test_llama4_chunks_past_8192(ref_bin, tmp_path, capfdbinary):
    """Past position 8192 llama4's chunked layers attend only the new chunk, and its
    rope-less layers scale their queries by the next temperature step."""
    shape = synth.ModelShape(n_layer=4, n_embd=64, n_ff=128, n_head=4, n_head_kv=2, n_ctx=8704, n_expert_used=1)
    model = synth.write_model(tmp_path / "llama4.gguf", "llama4", shape, "f32", seed=4)
    prompt = " ".join(["the old man went to the sea and"] * 522)     # 8353 tokens
    mine = ours(model, ["-ngl", "0", "-t", "2"], capfdbinary, prompt)
    ref = completion(ref_bin, model, ["-ngl", "0", "-t", "2"], prompt, expect=mine)
    near_tie("llama4 past 8192", model, mine, ref, prompt)


def test_llama4_128_experts_keep_q_and_k_unnormalized(ref_bin, tmp_path, capfdbinary):
    """llama.cpp takes a llama4 of 128 experts for Maverick, whose q and k are not
    RMS-normalized."""
    shape = synth.ModelShape(n_layer=4, n_embd=64, n_ff=128, n_head=4, n_head_kv=2, n_expert=128, n_expert_used=1)
    model = synth.write_model(tmp_path / "llama4-128.gguf", "llama4", shape, "f32", seed=2)
    mine = ours(model, ["-ngl", "0", "-t", "2"], capfdbinary)
    near_tie("llama4 128 experts", model, mine,
                      completion(ref_bin, model, ["-ngl", "0", "-t", "2"], expect=mine))
