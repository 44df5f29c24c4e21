"""The CPU device: host memory in anonymous mappings, graphs run by the C executor."""
from __future__ import annotations

import os

from .._native.hostmem import HostMemory
from .base import Buffer, Device, available_memory

CPU_ALIGNMENT = 32           # ggml's TENSOR_ALIGNMENT
SIZE_MAX = (1 << 64) - 1     # the CPU buffer type has no size limit


def cpu_description() -> str:
    """The CPU model name, as ggml's CPU device reports it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    _, _, value = line.partition(":")
                    if value.strip():
                        return value.strip()
    except OSError:
        pass
    return "CPU"


def physical_memory() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


class HostBuffer(Buffer):
    __slots__ = ("mem", "size")

    def __init__(self, size: int):
        self.mem = HostMemory(size)
        self.size = size

    def view(self) -> memoryview:
        return memoryview(self.mem)

    def recv_into(self, fd, offset, n, timeout_ms=-1):
        self.mem.recv_into(fd, offset, n, timeout_ms)

    def send_from(self, fd, header, offset, n, timeout_ms=-1):
        self.mem.send_from(fd, header, offset, n, timeout_ms)

    def write(self, offset, data):
        self.mem.write(offset, data)

    def read(self, offset, n):
        return bytes(memoryview(self.mem)[offset:offset + n])

    def fill(self, offset, n, value):
        self.mem.fill(offset, n, value)

    def copy_from(self, offset, src, src_offset, n):
        if not isinstance(src, HostBuffer):
            return False
        self.mem.copy_from(offset, src.mem, src_offset, n)
        return True

    def fnv1a(self, offset, n):
        return self.mem.fnv1a(offset, n)

    def free(self):
        self.mem = HostMemory(0)
        self.size = 0

    def host_address(self):
        return self.mem.addr, self.mem


class CpuDevice(Device):
    name = "CPU"

    def __init__(self, n_threads: int | None = None):
        self.description = cpu_description()
        self.n_threads = n_threads or max(1, (os.cpu_count() or 2) // 2)
        self._executor = None

    def memory(self):
        # ggml's CPU device reports all physical memory as free: "free" host
        # memory is ill-defined, and clients split layers by this number.
        total = physical_memory()
        return total, total

    def free_memory(self):
        return available_memory()

    def alignment(self):
        return CPU_ALIGNMENT

    def max_size(self):
        return SIZE_MAX

    def alloc_buffer(self, size):
        # never promise more than the host can back: a hostile size must fail here,
        # not later in the kernel's OOM killer
        if size > available_memory():
            return None
        try:
            return HostBuffer(size)
        except MemoryError:
            return None

    def executor(self):
        if self._executor is None:
            from ..compute.cpu import CpuExecutor
            self._executor = CpuExecutor(self.n_threads)
        return self._executor


def discover(n_threads: int | None = None) -> list[Device]:
    return [CpuDevice(n_threads)]
