"""The buffer table of one connection (a server session, or LocalBackend in-process):
the buffers by handle, the opaque base addresses handed out for them, and the lookup
that rejects an unknown handle."""
from __future__ import annotations

from dataclasses import dataclass

from .errors import ValidationError

# Opaque address space handed to clients: each buffer gets a base that is a
# multiple of 2 MiB, followed by a gap, so that neighbouring buffers never touch.
BASE_START = 0x0000_1000_0000_0000
BASE_GAP = 2 << 20


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


@dataclass(eq=False)
class ServerBuffer:
    handle: int
    base: int       # opaque base address (0 for an empty buffer)
    size: int
    device: int
    mem: object     # devices.Buffer, None when size == 0

    def view(self):
        return self.mem.view()


class BufferTable(dict):
    """handle -> ServerBuffer, with the next free base address."""

    def __init__(self):
        super().__init__()
        self.next_base = BASE_START

    def add(self, handle: int, size: int, device: int, mem) -> ServerBuffer:
        base = 0
        if size:
            base = self.next_base
            self.next_base += _round_up(size, BASE_GAP) + BASE_GAP
        b = self[handle] = ServerBuffer(handle, base, size, device, mem)
        return b

    def lookup(self, handle: int) -> ServerBuffer:
        b = self.get(handle)
        if b is None:
            raise ValidationError(f"unknown buffer {handle:#x}")
        return b
