"""Tokenizers from GGUF metadata against llama.cpp: the vocabularies the reference
sdist ships with their expected ids (`models/ggml-vocab-*.gguf` with `.inp`/`.out`,
which llama.cpp's own test-tokenizer-0 reads), and `llama-tokenize` on text with
special tokens, BOS and byte fallback."""
from __future__ import annotations

import ast
import functools
import subprocess
from pathlib import Path

import pytest

from ggmlrpc.llm.gguf_file import GGUFFile
from ggmlrpc.llm.tokenizer import Tokenizer
from tests.interop.llama_archs import save_models
from tests.unit.test_tokenizer import synth_model  # noqa: F401  (fixture)

pytestmark = pytest.mark.interop

# vocabularies with expected ids: SentencePiece, then BPE with their pre-tokenizers
SUPPORTED = ("llama-spm", "phi-3", "llama-bpe", "qwen2", "gpt-2", "deepseek-coder", "starcoder",
             "falcon", "refact", "command-r", "mpt", "gemma-4")


def vocab_dir(ref_bin: Path) -> Path:
    return ref_bin.parent.parent / "src" / "vendor" / "llama.cpp" / "models"


@functools.lru_cache(maxsize=None)
def tokenizer(path: Path) -> Tokenizer:
    """Loaded once per session (gguf-py reads Gemma 4's 262144 tokens and their
    merges in about a minute)."""
    return Tokenizer.from_gguf(GGUFFile(path))


def cases(path: Path) -> list[tuple[bytes, list[int]]]:
    """(text, ids) pairs, split as test-tokenizer-0 splits them."""
    texts = path.with_name(path.name + ".inp").read_bytes().split(b"\n__ggml_vocab_test__\n")
    lines = path.with_name(path.name + ".out").read_text().split("\n")
    return [(t, [int(x) for x in o.split()]) for t, o in zip(texts, lines)]


@pytest.mark.parametrize("name", SUPPORTED)
def test_vocab_files(ref_bin, name):
    path = vocab_dir(ref_bin) / f"ggml-vocab-{name}.gguf"
    tok = tokenizer(path)
    pairs = cases(path)
    assert len(pairs) > 40
    for text, ids in pairs:
        assert tok.tokenize(text, add_special=False) == ids, text


def llama_tokenize(ref_bin: Path, model: Path, text: str, parse_special: bool) -> list[int]:
    argv = [str(ref_bin / "llama-tokenize"), "-m", str(model), "-p", text, "--ids", "--log-disable"]
    if not parse_special:
        argv.append("--no-parse-special")
    r = subprocess.run(argv, capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode(errors="replace")[-2000:]
    return ast.literal_eval(r.stdout.decode().strip().splitlines()[-1])


TEXTS = ["Hello <s> world</s>x  é 🦙 the old fisherman\n\tsaid: 'hello'", "<unk>a</s> </s>",
         "<|endoftext|>12345 678.9 café naïve 日本語の文章 안녕하세요\n\n  def f(x):\n\treturn x**2  # ok",
         "<|begin_of_text|>It's   I'M we'll\r\n\u00a0\u2003x"]


@pytest.mark.parametrize("parse_special", [True, False])
def test_same_ids_as_llama_tokenize(ref_bin, synth_model, parse_special):
    # each llama-tokenize run loads its vocabulary: SentencePiece both ways, BPE parsing specials
    names = SUPPORTED[:5] if parse_special else SUPPORTED[:2]
    models = [vocab_dir(ref_bin) / f"ggml-vocab-{n}.gguf" for n in names] + [synth_model]
    for model in models:
        tok = Tokenizer.from_gguf(GGUFFile(model))
        for text in TEXTS:
            ours = tok.tokenize(text, add_special=True, parse_special=parse_special)
            assert ours == llama_tokenize(ref_bin, model, text, parse_special), (model.name, text)


def test_test_vocabulary(ref_bin, tmp_path):
    """llama.cpp's `test` vocabulary, as test-llama-archs -o writes it: 5-byte chunks
    hashed to ids (a special-token text is only text there)."""
    model = save_models(ref_bin, "llama", tmp_path)["dense"]
    tok = Tokenizer.from_gguf(GGUFFile(model))
    for text in TEXTS:
        for parse_special in (True, False):
            ours = tok.tokenize(text, add_special=True, parse_special=parse_special)
            assert ours == llama_tokenize(ref_bin, model, text, parse_special), text


GEMMA4_TEXTS = [*TEXTS, "<bos><start_of_turn>user\nWrite a haiku.<end_of_turn>\n<start_of_turn>model\n",
                "  leading and trailing  \n\n\n\nfour newlines\r\n\ttab\u3000ideographic space",
                "emoji 🦙🦙 ZWJ 👩\u200d💻 accents Ääkkönen ñ; Greek αβγ; Arabic مرحبا; Hindi नमस्ते",
                "<turn|><|tool_response><eos> <unused0> <mask> [multimodal] <pad>",
                "a\n\nb\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\nc"]


@pytest.mark.parametrize("parse_special", [True, False])
def test_gemma4_same_ids_as_llama_tokenize(ref_bin, parse_special):
    """Gemma 4's vocabulary (BPE on U+2581-escaped text, newline runs whole, byte
    tokens, BOS forced) against llama-tokenize, with and without special tokens."""
    model = vocab_dir(ref_bin) / "ggml-vocab-gemma-4.gguf"
    tok = tokenizer(model)
    for text in GEMMA4_TEXTS:
        ids = tok.tokenize(text, add_special=True, parse_special=parse_special)
        assert ids == llama_tokenize(ref_bin, model, text, parse_special), text
        if not parse_special:
            assert tok.detokenize(ids, remove_special=True) == text.encode(), text
