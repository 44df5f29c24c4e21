"""Random-weight GGUF models for tests and benchmarks.

They make no sense as language, but they send exactly the graphs a real model
of their architecture sends. Weights are written as F32, F16 or Q8_0 (gguf-py's
quantizer) with ``gguf.GGUFWriter``; llama.cpp's ``llama-quantize`` turns them into
any other quantized type. ``write_llama`` writes a llama model; ``write_model`` writes any
of ``ARCHS`` (llama with tied or untied output, qwen2, qwen3, qwen3moe, gemma2, gemma3, phi2, phi3 and
the mixtures of experts qwen2moe and gpt-oss), each chosen for the ops its graph
adds.

    python -m ggmlrpc.llm.synth out.gguf --layers 12 --embd 1024 --ff 2816
    python -m ggmlrpc.llm.synth out.gguf --arch qwen2moe --embd 256 --ff 512
"""
from __future__ import annotations

import argparse
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

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
    s = _Synth(path, "llama", shape, dtype, seed, vocab_from=vocab_from)
    e = shape.n_embd
    s.w.add_tensor("token_embd.weight", s.embd(tied))
    for i in range(shape.n_layer):
        p = f"blk.{i}."
        _attention(s, p)
        s.w.add_tensor(p + "ffn_norm.weight", s.norm(e))
        _ffn(s, p, shape.n_ff)
    s.w.add_tensor("output_norm.weight", np.ones(e, np.float32))
    if not tied:
        s.w.add_tensor("output.weight", s.mat(s.n_vocab, e))
    return s.finish()


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


def _qwen2(s: _Synth, moe: bool = False) -> None:
    """Llama with q/k/v biases and NeoX rope; qwen2moe replaces the feed-forward
    by routed experts (softmax gate, top-k, MUL_MAT_ID) plus a shared expert
    behind a sigmoid gate."""
    sh, e = s.shape, s.shape.n_embd
    if moe:
        ff_exp = _experts(s)
        s.w.add_expert_shared_feed_forward_length(sh.n_ff_shexp or sh.n_ff)
    s.w.add_tensor("token_embd.weight", s.embd())
    for i in range(sh.n_layer):
        p = f"blk.{i}."
        _attention(s, p, biases=True)
        s.w.add_tensor(p + "ffn_norm.weight", s.norm(e))
        if not moe:
            _ffn(s, p, sh.n_ff)
            continue
        _routed_experts(s, p, ff_exp)
        s.w.add_tensor(p + "ffn_gate_inp_shexp.weight", s.bias(e, 1.0 / np.sqrt(e)))
        _ffn(s, p, sh.n_ff_shexp or sh.n_ff, "_shexp")
    s.w.add_tensor("output_norm.weight", s.norm(e))
    s.w.add_tensor("output.weight", s.mat(s.n_vocab, e))


def _routed_experts(s: _Synth, p: str, ff_exp: int) -> None:
    """The expert gate (F32, as converted models keep it) and the stacked experts."""
    e, n = s.shape.n_embd, s.shape.n_expert
    s.w.add_tensor(p + "ffn_gate_inp.weight", s.mat(n, e, 1.0, dtype=np.float32))
    s.w.add_tensor(p + "ffn_gate_exps.weight", s.mat(ff_exp, e, n=n))
    s.w.add_tensor(p + "ffn_up_exps.weight", s.mat(ff_exp, e, n=n))
    s.w.add_tensor(p + "ffn_down_exps.weight", s.mat(e, ff_exp, n=n))


def _qwen3(s: _Synth, moe: bool = False) -> None:
    """Llama with an RMS norm over each query and key head (before rope), NeoX rope;
    qwen3moe has routed experts (their chosen gate weights renormalized), no shared one."""
    sh, e = s.shape, s.shape.n_embd
    if moe:
        ff_exp = _experts(s)
    s.w.add_tensor("token_embd.weight", s.embd())
    for i in range(sh.n_layer):
        p = f"blk.{i}."
        _attention(s, p)
        _qk_norms(s, p)
        s.w.add_tensor(p + "ffn_norm.weight", s.norm(e))
        if not moe:
            _ffn(s, p, sh.n_ff)
            continue
        _routed_experts(s, p, ff_exp)
    s.w.add_tensor("output_norm.weight", s.norm(e))
    s.w.add_tensor("output.weight", s.mat(s.n_vocab, e))


def _ffn(s: _Synth, p: str, ff: int, suffix: str = "") -> None:
    e = s.shape.n_embd
    s.w.add_tensor(p + f"ffn_gate{suffix}.weight", s.mat(ff, e))
    s.w.add_tensor(p + f"ffn_up{suffix}.weight", s.mat(ff, e))
    s.w.add_tensor(p + f"ffn_down{suffix}.weight", s.mat(e, ff))


def _attention(s: _Synth, p: str, biases: bool = False) -> None:
    """A layer's attention norm and its q, k, v, output matrices (q/k/v biases
    when asked)."""
    e, kv = s.shape.n_embd, s.n_kv
    s.w.add_tensor(p + "attn_norm.weight", s.norm(e))
    for name, rows in (("attn_q", e), ("attn_k", kv), ("attn_v", kv)):
        s.w.add_tensor(p + name + ".weight", s.mat(rows, e))
        if biases:
            s.w.add_tensor(p + name + ".bias", s.bias(rows))
    s.w.add_tensor(p + "attn_output.weight", s.mat(e, e))


def _experts(s: _Synth) -> int:
    """The expert counts of a mixture of experts; returns the per-expert width."""
    ff_exp = s.shape.n_ff_exp or s.shape.n_ff
    s.w.add_expert_count(s.shape.n_expert)
    s.w.add_expert_used_count(s.shape.n_expert_used)
    s.w.add_expert_feed_forward_length(ff_exp)
    return ff_exp


def _gemma(s: _Synth, version: int = 2) -> None:
    """Scaled embeddings, norms after attention and feed-forward too, GELU-gated
    feed-forward, output tied to the embeddings, sliding-window layers (a short
    window). gemma2: every other layer slides, attention and final logits are
    soft-capped (tanh). gemma3: per-head q/k norms, five of every six layers slide
    and rotate with their own rope base, no soft-capping."""
    sh, e = s.shape, s.shape.n_embd
    s.w.add_key_length(s.head)
    s.w.add_value_length(s.head)
    s.w.add_sliding_window(sh.n_swa)
    if version == 2:
        s.w.add_attn_logit_softcapping(sh.attn_softcap)
        s.w.add_final_logit_softcapping(sh.final_softcap)
    else:
        s.w.add_key_value("gemma3.rope.freq_base_swa", 10000.0, _value_type("FLOAT32"))
    s.w.add_tensor("token_embd.weight", s.embd(tied=True))
    for i in range(sh.n_layer):
        p = f"blk.{i}."
        _attention(s, p)
        if version == 3:
            _qk_norms(s, p)
        s.w.add_tensor(p + "post_attention_norm.weight", s.norm(e))
        s.w.add_tensor(p + "ffn_norm.weight", s.norm(e))
        _ffn(s, p, sh.n_ff)
        s.w.add_tensor(p + "post_ffw_norm.weight", s.norm(e))
    s.w.add_tensor("output_norm.weight", s.norm(e))


def _qk_norms(s: _Synth, p: str) -> None:
    s.w.add_tensor(p + "attn_q_norm.weight", s.norm(s.head))
    s.w.add_tensor(p + "attn_k_norm.weight", s.norm(s.head))


def _value_type(name: str):
    import gguf
    return getattr(gguf.GGUFValueType, name)


def _phi3(s: _Synth) -> None:
    """One fused q/k/v matrix and one fused gate/up matrix (the graph splits them
    with views), NeoX rope with per-dimension frequency factors (LongRoPE: the
    long set, as the context exceeds the original one)."""
    sh, e, kv = s.shape, s.shape.n_embd, s.n_kv
    s.w.add_rope_scaling_orig_ctx_len(sh.n_ctx // 2)
    s.w.add_tensor("token_embd.weight", s.embd())
    for name in ("rope_factors_long", "rope_factors_short"):
        s.w.add_tensor(name + ".weight", 1.0 + 3.0 * s.rng.random(s.head // 2, dtype=np.float32))
    for i in range(sh.n_layer):
        p = f"blk.{i}."
        s.w.add_tensor(p + "attn_norm.weight", s.norm(e))
        s.w.add_tensor(p + "attn_qkv.weight", s.mat(e + 2 * kv, e))
        s.w.add_tensor(p + "attn_output.weight", s.mat(e, e))
        s.w.add_tensor(p + "ffn_norm.weight", s.norm(e))
        s.w.add_tensor(p + "ffn_up.weight", s.mat(2 * sh.n_ff, e))
        s.w.add_tensor(p + "ffn_down.weight", s.mat(e, sh.n_ff))
    s.w.add_tensor("output_norm.weight", s.norm(e))
    s.w.add_tensor("output.weight", s.mat(s.n_vocab, e))


def _phi2(s: _Synth) -> None:
    """LayerNorm with biases, fused q/k/v with bias, rope on part of each head,
    attention and a GELU feed-forward in parallel on the same normed input, a
    biased output layer."""
    sh, e, kv = s.shape, s.shape.n_embd, s.n_kv
    s.w.add_tensor("token_embd.weight", s.embd())
    for i in range(sh.n_layer):
        p = f"blk.{i}."
        s.w.add_tensor(p + "attn_norm.weight", s.norm(e))
        s.w.add_tensor(p + "attn_norm.bias", s.bias(e))
        s.w.add_tensor(p + "attn_qkv.weight", s.mat(e + 2 * kv, e))
        s.w.add_tensor(p + "attn_qkv.bias", s.bias(e + 2 * kv))
        s.w.add_tensor(p + "attn_output.weight", s.mat(e, e))
        s.w.add_tensor(p + "attn_output.bias", s.bias(e))
        s.w.add_tensor(p + "ffn_up.weight", s.mat(sh.n_ff, e))
        s.w.add_tensor(p + "ffn_up.bias", s.bias(sh.n_ff))
        s.w.add_tensor(p + "ffn_down.weight", s.mat(e, sh.n_ff))
        s.w.add_tensor(p + "ffn_down.bias", s.bias(e))
    s.w.add_tensor("output_norm.weight", s.norm(e))
    s.w.add_tensor("output_norm.bias", s.bias(e))
    s.w.add_tensor("output.weight", s.mat(s.n_vocab, e))
    s.w.add_tensor("output.bias", s.bias(s.n_vocab))


def _gpt_oss(s: _Synth) -> None:
    """The other kind of mixture of experts: a learned sink logit per head in
    attention, every other layer a short sliding window, experts with biases
    (ADD_ID), the clamped SwiGLU variant (SWIGLU_OAI), and gate weights
    soft-maxed over the chosen experts only."""
    sh, e, n = s.shape, s.shape.n_embd, s.shape.n_expert
    ff_exp = _experts(s)
    s.w.add_sliding_window(sh.n_swa)
    s.w.add_tensor("token_embd.weight", s.embd())
    for i in range(sh.n_layer):
        p = f"blk.{i}."
        _attention(s, p, biases=True)
        s.w.add_tensor(p + "attn_output.bias", s.bias(e))
        s.w.add_tensor(p + "attn_sinks.weight", s.bias(sh.n_head, 1.0))
        s.w.add_tensor(p + "post_attention_norm.weight", s.norm(e))
        s.w.add_tensor(p + "ffn_gate_inp.weight", s.mat(n, e, 1.0, dtype=np.float32))
        s.w.add_tensor(p + "ffn_gate_inp.bias", s.bias(n))
        for name, rows, cols in (("ffn_gate_exps", ff_exp, e), ("ffn_up_exps", ff_exp, e),
                                 ("ffn_down_exps", e, ff_exp)):
            s.w.add_tensor(p + name + ".weight", s.mat(rows, cols, n=n))
            s.w.add_tensor(p + name + ".bias", s.mat(n, rows, 0.1, dtype=np.float32))
    s.w.add_tensor("output_norm.weight", s.norm(e))
    s.w.add_tensor("output.weight", s.mat(s.n_vocab, e))


# name -> (GGUF architecture, tensor writer); llama and llama-tied go through write_llama
ARCHS = {
    "llama": ("llama", None),
    "llama-tied": ("llama", None),
    "qwen2": ("qwen2", _qwen2),
    "qwen3": ("qwen3", _qwen3),
    "qwen3moe": ("qwen3moe", lambda s: _qwen3(s, moe=True)),
    "qwen2moe": ("qwen2moe", lambda s: _qwen2(s, moe=True)),
    "gpt-oss": ("gpt-oss", _gpt_oss),
    "gemma2": ("gemma2", _gemma),
    "gemma3": ("gemma3", lambda s: _gemma(s, 3)),
    "phi2": ("phi2", _phi2),
    "phi3": ("phi3", _phi3),
}


def write_model(path: str | Path, arch: str = "llama", shape: LlamaShape | None = None,
                dtype: str = "f16", seed: int = 0) -> Path:
    """A random-weight model of one of ``ARCHS`` (F32, F16 or Q8_0 weights; norms, biases,
    rope factors and the expert gate stay F32 as converted models have them)."""
    shape = shape if shape is not None else ModelShape()
    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; choose from {', '.join(ARCHS)}")
    gguf_arch, body = ARCHS[arch]
    if body is None:
        return write_llama(path, shape, dtype, seed, tied=arch == "llama-tied")
    if not isinstance(shape, ModelShape):
        shape = ModelShape(**vars(shape))
    n_rot = shape.n_rot or (shape.n_embd // shape.n_head // 2 if arch == "phi2" else 0)
    s = _Synth(path, gguf_arch, shape, dtype, seed, rms=arch != "phi2", n_rot=n_rot)
    body(s)
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
