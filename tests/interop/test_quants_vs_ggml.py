"""csrc's quant kernels against ggml's own, called in the reference build's shared
libraries through ctypes.

Quantizers must give ggml's CPU bytes (the conversion SET_ROWS, CPY and quantized
ADD results go through), dequantizers ggml's floats, and the grid IQ dot products
ggml's values to float rounding (ggml sums integers per sub-block, we sum floats).
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from ggmlrpc.ggml import TYPE_TRAITS, GGMLType as T
from tests.ops.test_quants import activations, quant_inputs, random_blocks

quants = pytest.importorskip("ggmlrpc._native.quants")

pytestmark = pytest.mark.interop

GRID_IQ = [T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M]
# every quantized type ggml's CPU backend quantizes to (type_traits_cpu.from_float)
QUANTIZERS = [T.Q1_0, T.Q2_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K,
              T.Q6_K, T.IQ4_NL, T.IQ4_XS, T.TQ1_0, T.TQ2_0, T.MXFP4, T.NVFP4]

ROW_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
VEC_DOT_FN = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_size_t,
                              ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                              ctypes.c_int)


class TypeTraits(ctypes.Structure):      # ggml.h: struct ggml_type_traits
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                ("from_float_ref", ctypes.c_void_p)]


class TypeTraitsCpu(ctypes.Structure):   # ggml-cpu.h: struct ggml_type_traits_cpu
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p),
                ("vec_dot_type", ctypes.c_int), ("nrows", ctypes.c_int64)]


@pytest.fixture
def rng(seed):
    return np.random.default_rng(seed)


@pytest.fixture(scope="module")
def ggml(ref_bin):
    base = ctypes.CDLL(str(ref_bin / "libggml-base.so"))
    cpu = ctypes.CDLL(str(ref_bin / "libggml-cpu.so"))
    base.ggml_get_type_traits.restype = ctypes.POINTER(TypeTraits)
    base.ggml_get_type_traits.argtypes = [ctypes.c_int]
    cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(TypeTraitsCpu)
    cpu.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
    cpu.ggml_cpu_init()
    return base, cpu


def row_bytes(t: int, n: int) -> int:
    blck, size = TYPE_TRAITS[t]
    return n // blck * size


def ggml_quantize(ggml, t: int, x: np.ndarray) -> np.ndarray:
    fn = ggml[1].ggml_get_type_traits_cpu(int(t)).contents.from_float
    assert fn, f"ggml has no from_float for {T(t).name}"
    out = np.zeros(row_bytes(t, x.size), np.uint8)
    ROW_FN(fn)(x.ctypes.data, out.ctypes.data, x.size)
    return out


def ggml_dequantize(ggml, t: int, raw: np.ndarray, n: int) -> np.ndarray:
    fn = ggml[0].ggml_get_type_traits(int(t)).contents.to_float
    out = np.zeros(n, np.float32)
    ROW_FN(fn)(raw.ctypes.data, out.ctypes.data, n)
    return out


@pytest.mark.parametrize("t", QUANTIZERS, ids=lambda t: T(t).name)
def test_quantize_equals_ggml(ggml, t, rng):
    n = 4096
    inputs = quant_inputs(rng, n) + [np.zeros(n, np.float32), -np.abs(activations(rng, n))]
    for k, x in enumerate(inputs):
        got, want = quants.quantize(t, x), ggml_quantize(ggml, t, x)
        if t == T.IQ4_NL:
            # an all-zero block gets d = 0 and codes ggml leaves from its stack (we
            # write the previous block's): compare the codes of the other blocks
            for b in (got.reshape(-1, 18), want.reshape(-1, 18)):
                b[b[:, :2].view(np.uint16)[:, 0] & 0x7FFF == 0, 2:] = 0
        np.testing.assert_array_equal(got, want, err_msg=f"{T(t).name} input {k}")


@pytest.mark.parametrize("t", GRID_IQ + [T.Q2_K, T.Q3_K, T.Q6_K, T.IQ4_XS, T.TQ1_0, T.NVFP4, T.Q1_0],
                         ids=lambda t: T(t).name)
def test_dequantize_equals_ggml(ggml, t, rng):
    n = 4096
    raw = random_blocks(rng, t, n)
    got = quants.dequantize(t, raw)
    want = ggml_dequantize(ggml, t, raw, n)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("t", GRID_IQ, ids=lambda t: T(t).name)
def test_grid_iq_vec_dot_near_ggml(ggml, t, rng):
    n, rows = 2048, 8
    x = activations(rng, n)
    act = quants.quantize(T.Q8_K, x)
    traits = ggml[1].ggml_get_type_traits_cpu(int(t)).contents
    assert traits.vec_dot_type == T.Q8_K
    got, want = [], []
    for _ in range(rows):
        w = random_blocks(rng, t, n)
        got.append(quants.vec_dot(t, w, act))
        s = ctypes.c_float()
        VEC_DOT_FN(traits.vec_dot)(n, ctypes.byref(s), 0, w.ctypes.data, 0, act.ctypes.data, 0, 1)
        want.append(s.value)
    got, want = np.array(got, np.float64), np.array(want, np.float64)
    assert np.sum((got - want) ** 2) / np.sum(want ** 2) < 1e-10
