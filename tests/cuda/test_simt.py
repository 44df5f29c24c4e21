"""The SIMT emulator itself: the errors it reports and the built-ins it implements."""
from __future__ import annotations

import numpy as np
import pytest

from .conftest import have_toolkit, simt

pytestmark = pytest.mark.skipif(not have_toolkit(), reason="no CUDA toolkit headers or g++")

SRC = r'''
#include <cuda_fp16.h>
extern "C" __global__ void early_return_then_barrier(float *out) {
    if (threadIdx.x == 3) return;
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}
extern "C" __global__ void shuffle_exited_lane(float *out) {
    if (threadIdx.x >= 16) return;
    out[threadIdx.x] = __shfl_down_sync(0xffffffffu, 1.0f, 1);
}
extern "C" __global__ void diverged_barrier(float *out) {
    if (threadIdx.x < 16) out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
    else __syncthreads();
}
extern "C" __global__ void reduce(float *out, const float *x, int n) {
    __shared__ float part[32];
    float v = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) v += x[i];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.0f;
        for (int w = 0; w < (int)blockDim.x / 32; w++) s += part[w];
        out[blockIdx.x] = s;
    }
}
extern "C" __global__ void read_shared_unwritten(float *out) {
    __shared__ float s[64];
    out[threadIdx.x] = s[threadIdx.x];
}
extern "C" __global__ void racy_last_writer(int *out) { out[0] = threadIdx.x; }
extern "C" __global__ void intrinsics(int *out, float *f, __half h) {
    out[0] = __dp4a(0x01020304, (int)0xff7f0201, 10);
    atomicAdd(&out[1], (int)threadIdx.x);
    atomicMax(&out[2], (int)threadIdx.x);
    unsigned b = __ballot_sync(0xffffffffu, threadIdx.x % 3 == 0);
    if (threadIdx.x == 0) out[3] = (int)b;
    int up = __shfl_up_sync(0xffffffffu, (int)threadIdx.x, 2, 8);
    if (threadIdx.x == 11) out[4] = up;
    int idx = __shfl_sync(0xffffffffu, (int)threadIdx.x * 10, 5, 16);
    if (threadIdx.x == 20) out[5] = idx;
    if (threadIdx.x == 0) f[0] = __half2float(h) * 2.0f;
}
extern "C" __global__ void overflow(float *out, int n) { out[threadIdx.x] = 0.0f; }
'''


@pytest.fixture(scope="module")
def mod():
    return simt.SourceModule(SRC)


def test_barrier_after_return(mod):
    with pytest.raises(simt.SimtError, match="__syncthreads reached after|returned while"):
        mod.get_function("early_return_then_barrier")(simt.mem_alloc(256), block=(64, 1, 1))


def test_shuffle_names_exited_lane(mod):
    with pytest.raises(simt.SimtError, match="returned|do not exist"):
        mod.get_function("shuffle_exited_lane")(simt.mem_alloc(256), block=(32, 1, 1))


def test_deadlock(mod):
    with pytest.raises(simt.SimtError, match="deadlock"):
        mod.get_function("diverged_barrier")(simt.mem_alloc(256), block=(32, 1, 1))


@pytest.mark.parametrize("order", ["forward", "reverse", "shuffled"])
def test_reduce(mod, order):
    x = np.arange(1000, dtype=np.float32)
    out = np.zeros(2, np.float32)
    mod.get_function("reduce")(simt.Out(out), simt.In(x), np.int32(1000), block=(128, 1, 1), grid=(2, 1),
                               order=order)
    assert out.tolist() == [x.sum()] * 2


def test_shared_memory_starts_as_nan(mod):
    out = np.zeros(64, np.float32)
    mod.get_function("read_shared_unwritten")(simt.Out(out), block=(64, 1, 1))
    assert np.isnan(out).all()


def test_thread_order_is_visible(mod):
    last = {}
    for order in ("forward", "reverse"):
        out = np.zeros(1, np.int32)
        mod.get_function("racy_last_writer")(simt.Out(out), block=(64, 1, 1), order=order)
        last[order] = int(out[0])
    assert last == {"forward": 63, "reverse": 0}


def test_intrinsics(mod):
    out = np.zeros(6, np.int32)
    f = np.zeros(1, np.float32)
    mod.get_function("intrinsics")(simt.InOut(out), simt.Out(f), np.float16(1.5), block=(32, 1, 1))
    assert out[0] == 4 * 1 + 3 * 2 + 2 * 127 + 1 * -1 + 10
    assert out[1] == sum(range(32)) and out[2] == 31
    assert out[3] == sum(1 << i for i in range(0, 32, 3))
    assert out[4] == 9 and out[5] == 210
    assert f[0] == 3.0


def test_write_outside_buffer(mod):
    with pytest.raises(simt.SimtError, match="outside a device buffer"):
        mod.get_function("overflow")(simt.mem_alloc(4 * 60), np.int32(60), block=(64, 1, 1))


def test_argument_sizes_checked(mod):
    with pytest.raises(TypeError, match="4 bytes where the kernel takes|8 bytes where"):
        mod.get_function("reduce")(simt.mem_alloc(8), simt.mem_alloc(8), np.int64(3), block=(32, 1, 1))
