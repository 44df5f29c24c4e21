"""A GGUF file: its metadata and its tensors, memory-mapped through gguf-py.

Tensor bytes are never copied in Python: each `TensorInfo.data` is a uint8 view
of the file's mapping, handed as is to SET_TENSOR or to a local buffer.
"""
from __future__ import annotations

import mmap
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import ggml
from ..errors import GgmlRpcError


class ModelError(GgmlRpcError):
    """A model file is missing, not GGUF, or holds something the runner cannot use."""


@dataclass
class TensorInfo:
    name: str
    type: int              # GGMLType
    ne: tuple[int, ...]    # ggml order, 4 dims
    data: np.ndarray       # uint8 view of the mapped file

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


# GGUF value types (gguf-py's GGUFValueType): fixed sizes; 8 is a string, 9 an array
_SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
_INT_FORMAT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 10: "<Q", 11: "<q"}


class _Header:
    """A GGUF header walked once without building anything (gguf-py's reader makes two
    NumPy arrays per array item: a million empty strings took it 40 s and 1.7 GiB).
    Every count is checked against the bytes left before it is used. Keeps the
    integer and string scalars, each array's item count, and each tensor's shape."""

    def __init__(self, path: Path):
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            self.buf, self.off, self.path = m, 0, path
            try:
                self._walk()
            finally:
                self.buf = None

    def _need(self, n: int, what: str) -> int:
        if n < 0 or n > len(self.buf) - self.off:
            raise ModelError(f"{self.path}: {what} runs past the end of the file "
                             f"({len(self.buf)} bytes)")
        at = self.off
        self.off += n
        return at

    def _int(self, st: struct.Struct, what: str) -> int:
        return st.unpack_from(self.buf, self._need(st.size, what))[0]

    def _str(self, what: str) -> bytes:
        n = self._int(_U64, what)
        at = self._need(n, what)
        return self.buf[at:at + n]

    def _walk(self) -> None:
        self._need(4, "the magic")
        version = self._int(_U32, "the version")
        if version not in (2, 3):
            raise ModelError(f"{self.path}: GGUF version {version} (2 or 3 are read)")
        n_tensors, n_kv = self._int(_U64, "the header"), self._int(_U64, "the header")
        left = len(self.buf) - self.off
        # a KV takes at least 8 + 4 + 1 bytes, a tensor info 8 + 4 + 8 + 4 + 8
        if n_kv > left // 13 or n_tensors > left // 32:
            raise ModelError(f"{self.path}: {n_kv} metadata keys and {n_tensors} tensors "
                             f"cannot fit in {len(self.buf)} bytes")
        self.ints: dict[str, int] = {}
        self.strs: dict[str, str] = {}
        self.counts: dict[str, int] = {}
        for _ in range(n_kv):
            key = self._str("a metadata key").decode("utf-8", "replace")
            vtype = self._int(_U32, key)
            if vtype == _ARRAY:
                self.counts[key] = self._array(key)
            elif vtype == _STRING:
                self.strs[key] = self._str(key).decode("utf-8", "replace")
            elif vtype in _SCALAR_SIZE:
                at = self._need(_SCALAR_SIZE[vtype], key)
                if vtype in _INT_FORMAT:
                    self.ints[key] = struct.unpack_from(_INT_FORMAT[vtype], self.buf, at)[0]
            else:
                raise ModelError(f"{self.path}: metadata key {key!r} has an unknown type {vtype}")
        self.shapes: dict[str, tuple[int, ...]] = {}
        for _ in range(n_tensors):
            name = self._str("a tensor name").decode("utf-8", "replace")
            n_dims = self._int(_U32, name)
            if n_dims > 4:
                raise ModelError(f"{self.path}: tensor {name} has {n_dims} dimensions")
            self.shapes[name] = tuple(self._int(_U64, name) for _ in range(n_dims))
            self._need(12, name)   # type, offset

    def _array(self, key: str) -> int:
        itype, count = self._int(_U32, key), self._int(_U64, key)
        if itype in _SCALAR_SIZE:
            self._need(count * _SCALAR_SIZE[itype], key)
        elif itype == _STRING:
            self._need(0 if count <= (len(self.buf) - self.off) // 8 else 1 << 64, key)
            for _ in range(count):   # only the lengths are read
                self._need(self._int(_U64, key), key)
        else:
            raise ModelError(f"{self.path}: metadata array {key!r} of type {itype}")
        return count


def check_metadata(path: Path) -> None:
    """Check a GGUF file's metadata against its size and the tensors it holds before
    anything is built from it: the layer count against the layer tensors present, the
    vocabulary against the token embedding rows. Raises ModelError."""
    h = _Header(path)
    arch = h.strs.get("general.architecture", "")
    n_layer = h.ints.get(f"{arch}.block_count")
    if n_layer is not None and h.shapes:   # (a vocabulary-only file has no tensors)
        layers = {int(m.group(1)) for m in map(_LAYER.match, h.shapes) if m}
        have = max(layers) + 1 if layers else 0
        if not 0 <= n_layer <= len(h.shapes) or (n_layer and n_layer - 1 not in layers):
            raise ModelError(f"{path}: {arch}.block_count is {n_layer}, the file holds the "
                             f"tensors of {have} layers")
    n_tokens = h.counts.get("tokenizer.ggml.tokens")
    embd = h.shapes.get("token_embd.weight")
    if n_tokens is not None and embd is not None and len(embd) >= 2 and n_tokens != embd[1]:
        raise ModelError(f"{path}: {n_tokens} tokens in tokenizer.ggml.tokens, "
                         f"token_embd.weight has {embd[1]} rows")


_LAYER = re.compile(r"^blk\.(\d+)\.")


class GGUFFile:
    """Metadata (`meta[key]`: int, float, bool, str, or list) and tensors by name.
    String values are str (UTF-8, undecodable bytes replaced) except arrays read
    with `strings(key)`, which keeps the exact bytes (token texts)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelError(f"model file not found: {self.path}")
        with open(self.path, "rb") as f:
            if f.read(4) != b"GGUF":
                raise ModelError(f"{self.path} is not a GGUF file")
        check_metadata(self.path)
        try:
            import gguf
        except ImportError as e:  # pragma: no cover - a dependency
            raise ModelError("reading GGUF files needs the gguf package (pip install gguf)") from e
        try:
            self.reader = gguf.GGUFReader(str(self.path), "r")
        except Exception as e:
            raise ModelError(f"{self.path}: cannot read GGUF ({e})") from None
        self.meta: dict[str, object] = {}
        for key, field in self.reader.fields.items():
            if key.startswith("GGUF."):
                continue
            try:
                self.meta[key] = field.contents()
            except Exception:   # an undecodable string: keep the key, raw bytes via strings()
                self.meta[key] = None
        self.tensors: dict[str, TensorInfo] = {}
        for t in self.reader.tensors:
            ne = tuple(int(x) for x in t.shape) + (1,) * (4 - len(t.shape))
            raw = np.asarray(t.data).view(np.uint8).reshape(-1)
            want = ggml.nbytes(int(t.tensor_type), ne, ggml.contiguous_strides(int(t.tensor_type), ne))
            if raw.nbytes != want:
                raise ModelError(f"{self.path}: tensor {t.name} has {raw.nbytes} bytes, "
                                 f"its shape needs {want}")
            self.tensors[t.name] = TensorInfo(t.name, int(t.tensor_type), ne, raw)

    def strings(self, key: str) -> list[bytes]:
        """A string array's items as raw bytes."""
        f = self.reader.fields[key]
        return [bytes(f.parts[i]) for i in f.data]

    def get(self, key: str, default=None):
        v = self.meta.get(key)
        return default if v is None else v

    @property
    def arch(self) -> str:
        return str(self.get("general.architecture", ""))

    def close(self) -> None:
        mm = getattr(self.reader, "data", None)
        self.tensors.clear()
        self.reader = None
        if mm is not None and hasattr(mm, "_mmap") and mm._mmap is not None:
            try:
                mm._mmap.close()
            except (BufferError, ValueError):
                pass   # views still alive elsewhere: the mapping goes with them
