"""Loader for the SIMT emulator: PyCUDA's shape on the CPU.

    mod = SourceModule(source, include_dirs=[...], no_extern_c=True)
    f = mod.get_function("rms_norm_f32")
    f(dst, src, np.int32(n), np.float32(eps), block=(256, 1, 1), grid=(rows, 1), shared=0)

The source is compiled with the host C++ compiler against simt.h and the CUDA
toolkit's own headers (cuda_fp16.h, cuda_bf16.h), into a shared library cached by
content hash. Arguments are what PyCUDA takes: device buffers (`mem_alloc`,
`to_device`), `In`/`Out`/`InOut` around NumPy arrays, and NumPy scalars, whose
sizes are checked against the kernel's C++ signature. Device buffers carry guard
bytes on both sides; a launch that writes outside a buffer it was given fails.
`order` (forward, reverse, shuffled) picks the order threads and blocks are resumed.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ORDERS = {"forward": 0, "reverse": 1, "shuffled": 2}
GUARD = 64                       # bytes on each side of a device buffer
GUARD_BYTE = 0xA5
_MARK = "__simt_kernel_mark__"     # what __global__ becomes in the pass that finds the kernels
_KERNEL_RE = re.compile(r'extern\s+"C"\s+' + _MARK + r'\s+void\s+(\w+)\s*\(')


class SimtError(RuntimeError):
    """A launch the emulator refused: a barrier after a return, a bad shuffle, a deadlock,
    a write outside a buffer."""


def cuda_include_dir() -> Path:
    """The toolkit's include folder: CUDA_HOME, else what nvcc on PATH says it uses."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "include" / "cuda_fp16.h").exists():
        return Path(home) / "include"
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise FileNotFoundError("no CUDA toolkit: set CUDA_HOME or put nvcc on PATH")
    out = subprocess.run([nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                         capture_output=True, text=True).stderr
    for m in re.finditer(r'-I"?([^"\s]+)', out):
        if (Path(m.group(1)) / "cuda_fp16.h").exists():
            return Path(m.group(1))
    raise FileNotFoundError("nvcc names no include folder with cuda_fp16.h")


def cache_dir() -> Path:
    d = Path(os.environ.get("GGMLRPC_SIMT_CACHE", Path(tempfile.gettempdir()) / f"ggmlrpc-simt-{os.getuid()}"))
    d.mkdir(parents=True, exist_ok=True)
    return d


# ---- device memory ----

class DeviceBuffer:
    """Host memory standing in for a device allocation, with guard bytes around it."""

    def __init__(self, nbytes: int):
        self.nbytes = int(nbytes)
        self._raw = np.full(self.nbytes + 2 * GUARD + 16, GUARD_BYTE, dtype=np.uint8)
        start = (-self._raw.ctypes.data) % 16 + GUARD   # 16-byte aligned data, as cudaMalloc's are
        self._start = start
        self.ptr = self._raw.ctypes.data + start
        self.data = self._raw[start:start + self.nbytes]
        self.data[:] = 0xFF            # uninitialised memory reads as NaN

    def __int__(self):
        return self.ptr

    def check_guards(self) -> None:
        lo = self._raw[:self._start]
        hi = self._raw[self._start + self.nbytes:]
        if (lo != GUARD_BYTE).any() or (hi != GUARD_BYTE).any():
            raise SimtError(f"a kernel wrote outside a device buffer of {self.nbytes} bytes")


class Offset:
    """A pointer `nbytes` into a device buffer (PyCUDA: int(allocation) + nbytes)."""

    def __init__(self, base: DeviceBuffer, nbytes: int):
        self.base = base.base if isinstance(base, Offset) else base
        self.ptr = base.ptr + int(nbytes)

    def __int__(self):
        return self.ptr


def mem_alloc(nbytes: int) -> DeviceBuffer:
    return DeviceBuffer(nbytes)


def memcpy_htod(dst: DeviceBuffer, src: np.ndarray) -> None:
    b = np.ascontiguousarray(src).view(np.uint8).reshape(-1)
    dst.data[:b.size] = b


def memcpy_dtoh(dst: np.ndarray, src: DeviceBuffer) -> None:
    dst.view(np.uint8).reshape(-1)[:] = src.data[:dst.nbytes]


def to_device(a: np.ndarray) -> DeviceBuffer:
    buf = DeviceBuffer(a.nbytes)
    memcpy_htod(buf, a)
    return buf


class _Arg:
    def __init__(self, array: np.ndarray):
        self.array = array


class In(_Arg):
    pass


class Out(_Arg):
    pass


class InOut(_Arg):
    pass


# ---- modules ----

class Function:
    def __init__(self, module: "SourceModule", name: str):
        lib = module.lib
        self.name = name
        self._entry = ctypes.cast(getattr(lib, f"simt_entry_{name}"), ctypes.c_void_p)
        sig = getattr(lib, f"simt_sig_{name}")
        sizes = (ctypes.c_int * 64)()
        n = sig(sizes, 64)
        self.arg_sizes = list(sizes[:n])
        self._launch = lib.simt_launch
        self._launch.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                 ctypes.c_size_t, ctypes.c_int, ctypes.c_ulonglong, ctypes.c_char_p,
                                 ctypes.c_int]
        self.order = module.order
        self.seed = module.seed

    def __call__(self, *args, block, grid=(1, 1), shared=0, order=None, seed=None):
        if len(args) != len(self.arg_sizes):
            raise TypeError(f"{self.name} takes {len(self.arg_sizes)} arguments, got {len(args)}")
        keep, slots, copies, buffers = [], [], [], []
        for i, (a, size) in enumerate(zip(args, self.arg_sizes)):
            if isinstance(a, _Arg):
                buf = to_device(a.array) if not isinstance(a, Out) else DeviceBuffer(a.array.nbytes)
                if not isinstance(a, In):
                    copies.append((a.array, buf))
                a = buf
            if isinstance(a, (DeviceBuffer, Offset)):
                buffers.append(a.base if isinstance(a, Offset) else a)
                val = ctypes.c_void_p(a.ptr)
                got = ctypes.sizeof(val)
            elif isinstance(a, (np.generic,)):
                raw = a.tobytes()
                val = ctypes.create_string_buffer(raw, max(len(raw), 1))
                got = len(raw)
            else:
                raise TypeError(f"{self.name} argument {i}: {type(a).__name__} "
                                f"(pass a device buffer, In/Out/InOut or a NumPy scalar)")
            if got != size:
                raise TypeError(f"{self.name} argument {i}: {got} bytes where the kernel takes {size}")
            keep.append(val)
            slots.append(ctypes.cast(ctypes.pointer(val), ctypes.c_void_p))
        argv = (ctypes.c_void_p * max(1, len(slots)))(*slots)
        block = tuple(block) + (1,) * (3 - len(block))
        grid = tuple(grid) + (1,) * (3 - len(grid))
        err = ctypes.create_string_buffer(512)
        order = self.order if order is None else order
        rc = self._launch(self._entry, argv, (ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block),
                          shared, ORDERS[order], self.seed if seed is None else seed, err, 512)
        if rc:
            raise SimtError(f"{self.name}: {err.value.decode()}")
        for b in buffers:
            b.check_guards()
        for array, buf in copies:
            memcpy_dtoh(array, buf)


class SourceModule:
    """Compiles `source` (the text of a .cu file) for the emulator."""

    def __init__(self, source: str, include_dirs=(), no_extern_c=True, options=(), order="forward",
                 seed=0, **_ignored):
        if not no_extern_c:
            raise ValueError("kernels are declared extern \"C\" in the source (no_extern_c=True)")
        self.order = order
        self.seed = seed
        flags = ["-std=c++17", "-O1", "-g0", "-fPIC", "-w", "-fno-strict-aliasing",
                 f"-I{HERE}", f"-I{cuda_include_dir()}", *[f"-I{d}" for d in include_dirs], *options]
        key = hashlib.sha256(("\0".join([source, *flags, (HERE / "simt.h").read_text(),
                                          *_include_texts(include_dirs)])).encode()).hexdigest()[:24]
        so = cache_dir() / f"{key}.so"
        cxx = os.environ.get("CXX", "g++")
        if not so.exists():
            with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
                src = Path(tmp) / "k.cpp"
                src.write_text('#include "simt.h"\n' + source + "\n")
                # kernels made by macros have names only after preprocessing
                pre = subprocess.run([cxx, *flags, f"-D__global__={_MARK}", "-E", str(src)],
                                     capture_output=True, text=True)
                if pre.returncode:
                    raise RuntimeError(f"emulator preprocessing failed:\n{pre.stderr[-4000:]}")
                names = sorted(set(_KERNEL_RE.findall(pre.stdout)))
                src.write_text(src.read_text() + "".join(f"SIMT_EXPORT({n})\n" for n in names))
                out = Path(tmp) / "k.so"
                r = subprocess.run([cxx, *flags, "-shared", str(src), "-o", str(out)],
                                   capture_output=True, text=True)
                if r.returncode:
                    raise RuntimeError(f"emulator compile failed:\n{r.stderr[-4000:]}")
                os.replace(out, so)
        self.lib = ctypes.CDLL(str(so))

    def get_function(self, name: str) -> Function:
        return Function(self, name)


def _include_texts(include_dirs):
    for d in include_dirs:
        for p in sorted(Path(d).glob("*.cuh")):
            yield p.read_text()
