"""Chat templates rendered as llama-server renders them: real templates from the
reference sdist (models/templates/) with small generated models that carry real
vocabularies (the template grafted into the model's metadata, or given to both as a
file), each rendered by ChatTemplate and by llama-server --jinja's /apply-template on
the same conversations, compared byte for byte; and the prompt's tokens compared with
what llama-server's /tokenize makes of its own prompt."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ggmlrpc.llm import synth
from ggmlrpc.llm.chat_template import ChatTemplate, TemplateError
from ggmlrpc.llm.gguf_file import GGUFFile
from ggmlrpc.llm.tokenizer import Tokenizer
from tests.interop.test_tokenizer_vs_llama import vocab_dir

pytestmark = pytest.mark.interop

# template file -> (vocabulary it is grafted onto, what it is exercised with; "own-format":
# llama.cpp handles the template with code of its own, whose continuation of a trailing
# assistant message is not reproduced)
TEMPLATES = {
    "meta-llama-Llama-3.1-8B-Instruct": ("llama-bpe", {"tools"}),
    "meta-llama-Llama-3.2-3B-Instruct": ("llama-bpe", set()),
    "Qwen-Qwen2.5-7B-Instruct": ("qwen2", {"tools"}),
    "Qwen-Qwen3-0.6B": ("qwen2", {"tools", "reasoning"}),
    "Qwen-QwQ-32B": ("qwen2", {"reasoning"}),
    "google-gemma-2-2b-it": ("llama-spm", set()),
    "microsoft-Phi-3.5-mini-instruct": ("phi-3", set()),
    "mistralai-Mistral-Nemo-Instruct-2407": ("llama-spm", {"tools"}),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": ("deepseek-coder", {"reasoning"}),
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": ("llama-bpe", {"tools"}),
    "meta-llama-Llama-3.3-70B-Instruct": ("llama-bpe", {"tools"}),
    "Mistral-Small-3.2-24B-Instruct-2506": ("llama-spm", {"tools"}),
    "ibm-granite-granite-3.3-2B-Instruct": ("gpt-2", {"tools", "reasoning"}),
    "HuggingFaceTB-SmolLM3-3B": ("llama-bpe", {"tools", "reasoning"}),
    "openai-gpt-oss-120b": ("gpt-2", {"tools", "reasoning", "own-format"}),
    "moonshotai-Kimi-K2": ("qwen2", {"tools", "own-format"}),
    "deepseek-ai-DeepSeek-V3.1": ("deepseek-coder", {"tools", "reasoning"}),
}

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city, now.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "Name of the city"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}]

CHAT = [{"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Hello there!"},
        {"role": "assistant", "content": "Hi. What do you need?"},
        {"role": "user", "content": "Say \"yes\" in Fran\u00e7ais \u2713, then stop."}]
NO_SYSTEM = CHAT[1:]
PARTS = [{"role": "user", "content": [{"type": "text", "text": "First part."},
                                      {"type": "text", "text": "Second part."}]}]
CONTINUE = [{"role": "user", "content": "Count to three."},
            {"role": "assistant", "content": "One, two,"}]
TOOL_CHAT = [
    {"role": "system", "content": "You can look up the weather."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{
        "id": "call0abc1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
    {"role": "tool", "tool_call_id": "call0abc1", "name": "get_weather", "content": "{\"temp\": 21.5}"},
    {"role": "assistant", "content": "It is 21.5 \u00b0C in Paris."},
    {"role": "user", "content": "And in Rome?"}]
OBJECT_ARGS = TOOL_CHAT[:2] + [dict(TOOL_CHAT[2], tool_calls=[{
    "id": "call0abc1", "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Z\u00fcrich", "days": 3}}}])] + TOOL_CHAT[3:]
THINKING = {"role": "assistant", "content": "", "reasoning_content": "Three and three"}
REASONING = [{"role": "user", "content": "What is 2+2?"},
             {"role": "assistant", "content": "4.", "reasoning_content": "Two and two make four."},
             {"role": "user", "content": "And 3+3?"}]


def cases(uses: set) -> list[tuple[str, dict]]:
    out = [("chat", {"messages": CHAT}),
           ("no-system", {"messages": NO_SYSTEM}),
           ("developer", {"messages": [dict(CHAT[0], role="developer")] + CHAT[1:]}),
           ("no-generation-prompt", {"messages": CHAT, "add_generation_prompt": False}),
           ("content-parts", {"messages": PARTS})]
    if "own-format" not in uses:
        out.append(("continue", {"messages": CONTINUE}))
    if "tools" in uses:
        out += [("tools", {"messages": CHAT, "tools": TOOLS}),
                ("tool-calls", {"messages": TOOL_CHAT, "tools": TOOLS}),
                ("tool-calls-object-arguments", {"messages": OBJECT_ARGS, "tools": TOOLS})]
    if "reasoning" in uses:
        out += [("reasoning", {"messages": REASONING}),
                ("thinking-off", {"messages": REASONING,
                                  "chat_template_kwargs": {"enable_thinking": False}})]
        if "own-format" not in uses:
            out += [("continue-reasoning", {"messages": REASONING[:1] + [THINKING]}),
                    ("continue-after-reasoning", {"messages": REASONING[:2]})]
    return out


class _KeysOnly:
    """Passes a vocabulary's keys to a writer, less its chat templates."""

    def __init__(self, writer):
        self.writer = writer

    def add_key_value(self, key, *args):
        if not key.startswith("tokenizer.chat_template"):
            self.writer.add_key_value(key, *args)


def graft(tmp: Path, vocab: Path, template: str | None) -> Path:
    """A small random llama model with `vocab`'s tokenizer and `template` (None: the
    vocabulary file's own templates)."""
    import gguf

    keys = tmp / "vocab.gguf"
    w = gguf.GGUFWriter(str(keys), "llama")
    if template is None:
        synth._graft_vocab(w, vocab)
    else:
        synth._graft_vocab(_KeysOnly(w), vocab)
        w.add_chat_template(template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    shape = synth.LlamaShape(n_layer=1, n_embd=32, n_ff=32, n_head=2, n_head_kv=1, n_ctx=256)
    return synth.write_llama(tmp / "model.gguf", shape, seed=1, vocab_from=keys)


def post(port: int, path: str, body: dict):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        return {"error": json.loads(e.read() or b"{}").get("error", {"code": e.code})}


def same_as_llama_server(ref_llama_server, model: Path, uses: set, name: str,
                         template: Path | None = None) -> list[str]:
    """Every case rendered by both and compared; returns the cases both refuse.
    `template`: a template file both take instead of the model's own."""
    f, tok = load(model)
    ours = ChatTemplate.from_gguf(f, tok, path=template)
    srv = ref_llama_server(model, "--jinja", "-ngl", "0", "-c", "256", "-t", "1",
                           *(["--chat-template-file", str(template)] if template else []))
    refused = []
    for case, body in cases(uses):
        ref = post(srv.port, "/apply-template", body)
        kw = {k: v for k, v in body.items() if k not in ("messages", "chat_template_kwargs")}
        kw.update(body.get("chat_template_kwargs", {}))
        if "error" in ref:  # llama-server refuses this conversation: so must we
            refused.append(case)
            with pytest.raises(TemplateError):
                ours.render(body["messages"], **kw)
            continue
        got = ours.render(body["messages"], **kw)
        assert got == ref["prompt"], (name, case)
        toks = post(srv.port, "/tokenize", {"content": ref["prompt"], "add_special": True,
                                            "parse_special": True})["tokens"]
        assert ours.prompt_tokens(tok, body["messages"], **kw) == toks, (name, case)
    print(f"\n[{name}] refused by both: {refused}")
    return refused


_loaded: dict = {}


def load(model: Path):
    if model not in _loaded:
        f = GGUFFile(model)
        _loaded[model] = f, Tokenizer.from_gguf(f)
    return _loaded[model]


@pytest.fixture(scope="module")
def vocab_model(ref_bin, tmp_path_factory):
    """Factory: a small random llama model with one of the sdist's vocabularies (one
    per vocabulary: writing and reading a large vocabulary is the slow part here)."""
    made: dict = {}

    def get(vocab: str) -> Path:
        if vocab not in made:
            shape = synth.LlamaShape(n_layer=1, n_embd=32, n_ff=32, n_head=2, n_head_kv=1, n_ctx=256)
            made[vocab] = synth.write_llama(tmp_path_factory.mktemp(vocab) / "model.gguf", shape,
                                            seed=1, vocab_from=vocab_dir(ref_bin) / f"ggml-vocab-{vocab}.gguf")
        return made[vocab]
    return get


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_same_prompt_as_llama_server(ref_bin, ref_llama_server, vocab_model, name):
    # the template given as a file to both (llama-server's --chat-template-file)
    vocab, uses = TEMPLATES[name]
    template = vocab_dir(ref_bin) / "templates" / f"{name}.jinja"
    assert "chat" not in same_as_llama_server(ref_llama_server, vocab_model(vocab), uses, name, template)


def test_template_grafted_into_the_model(ref_bin, ref_llama_server, tmp_path):
    # the template in the model's own metadata (tokenizer.chat_template)
    name = "meta-llama-Llama-3.1-8B-Instruct"
    source = (vocab_dir(ref_bin) / "templates" / f"{name}.jinja").read_text()
    model = graft(tmp_path, vocab_dir(ref_bin) / "ggml-vocab-llama-bpe.gguf", source)
    assert GGUFFile(model).meta.get("tokenizer.chat_template") == source
    assert "chat" not in same_as_llama_server(ref_llama_server, model, {"tools"}, name)


def test_the_models_tool_use_template(ref_bin, ref_llama_server, tmp_path):
    # Command R's vocabulary file carries its templates: a default one and a "tool_use"
    # one, which llama-server takes when the request has tools
    model = graft(tmp_path, vocab_dir(ref_bin) / "ggml-vocab-command-r.gguf", None)
    assert GGUFFile(model).meta.get("tokenizer.chat_template.tool_use")
    assert "chat" not in same_as_llama_server(ref_llama_server, model, {"tools"}, "command-r")
