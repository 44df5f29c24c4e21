"""Tensor parallelism (`-sm row`): every offloaded layer cut over all the servers'
devices by the -ts shares, through plain v7 commands (so llama.cpp's own
ggml-rpc-server is a worker too).

Each device (a Shard) holds a slice of every offloaded layer: the query, key and
value rows of its group of KV heads (and the KV cache of those heads only), the
attention output's matching columns, the feed-forward's hidden rows (gate and up
rows, down columns) and the output layer's vocabulary rows. A layer is two
segments, attention and feed-forward; each device computes its partial sum of a
segment's output projection, and the host adds the partials and the residual
(an all-reduce through the host: GET_TENSOR from every server, then the sum goes
out again with the next segment's SET_TENSOR) - once per block. The output layer's
rows are gathered as they are. Every server is asked before the host waits for
any, and each server's inputs, graph and read leave in one write.

Only the biases of the output projections are added once (by the first device);
norms, rope factors and per-head norms are copied to every device. The partial
sums change the order of the projections' additions, so the logits differ from a
single device's by rounding only (NMSE far below 1e-6).

v7 keeps one graph per device, so a segment runs with GRAPH_COMPUTE (its bytes
serialized once on the host); GRAPH_RECOMPUTE only when a device runs the same
segment twice in a row."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Sequence

import numpy as np

from .. import builder as B
from ..client import serialize_graph
from ..ggml import GGMLType, blck_size, type_size
from .archs import llama
from .blocks import Ctx, stage_weights
from .gguf_file import GGUFFile, ModelError, TensorInfo
from .hparams import HParams
from .kv_cache import KVCache
from .placement import Device, Stage, StageGraph, alloc_stage, send_weights, stage_graph

SPLIT_MODES = ("layer", "row")


def cuts(n: int, shares: Sequence[float], align: int = 1) -> list[tuple[int, int]]:
    """[start, end) of each share of n units, cut at multiples of `align`, by
    cumulative fractions (rounded)."""
    total, acc, bounds = sum(shares), 0.0, [0]
    for s in shares:
        acc += s
        bounds.append(round(n // align * acc / total) * align)
    bounds[-1] = n
    return list(zip(bounds, bounds[1:]))


def cut_tensor(ti: TensorInfo, axis: int, a: int, b: int) -> TensorInfo:
    """Rows [a, b) of a matrix (axis 1) or elements [a, b) of every row (axis 0)."""
    rows = ti.ne[1] * ti.ne[2] * ti.ne[3]
    raw = ti.data.reshape(rows, ti.nbytes // rows)
    if axis == 1:
        return TensorInfo(ti.name, ti.type, (ti.ne[0], b - a, 1, 1), raw[a:b].reshape(-1))
    bs, ts = blck_size(ti.type), type_size(ti.type)
    if a % bs or b % bs:
        raise ModelError(f"-sm row: {ti.name} cannot be cut at column {a if a % bs else b} "
                         f"(its type has blocks of {bs}); use -sm layer")
    data = np.ascontiguousarray(raw[:, a // bs * ts:b // bs * ts]).reshape(-1)
    return TensorInfo(ti.name, ti.type, (b - a, *ti.ne[1:]), data)


@dataclasses.dataclass
class Shard:
    """One device's slice of the offloaded layers (and of the output layer)."""
    stage: Stage
    hp: HParams                # its heads
    kv_heads: tuple[int, int]
    ff: tuple[int, int]
    vocab: tuple[int, int]
    first: bool                # adds the projections' biases
    tensors: dict[str, TensorInfo] = dataclasses.field(default_factory=dict)
    held: tuple | None = None  # the segment whose graph the device keeps


class RowSplit:
    """The offloaded layers (and the output layer when `output`) cut over `devices`."""

    def __init__(self, arch, hp: HParams, f: GGUFFile, kv: KVCache, devices: list[Device],
                 shares: Sequence[float], layers: list[int], output: bool, flash_attn: bool, n_ctx: int):
        if arch.layer is not llama.layer or hp.n_expert or hp.n_swa or any(
                f"blk.{il}.attn_qkv.weight" in f.tensors for il in layers):
            raise ModelError(f"-sm row does not support architecture {arch.name!r} "
                             f"(llama, qwen2 and qwen3 without experts only); use -sm layer")
        keep = [i for i, s in enumerate(shares) if s > 0]
        devices, shares = [devices[i] for i in keep], [shares[i] for i in keep]
        self.arch, self.hp, self.file, self.kv = arch, hp, f, kv
        self.layers, self.output, self.flash_attn, self.n_ctx = layers, output, flash_attn, n_ctx
        group = hp.n_head // hp.n_head_kv
        ff_align = max(blck_size(f.tensors[f"blk.{il}.ffn_down.weight"].type) for il in layers)
        kv_cuts, ff_cuts = cuts(hp.n_head_kv, shares), cuts(hp.n_ff, shares, ff_align)
        for what, cs in (("KV heads", kv_cuts), ("feed-forward rows", ff_cuts)):
            if any(a >= b for a, b in cs):
                raise ModelError(f"-sm row: the {what} cannot be cut over {len(devices)} devices "
                                 f"by -ts {','.join(f'{s:g}' for s in shares)}")
        self.shards = []
        for i, (d, kc, fc, vc) in enumerate(zip(devices, kv_cuts, ff_cuts, cuts(hp.n_vocab, shares))):
            n_kv = kc[1] - kc[0]
            hp_d = dataclasses.replace(hp, n_head=n_kv * group, n_head_kv=n_kv)
            st = Stage(d, list(layers), output=output)
            self.shards.append(Shard(st, hp_d, kc, fc, vc, i == 0))
        for sh in self.shards:
            self._cut(sh)

    # -- weights -----------------------------------------------------------------
    def _cut(self, sh: Shard) -> None:
        """The device's slices of its stage's weights."""
        f, hd, group = self.file, self.hp.head_dim, self.hp.n_head // self.hp.n_head_kv
        k0, k1 = (h * hd for h in sh.kv_heads)
        q0, q1 = k0 * group, k1 * group
        out_w = "output.weight" if "output.weight" in f.tensors else "token_embd.weight"
        rules = {"attn_q.weight": (1, q0, q1), "attn_q.bias": (0, q0, q1),
                 "attn_k.weight": (1, k0, k1), "attn_k.bias": (0, k0, k1),
                 "attn_v.weight": (1, k0, k1), "attn_v.bias": (0, k0, k1),
                 "attn_output.weight": (0, q0, q1),
                 "ffn_gate.weight": (1, *sh.ff), "ffn_up.weight": (1, *sh.ff), "ffn_down.weight": (0, *sh.ff)}
        for n in stage_weights(self.arch, self.hp, sh.stage, f.tensors):
            ti, tail = f.tensors[n], n.split(".", 2)[-1]
            if tail in ("attn_output.bias", "ffn_down.bias") and not sh.first:
                continue
            if n.startswith("blk.") and tail in rules:
                ti = cut_tensor(ti, *rules[tail])
            elif n == out_w and sh.stage.output:
                ti = cut_tensor(ti, 1, *sh.vocab)
            elif n == "output.bias":
                ti = cut_tensor(ti, 0, *sh.vocab)
            sh.tensors[n] = ti

    def alloc(self) -> int:
        """Every device's weights and cache in one buffer each; the bytes to send."""
        total = 0
        for sh in self.shards:
            part = SimpleNamespace(path=self.file.path, tensors=sh.tensors)
            total += alloc_stage(sh.stage, part, list(sh.tensors), self.kv, None, sh.hp.n_embd_kv)
        return total

    def send(self, sent) -> None:
        for sh in self.shards:
            send_weights(sh.stage, SimpleNamespace(tensors=sh.tensors), sent)

    def reserve(self, key: tuple) -> None:
        """The compute and input memory of the largest segments each device runs."""
        T = key[0]
        for sh in self.shards:
            for seg, k in ((("attn", self.layers[0]), key), (("ffn", self.layers[0]), (T, key[1], T, key[3])),
                           *((("out",), (T, 0, T, 0)),) * self.output):
                self._graph(sh, seg, k)
            sh.stage.graphs.clear()

    # -- graphs ------------------------------------------------------------------
    def _graph(self, sh: Shard, seg: tuple, key: tuple) -> StageGraph:
        st = sh.stage
        g = st.graphs.get((seg, key))
        if g is None:
            g = stage_graph(st, (seg, key), lambda st, _, align: self._build(sh, seg, key, align), {})
            g.wire = serialize_graph(st.device.index, g.graph.nodes)
            if sh.held and sh.held not in st.graphs:
                sh.held = None        # the buffers grew: the device's graph is gone
        return g

    def _build(self, sh: Shard, seg: tuple, key: tuple, align: int) -> StageGraph:
        """One segment: attention of layer il, or its feed-forward (each up to the
        device's partial output projection), or the output layer's rows."""
        c = Ctx(self.arch, sh.hp, sh.stage, self.kv.cells, self.flash_attn, self.n_ctx, key, align)
        x = c.inp.new(GGMLType.F32, (self.hp.n_embd, key[0]), "x")
        if seg[0] == "attn":
            c.layer_inputs()
            y = c.attention(seg[1], *c.qkv(seg[1], c.norm(x, "attn_norm", seg[1])))
        elif seg[0] == "ffn":
            y = c.ffn(seg[1], c.norm(x, "ffn_norm", seg[1]))
        else:
            y = c.output(x)
        c.g.expand(y, output=True)
        return StageGraph(key, c.g, {t.name: t for t in c.inp.tensors}, y, c.inp)

    # -- a step --------------------------------------------------------------------
    def _own(self, sh: Shard, values: dict) -> dict:
        """The inputs that differ per device: without flash attention, the indices
        into its transposed V cache (its heads' channels)."""
        if self.flash_attn:
            return values
        idx = values["k_idxs"]
        chan = np.arange(sh.hp.n_embd_kv, dtype=np.int64) * self.kv.cells(self.layers[0])
        return dict(values, v_idxs=(chan[None, :] + idx[:, None]).reshape(-1))

    def _combine(self, seg: tuple, key: tuple, values: dict) -> list[np.ndarray]:
        """Run one segment on every device: each device's inputs, graph and the read
        of its result go in one write, every device before the first answer is read."""
        answers = []
        for sh in self.shards:
            be, dev = sh.stage.device.backend, sh.stage.device.index
            g = self._graph(sh, seg, key)
            with be.corked():
                g.write_inputs(be, values if seg[0] != "attn" else self._own(sh, values))
                if sh.held == (seg, key):
                    be.graph_recompute(dev)
                else:
                    be.graph_compute_serialized(g.wire)
                    sh.held = (seg, key)
                answers.append((g.out.ne, be.request_tensor(g.out, out=g.result)))
        return [np.frombuffer(read(), np.float32).reshape(ne[1], ne[0]) for ne, read in answers]

    def run(self, key: tuple, values: dict, x) -> np.ndarray:
        """The residual `x` (the embeddings) through the layers: the host adds each
        segment's partial sums and the residual; then the output layer's rows
        gathered (n_out rows of logits), or the last residual rows when the output
        layer is elsewhere."""
        T, n_out = key[0], key[2]
        x = np.frombuffer(x, np.float32).reshape(T, self.hp.n_embd)
        last = self.hp.n_layer - 1
        out_ids = values["out_ids"]
        for il in self.layers:
            s = _sum(self._combine(("attn", il), key, dict(values, x=x)))
            if il == last and n_out < T:
                s, x = s[out_ids], x[out_ids]
            x = s + x
            R = x.shape[0]
            x = _sum(self._combine(("ffn", il), (R, key[1], R, key[3]), {"x": x})) + x
        if not self.output:
            return x
        R = x.shape[0]
        return np.ascontiguousarray(np.concatenate(self._combine(("out",), (R, 0, R, 0), {"x": x}), axis=1))

    def clear(self) -> None:
        for sh in self.shards:
            sh.stage.graphs.clear()
            sh.held = None


def _sum(parts: list[np.ndarray]) -> np.ndarray:
    s = parts[0].copy()
    for p in parts[1:]:
        s += p
    return s
