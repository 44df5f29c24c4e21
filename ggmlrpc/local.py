"""LocalBackend: the local CPU device in this process, with RemoteBackend's interface.

Buffers are host memory of the CPU device; graphs go through the same validation
(graph.build_graph) and the same compiled executor the server uses, with no socket
and no serialization of tensor data. Code written against RemoteBackend (the LLM
runner) runs unchanged on either.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
from typing import Sequence

import numpy as np

from . import protocol
from .buffers import BufferTable, ServerBuffer
from .client import RemoteBuffer, Tensor, rpc_tensors, tensor_array
from .errors import ValidationError
from .graph import build_graph


class _ArrayMemory:
    """Host memory that a numpy array owns (a read-only file mapping): graphs read it
    in place; nothing writes to it."""

    def __init__(self, array: np.ndarray):
        self.mem = array
        self.size = array.nbytes

    def host_address(self):
        return None if self.mem is None else (self.mem.ctypes.data, self.mem)

    def view(self) -> memoryview:
        return memoryview(self.mem).cast("B")

    def write(self, offset, data):
        raise ValidationError("a mapped buffer is read-only")

    fill = write

    def free(self):
        self.mem = None


class LocalBackend:
    """The host's CPU as one device (device 0), `n_threads` threads for graphs."""

    endpoint = "local"

    def __init__(self, n_threads: int | None = None):
        from .devices.cpu import CpuDevice

        self.device = CpuDevice(n_threads)
        self.codec = protocol.codec()
        self.version = (protocol.PROTO_MAJOR, protocol.PROTO_MINOR, protocol.PROTO_PATCH)
        self._buffers = BufferTable()   # the server session's, with the same checks
        self._handles = itertools.count(1)
        self._plan = None
        self._lock = threading.RLock()

    # the graph validator's view of a session
    def buffer(self, handle: int) -> ServerBuffer:
        return self._buffers.lookup(handle)

    @property
    def connected(self) -> bool:
        return True

    def close(self) -> None:
        with self._lock:
            self._plan = None
            for b in self._buffers.values():
                b.mem.free()
            self._buffers.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- devices ---------------------------------------------------------------
    def device_count(self) -> int:
        return 1

    def get_device_memory(self, device: int = 0) -> tuple[int, int]:
        return self.device.memory()

    def get_alignment(self, device: int = 0) -> int:
        return self.device.alignment()

    def get_max_size(self, device: int = 0) -> int:
        return self.device.max_size()

    # -- buffers -----------------------------------------------------------------
    def alloc_buffer(self, size: int, device: int = 0) -> RemoteBuffer | None:
        mem = self.device.alloc_buffer(size)
        if mem is None:
            return None
        with self._lock:
            b = self._buffers.add(next(self._handles), size, 0, mem)
        return RemoteBuffer(self, b.handle, size, b.base, 0)

    def map_buffer(self, array: np.ndarray) -> RemoteBuffer:
        """A read-only buffer over existing host memory (a GGUF file's mapping), so
        weights are used where they lie instead of being copied."""
        array = np.asarray(array).reshape(-1).view(np.uint8)
        mem = _ArrayMemory(array)
        with self._lock:
            b = self._buffers.add(next(self._handles), mem.size, 0, mem)
        return RemoteBuffer(self, b.handle, mem.size, b.base, 0)

    def free_buffer(self, buffer: RemoteBuffer) -> None:
        with self._lock:
            b = self._buffers.pop(buffer.handle, None)
            self._plan = None
        if b is not None:
            b.mem.free()

    def buffer_clear(self, buffer: RemoteBuffer, value: int = 0) -> None:
        b = self.buffer(buffer.handle)
        b.mem.fill(0, b.size, value)

    def _region(self, tensor: Tensor, offset: int, size: int) -> tuple[ServerBuffer, int]:
        if tensor.buffer is None:
            raise ValidationError(f"tensor {tensor.name!r} has no buffer")
        b = self.buffer(tensor.buffer.handle)
        start = tensor.data - b.base + offset
        if start < 0 or start + size > b.size or offset + size > tensor.nbytes:
            raise ValidationError(f"tensor {tensor.name!r}: bytes {offset}..{offset + size} out of range")
        return b, start

    # -- tensors -----------------------------------------------------------------
    def set_tensor(self, tensor: Tensor, data, offset: int = 0, weights: bool = False) -> bool:
        mv = memoryview(np.ascontiguousarray(data) if isinstance(data, np.ndarray) else data).cast("B")
        b, start = self._region(tensor, offset, len(mv))
        b.mem.write(start, mv)
        return False

    def get_tensor(self, tensor: Tensor, offset: int = 0, size: int | None = None, out=None):
        if size is None:
            size = tensor.nbytes - offset
        b, start = self._region(tensor, offset, size)
        view = b.mem.view()[start:start + size]
        if out is None:
            return bytearray(view)
        memoryview(out).cast("B")[:size] = view
        return out

    def get_array(self, tensor: Tensor) -> np.ndarray:
        return tensor_array(tensor, self.get_tensor(tensor))

    def memset_tensor(self, tensor: Tensor, value: int, offset: int = 0, size: int | None = None):
        if size is None:
            size = tensor.nbytes - offset
        b, start = self._region(tensor, offset, size)
        b.mem.fill(start, size, value)

    # -- graphs ------------------------------------------------------------------
    def graph_compute(self, nodes: Sequence[Tensor], device: int = 0) -> None:
        rpc = rpc_tensors(nodes)
        with self._lock:
            graph = build_graph(self, device, [n.id for n in nodes], rpc)
            executor = self.device.executor()
            self._plan = None
            plan = executor.compile(graph)
            self._plan = plan
            executor.run(plan)

    def graph_recompute(self, device: int = 0) -> None:
        with self._lock:
            if self._plan is None:
                raise ValidationError("graph_recompute without a stored graph")
            self.device.executor().run(self._plan)

    def synchronize(self) -> None:
        pass

    def corked(self):
        """RemoteBackend's batching of commands; here every call runs at once."""
        return contextlib.nullcontext(self)

    ping = synchronize
