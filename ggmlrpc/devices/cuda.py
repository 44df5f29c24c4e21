"""CUDA devices through PyCUDA (optional extra `ggmlrpc[cuda]`).

Every device the driver shows (the driver applies CUDA_VISIBLE_DEVICES) becomes
CUDA0..N in the driver's order, as llama.cpp names them. A host without PyCUDA, a
driver or a GPU has no CUDA devices; discovery says why at debug level.

Buffers live in device memory; SET/GET/COPY/MEMSET go through pinned host staging
(page-locked chunks the socket reads into and sends from). GET_ALIGNMENT,
GET_ALLOC_SIZE and GET_MAX_SIZE answer as ggml's CUDA buffer type does.

Graphs run through ggmlrpc.compute.cuda (the .cu kernels launched through PyCUDA).
That executor replays whole transformer sessions in the SIMT emulator, but has not
yet run on a GPU, so discovery hands out CUDA devices only when
GGMLRPC_CUDA_PREVIEW=1; without it a GPU host keeps serving from its CPU as before.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading

from ..ggml import is_quantized, type_size, blck_size
from .base import Buffer, Device

log = logging.getLogger("ggmlrpc.devices")

CUDA_ALIGNMENT = 128         # ggml_backend_cuda_buffer_type_get_alignment
MATRIX_ROW_PADDING = 512     # quantized rows padded to this many elements (ggml-cuda common.cuh)
SIZE_MAX = (1 << 64) - 1     # the CUDA buffer type sets no maximum
STAGE_BYTES = 8 << 20        # one pinned staging chunk per device
EXECUTOR_READY = False       # flips once the executor's tests pass on a GPU (tests/cuda -m cuda)
PREVIEW_ENV = "GGMLRPC_CUDA_PREVIEW"


def padded_alloc_size(type_: int, ne0: int, nbytes: int) -> int:
    """ggml's CUDA get_alloc_size: a quantized tensor whose rows are not a multiple of
    MATRIX_ROW_PADDING gets room for the rest of the last row's padding."""
    if is_quantized(type_) and ne0 % MATRIX_ROW_PADDING:
        pad = MATRIX_ROW_PADDING - ne0 % MATRIX_ROW_PADDING
        nbytes += pad // blck_size(type_) * type_size(type_)
    return nbytes


class _Staging:
    """A page-locked host chunk for one device's transfers (one transfer at a time)."""

    def __init__(self, cuda, nbytes: int):
        import numpy as np

        from .._native.hostmem import HostMemory

        self.mem = HostMemory(nbytes)
        self.size = nbytes
        self.view = memoryview(self.mem)
        self.array = np.frombuffer(self.view, dtype=np.uint8)
        try:
            self.pinned = cuda.register_host_memory(self.array)
        except Exception as e:  # still correct, only slower
            log.debug("CUDA staging not page-locked: %s", e)
            self.pinned = self.array
        self.lock = threading.Lock()


class CudaBuffer(Buffer):
    __slots__ = ("device", "size", "alloc", "ptr")

    def __init__(self, device: "CudaDevice", size: int):
        self.device = device
        self.size = size
        cuda = device.cuda
        with device.context():
            self.alloc = cuda.mem_alloc(max(size, 1))
            if size:
                cuda.memset_d8(int(self.alloc), 0, size)
        self.ptr = int(self.alloc)

    def device_address(self, device):
        return self.ptr if device is None or device is self.device else None

    def _chunks(self, offset: int, n: int):
        step = self.device.staging().size
        for pos in range(0, n, step):
            yield pos, min(step, n - pos)

    def write(self, offset, data):
        src = memoryview(data).cast("B")
        st = self.device.staging()
        with st.lock, self.device.context():
            for pos, m in self._chunks(offset, len(src)):
                st.view[:m] = src[pos:pos + m]
                self.device.cuda.memcpy_htod(self.ptr + offset + pos, st.pinned[:m])

    def read(self, offset, n):
        out = bytearray(n)
        st = self.device.staging()
        with st.lock, self.device.context():
            for pos, m in self._chunks(offset, n):
                self.device.cuda.memcpy_dtoh(st.pinned[:m], self.ptr + offset + pos)
                out[pos:pos + m] = st.view[:m]
        return bytes(out)

    def recv_into(self, fd, offset, n, timeout_ms=-1):
        st = self.device.staging()
        with st.lock:
            for pos, m in self._chunks(offset, n):
                st.mem.recv_into(fd, 0, m, timeout_ms)
                with self.device.context():
                    self.device.cuda.memcpy_htod(self.ptr + offset + pos, st.pinned[:m])

    def send_from(self, fd, header, offset, n, timeout_ms=-1):
        st = self.device.staging()
        with st.lock:
            if n == 0:
                st.mem.send_from(fd, header, 0, 0, timeout_ms)
            for pos, m in self._chunks(offset, n):
                with self.device.context():
                    self.device.cuda.memcpy_dtoh(st.pinned[:m], self.ptr + offset + pos)
                st.mem.send_from(fd, header if pos == 0 else b"", 0, m, timeout_ms)

    def fill(self, offset, n, value):
        if n:
            with self.device.context():
                self.device.cuda.memset_d8(self.ptr + offset, value & 0xFF, n)

    def copy_from(self, offset, src, src_offset, n):
        if not isinstance(src, CudaBuffer) or src.device is not self.device:
            return False
        if n:
            with self.device.context():
                self.device.cuda.memcpy_dtod(self.ptr + offset, src.ptr + src_offset, n)
        return True

    def fnv1a(self, offset, n):
        from ..protocol import native_codec

        codec = native_codec()
        st = self.device.staging()
        h = None
        with st.lock, self.device.context():
            for pos, m in self._chunks(offset, n):
                self.device.cuda.memcpy_dtoh(st.pinned[:m], self.ptr + offset + pos)
                h = codec.fnv1a(st.array[:m]) if h is None else codec.fnv1a(st.array[:m], h)
        return codec.fnv1a(b"") if h is None else h

    def free(self):
        if self.size:
            with self.device.context():
                self.alloc.free()
        self.size = 0


class CudaDevice(Device):
    def __init__(self, cuda, index: int, kernels=None):
        """cuda: pycuda.driver (or a stand-in); kernels: a ggmlrpc.cuda.Kernels to use
        instead of compiling the .cu files through PyCUDA (the tests' emulator)."""
        self.cuda = cuda
        self.index = index
        self.dev = cuda.Device(index)
        self.name = f"CUDA{index}"
        self.description = self.dev.name()
        self._ctx = None
        self._lock = threading.RLock()
        self._staging = None
        self._kernels = kernels
        self._executor = None

    @contextlib.contextmanager
    def context(self):
        """This device's primary context, current on the calling thread."""
        with self._lock:
            if self._ctx is None:
                self._ctx = self.dev.retain_primary_context()
        self._ctx.push()
        try:
            yield
        finally:
            self.cuda.Context.pop()

    def staging(self) -> _Staging:
        with self._lock:
            if self._staging is None:
                with self.context():
                    self._staging = _Staging(self.cuda, STAGE_BYTES)
            return self._staging

    def memory(self):
        with self.context():
            free, total = self.cuda.mem_get_info()
        return free, total

    def alignment(self):
        return CUDA_ALIGNMENT

    def max_size(self):
        return SIZE_MAX

    def alloc_size(self, tensor, nbytes):
        return padded_alloc_size(tensor.type, tensor.ne[0], nbytes)

    def init_tensor(self, buffer, tensor, offset: int | None = None):
        """Zero a quantized tensor's row padding (ggml does, so padded reads see no NaN)."""
        if offset is None or tensor.view_src or not isinstance(buffer, CudaBuffer):
            return
        end = min(offset + self.alloc_size(tensor, tensor.nbytes), buffer.size)
        start = offset + tensor.nbytes
        if end > start:
            buffer.fill(start, end - start, 0)

    def alloc_buffer(self, size):
        try:
            return CudaBuffer(self, size)
        except Exception as e:  # cuda.MemoryError, LogicError: no memory for it
            log.debug("%s: allocation of %d bytes failed: %s", self.name, size, e)
            return None

    def kernels(self):
        """The .cu kernels compiled for this device (PyCUDA's cache keeps the binaries)."""
        if self._kernels is None:
            from ..cuda import pycuda_kernels
            self._kernels = pycuda_kernels(self.dev)
        return self._kernels

    def executor(self):
        """The graph executor: this device's kernels launched through its driver."""
        with self._lock:
            if self._executor is None:
                from ..compute.cuda import CudaExecutor
                self._executor = CudaExecutor(self.kernels, self.cuda, self.context, device=self)
            return self._executor


def cuda_devices() -> list[CudaDevice]:
    """Every CUDA device the driver shows, or [] with the reason logged."""
    try:
        import pycuda.driver as cuda
    except ModuleNotFoundError as e:
        log.debug("CUDA backend skipped: PyCUDA is not installed (%s); pip install 'ggmlrpc[cuda]'", e)
        return []
    except ImportError as e:  # PyCUDA is there, the driver library (libcuda) is not
        log.debug("CUDA backend skipped: PyCUDA cannot load the CUDA driver (%s)", e)
        return []
    try:
        cuda.init()
        n = cuda.Device.count()
    except Exception as e:  # pycuda.driver.Error, RuntimeError: no driver or no usable device
        log.debug("CUDA backend skipped: the CUDA driver did not start (%s)", e)
        return []
    if n == 0:
        log.debug("CUDA backend skipped: no CUDA device visible (CUDA_VISIBLE_DEVICES=%r)",
                  os.environ.get("CUDA_VISIBLE_DEVICES"))
        return []
    return [CudaDevice(cuda, i) for i in range(n)]


def discover(n_threads: int | None = None):
    devices = cuda_devices()
    if devices and not EXECUTOR_READY and os.environ.get(PREVIEW_ENV) != "1":
        log.debug("CUDA backend skipped: %s found, but graphs do not run on CUDA yet (%s=1 exposes them)",
                  ", ".join(f"{d.name} ({d.description})" for d in devices), PREVIEW_ENV)
        return []
    return devices
