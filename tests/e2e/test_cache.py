"""The local tensor cache: hash-first weight writes, cache files, their directory.

Large writes (> 10 MiB, weights=True) go through RemoteBackend exactly as
llama.cpp's client sends them; the file rules are also driven with raw
SET_TENSOR / SET_TENSOR_HASH on small payloads, where an independent FNV-1a loop
names the file.
"""
from __future__ import annotations

import os
import re
import struct
import subprocess
import threading
import time

import numpy as np
import pytest

from ggmlrpc import protocol
from ggmlrpc.client import RemoteBackend
from ggmlrpc.ggml import GGMLType
from ggmlrpc.protocol import Cmd
from ggmlrpc.cache import INDEX_NAME, TensorCache
from ggmlrpc.server import cache_directory
from tests.conftest import our_server_argv, start_server
from tests.protocol.rawclient import HELLO_ANSWER, Raw, frame, tensor

BIG = protocol.HASH_THRESHOLD + 4096          # strictly above the client's threshold
HEX16 = re.compile(r"^[0-9a-f]{16}$")


def fnv1a_loop(data: bytes) -> int:
    """FNV-1a 64, written out here so the file names are not checked against themselves."""
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def cache_files(d) -> list[str]:
    """The directory's files, less the server's index of them."""
    return sorted(n for n in os.listdir(d) if n != INDEX_NAME) if os.path.isdir(d) else []


@pytest.fixture
def cache_dir(tmp_path):
    d = tmp_path / "rpc"
    d.mkdir()
    return d


def cached_server(cache_dir, codec_name="native"):
    return start_server(codec_name, cache_dir=str(cache_dir))


@pytest.fixture
def native_cached(cache_dir):
    srv = cached_server(cache_dir)
    yield f"127.0.0.1:{srv.port}", srv
    srv.close()


@pytest.fixture
def any_cached(cache_dir, codec_name):
    srv = cached_server(cache_dir, codec_name)
    yield f"127.0.0.1:{srv.port}", srv
    srv.close()


def big_payload(seed: int, n: int = BIG) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def fresh_tensor(rb: RemoteBackend, n: int, pad: int = 0):
    buf = rb.alloc_buffer(n + pad)
    return buf, buf.tensor(GGMLType.I8, (n + pad,), name="weights")


# -- the hash-first protocol, big writes ---------------------------------------------

def test_miss_then_hit_on_another_client(native_cached, cache_dir, seed):
    endpoint, _ = native_cached
    data = big_payload(seed)
    h = protocol.codec("native").fnv1a(data)
    with RemoteBackend(endpoint) as a:
        _, t = fresh_tensor(a, len(data))
        assert a.set_tensor(t, data, weights=True) is False  # miss: the bytes were sent
        assert a.get_tensor(t) == data
    assert cache_files(cache_dir) == [f"{h:016x}"]
    assert (cache_dir / f"{h:016x}").read_bytes() == data

    with RemoteBackend(endpoint) as b:
        # the hit fills a tensor at an offset in another buffer of another session
        _, t = fresh_tensor(b, len(data), pad=4096)
        assert b.set_tensor(t, data, offset=4096, weights=True) is True
        got = b.get_tensor(t)
        assert got[:4096] == bytes(4096) and got[4096:] == data
        # the hit wrote no new file
        assert cache_files(cache_dir) == [f"{h:016x}"]


def test_weights_false_and_small_writes_store_nothing(native_cached, cache_dir, seed):
    endpoint, _ = native_cached
    data = big_payload(seed)
    with RemoteBackend(endpoint) as rb:
        _, t = fresh_tensor(rb, len(data))
        assert rb.set_tensor(t, data) is False            # not weights: plain SET_TENSOR
        small = data[:protocol.HASH_THRESHOLD]             # exactly 10 MiB is not "above"
        _, s = fresh_tensor(rb, len(small))
        assert rb.set_tensor(s, small, weights=True) is False
        assert rb.get_tensor(t) == data and rb.get_tensor(s) == small
    assert cache_files(cache_dir) == []


def test_no_half_written_file_is_visible(native_cached, cache_dir, seed):
    """A watcher lists the directory while three big writes are stored: every cache
    file it ever sees is complete."""
    endpoint, _ = native_cached
    payloads = [big_payload(seed + i) for i in range(3)]
    seen: dict[str, int] = {}
    stop = threading.Event()
    polls = 0

    def watch():
        nonlocal polls
        while not stop.is_set():
            polls += 1
            for e in os.scandir(cache_dir):
                if HEX16.match(e.name):
                    try:
                        seen[e.name] = min(seen.get(e.name, BIG), e.stat().st_size)
                    except FileNotFoundError:
                        pass

    w = threading.Thread(target=watch)
    w.start()
    try:
        with RemoteBackend(endpoint) as rb:
            for data in payloads:
                _, t = fresh_tensor(rb, len(data))
                assert rb.set_tensor(t, data, weights=True) is False
            rb.synchronize()
    finally:
        stop.set()
        w.join()
    names = {f"{protocol.codec('native').fnv1a(d):016x}" for d in payloads}
    assert polls > 0 and set(seen) <= names
    assert all(size == BIG for size in seen.values()), seen
    assert set(cache_files(cache_dir)) == names  # and no temporary file stayed behind


# -- file rules with raw requests, both codecs ----------------------------------------

def raw_set(rb: RemoteBackend, t, data: bytes, cache_flag: int, offset: int = 0) -> None:
    """SET_TENSOR exactly as given: | rpc_tensor | cache_flag u8 | offset u64 | data |."""
    rb._post(Cmd.SET_TENSOR, protocol.encode_tensor(t.to_rpc()) + struct.pack("<BQ", cache_flag, offset),
             data)


def upload(rb: RemoteBackend, t, data: bytes, h: int) -> bool:
    """What llama.cpp's client does for a weight over the threshold: SET_TENSOR_HASH,
    and on "not cached" SET_TENSOR with the cache flag. True on a hit."""
    if rb.set_tensor_hash(t, h):
        return True
    raw_set(rb, t, data, cache_flag=1)
    rb.synchronize()
    return False


def test_only_announced_weights_are_stored(any_cached, cache_dir, seed):
    """The cache flag keeps bytes only as llama.cpp's client sends it: over 10 MiB,
    right after this connection's SET_TENSOR_HASH of those bytes was answered "not
    cached". Small writes, unannounced ones and ones announced under another hash
    store nothing (any size used to be kept, 4-byte files included)."""
    endpoint, _ = any_cached
    data = big_payload(seed)
    h = protocol.codec("native").fnv1a(data)
    with RemoteBackend(endpoint) as rb:
        _, t = fresh_tensor(rb, len(data))
        raw_set(rb, t, data[:3000], cache_flag=1)           # small
        raw_set(rb, t, data, cache_flag=1)                  # big, never announced
        assert rb.set_tensor_hash(t, h ^ 1) is False        # announced under another hash
        raw_set(rb, t, data, cache_flag=1)
        raw_set(rb, t, data, cache_flag=0)
        rb.synchronize()
        assert cache_files(cache_dir) == []
        assert upload(rb, t, data, h) is False              # announced, then sent: kept
        assert cache_files(cache_dir) == [f"{h:016x}"]
        assert (cache_dir / f"{h:016x}").read_bytes() == data
        # ... and the write itself happened
        assert rb.get_tensor(t) == data


def test_hash_hit_and_changed_files(any_cached, cache_dir, seed):
    """A hit is served only from a file this server wrote and that is unchanged since;
    a file planted or rewritten behind its back is never served."""
    endpoint, _ = any_cached
    data = big_payload(seed)
    h = protocol.codec("native").fnv1a(data)
    path = cache_dir / f"{h:016x}"
    with RemoteBackend(endpoint) as rb:
        _, t = fresh_tensor(rb, len(data))
        assert rb.set_tensor_hash(t, h) is False          # nothing cached yet
        path.write_bytes(data)                            # planted, not written by the server
        assert rb.set_tensor_hash(t, h) is False
        assert rb.get_tensor(t, 0, 4096) == bytes(4096)
        raw_set(rb, t, data, cache_flag=1)                # stored by the server
        _, u = fresh_tensor(rb, len(data))
        assert rb.set_tensor_hash(u, h) is True
        assert rb.get_tensor(u) == data

        _, v = fresh_tensor(rb, len(data))
        for bad in (data[:-1] + bytes([data[-1] ^ 1]),    # one bit off
                    data[:2048],                          # truncated
                    data + b"\0",                         # one byte longer
                    b""):                                 # emptied
            upload(rb, t, data, h)                        # a fresh, served copy
            assert rb.set_tensor_hash(v, h) is True
            rb.memset_tensor(v, 0)
            path.write_bytes(bad)
            assert rb.set_tensor_hash(v, h) is False, len(bad)
            assert rb.get_tensor(v, 0, 4096) == bytes(4096)   # nothing written
        # a file with the right content under the name of other bytes is not used either
        other = h ^ 0x5A5A
        (cache_dir / f"{other:016x}").write_bytes(data)
        assert rb.set_tensor_hash(v, other) is False
        assert rb.get_tensor(v, 0, 4096) == bytes(4096)


def test_cache_write_failure_keeps_the_connection(native_cached, cache_dir, seed):
    """The file name is taken by a directory: the rename fails, no temporary file
    stays, and the client goes on (llama.cpp ignores failed cache writes too)."""
    endpoint, srv = native_cached
    data = big_payload(seed)
    h = protocol.codec("native").fnv1a(data)
    blocker = cache_dir / f"{h:016x}"
    blocker.mkdir()
    with RemoteBackend(endpoint) as rb:
        _, t = fresh_tensor(rb, len(data))
        assert upload(rb, t, data, h) is False
        assert rb.get_tensor(t) == data
        assert rb.set_tensor_hash(t, h) is False             # a directory is no cache file
    assert cache_files(cache_dir) == [blocker.name]
    assert os.listdir(blocker) == []


def test_without_cache_dir(server, endpoint, tmp_path, monkeypatch):
    """A server without a cache never answers 1 and writes no file anywhere."""
    monkeypatch.chdir(tmp_path)
    data = os.urandom(1024)
    with RemoteBackend(endpoint) as rb:
        _, t = fresh_tensor(rb, len(data))
        raw_set(rb, t, data, cache_flag=1)
        assert rb.get_tensor(t) == data
        assert rb.set_tensor_hash(t, fnv1a_loop(data)) is False
    assert os.listdir(tmp_path) == []


# -- the directory, through the command line ------------------------------------------------

def clean_env(**values) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("LLAMA_CACHE", "XDG_CACHE_HOME", "HOME", "GGML_RPC_DEBUG")}
    env.update(values)
    return env


def banner_cache_line(out: str) -> str:
    m = re.search(r"^  local cache    : (.*)$", out, re.M)
    assert m, out
    return m.group(1)


def wait_output(proc, needle: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        out, _ = proc.output()
        if needle in out or time.monotonic() > deadline:
            return out
        time.sleep(0.02)


def dir_cases(tmp_path):
    """(env, expected directory) for each rule of the lookup order."""
    lc, xdg, home = tmp_path / "lc", tmp_path / "xdg", tmp_path / "home"
    return {
        "LLAMA_CACHE": (clean_env(LLAMA_CACHE=str(lc), XDG_CACHE_HOME=str(xdg), HOME=str(home)),
                        lc / "rpc"),
        "XDG_CACHE_HOME": (clean_env(LLAMA_CACHE="", XDG_CACHE_HOME=str(xdg), HOME=str(home)),
                           xdg / "llama.cpp" / "rpc"),
        "HOME": (clean_env(XDG_CACHE_HOME="", HOME=str(home)), home / ".cache" / "llama.cpp" / "rpc"),
    }


@pytest.mark.parametrize("rule", ["LLAMA_CACHE", "XDG_CACHE_HOME", "HOME"])
def test_cache_directory_rules(server_proc, tmp_path, rule):
    env, want = dir_cases(tmp_path)[rule]
    assert not want.exists()
    p = server_proc("-c", env=env)
    out = wait_output(p, "transport")
    assert banner_cache_line(out) == str(want)
    assert want.is_dir()
    # and the server uses it
    data = os.urandom(BIG)
    h = protocol.codec("native").fnv1a(data)
    with RemoteBackend(p.endpoint) as rb:
        _, t = fresh_tensor(rb, len(data))
        assert upload(rb, t, data, h) is False
    assert cache_files(want) == [f"{h:016x}"]


def test_no_cache_banner(server_proc):
    p = server_proc()
    assert banner_cache_line(wait_output(p, "transport")) == "n/a"


def test_cache_directory_empty_home_uses_passwd():
    import pwd
    home = pwd.getpwuid(os.getuid()).pw_dir
    want = os.path.join(home, ".cache", "llama.cpp", "rpc")
    assert cache_directory({"HOME": "", "XDG_CACHE_HOME": "", "LLAMA_CACHE": ""}) == want
    assert cache_directory({}) == want
    assert cache_directory({"LLAMA_CACHE": "/x/"}) == "/x/rpc"


def uncreatable(tmp_path) -> dict:
    blocker = tmp_path / "file"
    blocker.write_text("a file where a directory should go")
    return clean_env(LLAMA_CACHE=str(blocker / "sub"))


def test_uncreatable_cache_directory_exits_1(tmp_path):
    env = uncreatable(tmp_path)
    r = subprocess.run(our_server_argv("-p", "1", "-c"), env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1
    assert f"Failed to create cache directory: {tmp_path / 'file' / 'sub' / 'rpc'}" in r.stderr
    assert "Starting RPC server" not in r.stdout


# -- against the reference ------------------------------------------------------------------

@pytest.mark.interop
def test_reference_cache_directory_and_exit(ref_bin, ref_server, tmp_path):
    for rule, (env, want) in dir_cases(tmp_path).items():
        p = ref_server("-c", env=env)
        RemoteBackend(p.endpoint).close()  # a connection makes it flush its banner
        assert banner_cache_line(wait_output(p, "Accepted client connection")) == str(want), rule
        assert want.is_dir()
        p.stop()
    r = subprocess.run([str(ref_bin / "ggml-rpc-server"), "-p", "1", "-c"], env=uncreatable(tmp_path),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert f"Failed to create cache directory: {tmp_path / 'file' / 'sub' / 'rpc'}" in r.stderr


@pytest.mark.interop
def test_reference_writes_the_same_file(ref_server, native_cached, cache_dir, tmp_path, seed):
    data = big_payload(seed)
    ref_dir = tmp_path / "ref"
    ref = ref_server("-c", env=clean_env(LLAMA_CACHE=str(ref_dir), HOME=str(tmp_path)))
    for endpoint in (ref.endpoint, native_cached[0]):
        with RemoteBackend(endpoint) as rb:
            _, t = fresh_tensor(rb, len(data))
            assert rb.set_tensor(t, data, weights=True) is False
            rb.synchronize()
        with RemoteBackend(endpoint) as rb:  # the reference serves one client at a time
            _, t = fresh_tensor(rb, len(data))
            assert rb.set_tensor(t, data, weights=True) is True
            assert rb.get_tensor(t) == data
    assert cache_files(ref_dir / "rpc") == cache_files(cache_dir) != []
    assert (ref_dir / "rpc" / cache_files(cache_dir)[0]).read_bytes() == data


# -- integrity: the index, collisions, read-only preloaded caches, size cap ------------------

def write_gguf(path, tensors: dict[str, np.ndarray]) -> None:
    import gguf
    w = gguf.GGUFWriter(str(path), "llama")
    for name, a in tensors.items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture
def weak_fnv(monkeypatch):
    """The server names stored bytes by a hash with collisions on demand: FNV-1a of the
    first 64 bytes only. Two contents that share those bytes share a name, as two
    contents built to collide under the full FNV-1a would."""
    from ggmlrpc.devices.cpu import HostBuffer
    monkeypatch.setattr(HostBuffer, "fnv1a", lambda self, off, n: fnv1a_loop(self.read(off, min(n, 64))))
    return lambda data: fnv1a_loop(data[:64])


def colliding_pair(seed: int, n: int = BIG) -> tuple[bytes, bytes]:
    rng = np.random.default_rng(seed)
    head = rng.integers(0, 256, 64, dtype=np.uint8).tobytes()
    victim = head + rng.integers(0, 256, n - 64, dtype=np.uint8).tobytes()
    attacker = head + b"\xee" * (n - 64)
    return victim, attacker


def test_collision_after_store_is_never_served(native_cached, cache_dir, weak_fnv, seed, caplog):
    """The victim's bytes are stored; an attacker stores other bytes under the same hash:
    the server notices (digests differ), and from then on nobody is served that hash:
    neither bytes reach a victim through the cache."""
    endpoint, _ = native_cached
    victim, attacker = colliding_pair(seed)
    h = weak_fnv(victim)
    assert h == weak_fnv(attacker)
    with RemoteBackend(endpoint) as v, RemoteBackend(endpoint) as a:
        _, ta = fresh_tensor(a, len(attacker))
        assert a.set_tensor_hash(ta, h) is False          # the attacker announces first
        _, tv = fresh_tensor(v, len(victim))
        assert upload(v, tv, victim, h) is False
        _, tv2 = fresh_tensor(v, len(victim))
        assert v.set_tensor_hash(tv2, h) is True and v.get_tensor(tv2) == victim
        raw_set(a, ta, attacker, cache_flag=1)            # then uploads colliding bytes
        a.synchronize()
        assert a.get_tensor(ta) == attacker               # its own write still happened
        _, tv3 = fresh_tensor(v, len(victim))
        assert v.set_tensor_hash(tv3, h) is False         # "not cached": the victim uploads
        assert v.get_tensor(tv3, 0, 4096) == bytes(4096)
        raw_set(v, tv3, victim, cache_flag=1)             # and its upload does not revive it
        assert v.set_tensor_hash(tv3, h) is False
    assert "share the FNV-1a hash" in caplog.text
    assert attacker not in [(cache_dir / n).read_bytes() for n in cache_files(cache_dir)]


def raw_upload(port: int, source: str, data: bytes, h: int) -> bool:
    """llama.cpp's hash-first upload over a raw connection from another loopback
    address (another peer to the server); True when the server had the hash."""
    r = Raw(port, source=source)
    try:
        assert r.hello() == HELLO_ANSWER
        handle, base = r.alloc(len(data))
        t = tensor(buffer=handle, data=base, ne=(len(data) // 4,))
        hit = r.call(Cmd.SET_TENSOR_HASH, t + struct.pack("<QQ", 0, h), 1)[8:] == b"\x01"
        if not hit:
            r.send(frame(Cmd.SET_TENSOR, t + struct.pack("<BQ", 1, 0) + data))
        r.call(Cmd.DEVICE_COUNT)    # a fence: the upload was handled
        return hit
    finally:
        r.close()


def test_uploads_are_served_to_their_writer_only(native_cached, weak_fnv, seed):
    """With a writable cache, bytes one peer uploads under a hash are served to that
    peer's address only: an attacker storing its bytes under the hash of a victim's
    weights reaches nobody but itself (it used to be served to the victim)."""
    endpoint, srv = native_cached
    victim, attacker = colliding_pair(seed)
    h = weak_fnv(victim)
    assert raw_upload(srv.port, "127.0.0.2", attacker, h) is False    # stored, by .2
    assert raw_upload(srv.port, "127.0.0.2", attacker, h) is True     # served to .2
    with RemoteBackend(endpoint) as v:                                # 127.0.0.1
        _, tv = fresh_tensor(v, len(victim))
        assert v.set_tensor_hash(tv, h) is False
        assert v.get_tensor(tv, 0, 4096) == bytes(4096)


def test_readonly_preloaded_cache_cannot_be_poisoned(cache_dir, tmp_path, weak_fnv, seed):
    """A read-only cache preloaded from a local GGUF: the client's hash-first upload of a
    weight is a hit (same FNV-1a as llama.cpp's client computes, over the whole
    tensor), an attacker's colliding upload stores nothing, and the victim still gets
    the model's bytes."""
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((1024, 2816)).astype(np.float32)     # 11 MiB: hashed
    small = rng.standard_normal((16, 16)).astype(np.float32)          # never hashed
    model = tmp_path / "model.gguf"
    write_gguf(model, {"big.weight": weight, "small.weight": small})
    cache = TensorCache(str(cache_dir), readonly=True)
    assert cache.preload(str(model)) == (1, weight.nbytes)
    name = f"{protocol.codec().fnv1a(weight.tobytes()):016x}"
    assert cache_files(cache_dir) == [name]
    srv = start_server("native", cache=cache)
    try:
        endpoint = f"127.0.0.1:{srv.port}"
        raw = weight.tobytes()
        attacker = raw[:64] + b"\xee" * (len(raw) - 64)               # collides under weak_fnv
        with RemoteBackend(endpoint) as a:
            _, ta = fresh_tensor(a, len(attacker))
            raw_set(a, ta, attacker, cache_flag=1)
            a.synchronize()
        assert cache_files(cache_dir) == [name]
        with RemoteBackend(endpoint) as v:
            _, tv = fresh_tensor(v, len(raw))
            assert v.set_tensor(tv, weight, weights=True) is True     # a hit: nothing sent
            assert v.get_tensor(tv) == raw
            # uploads are not served from a read-only cache, whoever stored them
            _, tu = fresh_tensor(v, 4096)
            raw_set(v, tu, raw[:4096], cache_flag=1)
            assert v.set_tensor_hash(tu, weak_fnv(raw[:4096])) is False
    finally:
        srv.close()


def test_preload_wins_over_a_colliding_upload(cache_dir, tmp_path, weak_fnv, seed):
    """A writable cache with a preloaded model: an upload that collides with a
    preloaded file is dropped and the preloaded bytes stay servable."""
    weight = np.random.default_rng(seed).standard_normal((1024, 2816)).astype(np.float32)
    raw = weight.tobytes()
    model = tmp_path / "model.gguf"
    write_gguf(model, {"w": weight})

    class WeakCodec:  # the preload names files by the same weak hash as the uploads
        fnv1a = staticmethod(lambda data: weak_fnv(bytes(memoryview(data)[:64])))

    cache = TensorCache(str(cache_dir), codec=WeakCodec())
    assert cache.preload(str(model)) == (1, len(raw))
    h = weak_fnv(raw)
    srv = start_server("native", cache=cache)
    try:
        with RemoteBackend(f"127.0.0.1:{srv.port}") as rb:
            forged = raw[:64] + b"\xee" * (len(raw) - 64)
            _, tf = fresh_tensor(rb, len(forged))
            assert upload(rb, tf, forged, h) is True      # the preloaded file answers
            _, tw = fresh_tensor(rb, len(raw))
            assert rb.set_tensor_hash(tw, h) is True
            assert rb.get_tensor(tw) == raw
    finally:
        srv.close()
    assert cache_files(cache_dir) == [f"{h:016x}"]
    assert (cache_dir / f"{h:016x}").read_bytes() == raw


def test_index_survives_a_restart_and_tmp_files_do_not(cache_dir, seed):
    data = big_payload(seed)
    h = protocol.codec("native").fnv1a(data)
    stale = cache_dir / ".tmp-interrupted"
    stale.write_bytes(b"half a file")
    srv = cached_server(cache_dir)
    try:
        assert not stale.exists()                          # removed at start
        with RemoteBackend(f"127.0.0.1:{srv.port}") as rb:
            _, t = fresh_tensor(rb, len(data))
            assert upload(rb, t, data, h) is False
    finally:
        srv.close()
    srv = cached_server(cache_dir)                         # a new process would read the same
    try:
        with RemoteBackend(f"127.0.0.1:{srv.port}") as rb:
            _, t = fresh_tensor(rb, len(data))
            assert rb.set_tensor_hash(t, h) is True and rb.get_tensor(t) == data
    finally:
        srv.close()


def disk_usage(d) -> int:
    return sum(os.stat(os.path.join(d, n)).st_blocks * 512 for n in cache_files(d))


def test_max_size_evicts_least_recently_used(cache_dir, seed):
    rng = np.random.default_rng(seed)
    block = os.statvfs(cache_dir).f_frsize
    blobs = [rng.integers(0, 256, block, dtype=np.uint8).tobytes() for _ in range(4)]
    names = [fnv1a_loop(b) for b in blobs]
    cache = TensorCache(str(cache_dir), max_size=2 * block + block // 2)
    cache.store(names[0], blobs[0])
    cache.store(names[1], blobs[1])
    assert cache.load(names[0]) is not None               # 0 is now more recent than 1
    cache.store(names[2], blobs[2])                       # 3 blocks > 2.5: 1 goes
    assert sorted(cache_files(cache_dir)) == sorted(f"{names[i]:016x}" for i in (0, 2))
    assert cache.load(names[1]) is None
    assert cache.store(names[3], rng.bytes(3 * block)) is None  # larger than the cap: not kept
    assert cache.total_size() <= 2 * block + block // 2


def test_max_size_counts_disk_blocks_not_bytes(cache_dir, seed):
    """Tiny files take a block of disk each: 200 files of 4 bytes under a 64 KiB cap
    leave at most 64 KiB of files on disk (they used to count 4 bytes each, 800 in
    all, and took 800 KiB)."""
    rng = np.random.default_rng(seed)
    cache = TensorCache(str(cache_dir), max_size=64 << 10)
    for i in range(200):
        data = rng.bytes(4)
        cache.store(fnv1a_loop(data), data)
    assert 0 < disk_usage(cache_dir) <= 64 << 10
    assert cache.total_size() == disk_usage(cache_dir)


def test_max_files_evicts_least_recently_used(cache_dir, seed):
    rng = np.random.default_rng(seed)
    blobs = [rng.bytes(100) for _ in range(5)]
    names = [fnv1a_loop(b) for b in blobs]
    cache = TensorCache(str(cache_dir), max_files=3)
    for i in range(3):
        cache.store(names[i], blobs[i])
    assert cache.load(names[0]) is not None               # 1 is now the least recent
    cache.store(names[3], blobs[3])
    cache.store(names[4], blobs[4])
    assert sorted(cache_files(cache_dir)) == sorted(f"{names[i]:016x}" for i in (0, 3, 4))
    again = TensorCache(str(cache_dir), max_files=3)      # the index says the same
    assert all(again.load(names[i]) is not None for i in (0, 3, 4))


def test_a_store_appends_to_the_index(cache_dir, seed, monkeypatch):
    """The index is not rewritten per store (that cost O(files) per store, quadratic
    in all): 500 stores append 500 records and rewrite it at most once, and a new
    cache object reads every entry back."""
    rng = np.random.default_rng(seed)
    cache = TensorCache(str(cache_dir))
    index = str(cache_dir / INDEX_NAME)
    rewrites = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (rewrites.append(b) if str(b) == index else None,
                                                     real_replace(a, b))[1])
    blobs = [rng.bytes(64) for _ in range(500)]
    for b in blobs:
        assert cache.store(fnv1a_loop(b), b) is not None
    assert len(rewrites) <= 1
    monkeypatch.undo()
    again = TensorCache(str(cache_dir))
    assert all(bytes(again.load(fnv1a_loop(b))) == b for b in blobs)


def test_preload_again_does_not_hash_the_model_again(cache_dir, tmp_path, seed):
    """A restart with the same --cache-preload finds the model in the index (same size
    and mtime, every file intact) and reads none of it; a changed model is hashed."""
    weight = np.random.default_rng(seed).standard_normal((1024, 2816)).astype(np.float32)
    model = tmp_path / "model.gguf"
    write_gguf(model, {"w": weight})

    class Counting:
        calls = 0

        def fnv1a(self, data):
            Counting.calls += 1
            return protocol.codec().fnv1a(data)

    first = TensorCache(str(cache_dir), codec=Counting()).preload(str(model))
    assert first == (1, weight.nbytes) and Counting.calls == 1
    again = TensorCache(str(cache_dir), codec=Counting()).preload(str(model))
    assert again == first and Counting.calls == 1
    os.utime(model, ns=(time.time_ns(), time.time_ns() + 10**9))
    TensorCache(str(cache_dir), codec=Counting()).preload(str(model))
    assert Counting.calls == 2


def test_unreadable_index_serves_nothing(cache_dir, seed):
    """An index that cannot be read (truncated, edited) vouches for no file: the cache
    starts empty and serves nothing until files are written again."""
    data = big_payload(seed, 3000)
    h = fnv1a_loop(data)
    TensorCache(str(cache_dir)).store(h, data)
    assert TensorCache(str(cache_dir)).load(h) is not None
    index = cache_dir / INDEX_NAME
    index.write_text(index.read_text()[:40])
    fresh = TensorCache(str(cache_dir))
    assert fresh.load(h) is None
    fresh.store(h, data)
    assert bytes(fresh.load(h)) == data


def test_concurrent_colliding_stores_end_in_a_conflict(cache_dir, seed):
    """Two sessions store different bytes under one name at the same moment: whatever
    the interleaving, the name ends up refused and no file is served for it."""
    rng = np.random.default_rng(seed)
    cache = TensorCache(str(cache_dir))
    for i in range(20):
        a, b = rng.bytes(200_000), rng.bytes(200_000)
        start = threading.Barrier(2)

        def put(data):
            start.wait()
            cache.store(i, data)

        ts = [threading.Thread(target=put, args=(d,)) for d in (a, b)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert cache.load(i) is None
        assert f"{i:016x}" not in cache_files(cache_dir)


def test_cache_preload_of_a_missing_file_exits_1(tmp_path):
    env = dict(os.environ, LLAMA_CACHE=str(tmp_path))
    r = subprocess.run(our_server_argv("-p", "1", "--cache-preload", str(tmp_path / "none.gguf")),
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 1 and "cannot preload" in r.stderr
