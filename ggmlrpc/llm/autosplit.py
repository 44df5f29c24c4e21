"""`-sm auto`: layer or row split, chosen from what the servers measure.

Each server device is measured once at load: its round trip (the best of a few
pings) and its speed at the model's own work, a matrix-vector product over 64 MiB
of weights of the model's feed-forward type (a zeroed buffer: every block type
reads zeros as valid blocks). From those and the weight bytes of the offloaded
layers, a token is predicted to cost:

- with `layer`: every device's layers one after the other, plus one round trip
  per run of layers;
- with `row`: the slowest device's share of every layer, plus a round trip and
  the host's combine work for each of a layer's combines (3 in the llama family;
  rowsplit.combines_per_layer) and the output layer's; over servers that link to
  each other (ggmlrpc.peers: ours started with --peers, one device each), one
  round trip per token instead, and for each exchange half a round trip (one way,
  server to server, taken as the host's) plus PEER_EXCHANGE_MS.

`row` is chosen when it is predicted faster and the model can be cut
(rowsplit.refusal: its architecture, whole KV heads per device); else `layer`. The
host's work per combine, HOST_COMBINE_MS, is bench/tensor_split.py's figure: our
host's CPU time per token with `row` over the number of combines (8.5 ms / 37 on
a 2-core Sapphire Rapids VM); PEER_EXCHANGE_MS is what an exchange between linked
servers adds on the bare loopback there (bench/tensor_split.py's row-peers less
half a layer split token, over its exchanges: 36 when measured, 48 since the
linked servers cut the attention projection too).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

from .. import builder as B
from ..ggml import GGMLType, type_size, blck_size
from .gguf_file import GGUFFile
from .placement import Device, assign_layers
from .rowsplit import linkable

HOST_COMBINE_MS = 0.25
PEER_EXCHANGE_MS = 0.05
BENCH_BYTES = 64 << 20
BENCH_COLS = 4096


@dataclass
class Measured:
    """A server device's round trip (ms) and speed (weight bytes per ms)."""
    device: Device
    rtt_ms: float
    bytes_per_ms: float


def measure(dev: Device, wtype: int, rounds: int = 5) -> Measured:
    """Time `rounds` pings and `rounds` reruns of a matrix-vector product of
    BENCH_BYTES of `wtype` weights on `dev` (the best of each)."""
    be, d = dev.backend, dev.index
    rtts = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        be.ping()
        rtts.append((time.perf_counter() - t0) * 1e3)
    rtt = min(rtts)
    row = BENCH_COLS // blck_size(wtype) * type_size(wtype)
    rows = max(1, BENCH_BYTES // row)
    align = be.get_alignment(d)
    w_size = (rows * row + align - 1) // align * align
    x_size = (BENCH_COLS * 4 + align - 1) // align * align
    buf = be.alloc_buffer(w_size + x_size + rows * 4, d)
    if buf is None:
        return Measured(dev, rtt, 0.0)
    try:
        buf.clear(0)
        w = buf.tensor(wtype, (BENCH_COLS, rows, 1, 1), 0, "autosplit.w")
        x = buf.tensor(GGMLType.F32, (BENCH_COLS, 1, 1, 1), w_size, "autosplit.x")
        out = B.mul_mat(w, x, "autosplit.out")
        out.buffer, out.data = buf, buf.base + w_size + x_size
        g = B.Graph()
        g.expand(out, output=True)
        be.graph_compute(g.nodes, d)
        be.get_tensor(out)
        best = float("inf")
        for _ in range(rounds):
            t0 = time.perf_counter()
            be.graph_recompute(d)
            be.get_tensor(out)
            best = min(best, (time.perf_counter() - t0) * 1e3)
    finally:
        buf.free()
    return Measured(dev, rtt, rows * row / max(best - rtt, 1e-3))


def layer_bytes(f: GGUFFile, il: int) -> int:
    prefix = f"blk.{il}."
    return sum(t.nbytes for name, t in f.tensors.items() if name.startswith(prefix))


def output_bytes(f: GGUFFile) -> int:
    out = f.tensors.get("output.weight") or f.tensors.get("token_embd.weight")
    return out.nbytes if out is not None else 0


def predict(measured: Sequence[Measured], shares: Sequence[float], layers: Sequence[int],
            sizes: Sequence[int], out_bytes: int, linked: bool = False,
            per_layer: Sequence[int] | None = None) -> tuple[float, float]:
    """Predicted ms per token of (layer split, row split). `layers[i]` is layer i's
    device (an index into `measured`, -1: the local CPU, the same in both modes),
    `sizes[i]` its weight bytes; the output layer (`out_bytes`) goes with the
    last layer when every layer is offloaded. `linked`: the servers swap the row
    split's pieces themselves (ggmlrpc.peers). `per_layer[i]`: layer i's combines
    with row (rowsplit.combines_per_layer; default 3 each)."""
    n = len(measured)
    per_dev = [0] * n
    for dev, size in zip(layers, sizes):
        if dev >= 0:
            per_dev[dev] += size
    offloaded = all(dev >= 0 for dev in layers)
    if offloaded and layers:
        per_dev[layers[-1]] += out_bytes
    rtts = [m.rtt_ms for m in measured]
    t_layer = sum(b / m.bytes_per_ms for b, m in zip(per_dev, measured) if b) + \
        sum(rtts[dev] for i, dev in enumerate(layers) if dev >= 0 and (i == 0 or layers[i - 1] != dev))
    total = sum(per_dev)
    used = [(s, m) for s, m in zip(shares, measured) if s > 0]
    whole = sum(s for s, _ in used)
    per_layer = per_layer or [3] * len(layers)
    combines = sum(n for dev, n in zip(layers, per_layer) if dev >= 0) + offloaded
    t_row = max(s / whole * total / m.bytes_per_ms for s, m in used) + (
        max(rtts) + combines * (max(rtts) / 2 + PEER_EXCHANGE_MS) if linked else
        combines * (max(rtts) + HOST_COMBINE_MS))
    return t_layer, t_row


def choose(f: GGUFFile, n_layer: int, remote: list[Device], shares: Sequence[float], n_gpu_layers: int,
           refusal: str | None, combines: Callable[[int, bool], int] | None = None) -> tuple[str, str]:
    """("layer" or "row", why), measuring the servers where row split could be used;
    `combines(il, linked)`: layer il's combines with row (default 3)."""
    if len({id(d.backend) for d in remote}) < 2 or n_gpu_layers <= 0:
        return "layer", "fewer than two servers hold layers"
    if refusal:
        return "layer", refusal
    first = n_layer - min(n_gpu_layers, n_layer)
    up = f"blk.{first}.ffn_up.weight"
    wtype = f.tensors[up if up in f.tensors else f"blk.{first}.ffn_up_exps.weight"].type
    measured = [measure(d, wtype) for d in remote]
    if any(m.bytes_per_ms <= 0 for m in measured):
        return "layer", "a server could not hold the measuring buffer"
    layers = assign_layers(n_layer, n_gpu_layers, shares)
    linked = linkable([d.backend for d, s in zip(remote, shares) if s > 0])
    t_layer, t_row = predict(measured, shares, layers, [layer_bytes(f, il) for il in range(n_layer)],
                             output_bytes(f), linked, combines and [combines(il, linked) for il in range(n_layer)])
    speeds = ", ".join(f"{m.device.name} {m.rtt_ms:.2f} ms round trip, {m.bytes_per_ms / 1e6:.1f} GB/s"
                       for m in measured)
    mode = "row" if t_row < t_layer else "layer"
    how = " over linked servers" if linked else ""
    return mode, f"predicted {t_layer:.2f} ms per token with layer, {t_row:.2f} ms with row{how} ({speeds})"
