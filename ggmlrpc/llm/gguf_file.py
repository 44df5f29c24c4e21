"""A GGUF file: its metadata and its tensors, memory-mapped through gguf-py.

Tensor bytes are never copied in Python: each `TensorInfo.data` is a uint8 view
of the file's mapping, handed as is to SET_TENSOR or to a local buffer.
"""
from __future__ import annotations

import os
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
