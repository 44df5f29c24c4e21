"""The local tensor cache (`-c`): files named by the FNV-1a hash of their content.

The wire names a cached tensor by its 64-bit FNV-1a hash only (SET_TENSOR_HASH), and
FNV-1a is not collision resistant: bytes with a chosen FNV value are cheap to
compute. Nothing on the wire can change that, so this side keeps its own proof of
what each file holds:

- an index beside the files (INDEX_NAME) records, for each file this server wrote,
  a BLAKE2b-256 digest of the bytes as they were written, their size, the file's
  mtime and inode, where the bytes came from (an upload or a local GGUF) and when
  the file was last used;
- a hit is served only from an indexed file whose size, mtime and inode are still
  the recorded ones (no whole-file hashing per request), so a file changed or
  planted behind the server's back is never served;
- an upload whose FNV name is already indexed with a different digest is a
  collision: the name is never served again (a preloaded file stays and wins);
- `readonly` serves only files preloaded from local GGUF models and stores no
  upload, which is what a server shared by clients that do not trust each other
  must run with: with a writable cache, the first client to store bytes under a
  hash decides what a later client asking for that hash gets;
- `max_size` caps the bytes of uploaded files, evicting the least recently used.

Files are written atomically (a temporary file renamed into place) and temporary
files left by an interrupted server are removed at start.
"""
from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import pwd
import re
import tempfile
import threading
import time
from dataclasses import asdict, dataclass

from . import protocol

log = logging.getLogger("ggmlrpc.cache")

INDEX_NAME = ".ggmlrpc-index.json"
INDEX_VERSION = 1
TMP_PREFIX = ".tmp-"
HEX16 = re.compile(r"^[0-9a-f]{16}$")
DIGEST_SIZE = 32  # BLAKE2b-256
CHUNK = 16 << 20  # bytes hashed per step (the GIL is released for large updates)


def cache_directory(env=os.environ) -> str:
    """$LLAMA_CACHE/rpc, else $XDG_CACHE_HOME/llama.cpp/rpc, else $HOME/.cache/llama.cpp/rpc.
    An empty variable counts as unset."""
    if env.get("LLAMA_CACHE"):
        return os.path.join(env["LLAMA_CACHE"], "rpc")
    if env.get("XDG_CACHE_HOME"):
        base = env["XDG_CACHE_HOME"]
    else:
        # not expanduser("~"): it turns an empty HOME into "/" where llama.cpp asks passwd
        home = env.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir
        base = os.path.join(home, ".cache")
    return os.path.join(base, "llama.cpp", "rpc")


def strong_digest(view) -> str:
    h = hashlib.blake2b(digest_size=DIGEST_SIZE)
    mv = memoryview(view).cast("B")
    for i in range(0, len(mv), CHUNK):
        h.update(mv[i:i + CHUNK])
    return h.hexdigest()


@dataclass
class Entry:
    digest: str      # BLAKE2b-256 of the bytes written
    size: int
    mtime_ns: int
    ino: int
    source: str      # "upload" or "preload"
    used: float      # time of the last write or hit (LRU order)

    def matches(self, st: os.stat_result) -> bool:
        return (st.st_size == self.size and st.st_mtime_ns == self.mtime_ns
                and st.st_ino == self.ino)


class TensorCache:
    """The cache directory and its index. Thread-safe (sessions share one)."""

    def __init__(self, directory: str, readonly: bool = False, max_size: int | None = None,
                 codec=None):
        self.dir = directory
        self.readonly = readonly
        self.max_size = max_size
        self.codec = codec or protocol.codec()
        self._lock = threading.Lock()
        self.entries: dict[str, Entry] = {}
        self.conflicts: set[str] = set()
        # GGUF files preloaded before: path -> {"size", "mtime_ns", "names"}, so that a
        # restart with the same --cache-preload does not hash the model again
        self.preloads: dict[str, dict] = {}
        self._remove_stale_tmp()
        self._load_index()

    # -- files -----------------------------------------------------------------
    @staticmethod
    def name(h: int) -> str:
        return f"{h:016x}"

    def path(self, h: int | str) -> str:
        return os.path.join(self.dir, h if isinstance(h, str) else self.name(h))

    def _remove_stale_tmp(self) -> None:
        try:
            names = os.listdir(self.dir)
        except OSError:
            return
        for n in names:
            if n.startswith(TMP_PREFIX) or n.endswith(".tmp"):
                try:
                    os.unlink(os.path.join(self.dir, n))
                    log.info("removed stale temporary cache file %s", n)
                except OSError:
                    pass

    def _write_file(self, view) -> tuple[str, os.stat_result]:
        """A complete temporary file with `view`; the caller renames or removes it."""
        fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=self.dir)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(view)
                f.flush()
                st = os.fstat(f.fileno())
        except BaseException:
            _unlink(tmp)
            raise
        return tmp, st

    # -- the index --------------------------------------------------------------
    def _load_index(self) -> None:
        path = os.path.join(self.dir, INDEX_NAME)
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
            if doc.get("version") != INDEX_VERSION:
                raise ValueError(f"index version {doc.get('version')}")
            entries = {k: Entry(**v) for k, v in doc.get("entries", {}).items() if HEX16.match(k)}
            conflicts = {c for c in doc.get("conflicts", []) if HEX16.match(str(c))}
            preloads = {str(k): v for k, v in doc.get("preloads", {}).items()
                        if isinstance(v, dict) and isinstance(v.get("names"), list)}
        except FileNotFoundError:
            return
        except (OSError, ValueError, TypeError, AttributeError) as e:
            log.warning("cache index %s unreadable (%s): starting with an empty index", path, e)
            return
        for name, e in entries.items():
            try:
                st = os.stat(self.path(name))
            except OSError:
                continue
            if e.matches(st):
                self.entries[name] = e
            else:
                log.warning("cache file %s changed since it was written; not serving it", name)
        self.conflicts = conflicts
        self.preloads = preloads

    def _save_index(self) -> None:
        """Write the index atomically; called with the lock held."""
        doc = {"version": INDEX_VERSION, "digest": f"blake2b-{DIGEST_SIZE * 8}",
               "entries": {k: asdict(v) for k, v in sorted(self.entries.items())},
               "conflicts": sorted(self.conflicts), "preloads": self.preloads}
        data = json.dumps(doc, indent=0).encode()
        try:
            tmp, _ = self._write_file(data)
            os.replace(tmp, os.path.join(self.dir, INDEX_NAME))
        except OSError as e:
            log.warning("cannot write the cache index: %s", e)

    def total_size(self) -> int:
        return sum(e.size for e in self.entries.values())

    def _evict_for(self, n: int) -> bool:
        """Make room for n more bytes under max_size, dropping least recently used
        uploads (preloaded files stay); False when that is impossible."""
        if self.max_size is None:
            return True
        total = self.total_size()
        if total + n <= self.max_size:
            return True
        uploads = sorted((e.used, k) for k, e in self.entries.items() if e.source == "upload")
        freeable = sum(self.entries[k].size for _, k in uploads)
        if total - freeable + n > self.max_size:
            return False
        for _, k in uploads:
            if total + n <= self.max_size:
                break
            total -= self.entries.pop(k).size
            _unlink(self.path(k))
            log.info("cache: evicted %s (least recently used, --cache-max-size)", k)
        return True

    # -- serving -----------------------------------------------------------------
    def load(self, h: int):
        """A read-only mapping (or b"" when empty) of the file for hash h, or None when
        there is no servable file: not written by this cache, changed since, a hash
        with a collision, or an upload while the cache is read-only."""
        name = self.name(h)
        with self._lock:
            e = self.entries.get(name)
            if e is None or name in self.conflicts or (self.readonly and e.source != "preload"):
                return None
            try:
                f = open(self.path(name), "rb")
            except OSError:
                self.entries.pop(name, None)
                return None
            with f:
                st = os.fstat(f.fileno())
                if not e.matches(st):
                    log.warning("cache file %s changed since it was written; not serving it", name)
                    self.entries.pop(name, None)
                    self._save_index()
                    return None
                e.used = time.time()
                if e.size == 0:
                    return b""
                try:
                    return mmap.mmap(f.fileno(), e.size, prot=mmap.PROT_READ)
                except (OSError, ValueError):
                    return None

    def store(self, h: int, view, source: str = "upload") -> str | None:
        """Keep `view` (bytes whose FNV-1a is h) as the file for h; the file's path, or
        None when it is not kept (read-only cache, collision, over max_size)."""
        if self.readonly and source == "upload":
            return None
        name = self.name(h)
        n = len(view)
        digest = strong_digest(view)
        with self._lock:
            verdict = self._admit(name, digest, n, source)
        if verdict != "write":
            return verdict
        # the bytes go to disk outside the lock (other sessions keep hitting); another
        # store of the same name may have happened meanwhile, so admit again after
        tmp, st = self._write_file(view)
        with self._lock:
            verdict = self._admit(name, digest, n, source)
            if verdict != "write":
                _unlink(tmp)
                return verdict
            try:
                os.replace(tmp, self.path(name))
            except BaseException:
                _unlink(tmp)
                raise
            self.entries[name] = Entry(digest, n, st.st_mtime_ns, st.st_ino, source, time.time())
            if source == "preload":
                self.conflicts.discard(name)
            self._save_index()
        return self.path(name)

    def _admit(self, name: str, digest: str, n: int, source: str) -> str | None:
        """With the lock held: "write" when the bytes should be written, else what
        store() returns (the path when the same bytes are there, None when refused)."""
        known = self._known(name)
        if name in self.conflicts and source == "upload":
            return None
        if known is not None and known.digest == digest:
            if source == "preload" and known.source != "preload":
                known.source = "preload"
                self._save_index()
            known.used = time.time()
            return self.path(name)
        if known is not None and source == "upload":
            if known.source == "preload":
                log.warning("cache: an upload collides with preloaded %s (same FNV-1a, other "
                            "bytes); keeping the preloaded file", name)
                return None
            log.warning("cache: two different contents share the FNV-1a hash %s; that hash "
                        "is no longer served from the cache", name)
            self.conflicts.add(name)
            self.entries.pop(name, None)
            _unlink(self.path(name))
            self._save_index()
            return None
        if source == "upload" and not self._evict_for(n):
            log.info("cache: %s (%d bytes) does not fit under --cache-max-size", name, n)
            return None
        return "write"

    def _known(self, name: str) -> Entry | None:
        """The index entry for name if its file is still the one written; called
        with the lock held."""
        e = self.entries.get(name)
        if e is None:
            return None
        try:
            st = os.stat(self.path(name))
        except OSError:
            st = None
        if st is None or not e.matches(st):
            self.entries.pop(name, None)
            return None
        return e

    # -- preloading -----------------------------------------------------------------
    def preload(self, gguf_path: str) -> tuple[int, int]:
        """Fill the cache from a local GGUF model: every tensor a client would announce
        by hash (more than HASH_THRESHOLD bytes), under the FNV-1a of its bytes as
        llama.cpp's client hashes them (the whole tensor, as the file stores it).
        Returns (files written or adopted, bytes)."""
        from gguf import GGUFReader  # optional until a model is preloaded

        key = os.path.abspath(gguf_path)
        st = os.stat(key)
        with self._lock:
            done = self.preloads.get(key)
            if (done is not None and done.get("size") == st.st_size
                    and done.get("mtime_ns") == st.st_mtime_ns
                    and all(self._known(n) is not None and self.entries[n].source == "preload"
                            for n in done["names"])):
                return len(done["names"]), sum(self.entries[n].size for n in done["names"])
        reader = GGUFReader(gguf_path, "r")
        names: list[str] = []
        total = 0
        for t in reader.tensors:
            n = int(t.n_bytes)
            if n <= protocol.HASH_THRESHOLD:
                continue
            off = int(t.data_offset)
            data = memoryview(reader.data[off:off + n])
            h = self.codec.fnv1a(data)
            if self.store(h, data, source="preload") is not None:
                names.append(self.name(h))
                total += n
        del reader
        with self._lock:
            self.preloads[key] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "names": names}
            self._save_index()
        return len(names), total


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
