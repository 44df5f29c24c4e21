"""devices/cuda.py without a GPU: discovery and selection with PyCUDA missing, without a
driver, without a device and with (fake) devices; CUDA buffers on a fake driver."""
from __future__ import annotations

import logging
import socket
import sys
import threading

import numpy as np
import pytest

from ggmlrpc import devices
from ggmlrpc.cli.server import device_line
from ggmlrpc.devices import cuda as cuda_dev
from ggmlrpc.errors import DeviceError
from ggmlrpc.ggml import GGMLType as T
from ggmlrpc.protocol import RpcTensor, native_codec

from .fake_pycuda import make_pycuda


def install(monkeypatch, **kw):
    pkg, drv = make_pycuda(**kw)
    monkeypatch.setitem(sys.modules, "pycuda", pkg)
    monkeypatch.setitem(sys.modules, "pycuda.driver", drv)
    return drv


def test_without_pycuda(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "pycuda", None)
    monkeypatch.setitem(sys.modules, "pycuda.driver", None)
    with caplog.at_level(logging.DEBUG, "ggmlrpc.devices"):
        assert cuda_dev.cuda_devices() == []
        chosen = devices.select_devices(None, 1)
    assert "PyCUDA is not installed" in caplog.text
    assert [d.name for d in chosen] == ["CPU"]


class _NoDriverLibrary:
    """A meta path finder: `pycuda.driver` exists but its extension cannot load libcuda."""

    def find_spec(self, name, path=None, target=None):
        if name in ("pycuda.driver", "pycuda._driver"):
            raise ImportError("libcuda.so.1: cannot open shared object file: No such file or directory")
        return None


def test_pycuda_without_driver_library(monkeypatch, caplog):
    pkg, _ = make_pycuda()
    del pkg.driver
    monkeypatch.setitem(sys.modules, "pycuda", pkg)
    monkeypatch.delitem(sys.modules, "pycuda.driver", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_NoDriverLibrary(), *sys.meta_path])
    with caplog.at_level(logging.DEBUG, "ggmlrpc.devices"):
        assert cuda_dev.cuda_devices() == []
        assert [d.name for d in devices.select_devices(None, 1)] == ["CPU"]
    assert "cannot load the CUDA driver" in caplog.text and "libcuda.so.1" in caplog.text


def test_without_driver(monkeypatch, caplog):
    install(monkeypatch, init_error="cuInit failed: no CUDA-capable device is detected")
    with caplog.at_level(logging.DEBUG, "ggmlrpc.devices"):
        assert cuda_dev.cuda_devices() == []
    assert "driver did not start" in caplog.text and "cuInit failed" in caplog.text


def test_without_device(monkeypatch, caplog):
    install(monkeypatch, devices=())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with caplog.at_level(logging.DEBUG, "ggmlrpc.devices"):
        assert cuda_dev.cuda_devices() == []
        assert [d.name for d in devices.select_devices(None, 1)] == ["CPU"]
    assert "no CUDA device visible" in caplog.text


def test_devices_wait_for_the_executor(monkeypatch, caplog):
    install(monkeypatch, devices=(("GPU A", 1 << 30),))
    monkeypatch.delenv(cuda_dev.PREVIEW_ENV, raising=False)
    with caplog.at_level(logging.DEBUG, "ggmlrpc.devices"):
        assert [d.name for d in devices.select_devices(None, 1)] == ["CPU"]
    assert "CUDA0 (GPU A) found" in caplog.text


def test_discovery_and_selection(monkeypatch):
    install(monkeypatch, devices=(("GPU A", 1 << 30), ("GPU B", 3 << 30)))
    monkeypatch.setenv(cuda_dev.PREVIEW_ENV, "1")
    chosen = devices.select_devices(None, 1)            # accelerators only by default
    assert [(d.name, d.description) for d in chosen] == [("CUDA0", "GPU A"), ("CUDA1", "GPU B")]
    assert [d.name for d in devices.select_devices(["CUDA1", "CPU"], 1)] == ["CUDA1", "CPU"]
    with pytest.raises(DeviceError, match="unknown device: CUDA2"):
        devices.select_devices(["CUDA2"], 1)
    assert device_line(chosen[1]) == "  CUDA1: GPU B (3072 MiB, 3072 MiB free)"
    d = chosen[0]
    assert (d.alignment(), d.max_size()) == (128, (1 << 64) - 1)
    from ggmlrpc.compute.cuda import CudaExecutor
    assert isinstance(d.executor(), CudaExecutor) and d.executor() is d.executor()


def test_alloc_size_pads_quantized_rows():
    t = RpcTensor(type=T.Q4_0, ne=(100, 3, 1, 1))
    # (512 - 100) / 32 blocks of 18 bytes more, only when the row is not a multiple of 512
    assert cuda_dev.padded_alloc_size(T.Q4_0, 96, 54 * 3) == 54 * 3 + (512 - 96) // 32 * 18
    assert cuda_dev.padded_alloc_size(T.Q4_0, 1024, 576) == 576
    assert cuda_dev.padded_alloc_size(T.F16, 100, 200) == 200
    assert t.ne[0] == 100


@pytest.fixture
def gpu(monkeypatch):
    drv = install(monkeypatch, devices=(("GPU A", 1 << 26),))
    monkeypatch.setattr(cuda_dev, "STAGE_BYTES", 4096)     # transfers of several chunks
    return cuda_dev.CudaDevice(drv, 0)


def test_buffer_transfers(gpu, rng):
    buf = gpu.alloc_buffer(20000)
    assert buf.read(0, 20000) == bytes(20000)          # zero-filled
    data = rng.integers(0, 256, 15000, dtype=np.uint8).tobytes()
    buf.write(1000, data)
    assert buf.read(1000, 15000) == data
    assert buf.fnv1a(1000, 15000) == native_codec().fnv1a(data)
    buf.fill(2000, 5000, 0x1FF)
    assert buf.read(2000, 5000) == b"\xff" * 5000
    other = gpu.alloc_buffer(9000)
    assert other.copy_from(10, buf, 1000, 8000)
    assert other.read(10, 8000) == buf.read(1000, 8000)
    assert not other.copy_from(0, object(), 0, 1)
    free, total = gpu.memory()
    assert total - free == 29000
    buf.free()
    assert gpu.memory()[1] - gpu.memory()[0] == 9000
    assert gpu.alloc_buffer(1 << 27) is None           # more than the device has


def test_buffer_socket_io(gpu, rng):
    buf = gpu.alloc_buffer(12000)
    data = rng.integers(0, 256, 10000, dtype=np.uint8).tobytes()
    a, b = socket.socketpair()
    with a, b:
        t = threading.Thread(target=a.sendall, args=(data,))
        t.start()
        buf.recv_into(b.fileno(), 1500, len(data), 5000)
        t.join()
        assert buf.read(1500, len(data)) == data
        got = bytearray()
        t = threading.Thread(target=buf.send_from, args=(b.fileno(), b"HDR", 1500, len(data), 5000))
        t.start()
        while len(got) < len(data) + 3:
            got += a.recv(65536)
        t.join()
    assert bytes(got) == b"HDR" + data


def test_init_tensor_zeroes_row_padding(gpu):
    buf = gpu.alloc_buffer(4096)
    buf.fill(0, 4096, 0xAB)
    t = RpcTensor(type=T.Q8_0, ne=(64, 2, 1, 1), nbytes=2 * 2 * 34)
    gpu.init_tensor(buf, t, 100)
    pad = gpu.alloc_size(t, t.nbytes) - t.nbytes
    assert pad == (512 - 64) // 32 * 34
    raw = buf.read(0, 4096)
    assert raw[100:100 + t.nbytes] == b"\xab" * t.nbytes
    assert raw[100 + t.nbytes:100 + t.nbytes + pad] == bytes(pad)
    assert raw[100 + t.nbytes + pad:] == b"\xab" * (4096 - 100 - t.nbytes - pad)


@pytest.mark.cuda
def test_real_device_buffers(monkeypatch, rng):
    """On a host with a GPU and PyCUDA: the same buffer checks on real device memory."""
    monkeypatch.setenv(cuda_dev.PREVIEW_ENV, "1")
    found = cuda_dev.cuda_devices()
    if not found:
        pytest.skip("no CUDA device (PyCUDA, driver or GPU missing)")
    d = found[0]
    free, total = d.memory()
    assert 0 < free <= total
    print(f"\n{device_line(d)}")
    buf = d.alloc_buffer(3 * cuda_dev.STAGE_BYTES + 5)
    data = rng.integers(0, 256, buf.size - 3, dtype=np.uint8).tobytes()
    buf.write(3, data)
    assert buf.read(3, len(data)) == data
    assert buf.fnv1a(3, len(data)) == native_codec().fnv1a(data)
    buf.fill(0, 100, 7)
    assert buf.read(0, 100) == b"\x07" * 100
    other = d.alloc_buffer(1000)
    assert other.copy_from(0, buf, 3, 1000) and other.read(0, 1000) == buf.read(3, 1000)
    buf.free()
    other.free()
