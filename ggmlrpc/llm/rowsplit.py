"""Tensor parallelism (`-sm row`): every offloaded layer cut over all the servers'
devices by the -ts shares, through plain v7 commands (so llama.cpp's own
ggml-rpc-server is a worker too).

Each device (a Shard) holds a slice of every offloaded layer: the query, key and
value rows of its group of KV heads (and the KV cache of those heads only), the
feed-forward's hidden rows (gate and up) and the output layer's vocabulary rows;
norms, rope factors and per-head norms are copied to every device. Routed experts
(Mixtral-style llama, qwen3moe) are cut as the dense feed-forward is, every expert
by its hidden rows (and by "gather"'s rows of its down matrix), the router whole
on every device: each device picks the same experts and weights, and sums its rows
of the chosen experts' outputs in llama.cpp's order. The results
come back to the host (GET_TENSOR from every server, then what it made of them
goes out with the next segment's SET_TENSOR; every server is asked before the
host waits for any, and each server's inputs, graph and read leave in one write).
Two ways to combine (`combine`):

- "gather" (the default): every matrix is cut by its output rows, so each
  number is one device's whole dot product, as on a single device, and the
  logits are a single device's, bit for bit. A layer is three segments, and the
  host concatenates each one's pieces: the heads (attention output of its
  heads); then the whole attention output projection (every device computes it
  all: 1/12 of a llama layer's weights, one combine fewer), the residual, and
  its gate/up rows; then its rows of the down matrix plus the residual (kept on
  the device between the two in a small buffer of its own). With routed experts
  the last segment runs the router again on that residual (the same choice) for
  the chosen experts and their weights. Linked servers (`link`) cut the
  projection by its output rows too and gather them: an exchange on the servers
  costs less than a host round trip, and less than the projection's other rows.
- "reduce": the output projections are cut by their input columns (the heads'
  columns, the hidden rows' columns), each device sends its partial sum and the
  host adds them and the residual: two combines per layer (after attention,
  after the feed-forward), but a different order of additions, which quantized
  activations (Q8_0's 8-bit rounding of the next input) can magnify past NMSE 1e-6.
  Dense feed-forwards only.

The output layer's rows are gathered in both. In "reduce" only the first device
adds the projections' biases.

v7 keeps one graph per device, so a segment runs with GRAPH_COMPUTE (its bytes
serialized once on the host); GRAPH_RECOMPUTE only when a device runs the same
segment twice in a row."""
from __future__ import annotations

import dataclasses
import logging
import secrets
from types import SimpleNamespace
from typing import Sequence

import numpy as np

from .. import builder as B
from .. import peers
from ..client import serialize_graph
from ..ggml import GGMLType, blck_size, type_size
from .blocks import Ctx, stage_weights
from .gguf_file import GGUFFile, ModelError, TensorInfo
from .hparams import HParams
from .kv_cache import KVCache
from .placement import Device, Stage, StageGraph, alloc_stage, send_weights, stage_graph

log = logging.getLogger("ggmlrpc.llm")

SPLIT_MODES = ("layer", "row", "auto")
COMBINES = ("gather", "reduce")


def linkable(backends: list) -> bool:
    """Whether these backends (one per device of a row split) can be linked into one
    peer group (ggmlrpc.peers): each a server of its own that speaks the extension."""
    return len({id(b) for b in backends}) == len(backends) <= peers.MAX_RANKS and \
        all(getattr(b, "peers", False) for b in backends)


def cuts(n: int, shares: Sequence[float], align: int = 1) -> list[tuple[int, int]]:
    """[start, end) of each share of n units, cut at multiples of `align`, by
    cumulative fractions (rounded)."""
    total, acc, bounds = sum(shares), 0.0, [0]
    for s in shares:
        acc += s
        bounds.append(round(n // align * acc / total) * align)
    bounds[-1] = n
    return list(zip(bounds, bounds[1:]))


def cut_tensor(ti: TensorInfo, axis: int, a: int, b: int, *more: int) -> TensorInfo:
    """Rows [a, b) of a matrix, of every matrix of a stack (axis 1), or elements [a, b)
    of every row (axis 0); `more`: further (start, end) pairs, their pieces put after
    it in order (a fused matrix's parts: q, k and v rows, or gate and up rows)."""
    spans = [(a, b), *zip(more[::2], more[1::2])]
    n = sum(e - s for s, e in spans)
    rows = ti.ne[1] * ti.ne[2] * ti.ne[3]
    raw = ti.data.reshape(rows, ti.nbytes // rows)
    if axis == 1:     # of each matrix of a stack (the experts')
        stack = raw.reshape(rows // ti.ne[1], ti.ne[1], -1)
        part = np.concatenate([stack[:, s:e] for s, e in spans], axis=1)
        return TensorInfo(ti.name, ti.type, (ti.ne[0], n, *ti.ne[2:]), np.ascontiguousarray(part).reshape(-1))
    bs, ts = blck_size(ti.type), type_size(ti.type)
    for s, e in spans:
        if s % bs or e % bs:
            raise ModelError(f"-sm row: {ti.name} cannot be cut at column {s if s % bs else e} "
                             f"(its type has blocks of {bs}); use -sm layer")
    part = np.concatenate([raw[:, s // bs * ts:e // bs * ts] for s, e in spans], axis=1)
    return TensorInfo(ti.name, ti.type, (n, *ti.ne[1:]), np.ascontiguousarray(part).reshape(-1))


@dataclasses.dataclass(eq=False)     # a device's: found in lists by identity
class Shard:
    """One device's slice of the offloaded layers (and of the output layer)."""
    stage: Stage
    hp: HParams                # its heads
    kv_heads: tuple[int, int]
    ff: tuple[int, int]
    vocab: tuple[int, int]
    first: bool                # adds the projections' biases ("reduce")
    embd: tuple[int, int]      # its rows of the output projections ("gather")
    tensors: dict[str, TensorInfo] = dataclasses.field(default_factory=dict)
    held: tuple | None = None  # the segment whose graph the device keeps
    saved: object = None       # "gather": the residual a layer's last segment adds (n_embd x n_ubatch)
    # its V cache indices of this step, made from the step's K indices (RowSplit._own)
    v_idxs: dict = dataclasses.field(default_factory=dict)


ROW_ARCHS = ("llama", "qwen2", "qwen3", "qwen3moe")   # llama's layer, nothing added to it
# the architecture's own layers, their pieces gathered where they meet (blocks.Ctx.tp:
# on linked servers, else by the host in segments, _build_relay); each tested against
# the single device bit for bit
CUT_ARCHS = ROW_ARCHS + ("mistral3", "qwen2moe", "gemma2", "gemma3", "gpt-oss", "glm4moe", "llama4", "phi2",
                            "phi3", "minimax-m2")
# the per-layer tensors whose rows (axis 1) or elements (axis 0) follow the cut
# feed-forwards (of the dense layer, the shared expert, each routed expert)
FF_KINDS = ("", "_shexp", "_exps")
# what a layer of routed experts may hold to be cut (each expert by its rows)
EXPERT_TENSORS = ("ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight",
                  "exp_probs_b.bias")


def ff_width(hp: HParams, f: GGUFFile, layers: list[int]) -> int:
    """The feed-forward rows cut over the devices: each expert's where the layers
    have routed experts, else the dense feed-forward's."""
    return (ff_width_of(f, layers[0], "_exps") if layers else 0) or hp.n_ff


def _moe_refusal(arch, f: GGUFFile, layers: list[int], combine: str) -> str | None:
    """Why these layers' routed experts cannot be cut (None: they can): every expert
    is cut by its rows as a dense feed-forward is by "gather", so "reduce" and
    anything beside the router and the stacked experts (a shared expert, biases,
    merged gate and up) are left to -sm layer."""
    if combine != "gather":
        return "-sm row cuts routed experts with the gather combine only"
    for il in layers:
        extra = [n for n in f.tensors if n.startswith(f"blk.{il}.ffn_") or n.startswith(f"blk.{il}.exp_")]
        extra = [n for n in extra if n.split(".", 2)[-1] not in EXPERT_TENSORS + ("ffn_norm.weight",)]
        if extra or f"blk.{il}.ffn_gate_exps.weight" not in f.tensors:
            return (f"-sm row cannot cut layer {il}'s feed-forward ({', '.join(extra) or 'not routed experts'}); "
                    f"use -sm layer")
    return None


def _cuts(hp: HParams, f: GGUFFile, layers: list[int], shares: Sequence[float], combine: str) -> list[list]:
    """Each device's KV heads, feed-forward rows, embedding rows and vocabulary rows."""
    shares = [s for s in shares if s > 0]
    ff_align = 1 if combine == "gather" or hp.n_expert else max(
        blck_size(f.tensors[f"blk.{il}.ffn_down.weight"].type) for il in layers)
    return [cuts(hp.n_head_kv, shares), cuts(ff_width(hp, f, layers), shares, ff_align), cuts(hp.n_embd, shares),
            cuts(hp.n_vocab, shares)]


def ff_width_of(f: GGUFFile, il: int, kind: str) -> int:
    """Layer il's hidden width of its feed-forward `kind` (FF_KINDS: its down
    matrix's input), 0 where it has none."""
    t = f.tensors.get(f"blk.{il}.ffn_down{kind}.weight")
    return t.ne[0] if t is not None else 0


def ff_widths(f: GGUFFile, layers: list[int]) -> set[int]:
    """The widths of every feed-forward of these layers (dense, shared and routed experts)."""
    return {w for il in layers for k in FF_KINDS if (w := ff_width_of(f, il, k))}


def _generic_refusal(arch, hp: HParams, f: GGUFFile, layers: list[int], combine: str) -> str | None:
    """Why an architecture of CUT_ARCHS outside ROW_ARCHS cannot be cut here."""
    if combine != "gather":
        return f"-sm row cuts architecture {arch.name!r} with the gather combine only"
    if hp.n_head_kv_arr or hp.head_dim_swa or hp.n_layer_kv or (hp.head_dim_v and hp.head_dim_v != hp.head_dim):
        return "-sm row: the layers' heads differ in number or size; use -sm layer"
    for il in layers:
        if f"blk.{il}.ffn_gate_up_exps.weight" in f.tensors:
            return f"-sm row cannot cut layer {il} of this {arch.name} (merged expert matrices); use -sm layer"
    return None


def combines_per_layer(arch, hp: HParams, f: GGUFFile, il: int, linked: bool) -> int:
    """Layer il's combines per step with -sm row: through the host, the llama
    family's 3 segments, else its gathers (the heads, each feed-forward's hidden and
    output rows, q and k where a norm spans every head) and one more for the layer's
    output (_build_relay); on linked servers its gathers and one for the attention
    projection's rows (4 for the llama family)."""
    p = f"blk.{il}."
    whole_norm = (t := f.tensors.get(p + "attn_q_norm.weight")) is not None and t.ne[0] != hp.head_dim
    gathers = 1 + 2 * sum(1 for k in FF_KINDS if ff_width_of(f, il, k)) + 2 * whole_norm
    if linked:
        return gathers + 1
    return 3 if arch.name in ROW_ARCHS and not hp.n_swa else gathers + 1


def refusal(arch, hp: HParams, f: GGUFFile, layers: list[int], shares: Sequence[float],
            combine: str = "gather") -> str | None:
    """Why these layers of this model cannot be cut over devices of these shares
    (None: they can)."""
    fused = any(f"blk.{il}.attn_qkv.weight" in f.tensors for il in layers) and arch.name in ROW_ARCHS
    if arch.name not in CUT_ARCHS or fused or any(name.endswith(".scale") for name in f.tensors):
        return (f"-sm row does not support architecture {arch.name!r} ({', '.join(CUT_ARCHS)}); use -sm layer")
    if arch.name not in ROW_ARCHS or hp.n_swa:
        why = _generic_refusal(arch, hp, f, layers, combine)
    else:
        why = hp.n_expert and _moe_refusal(arch, f, layers, combine)
    if why:
        return why
    kept = [s for s in shares if s > 0]
    heads, _, rows, vocab = _cuts(hp, f, layers, shares, combine)
    ffs = [cuts(w, kept) for w in ff_widths(f, layers)]
    for what, cs in (("KV heads", heads), *(("feed-forward rows", c) for c in ffs), ("rows", rows),
                     ("vocabulary rows", vocab)):
        if any(a >= b for a, b in cs):
            return (f"-sm row: the {what} cannot be cut over {len(kept)} devices "
                    f"by -ts {','.join(f'{s:g}' for s in kept)}")
    return None


class RowSplit:
    """The offloaded layers (and the output layer when `output`) cut over `devices`."""

    def __init__(self, arch, hp: HParams, f: GGUFFile, kv: KVCache, devices: list[Device],
                 shares: Sequence[float], layers: list[int], output: bool, flash_attn: bool, n_ctx: int,
                 combine: str = "gather", n_ubatch: int = 512):
        if combine not in COMBINES:
            raise ModelError(f"row combine must be one of {', '.join(COMBINES)}, got {combine!r}")
        why = refusal(arch, hp, f, layers, shares, combine)
        if why:
            raise ModelError(why)
        # without a link the host combines the architecture's own layers through
        # _build_relay's segments (the others' are llama's layer)
        self.relay = arch.name not in ROW_ARCHS or bool(hp.n_swa)
        self.combine, self.n_ubatch = combine, n_ubatch
        self.linked = False      # the servers swap the pieces themselves (ggmlrpc.peers)
        keep = [i for i, s in enumerate(shares) if s > 0]
        devices, shares = [devices[i] for i in keep], [shares[i] for i in keep]
        self.arch, self.hp, self.file, self.kv = arch, hp, f, kv
        self.n_ff = ff_width(hp, f, layers)      # the rows of the feed-forward (of each expert) cut
        self.n_used = hp.n_expert_used if hp.n_expert else 1   # hidden columns per token
        # the router's renormalized weights, as the architecture's layer has them
        self.norm_w = bool(getattr(arch.layer, "keywords", {}).get("norm_w", False))
        self.layers, self.output, self.flash_attn, self.n_ctx = layers, output, flash_attn, n_ctx
        self.shares = shares
        group = hp.n_head // hp.n_head_kv
        kv_cuts, ff_cuts, embd_cuts, vocab_cuts = _cuts(hp, f, layers, shares, combine)
        self.shards = []
        for i, (d, kc, fc, vc) in enumerate(zip(devices, kv_cuts, ff_cuts, vocab_cuts)):
            n_kv = kc[1] - kc[0]
            hp_d = dataclasses.replace(hp, n_head=n_kv * group, n_head_kv=n_kv)
            st = Stage(d, list(layers), output=output)
            self.shards.append(Shard(st, hp_d, kc, fc, vc, i == 0, embd_cuts[i]))

    # -- weights -----------------------------------------------------------------
    def _rules(self, sh: Shard, il: int) -> dict[str, tuple[int, int, int]]:
        """How layer il's tensors are cut for this device: name -> (axis, start, end)
        (cut_tensor); the others go whole to every device."""
        f, hd, group = self.file, self.hp.head_dim, self.hp.n_head // self.hp.n_head_kv
        k0, k1 = (h * hd for h in sh.kv_heads)
        q0, q1 = k0 * group, k1 * group
        rules = {"attn_q.weight": (1, q0, q1), "attn_q.bias": (0, q0, q1),
                 "attn_k.weight": (1, k0, k1), "attn_k.bias": (0, k0, k1),
                 "attn_v.weight": (1, k0, k1), "attn_v.bias": (0, k0, k1),
                 "attn_output.weight": (0, q0, q1),
                 "ffn_gate.weight": (1, *sh.ff), "ffn_up.weight": (1, *sh.ff), "ffn_down.weight": (0, *sh.ff)}
        if self.combine == "reduce":
            return rules
        # "gather": the attention projection whole (through the host: one combine
        # fewer) or, on linked servers, by its output rows (an exchange costs less
        # than a twelfth of a layer's weights); each head's sink; every
        # feed-forward (dense, shared expert, each routed expert) by its hidden rows,
        # its down matrix by its output rows; the routers whole
        del rules["attn_output.weight"]
        if self.linked:
            rules.update({"attn_output.weight": (1, *sh.embd), "attn_output.bias": (0, *sh.embd)})
        rules["attn_sinks.weight"] = (0, sh.kv_heads[0] * group, sh.kv_heads[1] * group)
        e, kv = self.hp.n_head * hd, self.hp.n_head_kv * hd     # one fused q/k/v matrix: each part's rows
        fused = (q0, q1, e + k0, e + k1, e + kv + k0, e + kv + k1)
        rules.update({"attn_qkv.weight": (1, *fused), "attn_qkv.bias": (0, *fused)})
        for k in FF_KINDS:
            width = ff_width_of(f, il, k)
            if not width:
                continue
            a, b = cuts(width, self.shares)[self.shards.index(sh)]
            up = (a, b)
            if f"blk.{il}.ffn_gate{k}.weight" not in f.tensors and f.tensors[f"blk.{il}.ffn_up{k}.weight"].ne[1] == 2 * width:
                up = (a, b, width + a, width + b)    # gate and up in one matrix: each half's rows
            rules.update({f"ffn_gate{k}.weight": (1, a, b), f"ffn_up{k}.weight": (1, *up),
                          f"ffn_gate{k}.bias": (0, a, b), f"ffn_up{k}.bias": (0, *up),
                          f"ffn_down{k}.weight": (1, *sh.embd), f"ffn_down{k}.bias": (0, *sh.embd)})
        return rules

    def _cut(self, sh: Shard) -> None:
        """The device's slices of its stage's weights."""
        f = self.file
        out_w = "output.weight" if "output.weight" in f.tensors else "token_embd.weight"
        rules = {il: self._rules(sh, il) for il in self.layers}
        for n in stage_weights(self.arch, self.hp, sh.stage, f.tensors):
            ti, tail = f.tensors[n], n.split(".", 2)[-1]
            if tail in ("attn_output.bias", "ffn_down.bias") and not sh.first and self.combine == "reduce":
                continue
            rule = rules[int(n.split(".")[1])].get(tail) if n.startswith("blk.") else None
            if rule:
                ti = cut_tensor(ti, *rule)
            elif n == out_w and sh.stage.output:
                ti = cut_tensor(ti, 1, *sh.vocab)
            elif n == "output.bias":
                ti = cut_tensor(ti, 0, *sh.vocab)
            sh.tensors[n] = ti

    def alloc(self) -> int:
        """Every device's weights and cache in one buffer each; the bytes to send
        (the weights are cut here, after `link`, which decides how)."""
        total = 0
        for sh in self.shards:
            self._cut(sh)
            part = SimpleNamespace(path=self.file.path, tensors=sh.tensors)
            total += alloc_stage(sh.stage, part, list(sh.tensors), self.kv, None, sh.hp.n_embd_kv)
            if self.combine == "gather" and not self.linked:    # the residual between a layer's last two segments
                be, shape = sh.stage.device.backend, (self.hp.n_embd, self.n_ubatch)
                buf = be.alloc_buffer(4 * shape[0] * shape[1], sh.stage.device.index)
                if buf is None:
                    raise ModelError(f"{sh.stage.device.name}: cannot allocate the residual buffer")
                sh.stage.buffers.append(buf)
                sh.saved = buf.tensor(GGMLType.F32, shape, 0, name="ffn_inp")
        return total

    def send(self, sent) -> None:
        for sh in self.shards:
            send_weights(sh.stage, SimpleNamespace(tensors=sh.tensors), sent)
            sh.tensors = {}        # the slices cut by columns were copies

    def link(self) -> bool:
        """When every device is a server of its own that speaks the peer extension
        (ggmlrpc.peers: ggmlrpc servers started with --peers): make them one group, so
        that a token is one graph per server whose pieces meet on the servers.
        Returns whether they are linked; the host combines them otherwise. Before
        `alloc`: linked servers cut the attention projection too."""
        bes = [sh.stage.device.backend for sh in self.shards]
        if any(sh.stage.buffers for sh in self.shards):
            raise RuntimeError("RowSplit.link comes before alloc")
        if self.combine != "gather" or not linkable(bes):
            return False
        token, eps = secrets.randbits(64), [b.endpoint for b in bes]
        answers = [b.request_peer_group(token, r, eps) for r, b in enumerate(bes)]
        self.linked = all([a() for a in answers])
        if not self.linked:
            log.warning("-sm row: the servers could not link to each other (their logs say why); "
                        "the host combines their results instead")
        return self.linked

    def reserve(self, key: tuple) -> None:
        """The compute and input memory of the largest segments each device runs."""
        T, il = key[0], self.layers[0]
        rows = (T, key[1], T, *key[3:])
        segs = ([(("attn", il), key), (("ffn", il), rows)] if self.combine == "reduce" else
                [(("heads", il), key), (("mid", il), rows), (("down", il), rows)])
        segs += [(("out",), rows)] * self.output
        if self.linked:
            segs = [(("token",), key)]
        elif self.relay:
            segs = [(("relay", il, 0), key)] + [(("relay", "out"), rows)] * self.output
        for sh in self.shards:
            for seg, k in segs:
                self._graph(sh, seg, k)
            sh.stage.graphs.clear()

    # -- graphs ------------------------------------------------------------------
    def _graph(self, sh: Shard, seg: tuple, key: tuple) -> StageGraph:
        st = sh.stage
        g = st.graphs.get((seg, key))
        if g is None:
            build = (self._build_token if seg == ("token",) else self._build_relay if seg[0] == "relay"
                     else lambda sh, key, align: self._build(sh, seg, key, align))
            g = stage_graph(st, (seg, key), lambda st, _, align: build(sh, key, align) if seg[0] != "relay"
                            else build(sh, seg, key, align), {})
            g.wire = serialize_graph(st.device.index, g.graph.nodes)
            if sh.held and sh.held not in st.graphs:
                sh.held = None        # the buffers grew: the device's graph is gone
        return g

    def _build_token(self, sh: Shard, key: tuple, align: int) -> StageGraph:
        """Linked servers: a whole token in one graph, the architecture's own layers
        over the device's heads and rows, with OP_GATHER nodes (ggmlrpc.peers) where
        their pieces meet (blocks.Ctx.tp: before the attention's projection, after
        each feed-forward's hidden rows and after its down rows). Every server ends
        with the whole residual; with the output layer, each its vocabulary rows of
        the logits."""
        c = Ctx(self.arch, sh.hp, sh.stage, self.kv.cells, self.flash_attn, self.n_ctx, key, align)
        c.tp = _Pieces(self, self.shards.index(sh))
        x = c.inp.new(GGMLType.F32, (self.hp.n_embd, key[0]), "x")
        c.layer_inputs()
        for il in self.layers:
            x = self.arch.layer(c, il, x)
        y = c.output(x) if self.output else x
        c.g.expand(y, output=True)
        return StageGraph(key, c.g, {t.name: t for t in c.inp.tensors}, y, c.inp)

    def _build_relay(self, sh: Shard, seg: tuple, key: tuple, align: int) -> StageGraph:
        """The host-combined form of the architecture's own layers (architectures
        outside ROW_ARCHS over servers that do not link): segment ("relay", il, j)
        runs layer il from its input "x" up to its j-th gather, whose piece is the
        output; the gathers before it read what the host made of their pieces
        (inputs "g{il}_{i}"), and only the first segment to reach the layer's cache
        writes writes them. Past the layer's last gather the segment's output is the layer's
        output. ("relay", "out"): the output layer's rows."""
        c = Ctx(self.arch, sh.hp, sh.stage, self.kv.cells, self.flash_attn, self.n_ctx, key, align)
        x = c.inp.new(GGMLType.F32, (self.hp.n_embd, key[0]), "x")
        stopped = False
        if seg[1] == "out":
            y = c.output(x)
        else:
            il, j = seg[1:]
            c.tp = _Relay(self, self.shards.index(sh), c, il, j)
            c.layer_inputs()
            try:
                y = self.arch.layer(c, il, x)
            except _Stop as stop:
                y, stopped = stop.piece, True
        c.g.expand(y, output=True)
        g = StageGraph(key, c.g, {t.name: t for t in c.inp.tensors}, y, c.inp)
        g.stopped = stopped
        return g

    def _run_relay(self, key: tuple, values: dict, x: np.ndarray) -> np.ndarray:
        """Each layer's segments in turn on every device, the host putting each
        gather's pieces side by side (as linked servers do among themselves); the
        layer's output from the first device."""
        inputs = dict(values)
        for il in self.layers:
            inputs["x"], j = x, 0
            while self._graph(self.shards[0], ("relay", il, j), key).stopped:
                inputs[f"g{il}_{j}"] = _cat(self._combine(("relay", il, j), key, inputs))
                j += 1
            x = self._combine(("relay", il, j), key, inputs, self.shards[:1])[0].copy()
        if not self.output:
            return x
        R = x.shape[0]
        return _cat(self._combine(("relay", "out"), (R, 0, R, 0, ()), {"x": x}))

    def _build(self, sh: Shard, seg: tuple, key: tuple, align: int) -> StageGraph:
        """One segment: attention of layer il, or its feed-forward (each up to the
        device's partial output projection), or the output layer's rows."""
        c = Ctx(self.arch, sh.hp, sh.stage, self.kv.cells, self.flash_attn, self.n_ctx, key, align)
        kind, il, hp = seg[0], seg[-1], self.hp
        x = c.inp.new(GGMLType.F32, (self.n_ff, self.n_used * key[0]) if kind == "down" else (hp.n_embd, key[0]),
                      "x")
        if kind in ("attn", "heads"):
            c.layer_inputs()
            y = c.attention(il, *c.qkv(il, c.norm(x, "attn_norm", il)), project=kind == "attn")
        elif kind == "ffn":
            y = c.ffn(il, c.norm(x, "ffn_norm", il))
        elif kind == "mid":    # x: the residual; o: every head's attention output
            o = c.inp.new(GGMLType.F32, (hp.head_dim * hp.n_head, key[0]), "o")
            ids = (c.inp.new(GGMLType.I32, (key[2],), "out_ids")      # the rows that come out
                   if il == hp.n_layer - 1 and key[2] < key[0] else None)
            ffn_inp, y, _ = _mid(c, il, o, x, ids, self.norm_w)
            c.g.expand(B.cpy(ffn_inp, B.view(sh.saved, ffn_inp.ne[:2])))
        elif kind == "down":   # its rows of the layer's output: down x + the residual kept by "mid"
            route = None
            if hp.n_expert:    # the router again, on the residual "mid" kept (the same choice)
                route = c.route(il, c.norm(B.view(sh.saved, (hp.n_embd, key[0])), "ffn_norm", il), self.norm_w)
            y = _down(c, il, x, sh.saved, sh.embd, key[0], route)
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
        own = dict(values)
        for suffix, cells in (("", self.kv.full), ("_swa", self.kv.swa)):
            k = values.get("k_idxs" + suffix)
            if k is not None:      # the same for every layer of a step: made once a step
                held = sh.v_idxs.get(suffix)
                if held is None or held[0] is not k:
                    chan = np.arange(sh.hp.n_embd_kv, dtype=np.int64) * cells.size
                    held = sh.v_idxs[suffix] = (k, (chan[None, :] + k[:, None]).reshape(-1))
                own["v_idxs" + suffix] = held[1]
        return own

    def _combine(self, seg: tuple, key: tuple, values: dict, shards: list | None = None) -> list[np.ndarray]:
        """Run one segment on every device (or on `shards`): each device's inputs,
        graph and the read of its result go in one write, every device before the
        first answer is read."""
        answers = []
        for sh in self.shards if shards is None else shards:
            be = sh.stage.device.backend
            g = self._graph(sh, seg, key)
            answers.append((g.out.ne, g.issue(be, values if seg[0] not in ("attn", "heads", "relay", "token")
                                             else self._own(sh, values), sh.held == (seg, key))))
            sh.held = (seg, key)
        return [np.frombuffer(read(), np.float32).reshape(ne[1], ne[0]) for ne, read in answers]

    def run(self, key: tuple, values: dict, x) -> np.ndarray:
        """The residual `x` (the embeddings) through the layers: the host adds each
        segment's partial sums and the residual; then the output layer's rows
        gathered (n_out rows of logits), or the last residual rows when the output
        layer is elsewhere."""
        T, n_out = key[0], key[2]
        x = np.frombuffer(x, np.float32).reshape(T, self.hp.n_embd)
        if self.linked:
            return self._run_linked(key, values, x)
        if self.relay:
            return self._run_relay(key, values, x)
        last = self.hp.n_layer - 1
        out_ids = values["out_ids"]
        for il in self.layers:
            if self.combine == "reduce":
                s = _sum(self._combine(("attn", il), key, dict(values, x=x)))
            else:
                o = _cat(self._combine(("heads", il), key, dict(values, x=x)))
                h = _cat(self._combine(("mid", il), (T, key[1], n_out if il == last else T, *key[3:]),
                                       {"x": x, "o": o, "out_ids": out_ids}))
                R = h.shape[0] // self.n_used
                x = _cat(self._combine(("down", il), (R, key[1], R, *key[3:]), {"x": h}))
                continue
            if il == last and n_out < T:
                s, x = s[out_ids], x[out_ids]
            x = s + x
            R = x.shape[0]
            x = _sum(self._combine(("ffn", il), (R, key[1], R, *key[3:]), {"x": x})) + x
        if not self.output:
            return x
        R = x.shape[0]
        return _cat(self._combine(("out",), (R, 0, R, 0, ()), {"x": x}))

    def _run_linked(self, key: tuple, values: dict, x: np.ndarray) -> np.ndarray:
        """One graph per server, issued as any segment is (_combine); the logits' rows
        from each, or the residual from the first (the others' copy of it is read and
        dropped: a row of n_embd floats a token, one answer per server as before)."""
        parts = self._combine(("token",), key, dict(values, x=x))
        return _cat(parts) if self.output else parts[0].copy()

    def clear(self) -> None:
        for sh in self.shards:
            sh.stage.graphs.clear()
            sh.held = None


class _Pieces:
    """blocks.Ctx.tp of one device of linked servers (`rank` of the row split's):
    gather(t, kind, il) is an OP_GATHER of every device's rows of t (rows, columns),
    cut as RowSplit cuts the weights: "heads" (an attention's output, whole heads),
    "q" and "k" (the query's and key's projected rows, for a norm over all heads),
    "embd" (the output rows of a down matrix), or a feed-forward's hidden rows by
    the name of its up matrix ("ffn_up", "ffn_up_shexp", "ffn_up_exps")."""

    def __init__(self, rs: RowSplit, rank: int):
        self.rs, self.rank, self.n = rs, rank, 0

    def _cut(self, kind: str, il: int) -> list[tuple[int, int]]:
        rs, hp = self.rs, self.rs.hp
        group = hp.n_head // hp.n_head_kv
        if kind in ("heads", "q", "k"):     # the attention's output; the projections' rows
            width = {"heads": (hp.head_dim_v or hp.head_dim_of(il)) * group, "q": hp.head_dim_of(il) * group,
                     "k": hp.head_dim_of(il)}[kind]
            return [tuple(h * width for h in s.kv_heads) for s in rs.shards]
        if kind == "embd":
            return [s.embd for s in rs.shards]
        return cuts(ff_width_of(rs.file, il, kind[len("ffn_up"):]), rs.shares)

    def gather(self, t, kind: str, il: int):
        cut = self._cut(kind, il)
        bounds = [a for a, _ in cut] + [cut[-1][1]]
        self.n += 1
        return B._node(peers.OP_GATHER, GGMLType.F32, (bounds[-1], t.ne[1]), t,
                       params=peers.gather_params(self.rank, bounds), name=f"{kind}-{il}-{self.n}")

    def writes(self, il: int) -> bool:
        return True

    def projected(self, t, il: int):
        """The attention projection's output (n_embd, T) from this device's rows of it."""
        return self.gather(t, "embd", il)

    def mine(self, whole, kind: str, il: int):
        """This device's rows of a gathered (rows, columns) tensor, contiguous."""
        a, b = self._cut(kind, il)[self.rank]
        return B.cont(B.view(whole, (b - a, whole.ne[1]), (4, whole.nb[1]), 4 * a))


class _Stop(Exception):
    """A relay segment reached its gather: `piece` is its output."""

    def __init__(self, piece):
        super().__init__()
        self.piece = piece


class _Relay(_Pieces):
    """blocks.Ctx.tp of the host-combined form (RowSplit._build_relay): layer il's
    gather number `stop` ends the graph (_Stop); every other gather is an input the
    host fills with every device's pieces side by side."""

    def __init__(self, rs: RowSplit, rank: int, c: Ctx, il: int, stop: int):
        super().__init__(rs, rank)
        self.c, self.il, self.stop, self.count = c, il, stop, {}

    def gather(self, t, kind: str, il: int):
        i = self.count.get(il, 0)
        self.count[il] = i + 1
        if il == self.il and i == self.stop:
            raise _Stop(t)
        return self.c.inp.new(GGMLType.F32, (self._cut(kind, il)[-1][1], t.ne[1]), f"g{il}_{i}")

    def projected(self, t, il: int):
        return t       # through the host every device computes the projection whole

    def writes(self, il: int) -> bool:
        """The cache rows are written by the segment that stops at the gather after them."""
        return self.count.get(il, 0) == self.stop


def _mid(c: Ctx, il: int, o, x, ids, norm_w: bool = False):
    """"gather"'s middle of layer il: the whole attention projection of every head's
    output `o`, plus the residual `x` (their rows `ids` only, where given), then this
    device's gate/up rows of the feed-forward, or of each chosen expert (the router
    whole on every device: each makes the same choice). Returns (the sum, the
    hidden rows (rows, n_used x tokens), the router's (chosen, weights) or None)."""
    w, p = c.w, f"blk.{il}."
    cur = B.mul_mat(w[p + "attn_output.weight"], o, name=f"attn_out-{il}")
    if p + "attn_output.bias" in w:
        cur = B.add(cur, w[p + "attn_output.bias"], name=f"attn_out-{il}")
    if ids is not None:
        cur, x = B.get_rows(cur, ids), B.get_rows(x, ids)
    ffn_inp = B.add(cur, x, name=f"ffn_inp-{il}")
    cur = c.norm(ffn_inp, "ffn_norm", il)
    if c.hp.n_expert:
        route = c.route(il, cur, norm_w)
        h = c.experts_glu(il, cur, route[0])
        return ffn_inp, B.reshape(h, (h.ne[0], h.ne[1] * h.ne[2])), route
    return ffn_inp, B.swiglu_split(B.mul_mat(w[p + "ffn_gate.weight"], cur, name=f"ffn_gate-{il}"),
                                   B.mul_mat(w[p + "ffn_up.weight"], cur, name=f"ffn_up-{il}"),
                                   name=f"ffn_glu-{il}"), None


def _down(c: Ctx, il: int, h, whole, embd: tuple[int, int], cols: int, route=None):
    """"gather"'s end of layer il: this device's rows `embd` of the down projection of
    the hidden rows `h` (of each chosen expert, weighted and summed in llama.cpp's
    order, with `route`), plus the same rows of the residual `whole` (cols columns)."""
    w, p, (e0, e1) = c.w, f"blk.{il}.", embd
    if route is not None:
        chosen, weights = route
        h = B.reshape(h, (h.ne[0], chosen.ne[0], cols))
        y = B.mul_mat_id(w[p + "ffn_down_exps.weight"], h, chosen, name=f"ffn_moe_down-{il}")
        y = c.sum_experts(il, B.mul(y, weights, name=f"ffn_moe_weighted-{il}"))
    else:
        y = B.mul_mat(w[p + "ffn_down.weight"], h, name=f"ffn_out-{il}")
        if p + "ffn_down.bias" in w:
            y = B.add(y, w[p + "ffn_down.bias"], name=f"ffn_out-{il}")
    res = B.view(whole, (e1 - e0, cols), (4, 4 * whole.ne[0]), 4 * e0)
    return B.add(y, res, name=f"l_out-{il}")


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    """The devices' pieces of each row side by side."""
    return np.ascontiguousarray(np.concatenate(parts, axis=1))


def _sum(parts: list[np.ndarray]) -> np.ndarray:
    s = parts[0].copy()
    for p in parts[1:]:
        s += p
    return s
