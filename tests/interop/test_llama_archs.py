"""llama.cpp's test-llama-archs passes through our server, architecture by architecture.

Each architecture runs on a fresh server of ours (`-t 2`): test-llama-archs makes a
small random model of it (dense and MoE variants where it has them), computes its
logits through our server and on ggml's CPU backend (NMSE <= 1e-4), and checks that a
saved and reloaded model gives the same logits. Every configuration must pass, and
there must be as many as through llama.cpp's own ggml-rpc-server (REFERENCE_CASES,
measured with `python -m tests.interop.llama_archs --reference`): a graph our server
refuses closes the connection and aborts the client, so a lower count fails too.
The whole set takes a few minutes on two cores.
"""
from __future__ import annotations

import pytest

from tests.interop import backend_ops, llama_archs

pytestmark = pytest.mark.interop

# configurations run ("N test(s)" of the summary) per architecture through the
# reference ggml-rpc-server; all of them passed there
REFERENCE_CASES = {
    "llama": 2, "llama4": 1, "deci": 1, "falcon": 1, "baichuan": 1, "grok": 1, "gpt2": 1,
    "gptneox": 1, "mpt": 1, "starcoder": 1, "refact": 2, "bloom": 1, "stablelm": 1,
    "qwen": 1, "qwen2": 1, "qwen2moe": 1, "qwen2vl": 1, "qwen3": 1, "qwen3moe": 1,
    "qwen3next": 1, "qwen3vl": 1, "qwen3vlmoe": 1, "qwen35": 1, "qwen35moe": 1,
    "qwen4exp": 1, "phi2": 1, "phi3": 1, "phimoe": 1, "plamo": 1, "plamo2": 1, "plamo3": 1,
    "codeshell": 1, "orion": 1, "internlm2": 1, "minicpm": 2, "minicpm3": 1, "gemma": 1,
    "gemma2": 1, "gemma3": 1, "gemma3n": 1, "starcoder2": 1, "mamba": 1, "mamba2": 1,
    "maple": 1, "jamba": 1, "falcon-h1": 1, "xverse": 1, "command-r": 1, "cohere2": 1,
    "cohere2moe": 1, "dbrx": 1, "olmo": 1, "olmo2": 1, "olmoe": 1, "muse-glimmer": 1,
    "openelm": 1, "arctic": 1, "deepseek": 1, "deepseek2": 1, "deepseek32": 1,
    "deepseek4": 1, "chatglm": 1, "glm4": 1, "glm4moe": 1, "glm-dsa": 1, "bitnet": 1,
    "t5": 1, "jais": 1, "jais2": 1, "nemotron": 1, "nemotron_h": 1, "nemotron_h_moe": 1,
    "exaone": 1, "exaone4": 1, "exaone-moe": 1, "granite": 2, "granitemoe": 2,
    "granitehybrid": 1, "granite_swa": 1, "bailingmoe": 1, "bailingmoe2": 1,
    "bailingmoe3": 1, "dots1": 1, "dots3note": 1, "arcee": 1, "afmoe": 1, "laguna": 1,
    "ernie4_5": 1, "ernie4_5-moe": 1, "hunyuan-moe": 1, "hunyuan-dense": 1, "hunyuan_vl": 1,
    "hy_v3": 1, "hy_v4": 1, "smollm3": 1, "gpt-oss": 1, "lfm2": 1, "lfm2moe": 1, "dream": 1,
    "smallthinker": 1, "llada": 1, "llada-moe": 1, "seed_oss": 1, "grovemoe": 1,
    "apertus": 1, "minimax-m2": 1, "cogvlm": 1, "rnd1": 1, "pangu-embedded": 1,
    "mistral3": 2, "mistral4": 1, "paddleocr": 1, "mimo2": 1, "step35": 1, "spark2_5": 1,
    "maincoder": 1, "kimi-linear": 1, "kimi-k3": 1, "glm5-next": 1, "talkie": 1,
    "mellum": 1, "minimax-m3": 1, "nanbeige": 1, "qwen3tts": 1, "pockettts": 1,
    "minimax-01": 1, "hrm_text": 1,
}


def test_every_arch_has_a_reference_count():
    assert sorted(REFERENCE_CASES) == sorted(llama_archs.ARCHS)


@pytest.fixture(scope="module")
def shim(ref_bin, tmp_path_factory):
    return backend_ops.shim_or_skip(ref_bin, "test-llama-archs", tmp_path_factory)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("arch", llama_archs.ARCHS)
def test_arch_passes_through_our_server(ref_bin, shim, arch):
    r = llama_archs.run_arch(ref_bin, shim, backend_ops.our_server_argv(), arch)
    backend_ops.assert_passes(arch, r, REFERENCE_CASES[arch], llama_archs.plain(r.output))
