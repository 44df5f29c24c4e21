"""The SentencePiece tokenizer on a generated model's vocabulary (no reference needed)."""
from __future__ import annotations

import pytest

from ggmlrpc.llm import synth
from ggmlrpc.llm.gguf_file import GGUFFile, ModelError
from ggmlrpc.llm.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def synth_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "llama.gguf"
    return synth.write_llama(path, synth.LlamaShape(n_layer=1, n_embd=32, n_ff=64, n_head=2, n_head_kv=1))


@pytest.fixture(scope="module")
def tok(synth_model):
    return Tokenizer.from_gguf(GGUFFile(synth_model))


def pieces(tok, ids):
    return [tok.tokens[i].decode() for i in ids]


def test_words_merge_into_pieces(tok):
    ids = tok.tokenize("the old fisherman", add_special=True)
    assert ids[0] == tok.bos
    # a space prefix is added to the first fragment; spaces become U+2581; merges
    # go only through pieces the vocabulary has (its words, not their prefixes)
    assert "".join(pieces(tok, ids[1:])) == "\u2581the\u2581old\u2581fisherman"
    assert pieces(tok, ids[1:2]) == ["\u2581the"] and len(ids) < len("the old fisherman")


def test_byte_fallback_and_round_trip(tok):
    text = "sea \u00e9\U0001f999!\n"
    ids = tok.tokenize(text, add_special=False)
    assert "<0xC3>" in pieces(tok, ids) and "<0xF0>" in pieces(tok, ids)
    assert tok.detokenize(ids) == text.encode()
    # with BOS in front the leading space stays (llama.cpp's rule)
    assert tok.detokenize(tok.tokenize(text)) == b" " + text.encode()


def test_special_tokens_only_when_parsed(tok):
    with_special = tok.tokenize("a</s>b", add_special=False, parse_special=True)
    assert tok.eos in with_special
    assert tok.eos not in tok.tokenize("a</s>b", add_special=False, parse_special=False)
    assert tok.token_to_piece(tok.eos) == b"" and tok.token_to_piece(tok.eos, special=True) == b"</s>"
    assert tok.is_eog(tok.eos)


def test_not_gguf(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"nope")
    with pytest.raises(ModelError, match="not a GGUF file"):
        GGUFFile(bad)
    with pytest.raises(ModelError, match="not found"):
        GGUFFile(tmp_path / "missing.gguf")


def test_clean_spaces_rules():
    """llama.cpp's clean_up_tokenization_spaces, the rules its code states."""
    from ggmlrpc.llm.tokenizer import clean_spaces

    assert clean_spaces(b"Hello , world ! ok ? yes .") == b"Hello, world! ok? yes."
    assert clean_spaces(b"a ' b") == b"a'b"
    assert clean_spaces(b"it 's I 'm we 're you 've") == b"it's I'm we're you've"
    assert clean_spaces(b"don 't we 'll I 'd") == b"don 't we 'll I 'd"     # kept, as llama.cpp keeps them
    assert clean_spaces(b"") == b"" and clean_spaces(b" ,") == b","
