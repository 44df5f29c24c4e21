"""CUDA kernel tests on the CPU: the package's .cu files run in the SIMT emulator
(tests/cuda/simt) in forward, reverse and shuffled thread order, checked against
NumPy / gguf-py references with test-backend-ops' NMSE thresholds."""
from __future__ import annotations

import functools
import importlib.util
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from ggmlrpc.cuda import Kernels
from tests.conftest import nmse

HERE = Path(__file__).resolve().parent


def _load_simt():
    name = "ggmlrpc_tests_simt"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, HERE / "simt" / "simt.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


simt = _load_simt()


def have_toolkit() -> bool:
    try:
        simt.cuda_include_dir()
    except FileNotFoundError:
        return False
    return shutil.which("g++") is not None


ORDERS = ("forward", "reverse", "shuffled")


class EmulatedKernels(Kernels):
    """The package's kernels in the emulator, with the memory helpers the tests use."""

    on_device = False

    def __init__(self, order: str):
        super().__init__(functools.partial(simt.SourceModule, order=order, seed=1234))

    def dev(self, a: np.ndarray):
        return simt.to_device(np.ascontiguousarray(a))

    def empty(self, nbytes: int):
        return simt.mem_alloc(nbytes)

    def offset(self, buf, nbytes: int):
        return simt.Offset(buf, nbytes)

    def read(self, buf, shape, dtype=np.float32) -> np.ndarray:
        out = np.empty(shape, dtype=dtype)
        simt.memcpy_dtoh(out, buf)
        return out


class DeviceKernels(Kernels):
    """The same kernels compiled by PyCUDA on the first CUDA device (GPU-only runs)."""

    on_device = True

    def __init__(self):
        import pycuda.driver as cuda

        from ggmlrpc.cuda import pycuda_kernels

        cuda.init()
        self.cuda = cuda
        self.ctx = cuda.Device(0).retain_primary_context()
        self.ctx.push()
        k = pycuda_kernels(cuda.Device(0))
        super().__init__(k._source_module, **k._options)

    def dev(self, a: np.ndarray):
        return self.cuda.to_device(np.ascontiguousarray(a))

    def empty(self, nbytes: int):
        return self.cuda.mem_alloc(max(1, nbytes))

    def offset(self, buf, nbytes: int):
        return np.intp(int(buf) + nbytes)

    def read(self, buf, shape, dtype=np.float32) -> np.ndarray:
        out = np.empty(shape, dtype=dtype)
        self.cuda.Context.synchronize()
        self.cuda.memcpy_dtoh(out, buf)
        return out


def _device_kernels():
    try:
        import pycuda.driver as cuda
        cuda.init()
        if cuda.Device.count() == 0:
            return None, "no CUDA device"
    except Exception as e:  # ImportError, pycuda.driver.Error
        return None, f"no PyCUDA or driver: {e}"
    return DeviceKernels(), None


@pytest.fixture(scope="session", params=[*ORDERS, pytest.param("device", marks=pytest.mark.cuda)])
def k(request):
    """The package's kernels: in the emulator in one thread order, or on a real device."""
    if request.param == "device":
        kernels, why = _device_kernels()
        if kernels is None:
            pytest.skip(why)
        return kernels
    if not have_toolkit():
        pytest.skip("no CUDA toolkit headers (cuda_fp16.h) or no g++ for the emulator")
    return EmulatedKernels(request.param)


@pytest.fixture
def rng(seed):
    return np.random.default_rng(seed)


def assert_close(ours, ref, max_nmse=1e-7):
    ours = np.asarray(ours)
    ref = np.asarray(ref).reshape(ours.shape)
    fo, fr = np.isfinite(ours), np.isfinite(ref)
    np.testing.assert_array_equal(fo, fr, err_msg="non-finite entries differ")
    err = nmse(ours[fo], ref[fr])
    assert err <= max_nmse, f"NMSE {err:.3g} > {max_nmse:g}"


def cpu_ref(make, *inputs):
    """The result of `make(*leaves)` on our CPU executor (the reference ggml-equivalent
    semantics), for inputs given as (GGMLType, ne, array)."""
    from ggmlrpc import builder as B
    from ggmlrpc.local import LocalBackend

    with LocalBackend(1) as be:
        leaves = [B.Tensor(t, tuple(ne) + (1,) * (4 - len(ne)), name=f"in{i}") for i, (t, ne, _) in enumerate(inputs)]
        offs, size = [], 0
        for t in leaves:
            offs.append(size)
            size += (t.nbytes + 63) // 64 * 64
        buf = be.alloc_buffer(max(size, 64))
        placed = []
        for t, off, (_, _, a) in zip(leaves, offs, inputs):
            p = buf.tensor(t.type, t.ne, off, t.name)
            be.set_tensor(p, np.ascontiguousarray(a))
            placed.append(p)
        y = make(*placed)
        g = B.Graph()
        g.expand(y, output=True)
        alloc = B.Allocator()
        comp = be.alloc_buffer(max(alloc.plan(g), 64))
        alloc.place(comp)
        be.graph_compute(g.nodes)
        return be.get_array(y)


# byte offsets of the f16 scale fields of the types gguf-py cannot quantize
_SCALE_FIELDS = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
                 "IQ4_NL": (0,), "IQ4_XS": (0,)}


def random_weights(rng, type_, nrows: int, ncols: int) -> np.ndarray:
    """(nrows, row bytes) of weights of type_: gguf-py's quantization of normal values,
    or for the types it cannot quantize, random blocks with moderate f16 scales."""
    from gguf import GGMLQuantizationType as Q, quants

    qt = Q[type_.name]
    x = rng.standard_normal((nrows, ncols)).astype(np.float32)
    if type_.name == "F32":
        return x.view(np.uint8)
    if type_.name not in _SCALE_FIELDS:
        return np.ascontiguousarray(quants.quantize(x, qt)).view(np.uint8).reshape(nrows, -1)
    qk, bs = quants.GGML_QUANT_SIZES[qt]
    blocks = rng.integers(0, 256, (nrows, ncols // qk, bs), dtype=np.uint8)
    for off in _SCALE_FIELDS[type_.name]:
        d = (rng.random((nrows, ncols // qk)) * 0.02 + 0.002).astype(np.float16)
        blocks[:, :, off:off + 2] = d.view(np.uint8).reshape(nrows, ncols // qk, 2)
    return blocks.reshape(nrows, -1)


def dequantize(type_, data: np.ndarray) -> np.ndarray:
    from gguf import GGMLQuantizationType as Q, quants

    if type_.name == "F32":
        return data.view(np.float32)
    return quants.dequantize(data, Q[type_.name])
