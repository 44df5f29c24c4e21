"""-sm row on generated models through two of our servers: the logits of a prompt
and of decode steps after it within NMSE 1e-6 of the single-device run (equal and
unequal -ts, with and without flash attention, some layers kept on the CPU, the
output layer on the CPU), and one clear error for what cannot be cut."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlrpc.cli.main import main
from ggmlrpc.ggml import GGMLType
from ggmlrpc.llm import synth
from ggmlrpc.llm.gguf_file import ModelError
from ggmlrpc.llm.model import Model
from tests.conftest import nmse, start_server
from tests.e2e.test_batch import servers  # noqa: F401  (two of our servers' endpoints, a module fixture)

PROMPT = "the old fisherman lived in a small village by the sea"
SHAPE = synth.ModelShape(n_layer=3, n_embd=128, n_ff=256, n_head=8, n_head_kv=4, n_ctx=256)


def logits(path, **kw) -> list[np.ndarray]:
    """The prompt's last logits, then three decode steps'."""
    with Model.load(path, **kw) as m:
        out = [m.eval(m.tokenize(PROMPT))]
        for _ in range(3):
            out.append(m.eval([int(np.argmax(out[-1]))]))
        return out


@pytest.mark.parametrize("arch,dtype", [("llama", "f32"), ("llama", "q8_0"), ("qwen2", "q8_0"), ("qwen3", "q8_0"),
                                        ("qwen3moe", "f32"), ("llama-moe", "q8_0")])
def test_row_split_logits_match_one_device(tmp_path, servers, arch, dtype):
    path = synth.write_model(tmp_path / f"{arch}.gguf", arch, SHAPE, dtype, seed=5)
    for fa in (True, False):
        one = logits(path, n_gpu_layers=0, flash_attn=fa)
        for kw in (dict(tensor_split=[1, 1]), dict(tensor_split=[3, 1]), dict(tensor_split=[1, 2]),
                   dict(tensor_split=[1, 1], n_gpu_layers=3),      # layer 0 on the CPU
                   dict(tensor_split=[1, 1], n_gpu_layers=2),      # layers 0 and 1 on the CPU
                   dict(tensor_split=[1, 1], n_gpu_layers=1)):     # only the output layer offloaded (uncut)
            row = logits(path, rpc=servers, split_mode="row", flash_attn=fa, **kw)
            assert max(nmse(a, b) for a, b in zip(row, one)) <= 1e-6, (fa, kw)
    # a prompt in micro-batches of 5 tokens (each graph's residual kept between segments)
    one = logits(path, n_gpu_layers=0, n_ubatch=5)
    row = logits(path, rpc=servers, split_mode="row", tensor_split=[1, 1], n_ubatch=5)
    assert max(nmse(a, b) for a, b in zip(row, one)) <= 1e-6


def test_row_split_places_the_heads(tmp_path, servers):
    """-ts 3,1: three KV heads (and their cache) on the first server, one on the second."""
    path = synth.write_model(tmp_path / "llama.gguf", "llama", SHAPE, "f32", seed=5)
    with Model.load(path, rpc=servers, split_mode="row", tensor_split=[3, 1]) as m:
        a, b = m.rows.shards
        assert (a.hp.n_head_kv, b.hp.n_head_kv) == (3, 1) and (a.hp.n_head, b.hp.n_head) == (6, 2)
        k = a.stage.kv[0][0], b.stage.kv[0][0]
        assert [t.ne[0] for t in k] == [3 * m.hp.head_dim, m.hp.head_dim]
        assert [sh.ff for sh in m.rows.shards] == [(0, 192), (192, 256)]
        assert sum(sh.vocab[1] - sh.vocab[0] for sh in m.rows.shards) == m.hp.n_vocab
        assert [st.layers for st in m.stages] == [[]]     # the CPU keeps the embeddings only


def test_row_split_errors(tmp_path, servers, capsys):
    mla = synth.write_model(tmp_path / "mla.gguf", "deepseek2", SHAPE, "f32", seed=5)    # latent attention
    with pytest.raises(ModelError, match="-sm row does not support architecture 'deepseek2'"):
        Model.load(mla, rpc=servers, split_mode="row")
    routed = synth.write_model(tmp_path / "routed.gguf", "qwen3moe", SHAPE, "f32", seed=5)
    with pytest.raises(ModelError, match="routed experts with the gather combine only"):
        Model.load(routed, rpc=servers, split_mode="row", row_combine="reduce")
    llama = synth.write_model(tmp_path / "llama.gguf", "llama",
                              synth.ModelShape(n_layer=2, n_embd=64, n_ff=128, n_head=4, n_head_kv=1), "f32")
    with pytest.raises(ModelError, match="KV heads cannot be cut over 2 devices"):
        Model.load(llama, rpc=servers, split_mode="row", tensor_split=[1, 1])
    with pytest.raises(ModelError, match="split mode must be"):
        Model.load(llama, split_mode="column")
    assert main(["run", "-m", str(mla), "--rpc", ",".join(servers), "-sm", "row", "-p", "hi", "-n", "2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error:") and "-sm row does not support architecture 'deepseek2'" in err
    assert "Traceback" not in err


def test_bench_with_row_split(tmp_path, servers, capsys):
    import json

    path = synth.write_model(tmp_path / "llama.gguf", "llama", SHAPE, "q8_0", seed=5)
    assert main(["bench", "-m", str(path), "--rpc", ",".join(servers), "-sm", "row", "-ts", "1,1",
                 "-p", "8", "-n", "4", "-r", "1", "-o", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["test"] for r in rows] == ["pp8", "tg4"]
    assert all(r["split_mode"] == "row" and r["avg_ts"] > 0 for r in rows)


def test_row_split_over_three_servers(tmp_path):
    path = synth.write_model(tmp_path / "llama.gguf", "llama", SHAPE, "q8_0", seed=6)
    srvs = [start_server() for _ in range(3)]
    try:
        eps = [f"127.0.0.1:{s.port}" for s in srvs]
        one = logits(path, n_gpu_layers=0)
        for ts in ([1, 1, 1], [2, 1, 1]):
            with Model.load(path, rpc=eps, split_mode="row", tensor_split=ts) as m:
                assert len(m.rows.shards) == 3
            row = logits(path, rpc=eps, split_mode="row", tensor_split=ts)
            assert max(nmse(a, b) for a, b in zip(row, one)) <= 1e-6, ts
    finally:
        for s in srvs:
            s.close()


def test_row_split_runs_several_sequences(tmp_path, servers):
    """Two sequences in one step (serve -np 2): each one's logits as on one device."""
    path = synth.write_model(tmp_path / "llama.gguf", "llama", SHAPE, "q8_0", seed=7)

    def run(**kw):
        with Model.load(path, n_seq=2, **kw) as m:
            a, b = m.seq, m.new_sequence()
            return (m.decode([(a, [1, 5, 9, 20]), (b, [1, 7, 3])])
                    + m.decode([(a, [11]), (b, [12])]))

    one = run(n_gpu_layers=0)
    row = run(rpc=servers, split_mode="row", tensor_split=[1, 1])
    assert max(nmse(a, b) for a, b in zip(row, one)) <= 1e-6


def test_auto_split_says_what_it_chose_and_runs_it(tmp_path, servers, capfd):
    """-sm auto measures the two servers, picks a mode, says which and why, and runs
    exactly that mode (the logits of an explicit load of it)."""
    path = synth.write_model(tmp_path / "llama.gguf", "llama", SHAPE, "q8_0", seed=5)
    with Model.load(path, rpc=servers, split_mode="auto", tensor_split=[1, 1]) as m:
        chosen, why = m.split_mode, m.split_reason
        assert chosen in ("layer", "row") and why.startswith("predicted ") and "GB/s" in why
        got = [m.eval(m.tokenize(PROMPT))]
    assert np.array_equal(got[0], logits(path, rpc=servers, split_mode=chosen, tensor_split=[1, 1])[0])
    capfd.readouterr()
    assert main(["run", "-m", str(path), "--rpc", ",".join(servers), "-sm", "auto", "-p", "hi", "-n", "2"]) == 0
    assert "split mode auto: " in capfd.readouterr().err


def test_auto_split_measures_the_servers_alone_and_at_once(servers):
    """Each server's speed alone and with both computing at once (what row split
    runs at); one device alone has no second figure."""
    from ggmlrpc.client import RemoteBackend
    from ggmlrpc.llm.autosplit import measure, measure_all
    from ggmlrpc.llm.placement import Device
    bes = [RemoteBackend(ep) for ep in servers]
    try:
        devs = [Device(be, 0, ep, be.get_device_memory(0)[0]) for be, ep in zip(bes, servers)]
        both = measure_all(devs, GGMLType.Q8_0, rounds=2)
        assert [m.device for m in both] == devs
        assert all(m.rtt_ms > 0 and m.bytes_per_ms > 0 and m.together_bytes_per_ms > 0 for m in both)
        one = measure(devs[0], GGMLType.Q8_0, rounds=2)
        assert one.bytes_per_ms > 0 and one.together_bytes_per_ms == 0.0
        assert one.row_bytes_per_ms == one.bytes_per_ms
    finally:
        for be in bes:
            be.close()


def test_auto_split_keeps_layer_where_rows_cannot_be_cut(tmp_path, servers):
    mla = synth.write_model(tmp_path / "mla.gguf", "deepseek2", SHAPE, "f32", seed=5)
    llama = synth.write_model(tmp_path / "llama.gguf", "llama", SHAPE, "f32", seed=5)
    for path, kw, why in ((mla, dict(rpc=servers), "-sm row does not support architecture 'deepseek2'"),
                          (llama, dict(rpc=servers[:1]), "fewer than two servers"),
                          (llama, dict(rpc=servers, reconnect=5), "--reconnect needs -sm layer"),
                          (llama, dict(rpc=servers, n_gpu_layers=0), "fewer than two servers")):
        with Model.load(path, split_mode="auto", **kw) as m:
            assert (m.split_mode, m.rows) == ("layer", None) and why in m.split_reason, kw


def test_auto_split_rule():
    """The prediction: row pays when a layer's compute outweighs its three combines'
    round trips, and never across a slow link; layers left on the CPU count in neither."""
    from ggmlrpc.llm.autosplit import HOST_COMBINE_MS, Measured, predict

    def two(rtt, speed=1e6):
        return [Measured(None, rtt, speed), Measured(None, rtt, speed)]
    layers, sizes = [0] * 6 + [1] * 6, [50_000_000] * 12       # 50 MB a layer at 1 GB/s: 50 ms
    t_layer, t_row = predict(two(0.05), [1, 1], layers, sizes, 0, 1)
    assert t_layer == pytest.approx(600 + 0.1) and t_row == pytest.approx(300 + 37 * (0.05 + HOST_COMBINE_MS))
    assert t_row < t_layer
    small = [100_000] * 12                                      # 0.1 ms a layer: the combines dominate
    t_layer, t_row = predict(two(1.0), [1, 1], layers, small, 0, 1)
    assert t_row > t_layer
    # an unequal pair: row waits for the slower device's share
    t_layer, t_row = predict([Measured(None, 0.0, 1e6), Measured(None, 0.0, 0.5e6)], [1, 1], layers, sizes, 0, 1)
    assert t_layer == pytest.approx(300 + 600) and t_row == pytest.approx(600 + 37 * HOST_COMBINE_MS)
    # servers that share a host's memory bandwidth: row split computes at their speed
    # with both at once, layer split at their speed alone
    shared = [Measured(None, 0.0, 1e6, 0.5e6), Measured(None, 0.0, 1e6, 0.5e6)]
    t_layer, t_row = predict(shared, [1, 1], layers, sizes, 0, 1)
    assert t_layer == pytest.approx(600) and t_row == pytest.approx(600 + 37 * HOST_COMBINE_MS)
    # two layers on the CPU: ten offloaded layers, 30 combines (the output layer stays on the CPU)
    cpu = [-1, -1] + [0] * 5 + [1] * 5
    t_layer, t_row = predict(two(0.0), [1, 1], cpu, sizes, 10_000_000, -1)
    assert t_layer == pytest.approx(500) and t_row == pytest.approx(250 + 30 * HOST_COMBINE_MS)
    # linked servers: one host round trip a token, half a round trip and the exchange per combine
    from ggmlrpc.llm.autosplit import PEER_EXCHANGE_MS, PING_OVERHEAD_MS
    t_layer, t_row = predict(two(1.0), [1, 1], layers, [2_000_000] * 12, 0, 1, linked=True)
    assert t_row == pytest.approx(12 + 1 + 37 * ((1.0 - PING_OVERHEAD_MS) / 2 + PEER_EXCHANGE_MS))
    assert predict(two(1.0), [1, 1], layers, [2_000_000] * 12, 0, 1)[1] > t_row > t_layer == pytest.approx(26)
    # through the host, four combines a layer (the relay's: three gathers and the output)
    t_layer, t_row = predict(two(0.05), [1, 1], layers, sizes, 0, 1, per_layer=[4] * 12)
    assert t_row == pytest.approx(300 + 49 * (0.05 + HOST_COMBINE_MS))


def test_combines_per_layer(tmp_path):
    """What -sm auto counts per layer: through the host, the llama family's three
    segments, gemma2's three gathers and its output, qwen2moe's five gathers (routed
    and shared experts) and its output, minimax-m2's q and k rows besides; on linked
    servers the gathers and the attention projection's rows."""
    from ggmlrpc.llm.archs import ARCHS
    from ggmlrpc.llm.gguf_file import GGUFFile
    from ggmlrpc.llm.hparams import HParams
    from ggmlrpc.llm.rowsplit import combines_per_layer
    import dataclasses
    want = {"llama": (4, 3), "gemma2": (4, 4), "qwen2moe": (6, 6), "minimax-m2": (6, 6)}
    for name, (linked, host) in want.items():
        arch = next(a for a in ARCHS.values() if name in a.synth)
        path = synth.write_model(tmp_path / f"{name}.gguf", name, dataclasses.replace(SHAPE, **arch.test_shape),
                                 "f32", seed=5)
        f = GGUFFile(path)
        hp = HParams.from_gguf(f, 100, arch)
        got = (combines_per_layer(arch, hp, f, 1, True), combines_per_layer(arch, hp, f, 1, False))
        assert got == (linked, host), name
