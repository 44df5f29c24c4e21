"""The graph work estimate (ggmlrpc.compute.work): real model graphs fit the default
limit with a wide margin, stride-0 broadcasts over a few bytes do not."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from ggmlrpc import ggml
from ggmlrpc._native import executor
from ggmlrpc.compute import work
from ggmlrpc.compute.matmul_cost import WEIGHTS
from ggmlrpc.errors import ValidationError
from ggmlrpc.graph import Graph
from ggmlrpc.ggml import GGMLOp as Op, GGMLType as T


def t(ne, type=T.F32, op=Op.NONE, params=()):
    ne = tuple(ne) + (1,) * (4 - len(ne))
    return SimpleNamespace(ne=ne, nb=ggml.contiguous_strides(type, ne), type=type, op=op,
                           op_params=tuple(params) + (0,) * (16 - len(params)), name_str="t")


N_7B = 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008) + 32000 * 4096     # a 7B llama's weights


def llama_prompt_work(n_tokens, n_ctx, wtype=T.Q4_K, n_layer=32, d=4096, d_ff=11008, n_head=32,
                      vocab=32000):
    """The multiply-adds of a 7B llama's prompt graph, node by node as llama.cpp builds
    it, every weight of type `wtype`."""
    hd = d // n_head
    x = t((d, n_tokens))
    total = 0
    for _ in range(n_layer):
        total += work.node_work(t((d, n_tokens), op=Op.RMS_NORM), [x])
        for rows in (d, d, d):          # q, k, v
            total += work.node_work(t((rows, n_tokens), op=Op.MUL_MAT), [t((d, rows), wtype), x])
        q = t((hd, n_tokens, n_head))
        k = t((hd, n_ctx, n_head), T.F16)
        total += work.node_work(t((hd, n_head, n_tokens), op=Op.FLASH_ATTN_EXT),
                                [q, k, k, t((n_ctx, n_tokens), T.F16)])
        total += work.node_work(t((d, n_tokens), op=Op.MUL_MAT), [t((d, d), wtype), x])
        for _ in range(2):              # gate, up
            total += work.node_work(t((d_ff, n_tokens), op=Op.MUL_MAT), [t((d, d_ff), wtype), x])
        total += work.node_work(t((d_ff, n_tokens), op=Op.GLU), [t((d_ff, n_tokens)), t((d_ff, n_tokens))])
        total += work.node_work(t((d, n_tokens), op=Op.MUL_MAT), [t((d_ff, d), wtype), t((d_ff, n_tokens))])
        total += 4 * work.node_work(t((d, n_tokens), op=Op.ADD), [x, x])
    total += work.node_work(t((vocab, n_tokens), op=Op.MUL_MAT), [t((d, vocab), wtype), x])
    return total


@pytest.mark.parametrize("n_tokens", [512, 2048])
@pytest.mark.parametrize("wtype", sorted(WEIGHTS))
def test_7b_prompt_graph_passes(n_tokens, wtype):
    """A real model's prompt graph is never refused by the default, in any weight type:
    the IQ types, whose kernels are the slowest per multiply-add, included."""
    wt = T[wtype]
    n_ctx = 4096
    weights = N_7B // ggml.blck_size(wt) * ggml.type_size(wt)
    kv = 2 * 32 * n_ctx * 4096 * 2                # F16 K and V
    compute = n_tokens * (4096 + 11008) * 4 * 8   # a compute buffer's order of magnitude
    w = llama_prompt_work(n_tokens, n_ctx, wt)
    assert w * 2 < work.DEFAULT_PER_BYTE * (weights + kv + compute)
    # a server holding only one of the 32 layers (a split) does the same per byte
    assert w / 32 * 2 < work.DEFAULT_PER_BYTE * (weights + kv) / 32


class G:
    """Just enough of graph.Graph for check_graph: every tensor placed after the previous
    one in one buffer of buffer_size bytes (a tensor listed twice: one place)."""

    def __init__(self, nodes, buffer_size):
        self.tensors = {}
        self.nodes = []
        self.placement = {}
        self.buffer = SimpleNamespace(size=buffer_size)
        self.end = 0
        for i, (node, srcs) in enumerate(nodes):
            node.src = tuple(self.place(s) for s in srcs)
            self.place(node)
            node.name_str = f"n{i}"
            self.nodes.append(node)

    def place(self, t, buffer=None):
        if not hasattr(t, "id"):
            t.id = len(self.tensors) + 1
            self.tensors[t.id] = t
            self.placement[t.id] = SimpleNamespace(buffer=buffer or self.buffer, offset=self.end)
            self.end += ggml.nbytes(t.type, t.ne, t.nb)
        return t.id

    def runnable(self):
        return self.nodes

    sources = Graph.sources


def test_stride0_broadcast_refused():
    huge = (1 << 24, 1 << 24, 1, 1)            # MAX_ELEMENTS: hours of additions
    g = G([(t(huge, op=Op.ADD), [t(huge), t(huge)])], 1 << 30)
    with pytest.raises(ValidationError, match="over the limit"):
        work.check_graph(g, work.DEFAULT_PER_BYTE)
    assert work.check_graph(g, None) == 0      # limit off


@pytest.mark.parametrize("per_byte", [work.DEFAULT_PER_BYTE, None])
def test_element_count_bounded_without_the_work_limit(per_byte):
    """More than MAX_ELEMENTS logical elements in any tensor of a node is refused
    whatever the work limit, --max-graph-work 0 (None) included."""
    over = (1 << 24, (1 << 24) + 1, 1, 1)
    for node, srcs in ((t(over, op=Op.ADD), [t((1,)), t((1,))]),
                       (t((1,), op=Op.SUM), [t(over)])):
        g = G([(node, srcs)], 1 << 30)
        with pytest.raises(ValidationError, match="number of elements"):
            work.check_graph(g, per_byte)


def test_small_graph_on_small_buffer_passes():
    g = G([(t((256, 256), op=Op.MUL_MAT), [t((256, 256)), t((256, 256))])], 64)
    assert work.check_graph(g, work.DEFAULT_PER_BYTE) == work.graph_work(g)


@pytest.mark.parametrize("op, params", [
    (Op.POOL_2D, (0, 1000, 1000, 1, 1)),       # a million taps per output
    (Op.DSV4_HC_COMB, (0, 1 << 20)),           # a million Sinkhorn rounds
])
def test_loop_params_count(op, params):
    small = work.node_work(t((4, 4), op=op), [t((4, 4))])
    big = work.node_work(t((4, 4), op=op, params=params), [t((4, 4))])
    assert big >= small * 1000


def test_rows_count():
    """2^31 rows of one element cost far more than 2^31 elements in long rows."""
    rows = work.node_work(t((1, 1 << 31), op=Op.ADD), [t((1, 1 << 31)), t((1, 1 << 31))])
    long = work.node_work(t((1 << 31, 1), op=Op.ADD), [t((1 << 31, 1)), t((1 << 31, 1))])
    assert rows > 10 * long


def test_cli_option():
    from ggmlrpc.cli.server import UsageError, parse
    assert parse([], "ggml-rpc-server").limits.max_graph_work == work.DEFAULT_PER_BYTE
    assert parse(["--max-graph-work", "100"], "ggml-rpc-server").limits.max_graph_work == 100
    assert parse(["--max-graph-work", "0"], "ggml-rpc-server").limits.max_graph_work is None
    with pytest.raises(UsageError):
        parse(["--max-graph-work", "-5"], "ggml-rpc-server")


def iq_attack(wtype, n_nodes=40):
    """n_nodes products of one small weight by one activation: ~1.3 MiB of tensors."""
    w, x = t((4096, 256), wtype), t((4096, 64))
    return G([(t((256, 64), op=Op.MUL_MAT), [w, x]) for _ in range(n_nodes)], 1 << 23)


def test_matmul_cost_by_weight_type():
    """A product costs its weight type's calibrated weight per multiply-add: at a limit
    the Q8_0 graph passes, the same graph of IQ2 (small in bytes, long in time) is refused.
    (The default is higher: an IQ2 model's real prompt graph has the same work per byte
    as this one; what keeps it from holding the others is that graphs take turns.)"""
    q8, iq2 = iq_attack(T.Q8_0), iq_attack(T.IQ2_XXS)
    limit = 1 << 14          # a limit that the Q8_0 graph passes
    assert work.check_graph(q8, limit) > 0
    with pytest.raises(ValidationError, match="over the limit"):
        work.check_graph(iq2, limit)
    node, srcs = q8.nodes[0], q8.sources(q8.nodes[0])
    base = work.node_work(node, srcs) - work._inner(node, srcs)
    madds = 256 * 64 * 4096
    assert work.node_work(iq2.nodes[0], iq2.sources(iq2.nodes[0])) == \
        pytest.approx(base + madds * WEIGHTS["IQ2_XXS"], rel=1e-3)


def test_matmul_cost_table_covers_the_kernels():
    """Every weight type the executor multiplies has a calibrated weight; relations
    that hold on any host: Q8_0 is the unit, none is cheaper, the IQ1..IQ3 grid
    kernels cost far more than the block types with a plain integer dot."""
    kernels = {t.name for t in T if executor.has_vec_dot(int(t))}
    assert set(WEIGHTS) == kernels
    assert WEIGHTS["Q8_0"] == 1.0 and min(WEIGHTS.values()) >= 1.0
    plain = max(WEIGHTS[n] for n in ("Q4_0", "Q8_0", "Q4_K", "Q6_K"))
    for n in ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S"):
        assert WEIGHTS[n] > 10 * plain, n


def test_untouched_buffer_adds_no_budget():
    """The budget counts the bytes the computed nodes use, not the buffers they lie in:
    a tensor listed in a huge buffer that no node touches adds nothing, nor does a
    tensor the nodes use twice."""
    small = iq_attack(T.Q8_0, 1)
    before = work.backing_bytes(small)
    assert before == sum(ggml.nbytes(x.type, x.ne, x.nb) for x in small.tensors.values())
    small.buffer.size = 1 << 30                     # the same tensors in a 1 GiB buffer
    small.place(t((1 << 20, 256)), SimpleNamespace(size=1 << 30))   # listed, untouched
    assert work.backing_bytes(small) == before
    # 40 nodes: the same weight and activation, 39 more outputs
    assert work.backing_bytes(iq_attack(T.Q8_0, 40)) == before + 39 * 256 * 64 * 4
