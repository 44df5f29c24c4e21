"""A GGUF model (llama, qwen2, qwen3, qwen2moe, qwen3moe, gemma2, gemma3, phi2, phi3,
gpt-oss) spread over the
local CPU and RPC servers.

    model = Model.load("model.gguf", rpc=["10.0.0.2:50052"], n_gpu_layers=99)
    for piece in model.generate("Once upon a time", n_predict=16, temp=0):
        print(piece.decode(errors="replace"), end="", flush=True)
    model.close()

Placement follows llama.cpp: the token embeddings stay on the local CPU; the last
`n_gpu_layers` layers go to the servers' devices, in contiguous runs in proportion
to `tensor_split` (default: each device's free memory); the output layer goes with
the last layer when every layer is offloaded, else it stays on the CPU. Each
layer's KV cache (F16) lives beside it; sliding-window layers keep only the window
and a micro-batch of cells, reused as a ring in llama.cpp's order (SwaCells). Rope
scaling (linear, YaRN) comes from the file's metadata. Every device runs one graph
per step (its layers), built with ggmlrpc.builder exactly as llama.cpp builds it (same ops in
the same order, flash attention, the output rows picked before the last
feed-forward), so our CPU executor gives llama.cpp's logits bit for bit; the
residual stream moves between devices with GET_TENSOR / SET_TENSOR. A decode step
whose graphs have the shapes of the previous one reruns them with
GRAPH_RECOMPUTE after writing the new inputs; a device's SET_TENSOR, GRAPH_RECOMPUTE
and GET_TENSOR leave in one write, so a step costs one round trip per device (the
least the data flow allows: each device needs the previous one's output, and the
first needs the token sampled from the last one's logits).
"""
from __future__ import annotations

import math
import time
from typing import Iterator, Sequence

import numpy as np

from .. import builder as B
from ..client import RemoteBuffer, Tensor
from ..errors import ConnectionLost, GgmlRpcError
from ..ggml import GGMLGluOp, GGMLType, GGMLUnaryOp
from ..local import LocalBackend
from .gguf_file import GGUFFile, ModelError
from .hparams import HParams
from .kv_cache import KV_PAD, KVCache, SwaCells
from .placement import (Device, Stage, StageGraph, alloc_stage, assign_layers, open_devices, plan_stages,
                        send_weights, stage_graph)
from .sampling import Sampler
from .tokenizer import Tokenizer

__all__ = ["Model", "HParams", "SwaCells", "KV_PAD", "N_UBATCH", "SUPPORTED_ARCHS", "Device", "Stage",
           "assign_layers", "ModelError"]

N_UBATCH = 512        # prompt tokens per graph (llama.cpp's default micro-batch)
# architecture -> rope mode (0: consecutive pairs, 2: NeoX halves); the optional
# tensors (q/k/v/output biases, per-head q/k norms) are used wherever a file has them
ROPE_MODE = {"llama": 0, "qwen2": 2, "qwen3": 2, "qwen2moe": 2, "qwen3moe": 2, "gemma2": 2, "gemma3": 2,
             "phi2": 2, "phi3": 2, "gpt-oss": 2}
# gpt-oss: a learned sink logit per head, every other layer on a sliding window,
# experts with biases (ADD_ID) and the clamped SwiGLU, gate weights soft-maxed over
# the chosen experts only, the output rows picked after the last layer
OSS = {"gpt-oss"}
# phi3: fused q/k/v and fused gate/up matrices, LongRoPE frequency factors (the long
# set when the context exceeds the original one)
FUSED_FFN = {"phi3"}
# phi2: LayerNorm with biases, one fused q/k/v matrix, rope on part of each head,
# attention and a GELU feed-forward side by side on the same normed input
PARALLEL = {"phi2"}

# gemma2/3: embeddings scaled by sqrt(n_embd), norms after attention and feed-forward,
# GELU-gated feed-forward, sliding-window layers (gemma2: every other one, with tanh
# soft-capped attention and logits; gemma3: five of every six, their own rope base)
GEMMA = {"gemma2", "gemma3"}
SCALED_QUERY = GEMMA | PARALLEL | FUSED_FFN
# mixtures of experts whose chosen gate probabilities are renormalized to sum to 1
NORM_EXPERT_WEIGHTS = {"qwen3moe"}
SUPPORTED_ARCHS = tuple(ROPE_MODE)
OPTIONAL = ("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_q_norm.weight", "attn_k_norm.weight",
            "attn_output.bias", "attn_norm.bias", "attn_qkv.bias", "ffn_up.bias", "ffn_down.bias",
            "ffn_gate_inp.bias", "ffn_gate_exps.bias", "ffn_up_exps.bias", "ffn_down_exps.bias")


def _gemma_hparams(a: str, key) -> dict:
    """llama.cpp's defaults and keys for the sliding-window architectures (gemma2,
    gemma3, gpt-oss)."""
    base = float(key("rope.freq_base", 10000.0))
    scale = key("rope.scaling.factor", None)
    if a == "gemma2":
        return {"n_swa": int(key("attention.sliding_window", 4096)), "swa_pattern": 2,
                "rope_base_swa": float(key("rope.freq_base_swa", base)),
                "rope_scale_swa": 1.0 / float(scale) if scale else 1.0,
                "attn_softcap": float(key("attn_logit_softcapping", 50.0)),
                "final_softcap": float(key("final_logit_softcapping", 30.0))}
    if a == "gpt-oss":
        return {"n_swa": int(key("attention.sliding_window", 0)), "swa_pattern": 2,
                "rope_base_swa": float(key("rope.freq_base_swa", base)),
                "rope_scale_swa": 1.0 / float(scale) if scale else 1.0}
    if a == "gemma3":
        return {"n_swa": int(key("attention.sliding_window", 0)), "swa_pattern": 6,
                "rope_base_swa": float(key("rope.freq_base_swa", 10000.0)),
                "final_softcap": float(key("final_logit_softcapping", 0.0))}
    return {}


class Model:
    """A loaded model: tokenizer, weights on their devices, KV cache, generation."""

    def __init__(self):
        self.file: GGUFFile | None = None
        self.tokenizer: Tokenizer | None = None
        self.stages: list[Stage] = []
        self.backends: list = []
        self.n_past = 0
        self.tokens: list[int] = []
        self._held: dict[tuple, tuple] = {}    # (backend, device) -> (stage, key) of its graph
        self.cached_bytes = 0                  # weight bytes the servers' caches supplied
        self.history: list[list[int]] = []     # the batches run since the last reset
        self.reconnect = 0.0                   # seconds to wait for a lost server
        self.stop_reason: str | None = None
        self._mapped: RemoteBuffer | None = None   # the file mapping as a local buffer
        self.n_ubatch = N_UBATCH
        self.kv: KVCache | None = None

    @property
    def swa(self) -> SwaCells | None:
        """The sliding-window layers' cells (None: the model has none)."""
        return self.kv.swa if self.kv is not None else None

    # -- loading ---------------------------------------------------------------
    @classmethod
    def load(cls, path, rpc: Sequence[str] | str | None = None, n_gpu_layers: int = 99,
             tensor_split: Sequence[float] | None = None, n_ctx: int = 0,
             n_threads: int | None = None, flash_attn: bool = True, timeout: float = 120.0,
             progress=None, reconnect: float = 0.0, n_ubatch: int = N_UBATCH) -> "Model":
        """Open `path`, connect to `rpc` servers ("host:port", a list or a comma-separated
        string) and upload the weights (hash first: a server started with -c that has them
        cached is not sent the bytes). `progress(done, total, cached)` is called as
        bytes go. `reconnect`: seconds to wait for a server lost during generation
        (it gets its layers again and the context is replayed); 0 fails at once.
        `n_ubatch`: prompt tokens per graph (llama.cpp's -ub)."""
        m = cls()
        m.reconnect = reconnect
        m.n_ubatch = n_ubatch
        try:
            m._load(path, rpc, n_gpu_layers, tensor_split, n_ctx, n_threads, flash_attn,
                    timeout, progress)
        except BaseException:
            m.close()
            raise
        return m

    def _load(self, path, rpc, n_gpu_layers, tensor_split, n_ctx, n_threads, flash_attn,
              timeout, progress):
        f = self.file = GGUFFile(path)
        if f.arch not in SUPPORTED_ARCHS:
            raise ModelError(f"architecture {f.arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHS)})")
        self.tokenizer = Tokenizer.from_gguf(f)
        hp = self.hp = HParams.from_gguf(f, self.tokenizer.n_vocab, lambda key: _gemma_hparams(f.arch, key))
        self.flash_attn = flash_attn
        self.n_ctx = n_ctx or hp.n_ctx_train
        if self.n_ubatch < 1:
            raise ModelError(f"micro-batch size must be at least 1, got {self.n_ubatch}")
        self.n_ubatch = min(self.n_ubatch, self.n_ctx)
        self.kv = KVCache(hp, self.n_ctx, self.n_ubatch, flash_attn)
        cpu, remote = open_devices(rpc, n_threads, timeout, self.backends)
        self.stages = plan_stages(cpu, remote, hp.n_layer, n_gpu_layers, tensor_split)
        self._upload(progress)

    def _weight_names(self, st: Stage) -> list[str]:
        names = []
        if st.embed:
            names.append("token_embd.weight")
        ffn = (("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps") if self.hp.n_expert
               else ("ffn_gate", "ffn_up", "ffn_down"))
        if self.file.arch in GEMMA:
            ffn += ("post_attention_norm", "post_ffw_norm")
        shared = ("ffn_gate_inp_shexp", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")
        arch = self.file.arch
        attn = (("attn_norm", "attn_qkv", "attn_output") if arch in PARALLEL else
                ("attn_norm", "attn_qkv", "attn_output", "ffn_norm") if arch in FUSED_FFN else
                ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm"))
        if arch in PARALLEL | FUSED_FFN:
            ffn = ("ffn_up", "ffn_down")
        if arch in OSS:
            attn = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_sinks",
                    "post_attention_norm")
        if st.layers:
            names += [n for n in ("rope_freqs.weight", "rope_factors_long.weight",
                                  "rope_factors_short.weight") if n in self.file.tensors]
        for il in st.layers:
            names += [f"blk.{il}.{n}.weight" for n in (*attn, *ffn)]
            names += [f"blk.{il}.{n}.weight" for n in shared if f"blk.{il}.{n}.weight" in self.file.tensors]
            names += [f"blk.{il}.{n}" for n in OPTIONAL if f"blk.{il}.{n}" in self.file.tensors]
        if st.output:
            names.append("output_norm.weight")
            if "output_norm.bias" in self.file.tensors:
                names.append("output_norm.bias")
            names.append("output.weight" if "output.weight" in self.file.tensors else "token_embd.weight")
            if "output.bias" in self.file.tensors:
                names.append("output.bias")
        return list(dict.fromkeys(names))

    def _upload(self, progress) -> None:
        total = sum(self._alloc_stage(st) for st in self.stages)
        done = 0

        def sent(nbytes: int, cached: bool) -> None:
            nonlocal done
            done += nbytes
            self._sent(nbytes, cached)
            if progress:
                progress(done, total, self.cached_bytes)

        for st in self.stages:
            send_weights(st, self.file, sent)
        # reserve the compute and input memory of the largest graph each stage runs
        for st in self.stages:
            self._graph(st, self.kv.largest(self.n_ubatch))
            st.graphs.clear()

    def _sent(self, nbytes: int, cached: bool) -> None:
        if cached:
            self.cached_bytes += nbytes

    def _alloc_stage(self, st: Stage) -> int:
        return alloc_stage(st, self.file, self._weight_names(st), self.kv, self._file_buffer)

    def _file_buffer(self, be: LocalBackend) -> RemoteBuffer:
        """The whole file mapping as one read-only local buffer (made once)."""
        if self._mapped is None:
            self._mapped = be.map_buffer(self.file.reader.data)
        return self._mapped

    # -- graphs ----------------------------------------------------------------
    def _graph(self, st: Stage, key: tuple) -> StageGraph:
        return stage_graph(st, key, lambda st, key, align: self._build(st, *key, align), self._held)

    def _build(self, st: Stage, n_tokens: int, n_kv: int, n_out: int, n_kv_swa: int,
               align: int) -> StageGraph:
        """llama.cpp's llama graph for the layers of `st`: n_tokens new tokens attending
        n_kv cache cells (n_kv_swa in sliding-window layers), n_out rows of output
        (the last n_out tokens)."""
        hp, w = self.hp, st.weights
        inp = B.Inputs(align)
        g = B.Graph()
        T = n_tokens
        last_layer = hp.n_layer - 1
        if st.embed:
            x = B.get_rows(w["token_embd.weight"], inp.new(GGMLType.I32, (T,), "inp_tokens"),
                           name="inp_embd")
            if self.file.arch in GEMMA:
                x = B.scale(x, math.sqrt(hp.n_embd), name="inp_scaled")
        else:
            rows = T if st.layers else n_out
            x = inp.new(GGMLType.F32, (hp.n_embd, rows), "embd")
        if st.layers:
            pos = inp.new(GGMLType.I32, (T,), "inp_pos")
            k_idx = inp.new(GGMLType.I64, (T,), "k_idxs")
            # without flash attention the V cache is transposed: one index per element
            v_idx = inp.new(GGMLType.I64, (T if self.flash_attn else T * hp.n_embd_kv,), "v_idxs")
            mask_type = GGMLType.F16 if self.flash_attn else GGMLType.F32
            mask = inp.new(mask_type, (n_kv, T), "kq_mask")
            if hp.n_swa and any(self._swa(il) for il in st.layers):
                # the sliding-window layers' own cells: indices and mask
                k_idx = (k_idx, inp.new(GGMLType.I64, (T,), "k_idxs_swa"))
                v_idx = (v_idx, inp.new(GGMLType.I64, v_idx.ne[:1], "v_idxs_swa"))
                mask = (mask, inp.new(mask_type, (n_kv_swa, T), "kq_mask_swa"))
            out_ids = (inp.new(GGMLType.I32, (n_out,), "out_ids")
                       if last_layer in st.layers and n_out < T else None)
        late = self.file.arch in OSS   # gpt-oss picks the output rows after its last layer
        for il in st.layers:
            x = self._layer(g, st, il, x, pos, k_idx, v_idx, mask,
                            out_ids if il == last_layer and not late else None, T,
                            n_kv_swa if self._swa(il) else n_kv)
        if late and st.layers and st.layers[-1] == last_layer and out_ids is not None:
            x = B.get_rows(x, out_ids)
        if st.output:
            x = self._norm(x, w, "output_norm", "result_norm")
            out_w = w["output.weight"] if "output.weight" in w else w["token_embd.weight"]
            x = B.mul_mat(out_w, x, name="result_output")
            if "output.bias" in w:
                x = B.add(x, w["output.bias"], name="result_output")
            if hp.final_softcap:
                x = B.scale(B.unary(GGMLUnaryOp.TANH, B.scale(x, 1.0 / hp.final_softcap)),
                            hp.final_softcap, name="result_output")
        g.expand(x, output=True)
        return StageGraph((n_tokens, n_kv, n_out, n_kv_swa), g, {t.name: t for t in inp.tensors}, x, inp)

    def _layer(self, g: B.Graph, st: Stage, il: int, x: Tensor, pos, k_idx, v_idx, mask,
               out_ids, T: int, n_kv: int) -> Tensor:
        hp, w = self.hp, st.weights
        p = f"blk.{il}."
        hd = hp.head_dim
        swa = self._swa(il)
        n_ctx_orig = hp.n_ctx_orig or hp.n_ctx_train
        factors = None     # LongRoPE: the long set once the context exceeds the original one
        for name in ("rope_freqs.weight", "rope_factors_long.weight" if self.n_ctx > n_ctx_orig
                     else "rope_factors_short.weight"):
            factors = factors or w.get(name)
        rope = dict(n_dims=hp.n_rot, mode=ROPE_MODE[self.file.arch], n_ctx_orig=n_ctx_orig,
                    freq_base=hp.rope_base_swa if swa else hp.rope_base,
                    freq_scale=hp.rope_scale_swa if swa else hp.rope_scale,
                    ext_factor=hp.rope_ext_factor, attn_factor=hp.rope_attn_factor,
                    beta_fast=hp.yarn_beta_fast, beta_slow=hp.yarn_beta_slow)
        cur = cur_in = self._norm(x, w, p + "attn_norm", f"attn_norm-{il}")
        parallel = self.file.arch in PARALLEL

        def proj(name: str, n_head: int, rotate: bool) -> Tensor:
            """x W (+ bias), heads split, (+ per-head RMS norm), (+ rope): llama.cpp's order."""
            t = B.mul_mat(w[p + f"attn_{name}.weight"], cur, name=f"{name.upper()}cur-{il}")
            if p + f"attn_{name}.bias" in w:
                t = B.add(t, w[p + f"attn_{name}.bias"], name=f"{name.upper()}cur-{il}")
            t = B.reshape(t, (hd, n_head, T))
            if p + f"attn_{name}_norm.weight" in w:
                t = B.mul(B.rms_norm(t, hp.eps), w[p + f"attn_{name}_norm.weight"],
                          name=f"{name.upper()}cur_normed-{il}")
            return B.rope_ext(t, pos, factors, name=f"{name.upper()}cur-{il}", **rope) if rotate else t

        gemma = self.file.arch in GEMMA
        if isinstance(mask, tuple):
            mask, k_idx, v_idx = (t[1] if swa else t[0] for t in (mask, k_idx, v_idx))
        n_cells = self._cells(il)
        if p + "attn_qkv.weight" in w:   # one matrix: q, k, v are views of its rows
            qkv = B.mul_mat(w[p + "attn_qkv.weight"], cur, name=f"wqkv-{il}")
            if p + "attn_qkv.bias" in w:
                qkv = B.add(qkv, w[p + "attn_qkv.bias"], name=f"wqkv_b-{il}")
            es, rs = qkv.nb[0], qkv.nb[1]

            def part(n_head, at):
                return B.view(qkv, (hd, n_head, T), (es, es * hd, rs, rs * T), es * at)

            q = B.rope_ext(part(hp.n_head, 0), pos, factors, name=f"Qcur-{il}", **rope)
            k = B.rope_ext(part(hp.n_head_kv, hd * hp.n_head), pos, factors, name=f"Kcur-{il}", **rope)
            v = part(hp.n_head_kv, hd * (hp.n_head + hp.n_head_kv))
        else:
            q = proj("q", hp.n_head, True)
            k = proj("k", hp.n_head_kv, True)
            v = proj("v", hp.n_head_kv, False)
        kq_scale = 1.0 / math.sqrt(hd)
        if self.file.arch in SCALED_QUERY:   # the query is scaled, the scores are not
            big = hp.n_layer == {"gemma2": 46, "gemma3": 62}.get(self.file.arch)   # 27B: n_embd / n_head
            q_scale = 1.0 / math.sqrt(hp.n_embd // hp.n_head if big else hd)
            q, kq_scale = B.scale(q, q_scale, name=f"Qcur_scaled-{il}"), 1.0
        cache_k, cache_v = st.kv[il]
        # rows of n_embd_kv, one per token, however the heads lie in memory
        k2 = B.view(k, (hp.n_embd_kv, T), (k.nb[0], k.nb[2]))
        v2 = B.view(v, (hp.n_embd_kv, T), (v.nb[0], v.nb[2]))
        # the cache writes run before the attention that reads the cache
        g.expand(B.set_rows(cache_k, k2, k_idx))
        row = 2 * hd   # F16 cache rows
        kv_nb = (2, row, row * hp.n_head_kv, row * hp.n_head_kv * n_kv)
        kk = B.permute(B.view(cache_k, (hd, hp.n_head_kv, n_kv, 1), kv_nb), 0, 2, 1, 3)
        qq = B.permute(q, 0, 2, 1, 3)
        if self.flash_attn:
            g.expand(B.set_rows(cache_v, v2, v_idx))
            vv = B.permute(B.view(cache_v, (hd, hp.n_head_kv, n_kv, 1), kv_nb), 0, 2, 1, 3)
            o = B.flash_attn_ext(qq, kk, vv, mask, kq_scale, logit_softcap=hp.attn_softcap,
                                 sinks=w.get(p + "attn_sinks.weight"))
            o = B.reshape(o, (hd * hp.n_head, T), name=f"kqv_out-{il}")
        else:
            # V transposed: element (cell, channel) at channel * n_ctx + cell
            flat = B.reshape(cache_v, (1, hp.n_embd_kv * n_cells))
            v2 = v2 if B.is_contiguous(v2) else B.cont(v2)
            g.expand(B.set_rows(flat, B.reshape(v2, (1, T * hp.n_embd_kv)), v_idx))
            vt = B.view(cache_v, (n_kv, hp.n_head_kv, hd, 1),
                        (2, 2 * n_cells * hd, 2 * n_cells, 2 * n_cells * hp.n_embd_kv))
            kq = B.mul_mat(kk, qq, name=f"kq-{il}", prec_f32=True)
            if hp.attn_softcap:
                kq = B.scale(B.unary(GGMLUnaryOp.TANH, B.scale(kq, 1.0 / hp.attn_softcap)),
                             hp.attn_softcap, name=f"kq_scaled_2-{il}")
            kq = B.soft_max_ext(kq, mask, kq_scale, name=f"kq_soft_max-{il}",
                                sinks=w.get(p + "attn_sinks.weight"))
            kqv = B.mul_mat(B.permute(vt, 0, 2, 1, 3), kq, name=f"kqv-{il}")
            o = B.cont(B.permute(kqv, 0, 2, 1, 3), (hd * hp.n_head, T), name=f"kqv_out-{il}")
        cur = B.mul_mat(w[p + "attn_output.weight"], o, name=f"attn_out-{il}")
        if p + "attn_output.bias" in w:
            cur = B.add(cur, w[p + "attn_output.bias"], name=f"attn_out-{il}")
        attn_in = cur_in
        if out_ids is not None:
            cur = B.get_rows(cur, out_ids)
            x = B.get_rows(x, out_ids)
            attn_in = B.get_rows(attn_in, out_ids) if parallel else attn_in
        if parallel:   # the feed-forward reads the attention's input, not its output
            up = B.mul_mat(w[p + "ffn_up.weight"], attn_in, name=f"ffn_up-{il}")
            if p + "ffn_up.bias" in w:
                up = B.add(up, w[p + "ffn_up.bias"], name=f"ffn_up_b-{il}")
            ffn = B.mul_mat(w[p + "ffn_down.weight"], B.unary(GGMLUnaryOp.GELU, up, name=f"ffn_gelu-{il}"),
                            name=f"ffn_down-{il}")
            if p + "ffn_down.bias" in w:
                ffn = B.add(ffn, w[p + "ffn_down.bias"], name=f"ffn_out-{il}")
            return B.add(B.add(cur, ffn), x, name=f"l_out-{il}")
        if gemma:
            cur = B.mul(B.rms_norm(cur, hp.eps), w[p + "post_attention_norm.weight"],
                        name=f"attn_post_norm-{il}")
        ffn_inp = B.add(cur, x, name=f"ffn_inp-{il}")
        norm_w = w[p + "post_attention_norm.weight" if self.file.arch in OSS else p + "ffn_norm.weight"]
        cur = B.mul(B.rms_norm(ffn_inp, hp.eps), norm_w, name=f"ffn_norm-{il}")
        if hp.n_expert:
            cur = self._moe(g, w, p, il, cur)
        elif self.file.arch in FUSED_FFN:   # one matrix gives gate and up halves
            up = B.mul_mat(w[p + "ffn_up.weight"], cur, name=f"ffn_up-{il}")
            cur = B.mul_mat(w[p + "ffn_down.weight"], B.glu(GGMLGluOp.SWIGLU, up, name=f"ffn_swiglu-{il}"),
                            name=f"ffn_out-{il}")
        else:
            cur = self._ffn(w, p, "", il, cur, GGMLGluOp.GEGLU if gemma else GGMLGluOp.SWIGLU)
        if gemma:
            cur = B.mul(B.rms_norm(cur, hp.eps), w[p + "post_ffw_norm.weight"], name=f"ffn_post_norm-{il}")
        return B.add(cur, ffn_inp, name=f"l_out-{il}")

    def _norm(self, x: Tensor, w: dict, name: str, out: str) -> Tensor:
        """RMS norm times its weight, or (phi2) LayerNorm times its weight plus its bias."""
        if self.file.arch in PARALLEL:
            y = B.mul(B.norm(x, self.hp.eps), w[name + ".weight"])
            return B.add(y, w[name + ".bias"], name=out) if name + ".bias" in w else y
        return B.mul(B.rms_norm(x, self.hp.eps), w[name + ".weight"], name=out)

    def _cells(self, il: int) -> int:
        return self.kv.cells(il)

    def _swa(self, il: int) -> bool:
        return self.hp.is_swa(il)

    @staticmethod
    def _ffn(w: dict, p: str, suffix: str, il: int, cur: Tensor, act: int = GGMLGluOp.SWIGLU) -> Tensor:
        """Gated feed-forward: down(act(gate x) * up x), act SwiGLU or GeGLU."""
        gate = B.mul_mat(w[p + f"ffn_gate{suffix}.weight"], cur, name=f"ffn_gate{suffix}-{il}")
        up = B.mul_mat(w[p + f"ffn_up{suffix}.weight"], cur, name=f"ffn_up{suffix}-{il}")
        return B.mul_mat(w[p + f"ffn_down{suffix}.weight"], B.glu_split(act, gate, up, name=f"ffn_glu-{il}"),
                         name=f"ffn_out-{il}")

    def _moe(self, g: B.Graph, w: dict, p: str, il: int, cur: Tensor) -> Tensor:
        """A mixture of experts as llama.cpp builds it: soft-max gate, the top
        n_expert_used experts (MUL_MAT_ID) weighted by their gate probability
        (renormalized for qwen3moe; gpt-oss: biased gate and experts, soft-max over
        the chosen logits, clamped SwiGLU) and summed, plus qwen2moe's shared expert
        behind a sigmoid gate."""
        hp = self.hp
        oss = self.file.arch in OSS
        n_embd, T, k = cur.ne[0], cur.ne[1], hp.n_expert_used

        def biased(t: Tensor, name: str, ids: Tensor | None = None) -> Tensor:
            b = w.get(p + name + ".bias")
            if b is None:
                return t
            return B.add(t, b, name=t.name) if ids is None else B.add_id(t, b, ids, name=t.name)

        logits = biased(B.mul_mat(w[p + "ffn_gate_inp.weight"], cur, name=f"ffn_moe_logits-{il}"),
                        "ffn_gate_inp")
        probs = logits if oss else B.soft_max(logits, name=f"ffn_moe_probs-{il}")
        chosen = B.argsort_top_k(probs, k, name=f"ffn_moe_topk-{il}")
        weights = B.get_rows(B.reshape(probs, (1, hp.n_expert, T)), chosen, name=f"ffn_moe_weights-{il}")
        if oss:   # soft-max over the chosen experts only
            weights = B.reshape(B.soft_max(B.reshape(weights, (k, T))), (1, k, T))
        if self.file.arch in NORM_EXPERT_WEIGHTS:
            weights = B.reshape(weights, (k, T))
            total = B.clamp(B.sum_rows(weights), 6.103515625e-5, math.inf, name=f"ffn_moe_weights_sum-{il}")
            weights = B.reshape(B.div(weights, total, name=f"ffn_moe_weights_norm-{il}"), (1, k, T))
        g.expand(weights)
        x = B.reshape(cur, (n_embd, 1, T))
        up = biased(B.mul_mat_id(w[p + "ffn_up_exps.weight"], x, chosen, name=f"ffn_moe_up-{il}"),
                    "ffn_up_exps", chosen)
        gate = biased(B.mul_mat_id(w[p + "ffn_gate_exps.weight"], x, chosen, name=f"ffn_moe_gate-{il}"),
                      "ffn_gate_exps", chosen)
        act = (B.swiglu_oai(gate, up, 1.702, 7.0, name=f"ffn_moe_swiglu_oai-{il}") if oss
               else B.swiglu_split(gate, up, name=f"ffn_moe_swiglu-{il}"))
        down = biased(B.mul_mat_id(w[p + "ffn_down_exps.weight"], act, chosen, name=f"ffn_moe_down-{il}"),
                      "ffn_down_exps", chosen)
        experts = B.mul(down, weights, name=f"ffn_moe_weighted-{il}")
        g.expand(experts)
        views = [B.view(experts, (n_embd, T), (experts.nb[0], experts.nb[2]), i * experts.nb[1])
                 for i in range(k)]
        for v in views:
            g.expand(v)
        moe = views[0]
        for v in views[1:]:
            moe = g.expand(B.add(moe, v, name=f"ffn_moe_out-{il}"))
        if k == 1:
            moe = B.cont(moe)
        if p + "ffn_gate_inp_shexp.weight" not in w:
            return moe
        gate_in = B.mul_mat(w[p + "ffn_gate_inp_shexp.weight"], cur, name=f"ffn_shexp_gate_inp-{il}")
        shared_gate = B.div(B.silu(gate_in), gate_in, name=f"ffn_shexp_gate-{il}")
        shared = B.mul(self._ffn(w, p, "_shexp", il, cur), shared_gate, name=f"ffn_shexp_out-{il}")
        return B.add(moe, shared, name=f"ffn_out-{il}")

    # -- evaluation ------------------------------------------------------------
    def reset(self) -> None:
        """Forget the context (cells past the new tokens are masked, never read)."""
        self.n_past = 0
        self.tokens = []
        self.history = []
        if self.kv is not None:
            self.kv.reset()

    def eval(self, tokens: Sequence[int]) -> np.ndarray:
        """Run `tokens` after the context so far; the logits of the last one (F32, n_vocab)."""
        tokens = list(tokens)
        if not tokens:
            raise ValueError("eval needs at least one token")
        if self.n_past + len(tokens) > self.n_ctx:
            raise ModelError(f"context full: {self.n_past} + {len(tokens)} tokens > n_ctx {self.n_ctx}")
        for t in tokens:
            if not 0 <= t < self.hp.n_vocab:
                raise ValueError(f"token {t} outside the vocabulary")
        logits = None
        for i in range(0, len(tokens), self.n_ubatch):
            logits = self._step(tokens[i:i + self.n_ubatch])
        return logits

    def prefill(self, tokens: Sequence[int]) -> np.ndarray:
        """Make the context exactly `tokens` and return the last one's logits, running
        only what the context does not already hold: the longest common prefix is kept
        (a chat's next turn, a prompt that shares a system prompt), the rest is
        dropped and the new tokens are evaluated. At least one token is always run,
        since its logits are the result. Sliding-window caches cannot take back a
        token, so a model with one starts over when the prefix diverges."""
        tokens = list(tokens)
        if not tokens:
            raise ValueError("prefill needs at least one token")
        keep = 0
        for keep, (a, b) in enumerate(zip(self.tokens, tokens[:-1])):
            if a != b:
                break
        else:
            keep = min(len(self.tokens), len(tokens) - 1)
        if keep < len(self.tokens):
            if self.swa is not None:
                self.reset()
                keep = 0
            else:
                self.truncate(keep)
        return self.eval(tokens[keep:])

    def truncate(self, n: int) -> None:
        """Forget the context after its first `n` tokens (their cells are masked from
        then on and overwritten by the next tokens)."""
        if not 0 <= n <= self.n_past:
            raise ValueError(f"cannot keep {n} of {self.n_past} tokens")
        if n == self.n_past:
            return
        if n == 0 or self.swa is not None:
            if n and self.swa is not None:
                raise ModelError("a sliding-window cache cannot drop its last tokens")
            self.reset()
            return
        history, left = [], n
        for batch in self.history:
            if left <= 0:
                break
            history.append(batch[:left])
            left -= len(batch)
        self.history = history
        self.n_past = n
        self.tokens = self.tokens[:n]

    def stream(self, ids: Sequence[int], n_predict: int, sampler: Sampler,
               reuse: bool = False) -> Iterator[tuple[int, np.ndarray]]:
        """Generate after the context `ids`: yields each new token with the logits it
        was drawn from. `reuse` keeps what the context already holds of `ids`
        (`prefill`); else the context starts empty. n_predict < 0: until an
        end-of-generation token or a full context. Sets `stop_reason` ("eog",
        "length" or "context") when it ends. The last token yielded is not yet in the
        context: the next `prefill` or `eval` runs it."""
        tok = self.tokenizer
        self.stop_reason = None
        if not reuse:
            self.reset()
        logits = self.prefill(ids)
        n = 0
        while True:
            if 0 <= n_predict <= n:
                self.stop_reason = "length"
                return
            t = sampler(logits)
            n += 1
            yield t, logits
            if tok.is_eog(t):
                self.stop_reason = "eog"
                return
            if self.n_past >= self.n_ctx:
                self.stop_reason = "context"
                return
            if 0 <= n_predict <= n:
                self.stop_reason = "length"
                return
            logits = self.eval([t])

    def _step(self, tokens: list[int]) -> np.ndarray:
        """One batch through every stage; a server lost on the way is waited for (up
        to `reconnect` seconds), given its layers again, and the context so far is
        replayed in the batches it was first run in, so the result is the same."""
        lost = None
        deadline = 0.0
        while True:
            try:
                if lost is not None:
                    self._recover(lost, deadline)
                return self._run_step(tokens)
            except ConnectionLost as e:
                if getattr(e, "backend", None) is None or self.reconnect <= 0:
                    raise
                if lost is not e.backend:
                    deadline = time.monotonic() + self.reconnect
                lost = e.backend

    def _recover(self, be, deadline: float) -> None:
        cause = None
        delay = 0.1
        while True:
            try:
                be.connect()
                for st in self.stages:
                    if st.device.backend is be:
                        self._alloc_stage(st)
                        send_weights(st, self.file, self._sent)
                break
            except ConnectionLost as e:
                if getattr(e, "backend", be) is not be:
                    raise
                cause = e
                if time.monotonic() + delay > deadline:
                    raise ModelError(f"server {be.endpoint} lost and not back within "
                                     f"{self.reconnect:g} s ({cause})") from None
                time.sleep(delay)
                delay = min(2 * delay, 2.0)
        self._held = {k: v for k, v in self._held.items() if k[0] != id(be)}
        history = self.history
        self.reset()
        try:
            for batch in history:
                self._run_step(batch)
        except BaseException:
            self.history = history      # replay again after the next recovery
            raise

    def _run_step(self, tokens: list[int]) -> np.ndarray:
        saved = self.kv.save()
        try:
            return self._run_stages(tokens)
        except BaseException:
            self.kv.restore(saved)     # the batch did not happen: its cells are free again
            raise

    def _run_stages(self, tokens: list[int]) -> np.ndarray:
        T = len(tokens)
        key, values = self.kv.inputs(tokens, self.n_past)
        x = None
        for st in self.stages:
            be, dev = st.device.backend, st.device.index
            try:
                g = self._graph(st, key)
                values["embd"] = x
                # inputs, graph and the read of its result leave in one write: one
                # round trip per device per step
                with be.corked():
                    g.write_inputs(be, values)
                    # a device holds one graph: rerun it when it is this stage's graph of this shape
                    held = (id(be), dev)
                    if self._held.get(held) == (id(st), key):
                        be.graph_recompute(dev)
                    else:
                        be.graph_compute(g.graph.nodes, dev)
                        self._held[held] = (id(st), key)
                    x = be.get_tensor(g.out, out=g.result)
            except ConnectionLost as e:
                e.backend = be
                raise
        self.n_past += T
        self.tokens += tokens
        self.history.append(list(tokens))
        return np.frombuffer(x, dtype=np.float32)[-self.hp.n_vocab:].copy()

    def generate(self, prompt: str | bytes | Sequence[int], n_predict: int = -1, *,
                 temp: float = 0.8, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 seed: int | None = None, ignore_eos: bool = False,
                 echo: bool = False) -> Iterator[bytes]:
        """Generate after `prompt` (text, tokenized with BOS and special tokens, or token
        ids), from an empty context; yields each new token's text (bytes, as llama.cpp
        prints it), the prompt's first when `echo`. n_predict < 0: until an
        end-of-generation token or a full context. `self.stop_reason` says why it ended
        ("eog", "length" or "context")."""
        ids = list(prompt) if not isinstance(prompt, (str, bytes)) else self.tokenize(prompt)
        tok = self.tokenizer
        sampler = Sampler(temp, top_k, top_p, min_p, seed, banned=tok.eog if ignore_eos else ())
        self.reset()
        self.stop_reason = None
        if echo:
            for t in ids:
                yield tok.token_to_piece(t)
        for t, _ in self.stream(ids, n_predict, sampler):
            yield tok.token_to_piece(t)

    # -- API -------------------------------------------------------------------
    def tokenize(self, text, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self.tokenizer.tokenize(text, add_special, parse_special)

    def detokenize(self, tokens, remove_special: bool = False, unparse_special: bool = False) -> bytes:
        return self.tokenizer.detokenize(tokens, remove_special, unparse_special)

    def close(self) -> None:
        for st in self.stages:
            st.graphs.clear()
        for be in self.backends:
            try:
                be.close()
            except GgmlRpcError:
                pass
        self.backends.clear()
        self.stages = []
        self._mapped = None
        if self.file is not None:
            self.file.close()
            self.file = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
