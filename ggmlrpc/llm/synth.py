"""Random-weight GGUF models for tests and benchmarks.

They make no sense as language, but they send exactly the graphs a real model
of their architecture sends. Weights are written as F32, F16 or Q8_0 (gguf-py's
quantizer) with ``gguf.GGUFWriter``; llama.cpp's ``llama-quantize`` turns them into
any other quantized type. ``write_llama`` writes a llama model; ``write_model`` writes
any of ``ARCHS``: each architecture of ggmlrpc.llm.archs names its models (llama: with
tied or untied output) and writes their keys and tensors with the helpers of
``_Synth``.

    python -m ggmlrpc.llm.synth out.gguf --layers 12 --embd 1024 --ff 2816
    python -m ggmlrpc.llm.synth out.gguf --arch qwen2moe --embd 256 --ff 512
"""
from __future__ import annotations

import argparse
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import archs

# a few hundred word pieces so that prompts tokenize into real pieces
_WORDS = ("the of and to in is was he for it with as his on be at by had are but from or "
          "have an they which one you were her all she there would their we him been has "
          "when who will more no if out so said what up its about into than them can only "
          "other new some could time these two may then do first any my now such like our "
          "over man me even most made after also did many before must through back years "
          "where much your way well down should because each just those people how too "
          "little state good very make world still own see men work long get here between "
          "both life being under never day same another know while last might us great old "
          "year off come since against go came right used take three once upon village sea "
          "lived fisherman small hello small boat fish water night light story").split()


@dataclass
class LlamaShape:
    n_layer: int = 2
    n_embd: int = 128
    n_ff: int = 256
    n_head: int = 4
    n_head_kv: int = 2
    n_ctx: int = 512
    rope_base: float = 10000.0
    eps: float = 1e-5
    n_vocab: int = 0       # 0: the built-in vocabulary; more: padded with unused tokens
    rope_scaling: str = ""     # "linear" or "yarn" with rope_factor (""; none)
    rope_factor: float = 0.0
    rope_orig_ctx: int = 0     # the context the rope was trained on (0: not written)


def vocab() -> tuple[list[bytes], list[float], list[int]]:
    """SentencePiece-style vocabulary with byte fallback: tokens, scores, types."""
    tokens = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{i:02X}>".encode() for i in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)
    pieces = ["\u2581"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    seen = set()
    for w in _WORDS:
        for p in ("\u2581" + w, w):
            if p not in seen:
                seen.add(p)
                pieces.append(p)
    for i, p in enumerate(dict.fromkeys(pieces)):
        tokens.append(p.encode())
        types.append(1)
        scores.append(-float(i))
    return tokens, scores, types


def write_llama(path: str | Path, shape: LlamaShape = LlamaShape(), dtype: str = "f16",
                seed: int = 0, tied: bool = False, vocab_from: str | Path | None = None) -> Path:
    """A llama model; ``tied`` leaves out output.weight, so the output layer reuses
    the token embeddings (llama.cpp duplicates them onto the output device);
    ``vocab_from`` takes the tokenizer of another GGUF instead of the built-in one."""
    return write_model(path, "llama-tied" if tied else "llama", shape, dtype, seed, vocab_from)


@dataclass
class ModelShape(LlamaShape):
    """LlamaShape plus what the other architectures read; 0 means "derived"."""
    n_expert: int = 4
    n_expert_used: int = 2
    n_ff_exp: int = 0          # per-expert feed-forward (0: n_ff)
    n_ff_shexp: int = 0        # shared expert feed-forward (0: n_ff)
    n_swa: int = 8             # sliding window (gemma2, gpt-oss): short, so a prompt crosses it
    n_rot: int = 0             # rotated dims per head (0: all; phi2 rotates half)
    attn_softcap: float = 50.0
    final_softcap: float = 30.0


class _Q8_0(np.ndarray):
    """F32 weights that the writer stores as Q8_0 (gguf-py's quantizer, ggml's rounding)."""


def _quantizing(add_tensor):
    def add(name, tensor, *args, **kw):
        if isinstance(tensor, _Q8_0):
            import gguf

            tensor = gguf.quants.quantize(np.asarray(tensor), gguf.GGMLQuantizationType.Q8_0)
            kw["raw_dtype"] = gguf.GGMLQuantizationType.Q8_0
        add_tensor(name, tensor, *args, **kw)
    return add


class _Synth:
    """One GGUF being written: the metadata every architecture here shares (sizes,
    rope, SentencePiece vocabulary) and random tensors of the model's dtype."""

    def __init__(self, path, arch: str, shape: LlamaShape, dtype: str, seed: int,
                 rms: bool = True, n_rot: int | None = None, vocab_from=None):
        import gguf

        self.path = Path(path)
        self.shape = shape
        self.rng = np.random.default_rng(seed)
        self.dtype, ftype = {"f32": (np.float32, 0), "f16": (np.float16, 1), "q8_0": (_Q8_0, 7)}[dtype]
        self.head = shape.n_embd // shape.n_head
        self.n_kv = self.head * shape.n_head_kv
        w = self.w = gguf.GGUFWriter(str(self.path), arch)
        if dtype == "q8_0":
            w.add_tensor = _quantizing(w.add_tensor)
        if vocab_from is not None:
            self.n_vocab = _graft_vocab(w, vocab_from)
        else:
            tokens, scores, types = vocab()
            for i in range(len(tokens), getattr(shape, "n_vocab", 0)):
                tokens.append(f"<unused{i}>".encode())
                scores.append(-1e9)
                types.append(5)
            self.n_vocab = len(tokens)
        w.add_context_length(shape.n_ctx)
        w.add_embedding_length(shape.n_embd)
        w.add_block_count(shape.n_layer)
        w.add_feed_forward_length(shape.n_ff)
        w.add_head_count(shape.n_head)
        w.add_head_count_kv(shape.n_head_kv)
        if rms:
            w.add_layer_norm_rms_eps(shape.eps)
        else:
            w.add_layer_norm_eps(shape.eps)
        w.add_rope_dimension_count(n_rot or self.head)
        w.add_rope_freq_base(shape.rope_base)
        if shape.rope_scaling:
            w.add_rope_scaling_type(gguf.RopeScalingType(shape.rope_scaling))
            w.add_rope_scaling_factor(shape.rope_factor)
        if shape.rope_orig_ctx:
            w.add_rope_scaling_orig_ctx_len(shape.rope_orig_ctx)
        w.add_file_type(ftype)
        if vocab_from is None:
            w.add_tokenizer_model("llama")
            w.add_token_list(tokens)
            w.add_token_scores(scores)
            w.add_token_types(types)
            w.add_bos_token_id(1)
            w.add_eos_token_id(2)
            w.add_unk_token_id(0)
            w.add_add_bos_token(True)

    def mat(self, rows, cols, scale=None, n=None, dtype=None):
        """(rows, cols) weights, or n of them stacked (experts), scaled to keep
        activations near unit size."""
        scale = scale if scale is not None else 1.0 / np.sqrt(cols)
        dims = (rows, cols) if n is None else (n, rows, cols)
        x = self.rng.standard_normal(dims, dtype=np.float32) * scale
        if (dtype or self.dtype) is _Q8_0:
            return x.view(_Q8_0)
        return x.astype(dtype or self.dtype)

    def embd(self, tied: bool = False):
        """Token embeddings, unit-size unless tied to the output: then a unit-size
        row would dominate the residual stream and each token would predict
        itself forever, so the layers' contribution is made to dominate."""
        return self.mat(self.n_vocab, self.shape.n_embd, 0.005 if tied else 1.0)

    def norm(self, n):
        return np.ones(n, np.float32) + 0.1 * self.rng.standard_normal(n, dtype=np.float32)

    def bias(self, n, scale=0.1):
        return (scale * self.rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    def add_f32(self, key: str, value: float) -> None:
        import gguf
        self.w.add_key_value(key, value, gguf.GGUFValueType.FLOAT32)

    def attention(self, p: str, biases: bool = False) -> None:
        """A layer's attention norm and its q, k, v, output matrices (q/k/v biases
        when asked)."""
        e, kv = self.shape.n_embd, self.n_kv
        self.w.add_tensor(p + "attn_norm.weight", self.norm(e))
        for name, rows in (("attn_q", e), ("attn_k", kv), ("attn_v", kv)):
            self.w.add_tensor(p + name + ".weight", self.mat(rows, e))
            if biases:
                self.w.add_tensor(p + name + ".bias", self.bias(rows))
        self.w.add_tensor(p + "attn_output.weight", self.mat(e, e))

    def qk_norms(self, p: str) -> None:
        self.w.add_tensor(p + "attn_q_norm.weight", self.norm(self.head))
        self.w.add_tensor(p + "attn_k_norm.weight", self.norm(self.head))

    def ffn(self, p: str, ff: int, suffix: str = "") -> None:
        e = self.shape.n_embd
        self.w.add_tensor(p + f"ffn_gate{suffix}.weight", self.mat(ff, e))
        self.w.add_tensor(p + f"ffn_up{suffix}.weight", self.mat(ff, e))
        self.w.add_tensor(p + f"ffn_down{suffix}.weight", self.mat(e, ff))

    def experts(self) -> int:
        """The expert counts of a mixture of experts; returns the per-expert width."""
        ff_exp = self.shape.n_ff_exp or self.shape.n_ff
        self.w.add_expert_count(self.shape.n_expert)
        self.w.add_expert_used_count(self.shape.n_expert_used)
        self.w.add_expert_feed_forward_length(ff_exp)
        return ff_exp

    def routed_experts(self, p: str, ff_exp: int, gate_scale: float = 1.0) -> None:
        """The expert gate (F32, as converted models keep it; `gate_scale` below 1
        spreads the gate's probabilities over more experts) and the stacked experts."""
        e, n = self.shape.n_embd, self.shape.n_expert
        self.w.add_tensor(p + "ffn_gate_inp.weight", self.mat(n, e, gate_scale, dtype=np.float32))
        self.w.add_tensor(p + "ffn_gate_exps.weight", self.mat(ff_exp, e, n=n))
        self.w.add_tensor(p + "ffn_up_exps.weight", self.mat(ff_exp, e, n=n))
        self.w.add_tensor(p + "ffn_down_exps.weight", self.mat(e, ff_exp, n=n))

    def finish(self) -> Path:
        self.w.write_header_to_file()
        self.w.write_kv_data_to_file()
        self.w.write_tensors_to_file()
        self.w.close()
        return self.path


def _graft_vocab(w, path) -> int:
    """Copy every tokenizer.* key of another GGUF (a real vocabulary, such as
    llama.cpp's models/ggml-vocab-*.gguf) into the writer; returns the vocabulary size."""
    import gguf

    r = gguf.GGUFReader(str(path))
    n_vocab = 0
    for key, f in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = f.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = f.types[1]
            if sub == gguf.GGUFValueType.STRING:
                val = [bytes(f.parts[i]) for i in f.data]
            else:
                val = list(f.contents())
            w.add_key_value(key, val, vtype, sub)
            if key == "tokenizer.ggml.tokens":
                n_vocab = len(val)
        else:
            w.add_key_value(key, f.contents(), vtype)
    if not n_vocab:
        raise ValueError(f"{path} has no token list")
    return n_vocab


# model name -> (GGUF architecture, writer): the models each architecture names
ARCHS = {name: (arch.name, write) for arch in archs.ARCHS.values() for name, write in arch.synth.items()}


def write_model(path: str | Path, arch: str = "llama", shape: LlamaShape | None = None,
                dtype: str = "f16", seed: int = 0, vocab_from: str | Path | None = None) -> Path:
    """A random-weight model of one of ``ARCHS`` (F32, F16 or Q8_0 weights; norms, biases,
    rope factors and the expert gate stay F32 as converted models have them)."""
    shape = shape if shape is not None else ModelShape()
    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; choose from {', '.join(ARCHS)}")
    gguf_arch, write = ARCHS[arch]
    a = archs.ARCHS[gguf_arch]
    if not isinstance(shape, ModelShape):
        shape = ModelShape(**vars(shape))
    n_rot = shape.n_rot or int(shape.n_embd // shape.n_head * a.synth_rope_share)
    s = _Synth(path, gguf_arch, shape, dtype, seed, rms=not a.layer_norm, n_rot=n_rot, vocab_from=vocab_from)
    write(s)
    return s.finish()


def quantize(llama_quantize: str | Path, src: str | Path, dst: str | Path, qtype: str,
             threads: int = 2, options: tuple[str, ...] | list[str] = ()) -> Path:
    """Run llama.cpp's llama-quantize (e.g. qtype "Q8_0", "Q4_K_M"); ``options`` go
    before the files (e.g. ``("--pure",)`` or ``("--tensor-type", "ffn=mxfp4")``)."""
    subprocess.run([str(llama_quantize), *options, str(src), str(dst), qtype, str(threads)],
                   check=True, capture_output=True)
    return Path(dst)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--embd", type=int, default=128)
    ap.add_argument("--ff", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--heads-kv", type=int, default=2)
    ap.add_argument("--dtype", choices=["f32", "f16", "q8_0"], default="f16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arch", choices=list(ARCHS), default="llama")
    a = ap.parse_args(argv)
    write_model(a.out, a.arch, ModelShape(a.layers, a.embd, a.ff, a.heads, a.heads_kv),
                a.dtype, a.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
