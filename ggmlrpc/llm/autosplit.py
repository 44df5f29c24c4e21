"""`-sm auto`: layer or row split, chosen from what the servers measure.

Each server device is measured once at load: its round trip (the best of a few
pings) and its speed at the model's own work, a matrix-vector product over 64 MiB
of weights of the model's feed-forward type (a zeroed buffer: every block type
reads zeros as valid blocks), alone and with every device computing at once
(servers on one host share its memory bandwidth: two on a 2-core Zen 4 class VM
read Q8_0 weights at 28 GB/s alone and 19 each at once). From those and the
weight bytes of the offloaded layers, a token is predicted to cost:

- with `layer`: every device's layers one after the other (at its speed alone),
  plus one round trip per run of layers;
- with `row`: the slowest device's share of every layer (at its speed with all at
  once), plus a round trip and
  the host's combine work for each of a layer's combines (3 in the llama family;
  rowsplit.combines_per_layer) and the output layer's; over servers that link to
  each other (ggmlrpc.peers: ours started with --peers, one device each), one
  round trip per token instead, and for each exchange one way between the servers
  (half the host's round trip less PING_OVERHEAD_MS, what our host's own ping
  costs on the bare loopback, which the servers' exchanges in C do not pay) plus
  PEER_EXCHANGE_MS.

`row` is chosen when it is predicted faster and the model can be cut
(rowsplit.refusal: its architecture, whole KV heads per device); else `layer`. The
host's work per combine, HOST_COMBINE_MS, is bench/tensor_split.py's figure: our
host's CPU time per token with `row` over the number of combines (4.4-4.8 ms / 37
on a 2-core Zen 4 class VM, each server's requests framed once: StageGraph.issue);
PEER_EXCHANGE_MS is what an exchange between linked servers costs on the bare
loopback (bench/tensor_split.py's row-peers exchange time per token over its 49
exchanges: 0.85 ms on a 2-core Zen 4 class VM, where our host's pings took 0.03
ms at best).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

from .. import builder as B
from ..ggml import GGMLType, type_size, blck_size
from .gguf_file import GGUFFile
from .placement import Device, assign_layers, first_offloaded
from .rowsplit import linkable

HOST_COMBINE_MS = 0.13
PEER_EXCHANGE_MS = 0.02
PING_OVERHEAD_MS = 0.03
BENCH_BYTES = 64 << 20
BENCH_COLS = 4096


@dataclass
class Measured:
    """A server device's round trip (ms) and speed (weight bytes per ms): alone, and
    while every measured device computes at once (`together_bytes_per_ms`; 0: not
    measured). Servers on one host share its memory bandwidth: layer split runs them
    in turn, row split at once."""
    device: Device
    rtt_ms: float
    bytes_per_ms: float
    together_bytes_per_ms: float = 0.0

    @property
    def row_bytes_per_ms(self) -> float:
        return self.together_bytes_per_ms or self.bytes_per_ms


def _best_ms(rounds: int, call) -> float:
    """The shortest of `rounds` calls, in ms (inf for none)."""
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        call()
        best = min(best, (time.perf_counter() - t0) * 1e3)
    return best


def measure(dev: Device, wtype: int, rounds: int = 5) -> Measured:
    """Time `rounds` pings and `rounds` reruns of a matrix-vector product of
    BENCH_BYTES of `wtype` weights on `dev` (the best of each)."""
    return measure_all([dev], wtype, rounds)[0]


def _bench_graph(dev: Device, wtype: int):
    """The measuring product on `dev`, computed once: (buffer, output, weight bytes),
    or None where the device cannot hold it."""
    be, d = dev.backend, dev.index
    row = BENCH_COLS // blck_size(wtype) * type_size(wtype)
    rows = max(1, BENCH_BYTES // row)
    align = be.get_alignment(d)
    w_size = (rows * row + align - 1) // align * align
    x_size = (BENCH_COLS * 4 + align - 1) // align * align
    buf = be.alloc_buffer(w_size + x_size + rows * 4, d)
    if buf is None:
        return None
    buf.clear(0)
    w = buf.tensor(wtype, (BENCH_COLS, rows, 1, 1), 0, "autosplit.w")
    x = buf.tensor(GGMLType.F32, (BENCH_COLS, 1, 1, 1), w_size, "autosplit.x")
    out = B.mul_mat(w, x, "autosplit.out")
    out.buffer, out.data = buf, buf.base + w_size + x_size
    g = B.Graph()
    g.expand(out, output=True)
    be.graph_compute(g.nodes, d)
    be.get_tensor(out)
    return buf, out, rows * row


def measure_all(devs: Sequence[Device], wtype: int, rounds: int = 5) -> list[Measured]:
    """`measure` of each device, then (with two or more) the same products on all of
    them at once, `rounds` times: the best time until each device's answer. A
    server's devices share its connection, so they go one after another there."""
    rtts = [_best_ms(rounds, dev.backend.ping) for dev in devs]
    benches = []
    try:
        for dev in devs:
            benches.append(_bench_graph(dev, wtype))

        def run(dev, out):
            dev.backend.graph_recompute(dev.index)
            dev.backend.get_tensor(out)
        alone = [_best_ms(rounds, lambda: run(dev, b[1])) if b else float("inf") for dev, b in zip(devs, benches)]
        together = [float("inf")] * len(devs)
        live = [i for i, b in enumerate(benches) if b]
        waves: list[list[int]] = []       # the k-th device of every server, wave k
        seen: dict[int, int] = {}
        for i in live:
            k = seen[id(devs[i].backend)] = seen.get(id(devs[i].backend), -1) + 1
            if k == len(waves):
                waves.append([])
            waves[k].append(i)
        for _ in range(rounds if len(live) > 1 else 0):
            t0 = time.perf_counter()
            for wave in waves:
                answers = []
                for i in wave:
                    devs[i].backend.graph_recompute(devs[i].index)
                    answers.append((i, devs[i].backend.request_tensor(benches[i][1])))
                for i, answer in answers:
                    answer()
                    together[i] = min(together[i], (time.perf_counter() - t0) * 1e3)
    finally:
        for b in benches:
            if b:
                b[0].free()
    out = []
    for dev, rtt, b, t1, tn in zip(devs, rtts, benches, alone, together):
        if not b:
            out.append(Measured(dev, rtt, 0.0))
            continue
        out.append(Measured(dev, rtt, b[2] / max(t1 - rtt, 1e-3),
                            b[2] / max(tn - rtt, 1e-3) if tn < float("inf") else 0.0))
    return out


def layer_bytes(f: GGUFFile, il: int) -> int:
    prefix = f"blk.{il}."
    return sum(t.nbytes for name, t in f.tensors.items() if name.startswith(prefix))


def output_bytes(f: GGUFFile) -> int:
    out = f.tensors.get("output.weight") or f.tensors.get("token_embd.weight")
    return out.nbytes if out is not None else 0


def predict(measured: Sequence[Measured], shares: Sequence[float], layers: Sequence[int],
            sizes: Sequence[int], out_bytes: int, out_dev: int, linked: bool = False,
            per_layer: Sequence[int] | None = None) -> tuple[float, float]:
    """Predicted ms per token of (layer split, row split). `layers[i]` is layer i's
    device (an index into `measured`, -1: the local CPU, the same in both modes),
    `sizes[i]` its weight bytes; the output layer (`out_bytes`) is on `out_dev`
    (assign_layers' last entry). `linked`: the servers swap the row split's pieces
    themselves (ggmlrpc.peers). `per_layer[i]`: layer i's combines with row
    (rowsplit.combines_per_layer; default 3 each)."""
    n = len(measured)
    per_dev = [0] * n
    for dev, size in zip(layers, sizes):
        if dev >= 0:
            per_dev[dev] += size
    offloaded = out_dev >= 0
    if offloaded:
        per_dev[out_dev] += out_bytes
    rtts = [m.rtt_ms for m in measured]
    t_layer = sum(b / m.bytes_per_ms for b, m in zip(per_dev, measured) if b) + \
        sum(rtts[dev] for i, dev in enumerate(layers) if dev >= 0 and (i == 0 or layers[i - 1] != dev))
    total = sum(per_dev)
    used = [(s, m) for s, m in zip(shares, measured) if s > 0]
    whole = sum(s for s, _ in used)
    per_layer = per_layer or [3] * len(layers)
    combines = sum(n for dev, n in zip(layers, per_layer) if dev >= 0) + offloaded
    t_row = max(s / whole * total / m.row_bytes_per_ms for s, m in used) + (
        max(rtts) + combines * (max(max(rtts) - PING_OVERHEAD_MS, 0.0) / 2 + PEER_EXCHANGE_MS) if linked else
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
    first = min(first_offloaded(n_layer, n_gpu_layers), n_layer - 1)
    up = f"blk.{first}.ffn_up.weight"
    wtype = f.tensors[up if up in f.tensors else f"blk.{first}.ffn_up_exps.weight"].type
    measured = measure_all(remote, wtype)
    if any(m.bytes_per_ms <= 0 for m in measured):
        return "layer", "a server could not hold the measuring buffer"
    *layers, out_dev = assign_layers(n_layer, n_gpu_layers, shares)
    linked = linkable([d.backend for d, s in zip(remote, shares) if s > 0])
    t_layer, t_row = predict(measured, shares, layers, [layer_bytes(f, il) for il in range(n_layer)],
                             output_bytes(f), out_dev, linked,
                             combines and [combines(il, linked) for il in range(n_layer)])
    speeds = ", ".join(f"{m.device.name} {m.rtt_ms:.2f} ms round trip, {m.bytes_per_ms / 1e6:.1f} GB/s"
                       f" ({m.row_bytes_per_ms / 1e6:.1f} with all at once)" for m in measured)
    mode = "row" if t_row < t_layer else "layer"
    how = " over linked servers" if linked else ""
    return mode, f"predicted {t_layer:.2f} ms per token with layer, {t_row:.2f} ms with row{how} ({speeds})"
