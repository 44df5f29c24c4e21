"""Tokenizers built from GGUF metadata, tokenizing exactly as llama.cpp does.

SentencePiece vocabularies (`tokenizer.ggml.model` = "llama"):

- special tokens (control, user-defined, unknown; longest text first) are cut out
  of the text first; control and unknown ones only when `parse_special`;
- every other fragment gets a leading space when it follows a special token or
  starts the text (`add_space_prefix`), spaces become U+2581, and the fragment is
  split into UTF-8 characters that are merged pairwise, the pair whose merged
  text is the token of highest score first (leftmost on a tie), until no pair
  makes a token; a piece that is not a token is spelled by undoing its merges,
  and a character that is no token at all goes out as byte tokens (<0xXX>);
- BOS in front when the vocabulary says so (default yes), EOS never by default.

llama.cpp's test vocabulary (`tokenizer.ggml.model` = "test", what its
test-llama-archs writes): no special tokens named, no space prefix, each fragment
cut into 5-byte chunks, each chunk the token `h % n_vocab` of its rolling hash
h = 31 h + byte (unsigned 64-bit); a token's text is its id in lower-case hex.

BPE vocabularies (`tokenizer.ggml.model` = "gpt2") with the pre-tokenizers named
by `tokenizer.ggml.pre` (llama3/llama-bpe, qwen2, gpt-2 and their aliases):

- the same special-token partition; no space prefix; BOS only when the vocabulary
  asks (llama3 does);
- each fragment is split into words by the pre-tokenizer's regular expressions
  (applied in turn, each splitting the pieces of the one before, the text between
  matches kept as pieces), each word's bytes are mapped to GPT-2's byte alphabet,
  and merged pairwise by merge rank (lowest first, leftmost on a tie); llama3 takes
  a word that is a token whole (ignore_merges); a piece that is no token goes out
  byte by byte.

Gemma 4's vocabulary (`tokenizer.ggml.model` = "gemma4") is BPE in SentencePiece's
clothes: spaces become U+2581 first, the text is split only into runs of newlines
and runs of anything else (a run of newlines that is a token is taken whole), the
merges run on raw UTF-8, a piece that is no token goes out as byte tokens
(<0xXX>), and BOS always comes first.

Token ids are ints; text in and out is bytes-exact (`detokenize` returns bytes:
a byte token may end in the middle of a UTF-8 character).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

from .gguf_file import GGUFFile, ModelError

# token types in GGUF (llama_token_type) and the attributes llama.cpp gives them
TYPE_NORMAL, TYPE_UNKNOWN, TYPE_CONTROL, TYPE_USER_DEFINED, TYPE_UNUSED, TYPE_BYTE = 1, 2, 3, 4, 5, 6
ATTR_UNKNOWN, ATTR_UNUSED, ATTR_NORMAL, ATTR_CONTROL = 1, 2, 4, 8
ATTR_USER_DEFINED, ATTR_BYTE, ATTR_LSTRIP, ATTR_RSTRIP = 16, 32, 128, 256
_ATTR_OF_TYPE = {TYPE_NORMAL: ATTR_NORMAL, TYPE_UNKNOWN: ATTR_UNKNOWN, TYPE_CONTROL: ATTR_CONTROL,
                 TYPE_USER_DEFINED: ATTR_USER_DEFINED, TYPE_UNUSED: ATTR_UNUSED, TYPE_BYTE: ATTR_BYTE}
SPECIAL_ATTRS = ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN
SPACE = "\u2581".encode()

# texts llama.cpp takes for the end-of-turn token when the metadata names none
_EOT_TEXTS = {b"<|eot_id|>", b"<|im_end|>", b"<|end|>", b"<end_of_turn>", b"<|endoftext|>",
              b"<|end_of_text|>", b"<EOT>", b"_<EOT>", b"[EOT]", b"<end_of_utterance>",
              "<\uff5cend\u2581of\u2581sentence\uff5c>".encode()}
# texts that end generation whatever the metadata says (and are made control tokens)
_EOG_TEXTS = {b"<|eot_id|>", b"<|im_end|>", b"<|end|>", b"<|return|>", b"<|call|>", b"<|flush|>",
              b"<|calls|>", b"<end_of_turn>", b"<|endoftext|>", b"</s>", b"<|eom_id|>", b"<EOT>",
              b"_<EOT>", b"[EOT]", b"[EOS]", b"<|end_of_text|>", b"<end_of_utterance>", b"<eos>",
              b"<turn|>", b"<|tool_response>", "<\uff5cend\u2581of\u2581sentence\uff5c>".encode(),
              b"[e~["}


# pre-tokenizer regular expressions by llama.cpp's pre-tokenizer type
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
           r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")
# name -> (regexes, ignore_merges, add_bos)
PRE_TOKENIZERS = {
    **{n: ((_LLAMA3,), True, True) for n in ("llama3", "llama-v3", "llama-bpe", "falcon3",
                                              "falcon-h1", "pixtral", "midm-2.0", "lfm2")},
    **{n: ((_QWEN2,), False, None) for n in ("qwen2", "deepseek-r1-qwen", "kormo", "stablelm2",
                                              "hunyuan")},
    **{n: ((_GPT2,), False, None) for n in ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat",
                                             "jina-v2-es", "jina-v2-de", "mpt", "olmo", "jais",
                                             "trillion")},
    **{n: ((r"\p{N}", _GPT2), False, None) for n in ("starcoder", "refact", "command-r", "smollm",
                                                     "codeshell", "exaone")},
    "falcon": ((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"), False, None),
    "deepseek-coder": ((r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+",
                        "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+", r"\p{N}"), False, None),
    "default": (_DEFAULT, False, None),
    "gemma4": ((r"[^\n]+|[\n]+",), False, True),
}
# pre-tokenizers on raw UTF-8 with spaces as U+2581 (not GPT-2's byte alphabet)
SPM_STYLE = {"gemma4"}


# pre-tokenizers whose detokenizer keeps spaces as they are (llama.cpp's clean_spaces off)
KEEP_SPACES = {"deepseek-r1-qwen", "kormo", "qwen2", "deepseek-coder", "command-r", "smollm"}


def clean_spaces(text: bytes) -> bytes:
    """llama.cpp's clean_up_tokenization_spaces, pass for pass, on the bytes in place:
    no space before ? ! . , ; " ' " between spaces loses both; no space before 's 'm
    're 've."""
    t = bytearray(text)

    # each rule says, for byte i of a pass over n bytes: (drop the byte before, skip the next)
    def punct(i, n):
        return t[i - 1] == 0x20 and t[i] in b"?!.,", False

    def apostrophe(i, n):
        hit = t[i] == 0x27 and i + 1 < n and t[i - 1] == 0x20 and t[i + 1] == 0x20
        return hit, hit

    def contraction(i, n):
        if not (t[i - 1] == 0x20 and t[i] == 0x27 and i + 1 < n) or t[i + 1] in b"td":
            return False, False
        return t[i + 1] in b"sm" or (i + 2 < n and bytes(t[i + 1:i + 3]) in (b"re", b"ve")), False

    total = len(t)
    for rule in (punct, apostrophe, contraction):
        n, total = total, (1 if total else 0)
        i = 1
        while i < n:
            x = t[i]
            drop, skip = rule(i, n)
            total -= drop
            if skip:
                i += 1
                t[i] = 0
            t[total] = x
            total += 1
            i += 1
    return bytes(t[:total])


def _byte_alphabet() -> list[str]:
    """GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others
    are shifted to U+0100 and up."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, n = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return [table[b] for b in range(256)]


BYTE_TO_UNICODE = _byte_alphabet()
UNICODE_TO_BYTE = {c: b for b, c in enumerate(BYTE_TO_UNICODE)}


def _utf8_len(lead: int) -> int:
    """Bytes of a UTF-8 character from its lead byte (a stray continuation byte: 1)."""
    return (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)[lead >> 4]


@dataclass
class _Fragment:
    text: bytes = b""
    token: int = -1      # >= 0: an already-resolved special token


class Tokenizer:
    """A vocabulary and its tokenizer. Build one with `Tokenizer.from_gguf`."""

    test = False    # llama.cpp's test vocabulary (hashed chunks)

    def __init__(self, tokens: list[bytes], scores: list[float], types: list[int], *,
                 model: str = "llama", bos: int | None = 1, eos: int | None = 2,
                 eot: int | None = None, unk: int | None = 0, add_bos: bool = True,
                 add_eos: bool = False, add_space_prefix: bool | None = None, name: str = "",
                 merges: list[bytes] | None = None, pre: str | None = None):
        if model not in ("llama", "gpt2", "gemma4"):
            raise ModelError(f"tokenizer model {model!r} is not supported "
                             "(SentencePiece 'llama', BPE 'gpt2' and 'gemma4' are)")
        self.model = model
        self.bpe = model != "llama"
        if self.bpe:
            self._init_bpe(merges, "gemma4" if model == "gemma4" else pre or "default")
            add_bos = add_bos or model == "gemma4"      # llama.cpp forces it
            add_space_prefix = False if add_space_prefix is None else add_space_prefix
        elif add_space_prefix is None:
            add_space_prefix = True
        self.tokens = tokens
        self.scores = scores
        n = len(tokens)
        self.attrs = [_ATTR_OF_TYPE.get(t, 0) for t in types] if types else [ATTR_NORMAL] * n
        self.ids = {t: i for i, t in enumerate(tokens)}
        in_range = lambda i: i if i is not None and 0 <= i < n else None  # noqa: E731
        self.bos, self.eos, self.unk = in_range(bos), in_range(eos), in_range(unk)
        self.add_bos, self.add_eos, self.add_space_prefix = add_bos, add_eos, add_space_prefix
        self.eot = in_range(eot)
        self._mark_end_of_generation()
        if "phi-3" in name.lower() or "phi3" in name.lower():
            self._phi3_attrs()
        # cut out longest first (llama.cpp sorts by length, unstably; ties never overlap)
        self.special = sorted((i for i in range(n) if self.attrs[i] & SPECIAL_ATTRS),
                              key=lambda i: -len(tokens[i]))

    def _init_bpe(self, merges: list[bytes] | None, pre: str) -> None:
        import regex

        if merges is None:
            raise ModelError("BPE vocabulary without merges")
        if pre not in PRE_TOKENIZERS:
            raise ModelError(f"pre-tokenizer {pre!r} is not supported "
                             f"(supported: {', '.join(sorted(PRE_TOKENIZERS))})")
        exprs, self.ignore_merges, self.pre_add_bos = PRE_TOKENIZERS[pre]
        self.pre = pre
        self.clean_up_spaces = pre not in KEEP_SPACES
        self.spm_style = pre in SPM_STYLE
        self.regexes = [regex.compile(e) for e in exprs]
        self.ranks: dict[tuple[bytes, bytes], int] = {}
        for i, m in enumerate(merges):
            at = m.find(b" ", 1)
            if at > 0:
                self.ranks.setdefault((m[:at], m[at + 1:]), i)

    def _mark_end_of_generation(self) -> None:
        """llama.cpp's text rules: an end-of-turn token found by its text when the
        metadata names none, end-of-generation tokens by text plus EOS/EOT/EOM, each
        made a control token."""
        ids = self.ids
        if self.eot is None:
            self.eot = min((ids[t] for t in _EOT_TEXTS if t in ids), default=None)
            if self.eot is not None:
                self.attrs[self.eot] |= ATTR_CONTROL
        self.eom = ids.get(b"<|eom_id|>")
        self.eog = set()
        for text in _EOG_TEXTS & ids.keys():
            self.eog.add(ids[text])
            self.attrs[ids[text]] |= ATTR_CONTROL
        self.eog |= {t for t in (self.eos, self.eot, self.eom) if t is not None}
        s = ids.get(b"</s>")
        if s in self.eog and any(self.tokens[t] in (b"<|tool_response>", b"<|plamo:eos|>") for t in self.eog):
            self.eog.discard(s)         # Gemma 4's and PLaMo's </s> is a plain token
            self.attrs[s] = ATTR_NORMAL

    def _phi3_attrs(self) -> None:
        for i in range(len(self.tokens)):
            if self.attrs[i] & SPECIAL_ATTRS:
                self.attrs[i] |= ATTR_RSTRIP
        for text, on in ((b"</s>", True), (b"<unk>", False), (b"<s>", False), (b"<|endoftext|>", False)):
            if text in self.ids:
                i = self.ids[text]
                self.attrs[i] = self.attrs[i] | ATTR_RSTRIP if on else self.attrs[i] & ~ATTR_RSTRIP

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Tokenizer":
        model = f.get("tokenizer.ggml.model")
        if model is None:
            raise ModelError(f"{f.path}: no tokenizer in the model")
        if "tokenizer.ggml.tokens" not in f.reader.fields:
            raise ModelError(f"{f.path}: no token list in the model")
        tokens = f.strings("tokenizer.ggml.tokens")
        scores = [float(s) for s in f.get("tokenizer.ggml.scores", [0.0] * len(tokens))]
        types = [int(t) for t in f.get("tokenizer.ggml.token_type", [])]
        opt = lambda key: f.get(f"tokenizer.ggml.{key}")  # noqa: E731
        kw = {}
        for key, arg in (("bos_token_id", "bos"), ("eos_token_id", "eos"), ("eot_token_id", "eot"),
                         ("unknown_token_id", "unk"), ("add_bos_token", "add_bos"),
                         ("add_eos_token", "add_eos"), ("add_space_prefix", "add_space_prefix")):
            if opt(key) is not None:
                kw[arg] = opt(key)
        if model in ("gpt2", "gemma4"):
            if "tokenizer.ggml.merges" not in f.reader.fields:
                raise ModelError(f"{f.path}: BPE vocabulary without merges")
            kw["merges"] = f.strings("tokenizer.ggml.merges")
            kw["pre"] = str(f.get("tokenizer.ggml.pre", "default"))
            kw.setdefault("bos", None if "bos" not in kw else kw["bos"])
            kw.setdefault("eos", None)
            kw.setdefault("unk", None)
            pre = PRE_TOKENIZERS.get(kw["pre"])
            kw.setdefault("add_bos", bool(pre and pre[2]))
        if model == "test":     # SentencePiece's special-token handling, no special tokens named
            kw = {"bos": None, "eos": None, "unk": None, **kw, "add_space_prefix": False}
            tok = cls(tokens, scores, types, model="llama", **kw)
            tok.model, tok.test = "test", True
            return tok
        return cls(tokens, scores, types, model=str(model), name=str(f.get("general.name", "")), **kw)

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    # -- encoding ------------------------------------------------------------
    def tokenize(self, text: str | bytes, add_special: bool = True,
                 parse_special: bool = False) -> list[int]:
        raw = text.encode() if isinstance(text, str) else bytes(text)
        frags = self._partition(raw, parse_special) if raw else []
        out: list[int] = []
        if add_special and self.add_bos:
            if self.bos is None:
                raise ModelError("the vocabulary asks for BOS but has none")
            out.append(self.bos)
        prev_special = True
        for fr in frags:
            if self.test and fr.token < 0:
                self._test_chunks(fr.text, out)
                continue
            if fr.token >= 0:
                out.append(fr.token)
                prev_special = True
                continue
            if self.bpe:
                self._bpe(fr.text.replace(b" ", SPACE) if self.spm_style else fr.text, out)
            else:
                t = (b" " if self.add_space_prefix and prev_special else b"") + fr.text
                self._spm(t.replace(b" ", SPACE), out)
            prev_special = False
        if add_special and self.add_eos and self.eos is not None:
            out.append(self.eos)
        return out

    def _partition(self, raw: bytes, parse_special: bool) -> list[_Fragment]:
        """Cut special tokens out of the text (llama.cpp's tokenizer_st_partition)."""
        frags = [_Fragment(raw)]
        for tid in self.special:
            attr = self.attrs[tid]
            if not parse_special and attr & (ATTR_CONTROL | ATTR_UNKNOWN):
                continue
            needle = self.tokens[tid]
            if not needle:
                continue
            nxt: list[_Fragment] = []
            for fr in frags:
                if fr.token >= 0 or needle not in fr.text:
                    nxt.append(fr)
                    continue
                rest = fr.text
                while True:
                    at = rest.find(needle)
                    if at < 0:
                        if rest:
                            nxt.append(_Fragment(rest))
                        break
                    left = rest[:at]
                    if attr & ATTR_LSTRIP:
                        left = left.rstrip(b" \t\n\v\f\r")
                    if left:
                        nxt.append(_Fragment(left))
                    nxt.append(_Fragment(token=tid))
                    rest = rest[at + len(needle):]
                    if attr & ATTR_RSTRIP:
                        rest = rest.lstrip(b" \t\n\v\f\r")
            frags = nxt
        return frags

    def _test_chunks(self, text: bytes, out: list[int]) -> None:
        """llama.cpp's test tokenizer: a token per 5-byte chunk, from its rolling hash."""
        for at in range(0, len(text), 5):
            h = 0
            for b in text[at:at + 5]:
                h = (h * 31 + b) & 0xFFFFFFFFFFFFFFFF
            out.append(h % len(self.tokens))

    def _spm(self, text: bytes, out: list[int]) -> None:
        """One fragment through SentencePiece's merge loop (llama.cpp's spm session)."""
        # symbols: [start, length, prev, next]
        syms: list[list[int]] = []
        off = 0
        while off < len(text):
            n = min(_utf8_len(text[off]), len(text) - off)
            syms.append([off, n, len(syms) - 1, -1])
            off += n
        for i in range(len(syms) - 1):
            syms[i][3] = i + 1
        heap: list[tuple[float, int, int, int]] = []
        rev_merge: dict[bytes, tuple[int, int]] = {}
        ids, scores = self.ids, self.scores

        def add_bigram(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            s = syms[left][0]
            piece = text[s:s + syms[left][1] + syms[right][1]]
            tid = ids.get(piece)
            if tid is None:
                return
            heapq.heappush(heap, (-scores[tid], left, right, len(piece)))
            rev_merge[piece] = (left, right)

        for i in range(1, len(syms)):
            add_bigram(i - 1, i)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            ls, rs = syms[left], syms[right]
            if ls[1] == 0 or rs[1] == 0 or ls[1] + rs[1] != size:
                continue
            ls[1] += rs[1]
            rs[1] = 0
            ls[3] = rs[3]
            if rs[3] >= 0:
                syms[rs[3]][2] = left
            add_bigram(ls[2], left)
            add_bigram(left, ls[3])

        def resegment(i: int) -> None:
            s, n = syms[i][0], syms[i][1]
            piece = text[s:s + n]
            tid = ids.get(piece)
            if tid is not None:
                out.append(tid)
                return
            pair = rev_merge.get(piece)
            if pair is None:
                out.extend(self.byte_token(b) for b in piece)
                return
            resegment(pair[0])
            resegment(pair[1])

        i = 0 if syms else -1
        while i != -1:
            resegment(i)
            i = syms[i][3]

    def _words(self, text: bytes) -> list[bytes]:
        """The pre-tokenizer: each regex splits every piece of the one before (text
        between matches is a piece too); words come back in GPT-2's byte alphabet."""
        u = text.decode("utf-8", "surrogatepass") if self._valid(text) else None
        if u is None:   # invalid UTF-8 cannot be split by character classes
            return [text if self.spm_style else "".join(BYTE_TO_UNICODE[b] for b in text).encode()]
        spans = [(0, len(u))]
        for rx in self.regexes:
            nxt = []
            for start, end in spans:
                at = start
                for m in rx.finditer(u, start, end):
                    if m.start() > at:
                        nxt.append((at, m.start()))
                    nxt.append((m.start(), m.end()))
                    at = m.end()
                if at < end:
                    nxt.append((at, end))
            spans = nxt
        if self.spm_style:
            return [u[a:b].encode("utf-8", "surrogatepass") for a, b in spans]
        return ["".join(BYTE_TO_UNICODE[b] for b in u[a:b].encode("utf-8", "surrogatepass")).encode()
                for a, b in spans]

    @staticmethod
    def _valid(text: bytes) -> bool:
        try:
            text.decode("utf-8")
            return True
        except UnicodeDecodeError:
            return False

    def _bpe(self, text: bytes, out: list[int]) -> None:
        """One fragment through llama.cpp's BPE session: words, then rank-ordered merges."""
        ids, ranks = self.ids, self.ranks
        for word in self._words(text):
            whole = self.ignore_merges or (self.spm_style and not word.strip(b"\n"))
            if whole and word in ids:
                out.append(ids[word])
                continue
            parts = []
            off = 0
            while off < len(word):
                n = min(_utf8_len(word[off]), len(word) - off)
                parts.append(word[off:off + n])
                off += n
            while len(parts) > 1:
                best, at = None, -1
                for i in range(len(parts) - 1):
                    r = ranks.get((parts[i], parts[i + 1]))
                    if r is not None and (best is None or r < best):
                        best, at = r, i
                if best is None:
                    break
                parts[at:at + 2] = [parts[at] + parts[at + 1]]
            for p in parts:
                tid = ids.get(p)
                if tid is not None:
                    out.append(tid)
                    continue
                if self.spm_style:      # byte tokens <0xXX> where there are
                    out.extend(t for t in (ids.get(b"<0x%02X>" % b) for b in p) if t is not None)
                    continue
                for ch in p.decode("utf-8", "surrogatepass"):   # bytes of the alphabet, one token each
                    t = ids.get(ch.encode("utf-8", "surrogatepass"))
                    if t is not None:
                        out.append(t)

    def byte_token(self, b: int) -> int:
        tid = self.ids.get(b"<0x%02X>" % b)
        if tid is None:
            tid = self.ids.get(bytes([b]))
        if tid is None:
            raise ModelError(f"the vocabulary has no token for byte 0x{b:02X}")
        return tid

    # -- decoding ------------------------------------------------------------
    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        """A token's bytes as llama.cpp prints it (control tokens empty unless `special`)."""
        attr = self.attrs[token]
        if not special and attr & (ATTR_UNKNOWN | ATTR_CONTROL):
            return b""
        if self.test:
            return b"%x" % token
        text = self.tokens[token]
        if attr & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED):
            return text
        if attr & ATTR_NORMAL:
            if self.bpe and not self.spm_style:
                u = text.decode("utf-8", "surrogatepass")
                try:
                    return bytes(UNICODE_TO_BYTE[c] for c in u)
                except KeyError:
                    return b"".join(bytes([UNICODE_TO_BYTE[c]]) if c in UNICODE_TO_BYTE
                                    else c.encode() for c in u)
            return text.replace(SPACE, b" ")
        if attr & ATTR_BYTE:
            return bytes([int(text[3:5], 16)])
        return b""

    def detokenize(self, tokens: list[int], remove_special: bool = False,
                   unparse_special: bool = False) -> bytes:
        """The text of a token sequence, as llama.cpp's detokenizer gives it: the
        space SentencePiece put in front of the first fragment is dropped unless a
        BOS comes first (whose piece is empty unless `unparse_special`)."""
        tokens = list(tokens)
        remove_space = self.add_space_prefix
        if remove_special and self.add_bos and tokens and tokens[0] == self.bos:
            remove_space = False
            tokens = tokens[1:]
        if remove_special and self.add_eos and tokens and tokens[-1] == self.eos:
            tokens = tokens[:-1]
        out = bytearray()
        for t in tokens:
            piece = self.token_to_piece(t, unparse_special)
            if remove_space and piece.startswith(b" "):
                piece = piece[1:]
            remove_space = False
            out += piece
        if self.bpe and self.clean_up_spaces:
            return clean_spaces(bytes(out))
        return bytes(out)

    def is_eog(self, token: int) -> bool:
        return token in self.eog
