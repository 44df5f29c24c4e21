"""A stand-in for `pycuda.driver` backed by host memory: enough of PyCUDA's driver API
for discovery, contexts and buffers to be tested on a machine without a GPU."""
from __future__ import annotations

import ctypes
import types


def make_pycuda(devices=(("NVIDIA Fake GPU", 8 << 30),), init_error: str | None = None):
    """(pycuda package, pycuda.driver module) for devices given as (name, total bytes)."""
    drv = types.ModuleType("pycuda.driver")

    class Error(Exception):
        pass

    class MemoryError_(Error):
        pass

    class LogicError(Error):
        pass

    drv.Error, drv.MemoryError, drv.LogicError = Error, MemoryError_, LogicError
    state = {"stack": [], "used": {i: 0 for i in range(len(devices))}, "allocs": {}}
    drv.state = state

    def init(flags=0):
        if init_error:
            raise Error(init_error)

    class Context:
        def __init__(self, index):
            self.index = index

        def push(self):
            state["stack"].append(self.index)

        @staticmethod
        def pop():
            state["stack"].pop()

        @staticmethod
        def synchronize():
            current()

    class Device:
        def __init__(self, index):
            if not 0 <= index < len(devices):
                raise LogicError("invalid device ordinal")
            self.index = index

        @staticmethod
        def count():
            return len(devices)

        def name(self):
            return devices[self.index][0]

        def total_memory(self):
            return devices[self.index][1]

        def compute_capability(self):
            return (9, 0)

        def retain_primary_context(self):
            return Context(self.index)

    def current():
        if not state["stack"]:
            raise LogicError("no current context")
        return state["stack"][-1]

    class Allocation:
        def __init__(self, n):
            self.dev = current()
            self.n = n
            self.buf = ctypes.create_string_buffer(n)
            self.ptr = ctypes.addressof(self.buf)
            state["used"][self.dev] += n
            state["allocs"][self.ptr] = self

        def __int__(self):
            return self.ptr

        def free(self):
            if state["allocs"].pop(self.ptr, None) is not None:
                state["used"][self.dev] -= self.n

    def mem_alloc(n):
        d = current()
        if state["used"][d] + n > devices[d][1]:
            raise MemoryError_("cuMemAlloc failed: out of memory")
        return Allocation(n)

    def mem_get_info():
        d = current()
        return devices[d][1] - state["used"][d], devices[d][1]

    def memset_d8(ptr, value, n):
        current()
        ctypes.memset(int(ptr), value, n)

    def memcpy_htod(dst, src):
        current()
        ctypes.memmove(int(dst), src.ctypes.data, src.nbytes)

    def memcpy_dtoh(dst, src):
        current()
        ctypes.memmove(dst.ctypes.data, int(src), dst.nbytes)

    def memcpy_dtod(dst, src, n):
        current()
        ctypes.memmove(int(dst), int(src), n)

    def register_host_memory(array, flags=0):
        return array

    for f in (init, mem_alloc, mem_get_info, memset_d8, memcpy_htod, memcpy_dtoh, memcpy_dtod,
              register_host_memory):
        setattr(drv, f.__name__, f)
    drv.Device, drv.Context = Device, Context
    pkg = types.ModuleType("pycuda")
    pkg.driver = drv
    pkg.__path__ = []
    return pkg, drv
