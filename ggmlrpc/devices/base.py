"""Device and Buffer: what the server asks of a compute device."""
from __future__ import annotations

import abc
import os

from ..protocol import RpcTensor


def available_memory() -> int:
    """MemAvailable from /proc/meminfo (what a new allocation can really get)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


class Buffer(abc.ABC):
    """Device memory of a fixed size. Offsets are bytes from the buffer's start.

    Callers (the server) check every range before calling; implementations may
    assume offset + n <= size.
    """

    size: int

    @abc.abstractmethod
    def recv_into(self, fd: int, offset: int, n: int, timeout_ms: int = -1) -> None:
        """Receive n bytes from a socket straight into the buffer."""

    @abc.abstractmethod
    def send_from(self, fd: int, header: bytes, offset: int, n: int, timeout_ms: int = -1) -> None:
        """Send header followed by n bytes of the buffer."""

    @abc.abstractmethod
    def write(self, offset: int, data) -> None: ...

    @abc.abstractmethod
    def read(self, offset: int, n: int) -> bytes: ...

    @abc.abstractmethod
    def fill(self, offset: int, n: int, value: int) -> None: ...

    @abc.abstractmethod
    def copy_from(self, offset: int, src: "Buffer", src_offset: int, n: int) -> bool:
        """Copy from another buffer; False when this device cannot read src directly."""

    @abc.abstractmethod
    def fnv1a(self, offset: int, n: int) -> int: ...

    def free(self) -> None:
        """Release the memory now (also happens when the object is collected)."""

    def host_address(self) -> tuple[int, object] | None:
        """Where the CPU executor reads and writes the buffer in place: (the address of
        its byte 0 in this process, the object owning that memory, which a plan holds
        while it points there); None when the buffer is not in host memory."""
        return None

    def device_address(self, device) -> int | None:
        """The buffer's byte 0 in the memory of `device` (a kernel argument of its
        executor); None when the buffer is not that device's memory."""
        return None


class Device(abc.ABC):
    """One compute device exposed over RPC (a CPU, a CUDA GPU)."""

    name: str          # as llama.cpp names it: CPU, CUDA0, ...
    description: str   # CPU model, GPU name

    @abc.abstractmethod
    def memory(self) -> tuple[int, int]:
        """(free, total) bytes, as the device reports them to clients."""

    def free_memory(self) -> int:
        """Bytes a new allocation can really get now (the server's default memory
        limit comes from this at start); by default the free memory reported."""
        return self.memory()[0]

    @abc.abstractmethod
    def alignment(self) -> int: ...

    @abc.abstractmethod
    def max_size(self) -> int: ...

    @abc.abstractmethod
    def alloc_buffer(self, size: int) -> Buffer | None:
        """A new zero-filled buffer, or None when the memory cannot be had."""

    def alloc_size(self, tensor: RpcTensor, nbytes: int) -> int:
        """Bytes a tensor needs in this device's buffers (ggml's get_alloc_size)."""
        return nbytes

    def init_tensor(self, buffer: Buffer | None, tensor: RpcTensor, offset: int | None = None) -> None:
        """Prepare a tensor's memory at `offset` bytes into buffer (CUDA zeroes the padding
        of quantized rows); nothing on CPU."""

    @abc.abstractmethod
    def executor(self):
        """The graph executor of this device (see ggmlrpc.compute)."""
