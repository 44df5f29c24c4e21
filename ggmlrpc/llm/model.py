"""A GGUF model of one of the architectures of ggmlrpc.llm.archs spread over the
local CPU and RPC servers: loading, the steps (and a lost server's recovery), and
generation.

    model = Model.load("model.gguf", rpc=["10.0.0.2:50052"], n_gpu_layers=99)
    for piece in model.generate("Once upon a time", n_predict=16, temp=0):
        print(piece.decode(errors="replace"), end="", flush=True)
    model.close()

Placement follows llama.cpp (ggmlrpc.llm.placement): the token embeddings stay on
the local CPU; the output layer counts as one more layer after the last, and the
last `n_gpu_layers` of these go to the servers' devices, in contiguous runs in
proportion to `tensor_split` (default: each device's free memory); the rest stays
on the CPU. Each layer's KV cache (F16) lives beside it;
sliding-window layers keep only the window and a micro-batch of cells, reused as a
ring in llama.cpp's order (ggmlrpc.llm.kv_cache). Rope scaling (linear, YaRN) comes
from the file's metadata. Every device runs one graph per step (its layers), built
with ggmlrpc.builder exactly as llama.cpp builds it (ggmlrpc.llm.blocks: same ops
in the same order, flash attention, the output rows picked before the last
feed-forward), so our CPU executor gives llama.cpp's logits bit for bit; the
residual stream moves between devices with GET_TENSOR / SET_TENSOR. A decode step
whose graphs have the shapes of the previous one reruns them with
GRAPH_RECOMPUTE after writing the new inputs; a device's SET_TENSOR, GRAPH_RECOMPUTE
and GET_TENSOR leave in one write, so a step costs one round trip per device (the
least the data flow allows: each device needs the previous one's output, and the
first needs the token sampled from the last one's logits).
"""
from __future__ import annotations

import time
from typing import Iterator, Sequence as Seq

import numpy as np

from ..client import RemoteBackend, RemoteBuffer, serialize_graph
from ..errors import ConnectionLost, GgmlRpcError
from ..ggml import GGMLOp
from ..local import LocalBackend
from .archs import ARCHS, SUPPORTED_ARCHS
from .blocks import build, stage_weights
from .flow import Flow, inline_stages
from .gguf_file import GGUFFile, ModelError
from .hparams import HParams
from .kv_cache import KV_PAD, KVCache, SwaCells
from .placement import (Device, Stage, StageGraph, alloc_stage, assign_layers, device_shares, first_offloaded,
                        open_devices, plan_stages, send_weights, stage_graph)
from . import autosplit
from .rowsplit import SPLIT_MODES, RowSplit, combines_per_layer, refusal as row_refusal
from .sampling import Sampler
from .tokenizer import Tokenizer

__all__ = ["Model", "Sequence", "HParams", "SwaCells", "KV_PAD", "N_UBATCH", "SUPPORTED_ARCHS", "Device", "Stage",
           "assign_layers", "ModelError"]

N_UBATCH = 512        # prompt tokens per graph (llama.cpp's default micro-batch)
# A pipelined decode is cut into about PIPE_DEPTH micro-batches per stage (a prompt of
# one -ub micro-batch would otherwise not flow at all), none under PIPE_MIN_UBATCH
# tokens: with S stages, k micro-batches take k + S - 1 ticks of 1/k instead of S.
PIPE_DEPTH = 4
PIPE_MIN_UBATCH = 64
ROWS_KEPT_BYTES = 16 << 20     # the token rows of a row-wise stage kept for the next steps (_row_wise)
# the ops of a stage whose every output row is a function of its own token alone, the
# same bits whatever the batch (a lookup and an element-wise scale, as the token
# embedding on this host is for most architectures)
_ROW_WISE_OPS = frozenset({GGMLOp.NONE, GGMLOp.GET_ROWS, GGMLOp.SCALE})


def _row_wise(st: Stage, g: StageGraph) -> bool:
    """Whether stage `st`'s graph `g` maps each token to its own row of the result
    through a lookup and element-wise ops only (a token embedding on this host): then
    a token's row is the same bytes in every step, and Model keeps them (a decode
    step's embedding is a dictionary lookup, not a graph run on this host)."""
    rw = getattr(g, "row_wise", None)
    if rw is None:
        rw = (st.embed and not st.layers and not st.output and set(g.inputs) == {"inp_tokens"}
              and all(t.op in _ROW_WISE_OPS for t in g.graph.tensors))
        g.row_wise = rw
    return rw


class Model:
    """A loaded model: tokenizer, weights on their devices, KV cache, generation."""

    def __init__(self):
        self.file: GGUFFile | None = None
        self.tokenizer: Tokenizer | None = None
        self.stages: list[Stage] = []
        self.backends: list = []
        self._held: dict[tuple, tuple] = {}    # (backend, device) -> (stage, key) of its graph
        self._token_rows: dict[int, bytes] = {}    # token -> its row of a row-wise stage (_row_wise)
        self.cached_bytes = 0                  # weight bytes the servers' caches supplied
        self._batches: list[tuple] = []        # (seqs, tokens, positions, out rows) a recovery replays
        self._next_seq = 0
        self.seq = Sequence(self, 0)           # the sequence the model's own methods act on
        self.reconnect = 0.0                   # seconds to wait for a lost server
        self._mapped: RemoteBuffer | None = None   # the file mapping as a local buffer
        self.n_ubatch = N_UBATCH
        self.n_seq = 1
        self.kv: KVCache | None = None
        self.rows: RowSplit | None = None      # -sm row: the offloaded layers, run after stage 0
        self.split_mode, self.row_combine = "layer", "gather"
        self.split_reason = ""      # -sm auto: why it chose split_mode
        # called once per step when the step's work is out of this thread's hands (the
        # first server awaited, else the last stage computing): host work that can
        # overlap it, such as handing out the previous step's tokens
        self.on_wait = None
        # a decode of several micro-batches over several servers runs them as a pipeline
        self.pipeline = True
        self.peers = True                      # -sm row: linked servers swap pieces themselves

    @property
    def fixed_past(self) -> bool:
        """Whether the context cannot drop its last tokens (a sliding-window cache
        overwrites old cells; a recurrent state holds no past to go back to)."""
        return self.swa is not None or self.arch.state is not None

    @property
    def swa(self) -> SwaCells | None:
        """The sliding-window layers' cells (None: the model has none)."""
        return self.kv.swa if self.kv is not None else None

    # -- loading ---------------------------------------------------------------
    @classmethod
    def load(cls, path, rpc: Seq[str] | str | None = None, n_gpu_layers: int = 99,
             tensor_split: Seq[float] | None = None, n_ctx: int = 0,
             n_threads: int | None = None, flash_attn: bool = True, timeout: float = 120.0,
             progress=None, reconnect: float = 0.0, n_ubatch: int = N_UBATCH, n_seq: int = 1,
             split_mode: str = "layer", row_combine: str = "gather", pipeline: bool = True,
             peers: bool = True) -> "Model":
        """Open `path`, connect to `rpc` servers ("host:port", a list or a comma-separated
        string) and upload the weights (hash first: a server started with -c that has them
        cached is not sent the bytes). `progress(done, total, cached)` is called as
        bytes go. `reconnect`: seconds to wait for a server lost during generation
        (it gets its layers again and the context is replayed); 0 fails at once
        (split_mode "row" takes 0 only).
        `n_ubatch`: prompt tokens per graph (llama.cpp's -ub). `n_seq`: the sequences
        run at once (llama.cpp's -np: sliding-window layers keep a window for each,
        recurrent layers a state).
        `split_mode`: "layer" (runs of layers per device), "row" (every offloaded
        layer cut over all devices by `tensor_split`: ggmlrpc.llm.rowsplit, which
        says what `row_combine`, "gather" or "reduce", does), or "auto" (the one
        ggmlrpc.llm.autosplit predicts faster from the servers' measured round trips
        and speeds; `split_mode` then says which, `split_reason` why). `pipeline`: with layer
        split over two or more servers, the micro-batches of a long prompt flow
        through them at once (server B runs micro-batch i while A runs i + 1); False
        runs them one after the other (the same logits either way). `peers`: with
        split_mode "row" over ggmlrpc servers started with --peers, one per device,
        the servers swap their pieces of each layer themselves (ggmlrpc.peers) and a
        token is one graph per server; False (or other servers) combines on the host."""
        if split_mode not in SPLIT_MODES:
            raise ModelError(f"split mode must be one of {', '.join(SPLIT_MODES)}, got {split_mode!r}")
        if split_mode == "row" and reconnect > 0:
            raise ModelError("--reconnect does not work with -sm row yet (a lost server fails the step)")
        m = cls()
        m.split_mode, m.row_combine = split_mode, row_combine
        m.n_seq = max(1, n_seq)
        m.reconnect = reconnect
        m.n_ubatch = n_ubatch
        m.pipeline = pipeline
        m.peers = peers
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
        self.arch = ARCHS[f.arch]
        self.tokenizer = Tokenizer.from_gguf(f)
        hp = self.hp = HParams.from_gguf(f, self.tokenizer.n_vocab, self.arch)
        self.flash_attn = flash_attn
        self.n_ctx = n_ctx or hp.n_ctx_train
        if self.n_ubatch < 1:
            raise ModelError(f"micro-batch size must be at least 1, got {self.n_ubatch}")
        self.n_ubatch = min(self.n_ubatch, self.n_ctx)
        self.kv = KVCache(hp, self.n_ctx, self.n_ubatch, flash_attn, self.n_seq, self.arch.state is not None)
        cpu, remote = open_devices(rpc, n_threads, timeout, self.backends,
                                   peers=self.peers and self.split_mode != "layer")
        if self.split_mode == "auto":
            self.split_mode, self.split_reason = self._auto_split(remote, n_gpu_layers, tensor_split)
        # (-ngl 1 offloads the output layer alone: it goes to one device, uncut)
        if self.split_mode == "row" and remote and first_offloaded(hp.n_layer, n_gpu_layers) < hp.n_layer:
            self._plan_rows(cpu, remote, n_gpu_layers, tensor_split)
        else:
            self.stages = plan_stages(cpu, remote, hp.n_layer, n_gpu_layers, tensor_split)
        self._upload(progress)

    def _auto_split(self, remote: list[Device], n_gpu_layers: int, tensor_split) -> tuple[str, str]:
        n_layer = self.hp.n_layer
        shares = device_shares(remote, tensor_split) if remote else []
        layers = list(range(first_offloaded(n_layer, n_gpu_layers), n_layer))
        why = self.reconnect > 0 and "--reconnect needs -sm layer" or \
            (layers and row_refusal(self.arch, self.hp, self.file, layers, shares))
        return autosplit.choose(self.file, n_layer, remote, shares, n_gpu_layers, why or None,
                                lambda il, linked: combines_per_layer(self.arch, self.hp, self.file, il, linked))

    def _plan_rows(self, cpu: Device, remote: list[Device], n_gpu_layers: int, tensor_split) -> None:
        """-sm row (with at least one layer offloaded): the embeddings and the layers
        not offloaded on the CPU, every offloaded layer and the output layer cut over
        the devices (llama.cpp counts the output layer among -ngl's: first_offloaded)."""
        n_layer = self.hp.n_layer
        start = first_offloaded(n_layer, n_gpu_layers)
        self.stages = [Stage(cpu, list(range(start)), embed=True)]
        self.rows = RowSplit(self.arch, self.hp, self.file, self.kv, remote, device_shares(remote, tensor_split),
                             list(range(start, n_layer)), True, self.flash_attn, self.n_ctx, self.row_combine,
                             self.n_ubatch)

    def _upload(self, progress) -> None:
        if self.rows and self.peers:
            self.rows.link()       # before the weights are cut: linked servers cut more
        total = sum(self._alloc_stage(st) for st in self.stages) + (self.rows.alloc() if self.rows else 0)
        done = 0

        def sent(nbytes: int, cached: bool) -> None:
            nonlocal done
            done += nbytes
            self._sent(nbytes, cached)
            if progress:
                progress(done, total, self.cached_bytes)

        for st in self.stages:
            send_weights(st, self.file, sent)
        if self.rows:
            self.rows.send(sent)
            self.rows.reserve(self.kv.largest(self.n_ubatch))
        # reserve the compute and input memory of the largest graph each stage runs
        for st in self.stages:
            self._graph(st, self.kv.largest(self.n_ubatch))
            st.graphs.clear()

    def _sent(self, nbytes: int, cached: bool) -> None:
        if cached:
            self.cached_bytes += nbytes

    def _alloc_stage(self, st: Stage) -> int:
        names = stage_weights(self.arch, self.hp, st, self.file.tensors)
        state = self.arch.state and (lambda il: self.arch.state(self.hp, il))
        return alloc_stage(st, self.file, names, self.kv, self._file_buffer, state=state)

    def _file_buffer(self, be: LocalBackend) -> RemoteBuffer:
        """The whole file mapping as one read-only local buffer (made once)."""
        if self._mapped is None:
            self._mapped = be.map_buffer(self.file.reader.data)
        return self._mapped

    # -- graphs ----------------------------------------------------------------
    def _graph(self, st: Stage, key: tuple) -> StageGraph:
        return st.graphs.get(key) or stage_graph(st, key, self._build, self._held)

    def _build(self, st: Stage, key: tuple, align: int) -> StageGraph:
        return build(self.arch, self.hp, st, self.kv.cells, self.flash_attn, self.n_ctx, key, align)

    # -- sequences -------------------------------------------------------------
    def new_sequence(self) -> "Sequence":
        """Another sequence in the KV cache, beside the model's own (sequence 0, the
        one `eval`, `prefill`, `stream`... act on). Its tokens attend only its own
        cells; `Model.decode` runs steps of several sequences in one graph per
        device. `close()` it to free its cells. A model with a recurrent state holds
        `n_seq` sequences with a context at a time (a state slot each)."""
        self._next_seq += 1
        return Sequence(self, self._next_seq)

    def decode(self, parts: Seq[tuple["Sequence", Seq[int]]]) -> list[np.ndarray]:
        """Run each sequence's new tokens after its context, all in the same steps
        (one graph per device; micro-batches of n_ubatch tokens, where a model with a
        recurrent state gives each sequence of a micro-batch as many tokens): the
        logits of each part's last token, in order. A sequence may appear once."""
        parts = [(q, list(toks)) for q, toks in parts]
        rows = self._rows(parts)
        last = {i: r for r, (i, _, _) in enumerate(rows)}   # each part's last row
        result: list = [None] * len(parts)
        ub = self.pipeline_ubatch(len(rows))
        chunks = self._equal_split(parts, ub) if self.kv.slots and len(parts) > 1 else \
            [range(c, min(c + ub, len(rows))) for c in range(0, len(rows), ub)]
        batches = []
        for chunk in chunks:
            out = [k for k, r in enumerate(chunk) if last[rows[r][0]] == r] or [len(chunk) - 1]
            batches.append(([parts[rows[r][0]][0].id for r in chunk], [rows[r][1] for r in chunk],
                            [rows[r][2] for r in chunk], out))
        if len(batches) > 1 and self._pipelines():
            steps = iter(self._run_pipelined(batches))
        else:
            steps = (self._step(batch) for batch in batches)
        for chunk, batch, logits in zip(chunks, batches, steps):
            for r in chunk:
                parts[rows[r][0]][0].tokens.append(rows[r][1])
            for k, lg in zip(batch[3], logits):
                r = chunk[k]
                if last[rows[r][0]] == r:
                    result[rows[r][0]] = lg
        return result

    def _rows(self, parts: list[tuple["Sequence", list[int]]]) -> list[tuple[int, int, int]]:
        """(part, token, position) of every new token of a batch, in order."""
        if len({id(q) for q, _ in parts}) < len(parts):
            raise ValueError("a sequence appears twice in one batch")
        rows = []
        for i, (q, toks) in enumerate(parts):
            if q.model is not self or q.closed:
                raise ValueError(f"sequence {q.id} is closed or not this model's")
            if not toks:
                raise ValueError("eval needs at least one token")
            if q.n_past + len(toks) > self.n_ctx:
                raise ModelError(f"context full: {q.n_past} + {len(toks)} tokens > n_ctx {self.n_ctx}")
            for j, t in enumerate(toks):
                if not 0 <= t < self.hp.n_vocab:
                    raise ValueError(f"token {t} outside the vocabulary")
                rows.append((i, t, q.n_past + j))
        return rows

    def add_to(self, flow: Flow, parts: Seq[tuple["Sequence", Seq[int]]], tag=None):
        """Queue one micro-batch of `parts` (each sequence's new tokens after its
        context, n_ubatch tokens at most in all) in `flow`; the tokens join their
        sequences now (a failed flow is undone by resetting them). The micro-batch's
        `logits` are then each part's last token's, in order."""
        parts = [(q, list(toks)) for q, toks in parts]
        rows = self._rows(parts)
        if len(rows) > self.n_ubatch:
            raise ValueError(f"{len(rows)} tokens do not fit one micro-batch of {self.n_ubatch}")
        out = [int(n) - 1 for n in np.cumsum([len(toks) for _, toks in parts])]
        mb = flow.add(([parts[i][0].id for i, _, _ in rows], [t for _, t, _ in rows], [p for _, _, p in rows],
                       out), tag)
        for q, toks in parts:
            q.tokens.extend(toks)
        return mb

    def _equal_split(self, parts: list[tuple], n_ubatch: int) -> list[list[int]]:
        """The micro-batches of a model with a recurrent state, as llama.cpp's equal
        split cuts them: the parts with tokens left (n_ubatch at most), the same
        number of tokens of each, as many as the shortest has left and the
        micro-batch holds; each part's tokens one after the other. Rows are
        numbered as `decode` numbers them (part after part)."""
        starts = np.cumsum([0] + [len(toks) for _, toks in parts])
        done = [0] * len(parts)
        chunks = []
        while True:
            live = [i for i, (_, toks) in enumerate(parts) if done[i] < len(toks)][:n_ubatch]
            if not live:
                return chunks
            n_t = min(min(len(parts[i][1]) - done[i] for i in live), n_ubatch // len(live))
            chunks.append([int(starts[i]) + done[i] + j for i in live for j in range(n_t)])
            for i in live:
                done[i] += n_t

    def _forget(self, s: int, p0: int) -> None:
        """Free sequence s's cells from position p0 on, and its tokens there in the
        batches a recovery replays."""
        self.kv.remove(s, p0)
        kept = []
        for seqs, toks, pos, out in self._batches:
            keep = [k for k in range(len(seqs)) if seqs[k] != s or pos[k] < p0]
            if len(keep) == len(seqs):
                kept.append((seqs, toks, pos, out))
            elif keep:
                kept.append(([seqs[k] for k in keep], [toks[k] for k in keep], [pos[k] for k in keep],
                             [len(keep) - 1]))
        self._batches = kept

    # -- evaluation of the model's own sequence --------------------------------
    @property
    def n_past(self) -> int:
        return self.seq.n_past

    @property
    def tokens(self) -> list[int]:
        return self.seq.tokens

    @property
    def stop_reason(self) -> str | None:
        return self.seq.stop_reason

    @stop_reason.setter
    def stop_reason(self, value: str | None) -> None:
        self.seq.stop_reason = value

    @property
    def history(self) -> list[list[int]]:
        """The batches of sequence 0 run since its last reset."""
        return [[t for q, t in zip(seqs, toks) if q == 0] for seqs, toks, _, _ in self._batches
                if 0 in seqs]

    def reset(self) -> None:
        """Forget the context of sequence 0."""
        self.seq.reset()

    def eval(self, tokens: Seq[int]) -> np.ndarray:
        """Run `tokens` after the context so far; the logits of the last one (F32, n_vocab)."""
        return self.seq.eval(tokens)

    def warm_up(self) -> None:
        """One step of the vocabulary's BOS and EOS (those it has; else token 0) in
        sequence 0, then forgotten, as llama.cpp runs one before its first request:
        the servers allocate their compute buffers and first read the weights, this
        host builds its first graphs, and the first request does not wait for them.
        Sequence 0 must be empty; it is again after."""
        if self.seq.n_past:
            raise ValueError("warm_up needs an empty sequence 0")
        tok = self.tokenizer
        toks = [t for t in (getattr(tok, "bos", None), getattr(tok, "eos", None)) if t is not None] or [0]
        try:
            self.seq.eval(toks[:self.n_ubatch])
        finally:
            self.seq.reset()

    def prefill(self, tokens: Seq[int]) -> np.ndarray:
        """Make the context exactly `tokens`, keeping what it holds of them (Sequence.prefill)."""
        return self.seq.prefill(tokens)

    def truncate(self, n: int) -> None:
        """Forget the context after its first `n` tokens."""
        self.seq.truncate(n)

    def stream(self, ids: Seq[int], n_predict: int, sampler: Sampler,
               reuse: bool = False) -> Iterator[tuple[int, np.ndarray]]:
        """Generate after the context `ids` (Sequence.stream)."""
        return self.seq.stream(ids, n_predict, sampler, reuse)

    def stop_after(self, q: "Sequence", t: int, n: int, n_predict: int) -> str | None:
        """Why sequence q stops after its n-th new token t: "eog", "context",
        "length", or None."""
        if self.tokenizer.is_eog(t):
            return "eog"
        if q.n_past >= self.n_ctx:
            return "context"
        if 0 <= n_predict <= n:
            return "length"
        return None

    def _step(self, batch: tuple) -> np.ndarray:
        """One batch through every stage; a server lost on the way is waited for (up
        to `reconnect` seconds), given its layers again, and every sequence's context
        is replayed in the batches it was first run in, so the result is the same."""
        lost = None
        deadline = 0.0
        while True:
            try:
                if lost is not None:
                    self._recover(lost, deadline)
                return self._run_step(batch)
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
        batches, self._batches = self._batches, []
        self.kv.reset()
        try:
            for batch in batches:
                self._run_step(batch)
        except BaseException:
            self._batches = batches      # replay again after the next recovery
            raise

    def _run_step(self, batch: tuple) -> np.ndarray:
        saved = self.kv.save()
        try:
            return self._run_stages(batch)
        except BaseException:
            self.kv.restore(saved)     # the batch did not happen: its cells are free again
            raise

    def _run_stages(self, batch: tuple) -> np.ndarray:
        seqs, tokens, pos, out = batch
        key, values = self.kv.inputs(tokens, pos, seqs, out)
        x = None
        hook = self.on_wait
        for k, st in enumerate(self.stages):
            if k == 1 and self.rows:
                x = self.rows.run(key, values, x)
            answer, hook = self._issue(st, key, values, x, hook, k == len(self.stages) - 1)
            x = answer()
        if len(self.stages) == 1 and self.rows:
            x = self.rows.run(key, values, x)
        self._batches.append(batch)
        return self._logits(x, len(out))

    def _keep_rows(self, toks: list[int], result) -> None:
        """Keep each token's row of a row-wise stage's result (ROWS_KEPT_BYTES at most:
        the oldest go first)."""
        size = len(result) // len(toks)
        if not size:
            return
        limit = max(1, ROWS_KEPT_BYTES // size)
        mv = memoryview(result)
        for i, t in enumerate(toks):
            if t not in self._token_rows:
                if len(self._token_rows) >= limit:
                    del self._token_rows[next(iter(self._token_rows))]
                self._token_rows[t] = bytes(mv[i * size:(i + 1) * size])

    def _logits(self, x, n_out: int) -> np.ndarray:
        n_vocab = self.hp.n_vocab
        return np.frombuffer(x, dtype=np.float32)[-n_vocab * n_out:].reshape(n_out, n_vocab).copy()

    def _small_step(self, st: Stage, key: tuple, limit: int = 1 << 16) -> bool:
        """Whether stage `st`'s step of shape `key` is a small write: the graph its
        device holds rerun, inputs of `limit` bytes at most (a write that the
        socket's buffer takes at once, even while the server computes)."""
        g = st.graphs.get(key)
        be, dev = st.device.backend, st.device.index
        return (g is not None and getattr(g, "image", None) is not None and g.image.nbytes <= limit
                and self._held.get((id(be), dev)) == (id(st), key))

    def _issue(self, st: Stage, key: tuple, values: dict, x, hook=None, last: bool = False):
        """Send a stage its inputs, its graph and the read of its result in one write
        (one round trip per device per step); return a function that waits for the
        result, and the `hook` if it was not used. The hook runs while a server
        computes (the first remote stage's), else before the last local graph. The
        recurrent state of a sequence that starts here is zeroed first."""
        be, dev = st.device.backend, st.device.index
        try:
            g = self._graph(st, key)
            values["embd"] = x
            remote = isinstance(be, RemoteBackend)
            # a device holds one graph: rerun it when it is this stage's graph of this shape
            held = (id(be), dev)
            again = self._held.get(held) == (id(st), key)
            with be.corked():
                for k in values.get("rs_zero", ()) if st.state_span is not None else ():
                    be.memset_tensor(st.state_span, 0, k * st.state_slot, st.state_slot)
                if remote:
                    if hook is not None:
                        be.waiting, hook = hook, None       # run while the server computes
                    # serialized once: groups that take turns on a server send it again
                    g.wire = g.wire or serialize_graph(dev, g.graph.nodes)
                    wait = g.issue(be, values, again)
                else:
                    toks = values["inp_tokens"].tolist() if _row_wise(st, g) else None
                    rows = None
                    if toks is not None and all(t in self._token_rows for t in toks):
                        rows = b"".join(self._token_rows[t] for t in toks)    # no graph to run
                    else:
                        g.write_inputs(be, values)
                    if hook is not None and last:
                        hook()
                        hook = None
                    if rows is not None:
                        return (lambda: rows), hook
                    if again:
                        be.graph_recompute(dev)
                    else:
                        be.graph_compute(g.graph.nodes, dev)
                    result = be.get_tensor(g.out, out=g.result)
                    if toks is not None:
                        self._keep_rows(toks, result)
                    wait = lambda: result     # noqa: E731
                self._held[held] = (id(st), key)
        except ConnectionLost as e:
            e.backend = be
            raise

        def answer():
            try:
                return wait()
            except ConnectionLost as e:
                e.backend = be
                raise
        return answer, hook

    def pipeline_ubatch(self, n_tokens: int) -> int:
        """The micro-batch size of a decode of n_tokens: n_ubatch, or where the decode
        runs as a pipeline, smaller pieces (about PIPE_DEPTH per stage that takes a
        tick of the Flow: the embedding on this host does not; at least
        PIPE_MIN_UBATCH tokens each), so that even a prompt of one -ub micro-batch
        keeps every server busy. The logits then are those of that micro-batch size
        (as with -ub: equal within kernel noise, not bit for bit)."""
        if n_tokens <= PIPE_MIN_UBATCH or not self._pipelines():    # one micro-batch either way
            return self.n_ubatch
        want = -(-n_tokens // (PIPE_DEPTH * inline_stages(self.stages).count(False)))
        return min(self.n_ubatch, max(want, PIPE_MIN_UBATCH))

    def _pipelines(self) -> bool:
        """Whether micro-batches may flow through the stages at once: at least two
        servers, each server's connection in one stage."""
        if not self.pipeline or self.rows:
            return False
        remote = [st.device.backend for st in self.stages if isinstance(st.device.backend, RemoteBackend)]
        return len(remote) >= 2 and len({id(be) for be in remote}) == len(remote)

    def _run_pipelined(self, batches: list[tuple]) -> list[np.ndarray]:
        """The micro-batches of one decode through the stages as a pipeline (a Flow):
        the same graphs and inputs as one by one, so the same logits. A server lost
        on the way: the unread answers of the others are drained, the cache
        bookkeeping put back, and the micro-batches run one by one, where a lost
        server is recovered."""
        saved, n_run = self.kv.save(), len(self._batches)
        flow = Flow(self)
        try:
            mbs = [flow.add(batch) for batch in batches]
            while flow:
                flow.tick()
        except BaseException as e:
            self.kv.restore(saved)
            del self._batches[n_run:]
            if isinstance(e, ConnectionLost):
                return [self._step(batch) for batch in batches]
            raise
        return [mb.logits for mb in mbs]

    def flow(self) -> Flow | None:
        """A Flow of this model's micro-batches, where they can run as a pipeline (a
        layer split over two or more servers); else None. Not for a model with a
        recurrent state yet (its micro-batches give each sequence as many tokens,
        which `decode` cuts and `add_to` does not)."""
        return Flow(self) if self._pipelines() and not self.kv.slots else None

    def generate(self, prompt: str | bytes | Seq[int], n_predict: int = -1, *,
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
        if self.rows:
            self.rows.clear()
            self.rows = None
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


class Sequence:
    """One sequence in a model's KV cache: its tokens, and the calls that run it
    (each a step of this sequence alone; `Model.decode` runs several together)."""

    def __init__(self, model: Model, sid: int):
        self.model, self.id = model, sid
        self.tokens: list[int] = []
        self.stop_reason: str | None = None
        self.closed = False

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def reset(self) -> None:
        """Forget the context (its cells are freed)."""
        if self.tokens and self.model.kv is not None:
            self.model._forget(self.id, 0)
        self.tokens = []

    def close(self) -> None:
        """Free the sequence's cells; it cannot run again."""
        if not self.closed:
            self.reset()
            self.closed = True

    def eval(self, tokens: Seq[int]) -> np.ndarray:
        """Run `tokens` after the context so far; the logits of the last one (F32, n_vocab)."""
        return self.model.decode([(self, tokens)])[0]

    def common(self, tokens: Seq[int]) -> int:
        """How many of `tokens` (all but the last) the context already holds: what
        `prefill` keeps (a sliding-window cache keeps nothing once they differ)."""
        keep = 0
        for a, b in zip(self.tokens, tokens[:-1]):
            if a != b:
                break
            keep += 1
        if keep < len(self.tokens) and self.model.fixed_past:
            return 0
        return keep

    def prefill(self, tokens: Seq[int]) -> np.ndarray:
        """Make the context exactly `tokens` and return the last one's logits, running
        only what the context does not already hold: the longest common prefix is kept
        (a chat's next turn, a prompt that shares a system prompt), the rest is
        dropped and the new tokens are evaluated. At least one token is always run,
        since its logits are the result. Sliding-window caches cannot take back a
        token, so a model with one starts over when the prefix diverges."""
        tokens = list(tokens)
        if not tokens:
            raise ValueError("prefill needs at least one token")
        keep = self.common(tokens)
        if keep < len(self.tokens):
            self.truncate(keep) if keep else self.reset()
        return self.eval(tokens[keep:])

    def truncate(self, n: int) -> None:
        """Forget the context after its first `n` tokens (their cells are freed)."""
        if not 0 <= n <= self.n_past:
            raise ValueError(f"cannot keep {n} of {self.n_past} tokens")
        if n == self.n_past:
            return
        if n and self.model.fixed_past:
            raise ModelError("a sliding-window cache or a recurrent state cannot drop its last tokens")
        self.model._forget(self.id, n)
        del self.tokens[n:]

    def stream(self, ids: Seq[int], n_predict: int, sampler: Sampler,
               reuse: bool = False) -> Iterator[tuple[int, np.ndarray]]:
        """Generate after the context `ids`: yields each new token with the logits it
        was drawn from. `reuse` keeps what the context already holds of `ids`
        (`prefill`); else the context starts empty. n_predict < 0: until an
        end-of-generation token or a full context. Sets `stop_reason` ("eog",
        "length" or "context") when it ends. The last token yielded is not yet in the
        context: the next `prefill` or `eval` runs it."""
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
            self.stop_reason = self.model.stop_after(self, t, n, n_predict)
            if self.stop_reason:
                return
            logits = self.eval([t])
