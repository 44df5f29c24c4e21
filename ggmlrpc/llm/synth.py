"""Random-weight llama GGUF models for tests and benchmarks.

They make no sense as language, but they send exactly the graphs a real llama
model sends. Weights are written as F32 or F16 with ``gguf.GGUFWriter``;
llama.cpp's ``llama-quantize`` turns them into any quantized type.

    python -m ggmlrpc.llm.synth out.gguf --layers 12 --embd 1024 --ff 2816
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
                seed: int = 0) -> Path:
    import gguf

    path = Path(path)
    rng = np.random.default_rng(seed)
    ftype = {"f32": (np.float32, 0), "f16": (np.float16, 1)}[dtype]
    tokens, scores, types = vocab()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(shape.n_ctx)
    w.add_embedding_length(shape.n_embd)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_layer_norm_rms_eps(shape.eps)
    w.add_rope_dimension_count(shape.n_embd // shape.n_head)
    w.add_rope_freq_base(shape.rope_base)
    w.add_file_type(ftype[1])
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)

    def mat(rows, cols, scale=None):
        scale = scale if scale is not None else 1.0 / np.sqrt(cols)
        return (rng.standard_normal((rows, cols), dtype=np.float32) * scale).astype(ftype[0])

    e, kv = shape.n_embd, shape.n_embd // shape.n_head * shape.n_head_kv
    w.add_tensor("token_embd.weight", mat(len(tokens), e, 1.0))
    for i in range(shape.n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(e, np.float32) + 0.1 * rng.standard_normal(e, dtype=np.float32))
        w.add_tensor(p + "attn_q.weight", mat(e, e))
        w.add_tensor(p + "attn_k.weight", mat(kv, e))
        w.add_tensor(p + "attn_v.weight", mat(kv, e))
        w.add_tensor(p + "attn_output.weight", mat(e, e))
        w.add_tensor(p + "ffn_norm.weight", np.ones(e, np.float32) + 0.1 * rng.standard_normal(e, dtype=np.float32))
        w.add_tensor(p + "ffn_gate.weight", mat(shape.n_ff, e))
        w.add_tensor(p + "ffn_up.weight", mat(shape.n_ff, e))
        w.add_tensor(p + "ffn_down.weight", mat(e, shape.n_ff))
    w.add_tensor("output_norm.weight", np.ones(e, np.float32))
    w.add_tensor("output.weight", mat(len(tokens), e))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def quantize(llama_quantize: str | Path, src: str | Path, dst: str | Path, qtype: str,
             threads: int = 2) -> Path:
    """Run llama.cpp's llama-quantize (e.g. qtype "Q8_0", "Q4_K_M")."""
    subprocess.run([str(llama_quantize), str(src), str(dst), qtype, str(threads)],
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
    ap.add_argument("--dtype", choices=["f32", "f16"], default="f16")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    write_llama(a.out, LlamaShape(a.layers, a.embd, a.ff, a.heads, a.heads_kv), a.dtype, a.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
