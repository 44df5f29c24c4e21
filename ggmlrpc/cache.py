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
- an upload is served only to the peer address that wrote it (or that uploaded the
  same bytes since), preloaded files to everyone: one peer's bytes stored under
  another's FNV-1a name never reach that other peer;
- `readonly` serves only files preloaded from local GGUF models and stores no
  upload, which is what a server shared by clients that do not trust each other
  must run with: with a writable cache, the first client to store bytes under a
  hash decides what a later client asking for that hash gets;
- uploads are kept only when llama.cpp's client would announce them: more than
  HASH_THRESHOLD bytes, written with the cache flag right after a SET_TENSOR_HASH
  of the same hash was answered "not cached" (the server checks both);
- `max_size` caps the disk space of the files (allocated blocks, not bytes: a
  4-byte file takes a block) and `max_files` their number, evicting the least
  recently used uploads;
- the index is a journal: each store or drop appends one line, and the whole
  index is rewritten only when the journal has grown to twice what it describes,
  so a store costs the same with 10 files or 100,000.

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
from collections import OrderedDict
from dataclasses import asdict, dataclass, field

from . import protocol

log = logging.getLogger("ggmlrpc.cache")

INDEX_NAME = ".ggmlrpc-index.json"
INDEX_VERSION = 2       # 1: one JSON document rewritten per store (still read)
DEFAULT_MAX_FILES = 4096  # each one over HASH_THRESHOLD: 40 GiB at least
MAX_OWNERS = 16           # addresses an upload is served to, the latest uploaders
NO_PEER = "-"             # the owner of uploads whose writer is unknown (a version 1 index)
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
    disk: int = 0    # bytes of disk the file takes (its blocks)
    owners: list = field(default_factory=list)  # peer addresses an upload is served to
                                                # (none: stored locally, served to all)

    def matches(self, st: os.stat_result) -> bool:
        return (st.st_size == self.size and st.st_mtime_ns == self.mtime_ns
                and st.st_ino == self.ino)


class TensorCache:
    """The cache directory and its index. Thread-safe (sessions share one)."""

    def __init__(self, directory: str, readonly: bool = False, max_size: int | None = None,
                 codec=None, max_files: int | None = DEFAULT_MAX_FILES):
        self.dir = directory
        self.readonly = readonly
        self.max_size = max_size
        self.max_files = max_files
        self.codec = codec or protocol.codec()
        self._lock = threading.Lock()
        self.entries: dict[str, Entry] = {}
        self._lru: OrderedDict[str, None] = OrderedDict()  # uploads, least recently used first
        self._disk = 0                                     # disk bytes of every entry
        self.conflicts: set[str] = set()
        # GGUF files preloaded before: path -> {"size", "mtime_ns", "names"}, so that a
        # restart with the same --cache-preload does not hash the model again
        self.preloads: dict[str, dict] = {}
        self._journal = 0   # lines in the index file
        self._uploads_disk = 0  # disk bytes of the uploads (what eviction can free)
        try:
            self._block = os.statvfs(directory).f_frsize or 4096
        except OSError:
            self._block = 4096
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
    #
    # .ggmlrpc-index.json, one JSON object a line:
    #   {"version": 2, "digest": "blake2b-256"}       first line
    #   {"put": NAME, "entry": {Entry's fields}}       a file written, or adopted
    #   {"drop": NAME}                                 a file evicted or found changed
    #   {"conflict": NAME}                             a name never served again
    #   {"preload": PATH, "record": {...}}             a GGUF preloaded
    # A line that does not parse makes the whole index unreadable (nothing is served).

    def _index_path(self) -> str:
        return os.path.join(self.dir, INDEX_NAME)

    def _load_index(self) -> None:
        path = self._index_path()
        entries: dict[str, Entry] = {}
        conflicts: set[str] = set()
        preloads: dict[str, dict] = {}
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
            lines = self._index_lines(text)
            for rec in lines[1:]:
                if "put" in rec:
                    entries[str(rec["put"])] = Entry(**rec["entry"])
                elif "drop" in rec:
                    entries.pop(str(rec["drop"]), None)
                elif "conflict" in rec:
                    conflicts.add(str(rec["conflict"]))
                    entries.pop(str(rec["conflict"]), None)
                elif "preload" in rec and isinstance(rec["record"].get("names"), list):
                    preloads[str(rec["preload"])] = rec["record"]
        except FileNotFoundError:
            return self._rewrite_index()
        except (OSError, ValueError, TypeError, AttributeError, KeyError) as e:
            log.warning("cache index %s unreadable (%s): starting with an empty index", path, e)
            return self._rewrite_index()
        for name, e in entries.items():
            if not HEX16.match(name):
                continue
            try:
                st = os.stat(self.path(name))
            except OSError:
                continue
            if e.matches(st):
                e.disk = st.st_blocks * 512
                self._add(name, e)
            else:
                log.warning("cache file %s changed since it was written; not serving it", name)
        self.conflicts = {c for c in conflicts if HEX16.match(c)}
        self.preloads = preloads
        self._rewrite_index()   # compacted, and a version 1 index converted

    @staticmethod
    def _index_lines(text: str) -> list[dict]:
        """The index's records, the header first; a version 1 index as the same."""
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and doc.get("version") == 1:
            return ([{"version": INDEX_VERSION}]
                    + [{"put": k, "entry": {**v, "owners": [NO_PEER]}}   # served to no peer
                       for k, v in doc.get("entries", {}).items()]
                    + [{"conflict": c} for c in doc.get("conflicts", [])]
                    + [{"preload": k, "record": v} for k, v in doc.get("preloads", {}).items()
                       if isinstance(v, dict)])
        lines = [json.loads(line) for line in text.splitlines() if line.strip()]
        if not lines or not all(isinstance(r, dict) for r in lines):
            raise ValueError("no records")
        if lines[0].get("version") != INDEX_VERSION:
            raise ValueError(f"index version {lines[0].get('version')}")
        return lines

    def _rewrite_index(self) -> None:
        """Write the whole index anew (atomically); called with the lock held, or alone."""
        recs = [{"version": INDEX_VERSION, "digest": f"blake2b-{DIGEST_SIZE * 8}"}]
        recs += [{"put": k, "entry": asdict(v)} for k, v in self.entries.items()]
        recs += [{"conflict": c} for c in sorted(self.conflicts)]
        recs += [{"preload": k, "record": v} for k, v in self.preloads.items()]
        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in recs).encode()
        try:
            tmp, _ = self._write_file(data)
            os.replace(tmp, self._index_path())
            self._journal = len(recs)
        except OSError as e:
            log.warning("cannot write the cache index: %s", e)

    def _note(self, rec: dict) -> None:
        """Append one record to the index; called with the lock held. When the journal
        has grown to twice what it describes it is rewritten instead (amortized O(1))."""
        if self._journal > 2 * (len(self.entries) + len(self.conflicts) + len(self.preloads)) + 64:
            return self._rewrite_index()
        try:
            with open(self._index_path(), "a", encoding="utf-8") as f:
                f.write(json.dumps(rec, separators=(",", ":")) + "\n")
            self._journal += 1
        except OSError as e:
            log.warning("cannot write the cache index: %s", e)

    def _add(self, name: str, e: Entry) -> None:
        """Count an entry in (replacing one of the same name); with the lock held."""
        self._remove(name)
        self.entries[name] = e
        self._disk += e.disk
        if e.source == "upload":
            self._lru[name] = None
            self._uploads_disk += e.disk

    def _remove(self, name: str) -> Entry | None:
        e = self.entries.pop(name, None)
        if e is not None:
            self._disk -= e.disk
            if self._lru.pop(name, 0) is None:
                self._uploads_disk -= e.disk
        return e

    def _forget(self, name: str) -> None:
        """An entry whose file is gone or changed: out of the index."""
        if self._remove(name) is not None:
            self._note({"drop": name})

    def _touch(self, name: str, e: Entry) -> None:
        e.used = time.time()
        if name in self._lru:
            self._lru.move_to_end(name)

    def total_size(self) -> int:
        """Disk bytes of the cached files."""
        return self._disk

    def _evict_for(self, n: int) -> bool:
        """Make room for one more file taking n bytes of disk under max_size and
        max_files, dropping least recently used uploads (preloaded files stay);
        False when that is impossible."""
        def fits(extra_disk: int, extra_files: int) -> bool:
            return ((self.max_size is None or self._disk - extra_disk + n <= self.max_size)
                    and (self.max_files is None or len(self.entries) - extra_files < self.max_files))
        if fits(0, 0):
            return True
        if not fits(self._uploads_disk, len(self._lru)):
            return False
        while not fits(0, 0):
            k = next(iter(self._lru))
            self._forget(k)
            _unlink(self.path(k))
            log.info("cache: evicted %s (least recently used, --cache-max-size/--cache-max-files)", k)
        return True

    # -- serving -----------------------------------------------------------------
    def load(self, h: int, peer: str | None = None):
        """A read-only mapping (or b"" when empty) of the file for hash h, or None when
        there is no servable file: not written by this cache, changed since, a hash
        with a collision, an upload while the cache is read-only, or an upload by
        another address than `peer` (None: a local caller, served any file)."""
        name = self.name(h)
        with self._lock:
            e = self.entries.get(name)
            if e is None or name in self.conflicts or (self.readonly and e.source != "preload"):
                return None
            if e.source == "upload" and e.owners and peer is not None and peer not in e.owners:
                return None
            try:
                f = open(self.path(name), "rb")
            except OSError:
                self._forget(name)
                return None
            with f:
                st = os.fstat(f.fileno())
                if not e.matches(st):
                    log.warning("cache file %s changed since it was written; not serving it", name)
                    self._forget(name)
                    return None
                self._touch(name, e)
                if e.size == 0:
                    return b""
                try:
                    return mmap.mmap(f.fileno(), e.size, prot=mmap.PROT_READ)
                except (OSError, ValueError):
                    return None

    def store(self, h: int, view, source: str = "upload", owner: str | None = None) -> str | None:
        """Keep `view` (bytes whose FNV-1a is h) as the file for h, served to `owner`
        (a peer address) if an upload; the file's path, or None when it is not kept
        (read-only cache, collision, over max_size or max_files)."""
        if self.readonly and source == "upload":
            return None
        name = self.name(h)
        n = len(view)
        digest = strong_digest(view)
        with self._lock:
            verdict = self._admit(name, digest, n, source, owner)
        if verdict != "write":
            return verdict
        # the bytes go to disk outside the lock (other sessions keep hitting); another
        # store of the same name may have happened meanwhile, so admit again after
        tmp, st = self._write_file(view)
        with self._lock:
            verdict = self._admit(name, digest, n, source, owner)
            if verdict != "write":
                _unlink(tmp)
                return verdict
            try:
                os.replace(tmp, self.path(name))
            except BaseException:
                _unlink(tmp)
                raise
            e = Entry(digest, n, st.st_mtime_ns, st.st_ino, source, time.time(), st.st_blocks * 512,
                      [owner] if owner is not None else [])
            self._add(name, e)
            if source == "preload":
                self.conflicts.discard(name)
            self._note({"put": name, "entry": asdict(e)})
        return self.path(name)

    def _admit(self, name: str, digest: str, n: int, source: str, owner: str | None) -> str | None:
        """With the lock held: "write" when the bytes should be written, else what
        store() returns (the path when the same bytes are there, None when refused)."""
        known = self._known(name)
        if name in self.conflicts and source == "upload":
            return None
        if known is not None and known.digest == digest:
            if source == "preload" and known.source != "preload":
                known.source = "preload"
                self._add(name, known)
                self._note({"put": name, "entry": asdict(known)})
            elif owner is not None and owner not in known.owners:
                known.owners = [*known.owners[-(MAX_OWNERS - 1):], owner]
                self._note({"put": name, "entry": asdict(known)})
            self._touch(name, known)
            return self.path(name)
        if known is not None and source == "upload":
            if known.source == "preload":
                log.warning("cache: an upload collides with preloaded %s (same FNV-1a, other "
                            "bytes); keeping the preloaded file", name)
                return None
            log.warning("cache: two different contents share the FNV-1a hash %s; that hash "
                        "is no longer served from the cache", name)
            self.conflicts.add(name)
            self._remove(name)
            _unlink(self.path(name))
            self._note({"conflict": name})
            return None
        if source == "upload" and not self._evict_for(_round_up(n, self._block)):
            log.info("cache: %s (%d bytes) does not fit under --cache-max-size/--cache-max-files",
                     name, n)
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
            self._forget(name)
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
            self._note({"preload": key, "record": self.preloads[key]})
        return len(names), total


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
