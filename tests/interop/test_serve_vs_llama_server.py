"""`ggml-rpc-cli serve` against llama-server, both driving the same two RPC servers of
ours with the same generated model: with temperature 0 the same prompt gives the same
text (whole and streamed), the same token counts and finish reason, through
/v1/completions and /v1/chat/completions; /tokenize, /detokenize and /apply-template
give the same answers."""
from __future__ import annotations

import json

import httpx
import pytest

from ggmlrpc.llm import synth
from tests.e2e.test_serve import CHATML, N_CTX, Serve, rpc  # noqa: F401  (rpc: fixture)
from tests.interop.test_tokenizer_vs_llama import vocab_dir

pytestmark = pytest.mark.interop

PROMPTS = ["the old fisherman lived in a small village by the sea",
           "Once upon a time, there was a boat",
           "water light story night\n\n- fish"]
MESSAGES = [[{"role": "user", "content": "tell me about the old fisherman"}],
            [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"},
             {"role": "assistant", "content": "the sea"}, {"role": "user", "content": "and then?"}]]


@pytest.fixture(scope="module")
def files(tmp_path_factory, ref_bin):
    d = tmp_path_factory.mktemp("serve-interop")
    shape = synth.LlamaShape(n_layer=3, n_embd=128, n_ff=256, n_head=4, n_head_kv=2, n_ctx=N_CTX)
    f32 = synth.write_llama(d / "f32.gguf", shape, "f32", seed=5)
    (d / "chatml.jinja").write_text(CHATML)
    return {"f32": f32, "q8_0": synth.quantize(ref_bin / "llama-quantize", f32, d / "q8_0.gguf", "Q8_0"),
            "template": d / "chatml.jinja", "dir": d}


@pytest.fixture
def pair(files, rpc, ref_llama_server):
    """Factory: (ours, llama-server) on the same model and servers."""
    started = []

    def start(model):
        common = ["-c", str(N_CTX), "-ngl", "99", "--rpc", rpc, "--chat-template-file",
                  str(files["template"]), "--jinja"]
        ours = Serve(model, *common, "-ts", "1,1")
        started.append(ours)
        ref = ref_llama_server(model, *common, "-ts", "1/1", "-np", "1", "-t", "1")
        return ours, ref

    yield start
    for s in started:
        s.stop()


def post(url: str, path: str, body: dict) -> dict:
    r = httpx.post(url + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def streamed(url: str, path: str, body: dict) -> tuple[str, str | None]:
    text, finish = "", None
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for c in json.loads(line[6:])["choices"]:
                text += c.get("text") or (c.get("delta") or {}).get("content") or ""
                finish = c.get("finish_reason") or finish
    return text, finish


def answer(r: dict) -> tuple:
    c = r["choices"][0]
    text = c["text"] if "text" in c else c["message"]["content"]
    u = r["usage"]
    return text, c["finish_reason"], u["prompt_tokens"], u["completion_tokens"]


@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_same_text_at_temperature_0(files, pair, kind):
    ours, ref = pair(files[kind])
    for prompt in PROMPTS:
        body = {"prompt": prompt, "max_tokens": 24, "temperature": 0}
        mine = answer(post(ours.url, "/v1/completions", body))
        theirs = answer(post(ref.url, "/v1/completions", body))
        assert mine == theirs, prompt
        assert mine[3] == 24 and mine[1] == "length"
        assert streamed(ours.url, "/v1/completions", body) == streamed(ref.url, "/v1/completions", body)
    for messages in MESSAGES:
        body = {"messages": messages, "max_tokens": 16, "temperature": 0}
        assert answer(post(ours.url, "/v1/chat/completions", body)) == \
            answer(post(ref.url, "/v1/chat/completions", body))
        assert streamed(ours.url, "/v1/chat/completions", body) == \
            streamed(ref.url, "/v1/chat/completions", body)
    # stop strings cut the text at the same place
    full = answer(post(ref.url, "/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 24,
                                                    "temperature": 0}))[0]
    body = {"prompt": PROMPTS[0], "max_tokens": 24, "temperature": 0, "stop": [full[10:13]]}
    assert answer(post(ours.url, "/v1/completions", body))[:2] == \
        answer(post(ref.url, "/v1/completions", body))[:2]


TEXTS = ["hello the sea", "Hello <s> world</s>x  é 🦙 the old fisherman\n\tsaid: 'hello'",
         "<|endoftext|>12345 678.9 café naïve 日本語\n\n  def f(x):\n\treturn x**2"]


@pytest.mark.parametrize("vocab", ["synth", "llama-bpe"])
def test_tokenize_and_templates_agree(files, pair, ref_bin, vocab):
    model = files["f32"]
    if vocab != "synth":
        model = synth.write_llama(files["dir"] / f"{vocab}.gguf",
                                  synth.LlamaShape(n_layer=1, n_embd=64, n_ff=64, n_head=2, n_head_kv=1,
                                                   n_ctx=N_CTX), "f16", seed=2,
                                  vocab_from=vocab_dir(ref_bin) / f"ggml-vocab-{vocab}.gguf")
    ours, ref = pair(model)
    for text in TEXTS:
        for extra in ({}, {"add_special": True}, {"parse_special": False}, {"with_pieces": True}):
            body = {"content": text, **extra}
            mine = post(ours.url, "/tokenize", body)
            assert mine == post(ref.url, "/tokenize", body), (text, extra)
        ids = post(ref.url, "/tokenize", {"content": text, "add_special": True})["tokens"]
        assert post(ours.url, "/detokenize", {"tokens": ids}) == post(ref.url, "/detokenize", {"tokens": ids})
    for messages in MESSAGES:
        body = {"messages": messages}
        assert post(ours.url, "/apply-template", body) == post(ref.url, "/apply-template", body)
