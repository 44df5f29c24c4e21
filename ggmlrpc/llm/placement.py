"""Where a model lives (llama.cpp's placement): the local CPU and the servers'
devices, the stages a step runs through (the embeddings on the CPU, each run of
layers on one device, the output layer where llama.cpp puts it), each stage's
weights and KV cache in one buffer on its device, and its graphs in compute and
input buffers there."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .. import builder as B
from ..client import RemoteBackend, RemoteBuffer, Tensor
from ..ggml import GGMLType
from ..local import LocalBackend
from .gguf_file import GGUFFile, ModelError
from .kv_cache import KVCache


@dataclass
class Device:
    """One compute device: a backend (local or a server) and its device index."""
    backend: object            # LocalBackend | RemoteBackend
    index: int
    name: str
    free: int

    @property
    def local(self) -> bool:
        return isinstance(self.backend, LocalBackend)


@dataclass
class StageGraph:
    """A built graph of one stage for one input shape, and its input tensors."""
    key: tuple
    graph: B.Graph
    inputs: dict[str, Tensor]
    out: Tensor
    layout: B.Inputs
    wire: bytes = b""       # the graph as GRAPH_COMPUTE sends it, once serialized
    # made at the first step: each input's (name, start, end) in the image, and the
    # step's requests to the server with their headers encoded (issue)
    slots: list | None = field(default=None, repr=False)
    requests: object = field(default=None, repr=False)
    row_wise: bool | None = field(default=None, repr=False)    # see model._row_wise

    @property
    def inputs_size(self) -> int:
        return self.layout.size

    def place_inputs(self, buffer: RemoteBuffer) -> None:
        self.layout.place(buffer)
        # every input of a step goes in one SET_TENSOR over the inputs' whole span
        self.span = buffer.tensor(GGMLType.I8, (max(self.layout.size, 1),), 0, name="inputs")
        self.image = np.zeros(self.layout.size, np.uint8)
        # the result of each step lands here (read before the next step overwrites it)
        self.result = bytearray(self.out.nbytes)

    def fill(self, values: dict) -> None:
        """Every input's bytes into the image of the inputs' span."""
        if self.slots is None:
            self.slots = [(name, t.offset, t.offset + t.nbytes) for name, t in self.inputs.items()]
        view = memoryview(self.image)
        for name, a, b in self.slots:
            raw = memoryview(values[name]).cast("B")
            if raw.nbytes != b - a:
                raise ValueError(f"input {name}: {raw.nbytes} bytes for a tensor of {b - a}")
            view[a:b] = raw

    def write_inputs(self, backend, values: dict) -> None:
        self.fill(values)
        backend.set_tensor(self.span, self.image)

    def issue(self, backend, values: dict, recompute: bool):
        """A remote step in one write: the inputs, the graph (`wire`; rerun when
        `recompute`) and the read of the result; returns the function that waits
        for the result (in `result`). Corked commands go first."""
        self.fill(values)
        if self.requests is None or self.requests.wire is not self.wire:
            self.requests = backend.step_requests(self.span, self.wire, self.out, self.span.buffer.device)
        return backend.issue_step(self.requests, self.image, recompute, self.result)


@dataclass
class Stage:
    """What one device runs each step: maybe the embeddings, a run of layers, maybe
    the output layer."""
    device: Device
    layers: list[int]
    embed: bool = False
    output: bool = False
    weights: dict[str, Tensor] = field(default_factory=dict)
    kv: dict[int, tuple[Tensor, Tensor | None]] = field(default_factory=dict)   # K, V (None: MLA)
    # recurrent layers' state: per layer, (one sequence's state, slot) tensors of F32
    state: dict[int, tuple[Tensor, ...]] = field(default_factory=dict)
    state_span: Tensor | None = None      # all of the stage's recurrent state, slot after slot
    state_slot: int = 0                   # the bytes of one slot (every layer's state of one sequence)
    buffers: list[RemoteBuffer] = field(default_factory=list)
    compute: RemoteBuffer | None = None
    inputs_buf: RemoteBuffer | None = None
    mapped: bool = False        # weights used in place in the file mapping (local CPU)
    graphs: dict[tuple, StageGraph] = field(default_factory=dict)


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def first_offloaded(n_layer: int, n_gpu_layers: int) -> int:
    """The first of the n_layer + 1 "layers" (the repeating ones, then the output
    layer as number n_layer) that -ngl sends to the servers: llama.cpp counts the
    output layer as one, so -ngl N offloads it and the last N - 1 layers."""
    return max(n_layer + 1 - max(n_gpu_layers, 0), 0)


def assign_layers(n_layer: int, n_gpu_layers: int, split: Sequence[float]) -> list[int]:
    """The device of each layer and, last, of the output layer: -1 for the local
    CPU, else an index into `split`. llama.cpp's rule: the offloaded "layers"
    (first_offloaded) cut by cumulative fractions of the shares, the output layer
    counted as one more (with -ts 1,1 a 12-layer model puts 7 layers on the first
    device, 5 and the output layer on the second)."""
    start = first_offloaded(n_layer, n_gpu_layers) if split else n_layer + 1
    n_off = n_layer + 1 - start
    total = sum(split) if split else 0.0
    if split and total <= 0:
        raise ModelError("tensor split must have a positive sum")
    cum, acc = [], 0.0
    for s in split:
        acc += s / total
        cum.append(acc)
    out = []
    for il in range(n_layer + 1):
        if il < start:
            out.append(-1)
            continue
        x = (il - start) / n_off
        out.append(next((i for i, c in enumerate(cum) if c > x), len(cum) - 1))
    return out


def open_devices(rpc: Sequence[str] | str | None, n_threads: int | None, timeout: float,
                 backends: list, peers: bool = False) -> tuple[Device, list[Device]]:
    """The local CPU and every device of the `rpc` servers ("host:port", a list or a
    comma-separated string); each backend goes into `backends` as it opens. `peers`:
    ask each server for the peer extension (ggmlrpc.peers)."""
    cpu = LocalBackend(n_threads)
    backends.append(cpu)
    cpu_dev = Device(cpu, 0, "CPU", cpu.get_device_memory(0)[0])
    remote: list[Device] = []
    if isinstance(rpc, str):
        rpc = [e for e in rpc.split(",") if e]
    for ep in rpc or []:
        rb = RemoteBackend(ep, timeout=timeout, peers=peers)
        backends.append(rb)
        for d in range(rb.device_count()):
            remote.append(Device(rb, d, f"RPC{len(remote)}[{ep}]", rb.get_device_memory(d)[0]))
    return cpu_dev, remote


def device_shares(remote: list[Device], tensor_split: Sequence[float] | None) -> list[float]:
    """Each remote device's share: `tensor_split` (0 for the devices it leaves out),
    default its free memory."""
    if not tensor_split:
        return [float(d.free) for d in remote]
    if len(tensor_split) > len(remote):
        raise ModelError(f"--tensor-split names {len(tensor_split)} devices, the servers have {len(remote)}")
    return list(tensor_split) + [0.0] * (len(remote) - len(tensor_split))


def plan_stages(cpu: Device, remote: list[Device], n_layer: int, n_gpu_layers: int,
                tensor_split: Sequence[float] | None) -> list[Stage]:
    """The stages in step order: the CPU (embeddings), then each run of layers on one
    device, then the output layer (assign_layers: llama.cpp's placement).
    `tensor_split`: each remote device's share of the offloaded layers (default:
    its free memory)."""
    where = assign_layers(n_layer, n_gpu_layers, device_shares(remote, tensor_split))
    devs = [cpu if w < 0 else remote[w] for w in where]
    out_dev = devs.pop()
    stages = [Stage(cpu, [], embed=True)]
    for il, d in enumerate(devs):
        if stages[-1].device is not d:
            stages.append(Stage(d, []))
        stages[-1].layers.append(il)
    if stages[-1].device is not out_dev:
        stages.append(Stage(out_dev, []))
    stages[-1].output = True
    return stages


def alloc_stage(st: Stage, f: GGUFFile, names: list[str], kv: KVCache,
                file_buffer: Callable[[LocalBackend], RemoteBuffer], n_embd_kv: int | None = None,
                state: Callable[[int], tuple] | None = None) -> int:
    """One buffer on the stage's device for its weights (`names`), KV cache (rows of
    `n_embd_kv`, default each layer's own) and recurrent state (`state(il)`: the
    shapes of layer il's F32 state tensors for one sequence; a layer with some keeps
    no KV cache; one slot of them per sequence of `kv`, each slot's in one span);
    places the tensors in it. Returns the weight bytes to send. On the local CPU the
    weights stay in the file's mapping (`file_buffer`) and only the cache gets a buffer."""
    be, dev = st.device.backend, st.device.index
    align = be.get_alignment(dev)
    for n in names:
        if n not in f.tensors:
            raise ModelError(f"{f.path}: missing tensor {n}")
    width = (lambda il: n_embd_kv) if n_embd_kv else kv.hp.n_embd_kv_of   # a cache row, per layer
    v_width = (lambda il: n_embd_kv) if n_embd_kv else kv.hp.n_embd_v_of
    n_cache = 1 if kv.hp.is_mla else 2      # MLA: a K cache only (V is part of it)
    st.mapped = st.device.local
    size = 0 if st.mapped else sum(_align(f.tensors[n].nbytes, align) for n in names)
    shapes = {il: state(il) if state else () for il in st.layers}
    # a layer that reuses an earlier layer's cache (hp.kv_layer) has none of its own: it
    # reads that layer's, here or the copy of it a later stage keeps
    attn = sorted({kv.hp.kv_layer(il) for il in st.layers if not shapes[il]})
    kv_size = sum(_align(2 * width(il) * kv.cells(il), align)
                  + (n_cache - 1) * _align(2 * v_width(il) * kv.cells(il), align) for il in attn)
    slot = sum(_align(4 * int(np.prod(ne)), align) for il in st.layers for ne in shapes[il])
    kv_size += slot * kv.n_seq
    st.buffers, st.weights, st.kv, st.state = [], {}, {}, {}
    st.compute = st.inputs_buf = st.state_span = None
    st.state_slot = slot
    st.graphs.clear()
    if st.mapped:
        whole = file_buffer(be)
        start = f.reader.data.ctypes.data
        for n in names:
            ti = f.tensors[n]
            st.weights[n] = whole.tensor(ti.type, ti.ne, ti.data.ctypes.data - start, name=n)
    if not size + kv_size:
        return 0
    buf = be.alloc_buffer(size + kv_size, dev)
    if buf is None:
        raise ModelError(f"{st.device.name}: cannot allocate {(size + kv_size) >> 20} MiB "
                         f"for weights and KV cache (free: {st.device.free >> 20} MiB)")
    st.buffers.append(buf)
    off = 0
    for n in names if not st.mapped else ():
        ti = f.tensors[n]
        st.weights[n] = buf.tensor(ti.type, ti.ne, off, name=n)
        off += _align(ti.nbytes, align)
    for il in attn:
        n_embd_kv, n_embd_v = width(il), v_width(il)
        k_row = _align(2 * n_embd_kv * kv.cells(il), align)
        k = buf.tensor(GGMLType.F16, (n_embd_kv, kv.cells(il)), off, name=f"cache_k_l{il}")
        v = (None if n_cache == 1 else
             buf.tensor(GGMLType.F16, (n_embd_v, kv.cells(il)), off + k_row, name=f"cache_v_l{il}"))
        off += k_row + (n_cache - 1) * _align(2 * n_embd_v * kv.cells(il), align)
        st.kv[il] = (k, v)
    for il in st.layers:
        if not shapes[il]:
            st.kv[il] = st.kv[kv.hp.kv_layer(il)]
    at = 0      # in a slot
    for il in st.layers:
        ts = []
        for kind, ne in zip("rs", shapes[il]):     # llama.cpp's r (conv) and s (ssm) states
            n = int(np.prod(ne))
            ts.append(buf.tensor(GGMLType.F32, (n, kv.n_seq), off + at, name=f"cache_{kind}_l{il}",
                                 nb=(4, slot, slot * kv.n_seq, slot * kv.n_seq)))
            at += _align(4 * n, align)
        st.state[il] = tuple(ts)
    if slot:
        st.state_span = buf.tensor(GGMLType.I8, (slot * kv.n_seq,), off, name="rs")
    if kv_size:
        be.memset_tensor(buf.tensor(GGMLType.I8, (kv_size,), size, name="kv"), 0)
    return 0 if st.mapped else sum(f.tensors[n].nbytes for n in names)


def send_weights(st: Stage, f: GGUFFile, sent: Callable[[int, bool], None]) -> None:
    """Upload the stage's weights (hash first: a server whose cache has them is not
    sent the bytes); `sent(nbytes, cached)` after each tensor."""
    if st.mapped:
        return
    be = st.device.backend
    for n, t in st.weights.items():
        data = f.tensors[n].data
        sent(data.nbytes, be.set_tensor(t, data, weights=True))


def stage_graph(st: Stage, key: tuple, build: Callable[[Stage, tuple, int], StageGraph],
                held: dict) -> StageGraph:
    """Stage `st`'s graph for `key`, built once (`build(st, key, alignment)`) and
    placed in the stage's compute and input buffers, which grow to fit it (then the
    graphs placed in the old ones, and what the devices hold, `held`, are forgotten)."""
    g = st.graphs.get(key)
    if g is not None:
        return g
    be, dev = st.device.backend, st.device.index
    align = be.get_alignment(dev)
    g = build(st, key, align)
    alloc = B.Allocator(align)
    need = alloc.plan(g.graph)
    for attr, size in (("compute", need), ("inputs_buf", g.inputs_size)):
        cur = getattr(st, attr, None)
        if cur is None or cur.size < size:
            if cur is not None:
                be.free_buffer(cur)
                st.graphs.clear()    # every cached graph pointed into the old buffer
                held.clear()
            new = be.alloc_buffer(max(size, align), dev)
            if new is None:
                raise ModelError(f"{st.device.name}: cannot allocate {size >> 20} MiB of compute memory")
            setattr(st, attr, new)
    g.place_inputs(st.inputs_buf)     # first: views of the inputs take their addresses
    alloc.place(st.compute)
    st.graphs[key] = g
    return g
