"""The blocks every architecture's layer is built from, as llama.cpp builds them
(its llm_graph_context): norms, q/k/v projections with rope, attention over the KV
cache (flash attention, or soft-max over a transposed V cache), gated
feed-forward, mixture of experts; and a stage's whole graph (`build`): the
embeddings, its run of layers, the output layer. Node names and op order are
llama.cpp's, so the CPU executor gives its logits bit for bit.

The optional tensors (OPTIONAL: biases, per-head q/k norms, a shared expert) are
used wherever a file has them."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Container

from .. import builder as B
from ..client import Tensor
from ..ggml import GGMLGluOp, GGMLType, GGMLUnaryOp
from .hparams import GATING_SIGMOID, HParams
from .placement import Stage, StageGraph

if TYPE_CHECKING:
    from .archs import Arch

# the per-layer tensors (blk.N.<name>.weight) of the common blocks
ATTENTION = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output")
FEED_FORWARD = ("ffn_gate", "ffn_up", "ffn_down")
EXPERTS = ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
# per-matrix scales (llama.cpp's generic ".scale": NVFP4's second scale, and every matrix of
# test-llama-archs' models), one per expert for the stacked experts
SCALES = tuple(f"{m}.scale" for m in ("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output", "ffn_gate",
                                      "ffn_up", "ffn_down", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp",
                                      "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "attn_gate", "ssm_out",
                                      "ssm_alpha", "ssm_beta"))
# per-layer tensors the blocks use when a file has them
OPTIONAL = (*SCALES, "ffn_gate.bias", "ffn_gate_inp_shexp.weight", "ffn_gate_shexp.weight", "ffn_up_shexp.weight",
            "ffn_down_shexp.weight",
            "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_q_norm.weight", "attn_k_norm.weight",
            "attn_output.bias", "attn_norm.bias", "attn_qkv.bias", "ffn_up.bias", "ffn_down.bias",
            "ffn_gate_inp.bias", "ffn_gate_exps.bias", "ffn_up_exps.bias", "ffn_down_exps.bias",
            "exp_probs_b.bias", "attn_v.weight", "layer_output_scale.weight", "ffn_gate_inp.scale",
            "ffn_gate_up_exps.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.scale")
# rope frequency factors (LongRoPE: a long and a short set), used wherever a file has them
ROPE_FACTORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")


class Ctx:
    """One stage's graph being built for one input shape: its graph, weights, cache
    tensors and inputs (positions, cache cells, masks, output rows), and the blocks
    an architecture's `layer(c, il, x)` calls."""

    def __init__(self, arch: "Arch", hp: HParams, st: Stage, cells: Callable[[int], int], flash_attn: bool,
                 n_ctx: int, key: tuple, align: int):
        self.arch, self.hp, self.w, self.st = arch, hp, st.weights, st
        self.cells, self.flash_attn = cells, flash_attn
        self.T, self.n_kv, self.n_out, self.n_kv_swa, rs = key
        # the sequences of the micro-batch, and (one sequence) its recurrent state slot
        self.n_seqs, self.rs_slot = rs or (1, 0)
        self.inp = B.Inputs(align)
        self.g = B.Graph()
        self.last = hp.n_layer - 1
        self.n_ctx_orig = hp.n_ctx_orig or hp.n_ctx_train
        self.factors = None     # LongRoPE: the long set once the context exceeds the original one
        # what the layers read beside the residual stream (per-layer embeddings, the K/V
        # rows of a cache that layers on later stages read), (rows, T) each
        self.side: dict[str, Tensor] = {}
        end = st.layers[-1] + 1 if st.layers else 0
        self.kv_read_later = {hp.kv_layer(il) for il in range(end, hp.n_layer)}
        self.tokens: Tensor | None = None   # the token ids, on the embeddings' stage
        # -sm row over linked servers (rowsplit): this device holds some heads and
        # some rows of each matrix; tp.gather(t, kind, il) gives every device's rows
        # of t, where a layer's pieces meet (attention before its projection, the
        # feed-forward's hidden rows and its output rows); tp.projected(t, il): the
        # attention projection from this device's rows of it; tp.writes(il): whether
        # this graph writes layer il's cache rows
        self.tp = None
        for name in ("rope_freqs.weight", "rope_factors_long.weight" if n_ctx > self.n_ctx_orig
                     else "rope_factors_short.weight"):
            self.factors = self.factors or self.w.get(name)

    def layer_inputs(self) -> None:
        """Positions, cache cells and masks (the sliding-window layers' own too), and
        the output rows when this stage ends the model and fewer rows than tokens come out."""
        T, hp, inp = self.T, self.hp, self.inp
        self.pos = inp.new(GGMLType.I32, (T,), "inp_pos")
        k_idx = inp.new(GGMLType.I64, (T,), "k_idxs")
        # without flash attention the V cache is transposed: one index per element
        v_idx = inp.new(GGMLType.I64, (T if self.flash_attn else T * hp.v_width(False),), "v_idxs")
        mask_type = GGMLType.F16 if self.flash_attn else GGMLType.F32
        mask = inp.new(mask_type, (self.n_kv, T), "kq_mask")
        # (cache indices of K, of V, mask): of the full-attention layers, of the sliding-window ones
        self.attn_in = self.attn_in_swa = (k_idx, v_idx, mask)
        if hp.n_swa and any(hp.is_swa(il) for il in self.st.layers):
            self.attn_in_swa = (inp.new(GGMLType.I64, (T,), "k_idxs_swa"),
                                inp.new(GGMLType.I64, (T if self.flash_attn else T * hp.v_width(True),),
                                        "v_idxs_swa"),
                                inp.new(mask_type, (self.n_kv_swa, T), "kq_mask_swa"))
        # temperature tuning: each token's query scale, (1, 1, T)
        self.attn_scale = inp.new(GGMLType.F32, (1, 1, T), "inp_attn_scale") if hp.attn_temp_scale else None
        self.out_ids = (inp.new(GGMLType.I32, (self.n_out,), "out_ids")
                        if self.last in self.st.layers and self.n_out < T else None)
        # several sequences: the recurrent state slot of each, in the micro-batch's order
        self.rs_slots = (inp.new(GGMLType.I32, (self.n_seqs,), "rs_slots")
                         if self.st.state_span is not None and self.rs_slot < 0 else None)

    # -- recurrent state ---------------------------------------------------------
    def state(self, t: Tensor, ne: tuple, name: str) -> Tensor:
        """The states of the micro-batch's sequences in state tensor t (a row of one
        sequence's state per slot), shaped `ne` + (n_seqs,): one sequence's in place,
        several gathered (llama.cpp gathers them with get_rows too)."""
        if self.rs_slots is None:
            t = self._slot(t)
        else:
            t = B.get_rows(t, self.rs_slots, name=f"{t.name} (rows)")
        return B.reshape(t, (*ne, self.n_seqs), name=name)

    def _slot(self, t: Tensor) -> Tensor:
        """The micro-batch's one sequence's row of state tensor t, as a tensor of its
        own in t's buffer (no view node: the graph of one sequence is the graph of
        a state for one)."""
        buf = t.buffer
        return buf.tensor(t.type, (t.ne[0],), t.data - buf.base + self.rs_slot * t.nb[1], name=t.name)

    def keep_state(self, new: Tensor, t: Tensor, name: str = "") -> None:
        """Write the micro-batch's new states (a state per sequence, in order) into
        their slots of state tensor t."""
        if self.rs_slots is None:
            self.g.expand(B.cpy(new, self._slot(t), name=name))
        else:
            rows = B.reshape(B.cont(new) if not B.is_contiguous(new) else new, (t.ne[0], self.n_seqs))
            self.g.expand(B.set_rows(t, rows, self.rs_slots, name=name))

    # -- blocks ----------------------------------------------------------------
    def scaled(self, t: Tensor, name: str, il: int, ids: Tensor | None = None) -> Tensor:
        """t times the file's scale of matrix `name` of layer il, where it has one
        (llama.cpp's build_lora_mm); per expert, the chosen experts' (`ids`)."""
        s = self.w.get(f"blk.{il}.{name}.scale")
        if s is None:
            return t
        if ids is not None:     # (n_expert) -> the scale of each chosen expert, (1, n_used, T)
            rows = B.repeat(B.reshape(s, (1, s.ne[0], 1)), (1, s.ne[0], ids.ne[1]))
            s = B.get_rows(rows, ids)
        return B.mul(t, s, name=t.name)

    def norm(self, x: Tensor, name: str, il: int | None = None, out: str | None = None) -> Tensor:
        """Weight `name` (of layer il) times the RMS norm of x, or the architecture's
        LayerNorm plus its bias; the result is named `out` (default `name`), -il."""
        p = "" if il is None else f"blk.{il}."
        out = out or name
        out = out if il is None else f"{out}-{il}"
        if self.arch.layer_norm:
            y = B.mul(B.norm(x, self.hp.eps), self.w[p + name + ".weight"])
            return B.add(y, self.w[p + name + ".bias"], name=out) if p + name + ".bias" in self.w else y
        return B.mul(B.rms_norm(x, self.hp.eps), self.w[p + name + ".weight"], name=out)

    def rope(self, t: Tensor, il: int, name: str, factors: bool = True, offset: int = 0) -> Tensor:
        """t rotated by the positions (with the file's frequency factors unless not
        `factors`), on the layer's n_rot values of each head from `offset`."""
        hp, swa = self.hp, self.hp.is_swa(il)
        return B.rope_ext(t, self.pos, self.factors if factors else None, name=name, n_dims=hp.n_rot_of(il),
                          mode=self.arch.rope_mode, offset=offset,
                          n_ctx_orig=self.n_ctx_orig,
                          freq_base=hp.rope_base_swa if swa else hp.rope_base,
                          freq_scale=hp.rope_scale_swa if swa else hp.rope_scale,
                          ext_factor=hp.rope_ext_factor, attn_factor=hp.rope_attn_factor,
                          beta_fast=hp.yarn_beta_fast, beta_slow=hp.yarn_beta_slow)

    def qkv(self, il: int, cur: Tensor, rotate: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        """The heads of q, k (rotated unless not `rotate`) and v: one matrix each
        (+ bias, + per-head RMS norm), or views of one fused matrix's rows."""
        hp, w, T = self.hp, self.w, self.T
        p, hd, n_head_kv = f"blk.{il}.", hp.head_dim_of(il), hp.n_head_kv_of(il)
        if p + "attn_qkv.weight" in w:   # one matrix: q, k, v are views of its rows
            qkv = self.scaled(B.mul_mat(w[p + "attn_qkv.weight"], cur, name=f"wqkv-{il}"), "attn_qkv", il)
            if p + "attn_qkv.bias" in w:
                qkv = B.add(qkv, w[p + "attn_qkv.bias"], name=f"wqkv_b-{il}")
            es, rs = qkv.nb[0], qkv.nb[1]

            def part(n_head, at):
                return B.view(qkv, (hd, n_head, T), (es, es * hd, rs, rs * T), es * at)

            rope = self.rope if rotate else (lambda t, il, name: t)
            return (rope(part(hp.n_head, 0), il, f"Qcur-{il}"),
                    rope(part(n_head_kv, hd * hp.n_head), il, f"Kcur-{il}"),
                    part(n_head_kv, hd * (hp.n_head + n_head_kv)))

        def proj(name: str, n_head: int, rotate: bool) -> Tensor:
            """x W (+ bias), heads split, (+ RMS norm: per head, or over all heads
            before the split when the norm weight spans them, as minimax-m2's), (+ rope):
            llama.cpp's order."""
            t = B.mul_mat(w[p + f"attn_{name}.weight"], cur, name=f"{name.upper()}cur-{il}")
            t = self.scaled(t, f"attn_{name}", il)
            if p + f"attn_{name}.bias" in w:
                t = B.add(t, w[p + f"attn_{name}.bias"], name=f"{name.upper()}cur-{il}")
            nw = w.get(p + f"attn_{name}_norm.weight")
            if nw is not None and nw.ne[0] != hd:
                if self.tp is None:
                    t = B.mul(B.rms_norm(t, hp.eps), nw, name=f"{name.upper()}cur_normed-{il}")
                else:      # over every device's heads, then this device's again
                    whole = B.mul(B.rms_norm(self.tp.gather(t, name, il), hp.eps), nw,
                                  name=f"{name.upper()}cur_normed-{il}")
                    t = self.tp.mine(whole, name, il)
            t = B.reshape(t, (hd, n_head, T))
            if nw is not None and nw.ne[0] == hd:
                t = B.mul(B.rms_norm(t, hp.eps), nw, name=f"{name.upper()}cur_normed-{il}")
            return self.rope(t, il, f"{name.upper()}cur-{il}") if rotate else t

        return proj("q", hp.n_head, rotate), proj("k", n_head_kv, rotate), proj("v", n_head_kv, False)

    def scale_query(self, q: Tensor, il: int, dim: int = 0) -> Tensor:
        """q / sqrt(dim) (default: the head size), for the architectures that scale the
        query and not the scores (then attention's kq_scale is 1)."""
        return B.scale(q, 1.0 / math.sqrt(dim or self.hp.head_dim), name=f"Qcur_scaled-{il}")

    def store(self, il: int, k: Tensor, v: Tensor) -> None:
        """The K and V rows of the batch's tokens, (n_embd_kv, T) and (n_embd_v, T),
        written to layer il's cache cells (V transposed without flash attention),
        before the attention that reads them."""
        if self.tp is not None and not self.tp.writes(il):
            return
        k_idx, v_idx, _ = self.attn_in_swa if self.hp.is_swa(il) else self.attn_in
        cache_k, cache_v = self.st.kv[il]
        self.g.expand(B.set_rows(cache_k, k, k_idx))
        if self.flash_attn:
            self.g.expand(B.set_rows(cache_v, v, v_idx))
            return
        v = v if B.is_contiguous(v) else B.cont(v)
        flat = B.reshape(cache_v, (1, v.ne[0] * self.cells(il)))
        self.g.expand(B.set_rows(flat, B.reshape(v, (1, v.ne[0] * v.ne[1])), v_idx))

    def attention(self, il: int, q: Tensor, k: Tensor | None, v: Tensor | None, kq_scale: float | None = None,
                  project: bool = True) -> Tensor:
        """k and v written to the layer's cache cells (none from a layer that reuses an
        earlier layer's cache: hp.kv_layer), q attending the cells
        (flash attention, or soft-max over the transposed V cache; the file's sink
        logits and the soft-capping of the scores where there are), then the output
        projection (+ bias) when `project`."""
        hp, w, T = self.hp, self.w, self.T
        src = hp.kv_layer(il)       # a layer reusing an earlier one's cache writes none
        p, hd, n_head, n_head_kv = f"blk.{il}.", hp.head_dim_of(il), q.ne[1], hp.n_head_kv_of(src)
        hv = hp.head_dim_v or hd        # a value head
        n_embd_v = hv * n_head_kv
        swa = hp.is_swa(il)
        mask = (self.attn_in_swa if swa else self.attn_in)[2]
        n_kv = self.n_kv_swa if swa else self.n_kv
        n_cells = self.cells(il)
        kq_scale = 1.0 / math.sqrt(hd) if kq_scale is None else kq_scale
        cache_k, cache_v = self.st.kv[il]
        if src == il:
            # rows of n_embd_kv, one per token, however the heads lie in memory
            k2 = B.view(k, (hd * n_head_kv, T), (k.nb[0], k.nb[2]))
            v2 = B.view(v, (n_embd_v, T), (v.nb[0], v.nb[2]))
            self.store(il, k2, v2)
            if il in self.kv_read_later:     # later layers on other stages read these rows
                self.side[f"k{il}"], self.side[f"v{il}"] = k2, v2
        row = 2 * hd   # F16 cache rows
        kv_nb = (2, row, row * n_head_kv, row * n_head_kv * n_kv)
        kk = B.permute(B.view(cache_k, (hd, n_head_kv, n_kv, 1), kv_nb), 0, 2, 1, 3)
        qq = B.permute(q, 0, 2, 1, 3)
        if self.flash_attn:
            vv = B.permute(B.view(cache_v, (hv, n_head_kv, n_kv, 1),
                                  (2, 2 * hv, 2 * n_embd_v, 2 * n_embd_v * n_kv)), 0, 2, 1, 3)
            o = B.flash_attn_ext(qq, kk, vv, mask, kq_scale, logit_softcap=hp.attn_softcap,
                                 sinks=w.get(p + "attn_sinks.weight"))
            o = B.reshape(o, (hv * n_head, T), name=f"kqv_out-{il}")
        else:
            # V transposed: element (cell, channel) at channel * n_ctx + cell
            vt = B.view(cache_v, (n_kv, n_head_kv, hv, 1),
                        (2, 2 * n_cells * hv, 2 * n_cells, 2 * n_cells * n_embd_v))
            kq = B.mul_mat(kk, qq, name=f"kq-{il}", prec_f32=True)
            if hp.attn_softcap:
                kq = B.scale(B.unary(GGMLUnaryOp.TANH, B.scale(kq, 1.0 / hp.attn_softcap)),
                             hp.attn_softcap, name=f"kq_scaled_2-{il}")
            kq = B.soft_max_ext(kq, mask, kq_scale, name=f"kq_soft_max-{il}",
                                sinks=w.get(p + "attn_sinks.weight"))
            kqv = B.mul_mat(B.permute(vt, 0, 2, 1, 3), kq, name=f"kqv-{il}")
            o = B.cont(B.permute(kqv, 0, 2, 1, 3), (hv * n_head, T), name=f"kqv_out-{il}")
        if not project:
            return o
        if self.tp is not None:
            o = self.tp.gather(o, "heads", il)
        cur = B.mul_mat(w[p + "attn_output.weight"], o, name=f"attn_out-{il}")
        cur = self.scaled(cur, "attn_output", il)
        if p + "attn_output.bias" in w:
            cur = B.add(cur, w[p + "attn_output.bias"], name=f"attn_out-{il}")
        return cur if self.tp is None else self.tp.projected(cur, il)

    def out_rows(self, il: int, *ts: Tensor) -> tuple[Tensor, ...]:
        """In the model's last layer, only the rows that come out (the last tokens'):
        llama.cpp drops the others before the last feed-forward."""
        if il != self.last or self.out_ids is None:
            return ts
        return tuple(B.get_rows(t, self.out_ids) for t in ts)

    def ffn(self, il: int, cur: Tensor, act: int = GGMLGluOp.SWIGLU, suffix: str = "",
            scales: bool = True) -> Tensor:
        """Gated feed-forward: down(act(gate x) * up x), act SwiGLU or GeGLU; each
        matrix + its bias, times its scale (unless not `scales`), where the file has them."""
        w, p = self.w, f"blk.{il}."

        def mm(name: str, x: Tensor) -> Tensor:
            out = "ffn_out" if name == "ffn_down" else name + suffix
            t = B.mul_mat(w[p + f"{name}{suffix}.weight"], x, name=f"{out}-{il}")
            if p + f"{name}{suffix}.bias" in w:
                t = B.add(t, w[p + f"{name}{suffix}.bias"], name=f"{name}_b-{il}")
            return self.scaled(t, name + suffix, il) if scales else t

        up = mm("ffn_up", cur)
        gate = mm("ffn_gate", cur)
        glu = B.glu_split(act, gate, up, name=f"ffn_glu-{il}")
        if self.tp is not None:
            glu = self.tp.gather(glu, "ffn_up" + suffix, il)
        return self.rows_whole(il, mm("ffn_down", glu))

    def moe(self, il: int, cur: Tensor, norm_w: bool = False, oai: bool = False,
            logits: Tensor | None = None, act: int = GGMLGluOp.SWIGLU,
            sigmoid_shexp: bool = False, scales: bool = True) -> Tensor:
        """A mixture of experts as llama.cpp builds it: soft-max gate (or a sigmoid
        per expert: hp.expert_gating), the top n_expert_used experts (MUL_MAT_ID;
        chosen after adding the file's selection bias exp_probs_b where it has one)
        weighted by their gate probability (`norm_w`: renormalized to sum to 1; times
        hp.expert_weights_scale unless 0 or 1) and summed, plus a shared expert (behind a sigmoid gate where
        the file has one: ggml's SIGMOID with `sigmoid_shexp`, else silu(x) / x). `logits`: the router's, computed by the architecture;
        `act`: the experts' gated activation (GeGLU for gemma4), their gate and up
        matrices one fused matrix where the file has it, and a scale per expert on
        their output where it has one (unless not `scales`: the shared expert's too). `oai` (gpt-oss): the chosen logits are soft-maxed among
        themselves and the experts use the clamped SwiGLU; gate and experts take their
        biases (ADD_ID) where the file has them."""
        w, p = self.w, f"blk.{il}."
        chosen, weights = self.route(il, cur, norm_w, oai, logits)
        glu = self.experts_whole(il, self.experts_glu(il, cur, chosen, oai, act, scales))
        down = self._expert_bias(il, B.mul_mat_id(w[p + "ffn_down_exps.weight"], glu, chosen,
                                                  name=f"ffn_moe_down-{il}"), "ffn_down_exps", chosen, scales)
        moe = self.rows_whole(il, self.sum_experts(il, B.mul(down, weights, name=f"ffn_moe_weighted-{il}")))
        if p + "ffn_up_shexp.weight" not in w:
            return moe
        if p + "ffn_gate_inp_shexp.weight" not in w:
            return B.add(moe, self.ffn(il, cur, suffix="_shexp", scales=scales), name=f"ffn_out-{il}")
        gate_in = B.mul_mat(w[p + "ffn_gate_inp_shexp.weight"], cur, name=f"ffn_shexp_gate_inp-{il}")
        shared_gate = (B.unary(GGMLUnaryOp.SIGMOID, gate_in, name=f"shared_expert_gate_sigmoid-{il}")
                       if sigmoid_shexp else B.div(B.silu(gate_in), gate_in, name=f"ffn_shexp_gate-{il}"))
        shared = B.mul(self.ffn(il, cur, suffix="_shexp", scales=scales), shared_gate, name=f"ffn_shexp_out-{il}")
        return B.add(moe, shared, name=f"ffn_out-{il}")

    def _expert_bias(self, il: int, t: Tensor, name: str, ids: Tensor | None, scales: bool = True) -> Tensor:
        """t times the chosen experts' scale (stacked experts, unless not `scales`),
        plus its bias (ADD_ID per expert), where the file has them."""
        w, p = self.w, f"blk.{il}."
        t = t if ids is None or not scales else self.scaled(t, name, il, ids)
        b = w.get(p + name + ".bias")
        if b is None:
            return t
        return B.add(t, b, name=t.name) if ids is None else B.add_id(t, b, ids, name=t.name)

    def route(self, il: int, cur: Tensor, norm_w: bool = False, oai: bool = False,
              logits: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The router of Ctx.moe: the chosen experts (n_used, T) and their weights (1, n_used, T)."""
        hp, w, g = self.hp, self.w, self.g
        p = f"blk.{il}."
        T, k = cur.ne[1], hp.n_expert_used
        if logits is None:
            logits = self._expert_bias(il, B.mul_mat(w[p + "ffn_gate_inp.weight"], cur, name=f"ffn_moe_logits-{il}"),
                                       "ffn_gate_inp", None)
        if oai:
            probs = logits
        elif hp.expert_gating == GATING_SIGMOID:
            probs = B.unary(GGMLUnaryOp.SIGMOID, logits, name=f"ffn_moe_probs-{il}")
        else:
            probs = B.soft_max(logits, name=f"ffn_moe_probs-{il}")
        select = probs    # the experts' selection bias (exp_probs_b) steers the choice, not the weights
        if p + "exp_probs_b.bias" in w:
            select = B.add(probs, w[p + "exp_probs_b.bias"], name=f"ffn_moe_probs_biased-{il}")
        if hp.n_expert_groups > 1:
            select = self.expert_groups(il, select)
        chosen = B.argsort_top_k(select, k, name=f"ffn_moe_topk-{il}")
        weights = B.get_rows(B.reshape(probs, (1, hp.n_expert, T)), chosen, name=f"ffn_moe_weights-{il}")
        if oai:   # soft-max over the chosen experts only
            weights = B.reshape(B.soft_max(B.reshape(weights, (k, T))), (1, k, T))
        if norm_w:
            weights = B.reshape(weights, (k, T))
            total = B.clamp(B.sum_rows(weights), 6.103515625e-5, math.inf, name=f"ffn_moe_weights_sum-{il}")
            weights = B.reshape(B.div(weights, total, name=f"ffn_moe_weights_norm-{il}"), (1, k, T))
        if hp.expert_weights_scale not in (0.0, 1.0):
            weights = B.scale(weights, hp.expert_weights_scale, name=f"ffn_moe_weights_scaled-{il}")
        g.expand(weights)
        return chosen, weights

    def experts_glu(self, il: int, cur: Tensor, chosen: Tensor, oai: bool = False,
                    act: int = GGMLGluOp.SWIGLU, scales: bool = True) -> Tensor:
        """The chosen experts' gated hidden rows (n_ff_exp, n_used, T), before their down matrix."""
        w, p = self.w, f"blk.{il}."
        x = B.reshape(cur, (cur.ne[0], 1, cur.ne[1]))
        if p + "ffn_gate_up_exps.weight" in w:
            both = B.mul_mat_id(w[p + "ffn_gate_up_exps.weight"], x, chosen, name=f"ffn_moe_gate_up-{il}")
            n_ff = both.ne[0] // 2
            gate, up = (B.view(both, (n_ff, *both.ne[1:3]), both.nb[:3], at * n_ff * both.nb[0])
                        for at in (0, 1))
        else:
            up = self._expert_bias(il, B.mul_mat_id(w[p + "ffn_up_exps.weight"], x, chosen, name=f"ffn_moe_up-{il}"),
                                   "ffn_up_exps", chosen, scales)
            gate = self._expert_bias(il, B.mul_mat_id(w[p + "ffn_gate_exps.weight"], x, chosen,
                                                      name=f"ffn_moe_gate-{il}"), "ffn_gate_exps", chosen, scales)
        return (B.swiglu_oai(gate, up, 1.702, 7.0, name=f"ffn_moe_swiglu_oai-{il}") if oai
                else B.glu_split(act, gate, up, name=f"ffn_moe_glu-{il}"))

    def experts_whole(self, il: int, glu: Tensor) -> Tensor:
        """The chosen experts' hidden rows (n_ff_exp, n_used, T): with `tp`, every
        device's rows of each (this device holds some rows of every expert)."""
        if self.tp is None:
            return glu
        h = self.tp.gather(B.reshape(glu, (glu.ne[0], glu.ne[1] * glu.ne[2])), "ffn_up_exps", il)
        return B.reshape(h, (h.ne[0], glu.ne[1], glu.ne[2]))

    def rows_whole(self, il: int, t: Tensor) -> Tensor:
        """A down matrix's output (n_embd, T): with `tp`, every device's rows of it."""
        return t if self.tp is None else self.tp.gather(t, "embd", il)

    def sum_experts(self, il: int, experts: Tensor) -> Tensor:
        """The chosen experts' outputs (n_embd, n_used, T) summed, in llama.cpp's order."""
        g, (n_embd, k, T) = self.g, experts.ne[:3]
        g.expand(experts)
        views = [B.view(experts, (n_embd, T), (experts.nb[0], experts.nb[2]), i * experts.nb[1])
                 for i in range(k)]
        for v in views:
            g.expand(v)
        moe = views[0]
        for v in views[1:]:
            moe = g.expand(B.add(moe, v, name=f"ffn_moe_out-{il}"))
        return B.cont(moe) if k == 1 else moe

    def expert_groups(self, il: int, select: Tensor) -> Tensor:
        """select (n_expert, T) with the experts outside the n_group_used best groups
        at -inf; a group scores the sum of its two best experts (DeepSeek V3)."""
        hp, T = self.hp, select.ne[1]
        n_groups = hp.n_expert_groups
        groups = B.reshape(select, (hp.n_expert // n_groups, n_groups, T))
        best2 = B.argsort_top_k(groups, 2)
        best2 = B.get_rows(B.reshape(groups, (1, *groups.ne[:3])), best2)
        score = B.reshape(B.sum_rows(B.reshape(best2, best2.ne[1:])), (n_groups, T))
        used = B.argsort_top_k(score, hp.n_group_used, name=f"ffn_moe_group_topk-{il}")
        kept = B.set_rows(B.fill(groups, -math.inf), B.get_rows(groups, used), used)
        return B.reshape(kept, (hp.n_expert, T), name=f"ffn_moe_probs_masked-{il}")

    def output(self, x: Tensor) -> Tensor:
        """The output layer: norm, the vocabulary's logits (the token embeddings when
        the file has no output matrix), + bias, tanh soft-capping where set."""
        hp, w = self.hp, self.w
        x = self.norm(x, "output_norm", out="result_norm")
        out_w = w["output.weight"] if "output.weight" in w else w["token_embd.weight"]
        x = B.mul_mat(out_w, x, name="result_output")
        if "output.bias" in w:
            x = B.add(x, w["output.bias"], name="result_output")
        if hp.final_softcap:
            x = B.scale(B.unary(GGMLUnaryOp.TANH, B.scale(x, 1.0 / hp.final_softcap)),
                        hp.final_softcap, name="result_output")
        return x


def side_rows(hp: HParams, b: int) -> list[tuple[str, int]]:
    """What crosses the boundary before layer b beside the residual stream, (name,
    rows per token): the per-layer embeddings while layers remain, and the K and V
    rows of each earlier layer whose cache layers from b on read (the stage of those
    keeps its own copy of that cache, written from these rows)."""
    out = [("ple", hp.n_embd_per_layer * hp.n_layer)] if hp.n_embd_per_layer and b < hp.n_layer else []
    for s in sorted({hp.kv_layer(il) for il in range(b, hp.n_layer)}):
        if s < b:
            out += [(f"k{s}", hp.n_embd_kv_of(s)), (f"v{s}", hp.n_embd_v_of(s))]
    return out


def stage_weights(arch: "Arch", hp: HParams, st: Stage, tensors: Container[str]) -> list[str]:
    """The tensors `build` reads for stage `st`, in upload order (`tensors`: the file's)."""
    names = []
    if st.embed:
        names.append("token_embd.weight")
        names += [n for n in arch.input_weights if n in tensors]
    if st.layers:
        names += [n for n in ROPE_FACTORS if n in tensors]
    for il in st.layers:
        p = f"blk.{il}."
        own = [f"{p}{n}.weight" for n in arch.weights(hp)]
        if arch.layer_weights is not None:
            own += [p + n for n in arch.layer_weights(hp, il)]
        if p + "ffn_gate_up_exps.weight" in tensors:   # the experts' gate and up merged into one matrix
            own = [n for n in own if n not in (p + "ffn_gate_exps.weight", p + "ffn_up_exps.weight")]
        names += own
        names += [p + n for n in OPTIONAL if p + n in tensors]
    if st.output:
        names.append("output_norm.weight")
        if "output_norm.bias" in tensors:
            names.append("output_norm.bias")
        names.append("output.weight" if "output.weight" in tensors else "token_embd.weight")
        if "output.bias" in tensors:
            names.append("output.bias")
    return list(dict.fromkeys(names))


def build(arch: "Arch", hp: HParams, st: Stage, cells: Callable[[int], int], flash_attn: bool, n_ctx: int,
          key: tuple, align: int) -> StageGraph:
    """llama.cpp's graph for stage `st` and `key` = (n_tokens new tokens attending
    n_kv cache cells, n_out rows of output (the last ones), n_kv_swa cells in
    sliding-window layers): the embeddings (or the previous stage's residual), the
    stage's layers (`arch.layer` each), the output layer."""
    c = Ctx(arch, hp, st, cells, flash_attn, n_ctx, key, align)
    w, inp, T = c.w, c.inp, c.T
    if st.embed:
        c.tokens = inp.new(GGMLType.I32, (T,), "inp_tokens")
        x = B.get_rows(w["token_embd.weight"], c.tokens, name="inp_embd")
        if arch.scale_embd:
            x = B.scale(x, math.sqrt(hp.n_embd), name="inp_scaled")
        if arch.inputs is not None:
            c.side.update(arch.inputs(c, x))
    else:
        rows = T if st.layers else c.n_out
        side = side_rows(hp, st.layers[0]) if st.layers else []
        x = inp.new(GGMLType.F32, (hp.n_embd + sum(n for _, n in side), rows), "embd")
        at = hp.n_embd
        for name, n in side:    # each a view of its rows of the previous stage's result
            c.side[name] = B.view(x, (n, rows), (4, x.nb[1]), 4 * at)
            at += n
        if side:
            x = B.cont(B.view(x, (hp.n_embd, rows), (4, x.nb[1])), name="embd_residual")
    if st.layers:
        c.layer_inputs()
        # the copies of earlier stages' caches that this stage's layers read
        for s in sorted({hp.kv_layer(il) for il in st.layers} - set(st.layers)):
            c.store(s, c.side[f"k{s}"], c.side[f"v{s}"])
    for il in st.layers:
        x = arch.layer(c, il, x)
    if st.output:
        x = c.output(x)
    else:   # the rows the next stage reads beside the residual stream
        for name, _ in side_rows(hp, st.layers[-1] + 1 if st.layers else 0):
            x = B.concat(x, c.side[name], 0)
    c.g.expand(x, output=True)
    return StageGraph(key, c.g, {t.name: t for t in inp.tensors}, x, inp)
