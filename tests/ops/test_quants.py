"""csrc/cpu/quants/quants.c against independent references: gguf-py's quant formats and NumPy.

Dequantization must equal gguf-py bit for bit; quantization must equal gguf-py
where it implements the type (ggml-quants.c's reference semantics), and a NumPy
model of ggml's x86 CPU path where that path differs (Q8_0/Q8_1) or gguf-py has
no quantizer (Q8_1, Q8_K, IQ4_NL). Dot products are checked against float64
dot products of the dequantized rows. Every check runs on the portable C
kernels and, where this CPU has it, on the AVX2 ones.
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import quants as gq

from ggmlrpc.ggml import TYPE_TRAITS, GGMLType as T

quants = pytest.importorskip("ggmlrpc._native.quants")

LEVELS = [0, 1] if quants.simd() >= 1 else [0]


@pytest.fixture(params=LEVELS, ids=lambda lv: ["c", "avx2"][lv])
def simd(request):
    """Run the test with the portable kernels and again with the AVX2 ones."""
    prev = quants.simd()
    quants.simd(request.param)
    yield request.param
    quants.simd(prev)


@pytest.fixture
def rng(seed):
    return np.random.default_rng(seed)


# byte offsets of the f16 scales in each block (ggml-common.h layouts), so that
# random blocks get finite, sane scales
F16_SCALES = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.IQ4_NL: [0], T.IQ4_XS: [0], T.TQ1_0: [52], T.TQ2_0: [64], T.Q1_0: [0], T.Q2_0: [0],
    T.IQ2_XXS: [0], T.IQ2_XS: [0], T.IQ2_S: [0], T.IQ3_XXS: [0], T.IQ3_S: [0], T.IQ1_S: [0],
}
GRID_IQ = [T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M]


def random_blocks(rng, t: int, n: int) -> np.ndarray:
    """n elements of type t as random blocks with finite scales (uint8 array)."""
    blck, size = TYPE_TRAITS[t]
    nb = n // blck
    if t == T.F32:
        return rng.standard_normal(n).astype(np.float32).view(np.uint8)
    if t == T.F16:
        return rng.standard_normal(n).astype(np.float16).view(np.uint8)
    if t == T.BF16:
        return (rng.standard_normal(n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    raw = rng.integers(0, 256, (nb, size), dtype=np.uint8)
    for off in F16_SCALES.get(t, []):
        d = (rng.standard_normal(nb) * 0.05).astype(np.float16)
        raw[:, off:off + 2] = d.view(np.uint8).reshape(nb, 2)
    if t == T.MXFP4:
        raw[:, 0] = rng.integers(110, 135, nb)   # E8M0 exponents around 2^-10..2^7
    if t == T.IQ1_M:
        # the f16 block scale is spread over the top nibbles of the four u16 scale words
        d = (rng.standard_normal(nb) * 0.05).astype(np.float16).view(np.uint16).astype(np.uint32)
        sc = raw[:, 48:56].copy().view(np.uint16).astype(np.uint32) & 0x0FFF
        for k in range(4):
            sc[:, k] |= ((d >> (4 * k)) & 0xF) << 12
        raw[:, 48:56] = sc.astype(np.uint16).view(np.uint8).reshape(nb, 8)
    if t == T.Q8_K:
        raw[:, 0:4] = (rng.standard_normal(nb).astype(np.float32) * 0.01).view(np.uint8).reshape(nb, 4)
    return raw.reshape(-1)


def activations(rng, n: int) -> np.ndarray:
    """Activation-like floats: mostly normal, some outliers, a few exact zeros."""
    x = rng.standard_normal(n).astype(np.float32)
    x[rng.random(n) < 0.02] *= 20
    x[rng.random(n) < 0.01] = 0
    return x


# --------------------------------------------------------------------------
# fp16 / bf16
# --------------------------------------------------------------------------

def f16_expected_nan_bits(f32_bits: np.ndarray) -> np.ndarray:
    """F16C turns a float NaN into a quiet half NaN keeping sign and top payload."""
    b = f32_bits.astype(np.uint32)
    return (((b >> 16) & 0x8000) | 0x7E00 | ((b >> 13) & 0x3FF)).astype(np.uint16)


@pytest.mark.parametrize("scalar", [False, True], ids=["row", "scalar"])
def test_fp16_to_fp32_all_halves(simd, scalar):
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    got = quants.fp16_to_fp32(h, scalar=scalar).view(np.uint32)
    want = h.view(np.float16).astype(np.float32).view(np.uint32)
    nan = np.isnan(h.view(np.float16))
    np.testing.assert_array_equal(got[~nan], want[~nan])
    # NaNs come out quiet, payload and sign kept (numpy keeps signalling NaNs as they are)
    np.testing.assert_array_equal(got[nan], want[nan] | 0x400000)


def fp32_probe(rng) -> np.ndarray:
    """Random bit patterns plus every boundary a half conversion can get wrong."""
    specials = [0.0, -0.0, np.inf, -np.inf, 65504, 65519.996, 65520, 65536, -65520, 1e30,
                2.0 ** -14, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, 2.0 ** -26, 2.0 ** -14 - 2.0 ** -25,
                1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 1 + 2.0 ** -11 + 2.0 ** -20, 2049.0, 2051.0]
    sp = np.array(specials, dtype=np.float32)
    nans = np.array([0x7FC00000, 0x7F800001, 0xFFA00000, 0x7FFFFFFF, 0x7F802000, 0xFF801FFF],
                    dtype=np.uint32).view(np.float32)
    bits = rng.integers(0, 1 << 32, 1 << 18, dtype=np.uint64).astype(np.uint32).view(np.float32)
    # halves' exact values and the midpoints between neighbouring halves (ties)
    halves = np.arange(0, 0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)
    mids = ((halves[:-1] + halves[1:]) / 2).astype(np.float32)
    return np.concatenate([sp, -sp, nans, bits, halves.astype(np.float32), mids, -mids])


@pytest.mark.parametrize("scalar", [False, True], ids=["row", "scalar"])
def test_fp32_to_fp16(simd, scalar, rng):
    x = fp32_probe(rng)
    got = quants.fp32_to_fp16(x, scalar=scalar)
    nan = np.isnan(x)
    with np.errstate(over="ignore"):
        want = x[~nan].astype(np.float16).view(np.uint16)   # numpy rounds to nearest even
    np.testing.assert_array_equal(got[~nan], want)
    np.testing.assert_array_equal(got[nan], f16_expected_nan_bits(x[nan].view(np.uint32)))


def test_fp16_row_and_scalar_paths_agree(rng):
    x = fp32_probe(rng)
    h = quants.fp32_to_fp16(x, scalar=True)
    for level in LEVELS:
        prev = quants.simd(level)
        try:
            np.testing.assert_array_equal(quants.fp32_to_fp16(x), h)
            back = quants.fp16_to_fp32(h)
            np.testing.assert_array_equal(back.view(np.uint32), quants.fp16_to_fp32(h, scalar=True).view(np.uint32))
        finally:
            quants.simd(prev)


@pytest.mark.parametrize("scalar", [False, True], ids=["row", "scalar"])
def test_bf16(simd, scalar, rng):
    x = fp32_probe(rng)
    got = quants.fp32_to_bf16(x, scalar=scalar)
    np.testing.assert_array_equal(got, gq.quantize(x, QT.BF16).view(np.uint16))
    # independent check of round-to-nearest-even on the non-NaNs
    ok = ~np.isnan(x)
    b = x[ok].view(np.uint32).astype(np.uint64)
    want = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    np.testing.assert_array_equal(got[ok], want)
    assert np.all(np.isnan(quants.bf16_to_fp32(got[~ok])))
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    back = quants.bf16_to_fp32(h, scalar=scalar)
    np.testing.assert_array_equal(back.view(np.uint32), h.astype(np.uint32) << 16)


# --------------------------------------------------------------------------
# dequantize
# --------------------------------------------------------------------------

GGUF_DEQUANT = [T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K,
                T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS, T.MXFP4, T.NVFP4, T.TQ1_0, T.TQ2_0] + GRID_IQ


@pytest.mark.parametrize("t", GGUF_DEQUANT, ids=lambda t: T(t).name)
def test_dequantize_matches_gguf(simd, t, rng):
    n = 4096
    raw = random_blocks(rng, t, n)
    got = quants.dequantize(t, raw)
    want = gq.dequantize(raw, QT(int(t))).reshape(-1)
    assert got.shape == (n,)
    np.testing.assert_array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("t", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.MXFP4], ids=lambda t: T(t).name)
def test_dequantize_gguf_quantized_data(t, rng):
    """Data written by gguf-py's quantizer reads back as gguf-py reads it."""
    x = activations(rng, 2048)
    raw = gq.quantize(x, QT(int(t)))
    np.testing.assert_array_equal(quants.dequantize(t, raw), gq.dequantize(raw, QT(int(t))).reshape(-1))


def np_dequant_small(t: int, raw: np.ndarray) -> np.ndarray:
    """NumPy readers for the formats gguf-py does not read: Q1_0, Q2_0, Q8_K."""
    blck, size = TYPE_TRAITS[t]
    b = raw.reshape(-1, size)
    if t == T.Q8_K:
        d = b[:, :4].copy().view(np.float32)
        return (d * b[:, 4:260].view(np.int8).astype(np.float32)).reshape(-1)
    d = b[:, :2].copy().view(np.float16).astype(np.float32)
    if t == T.Q1_0:
        bits = np.unpackbits(b[:, 2:], axis=1, bitorder="little")
        return np.where(bits == 1, d, -d).reshape(-1)
    codes = (b[:, 2:, None] >> np.array([0, 2, 4, 6], dtype=np.uint8)) & 3
    return ((codes.reshape(len(b), 64).astype(np.float32) - 1) * d).reshape(-1)


@pytest.mark.parametrize("t", [T.Q1_0, T.Q2_0, T.Q8_K], ids=lambda t: T(t).name)
def test_dequantize_small_formats(t, rng):
    raw = random_blocks(rng, t, 4096)
    np.testing.assert_array_equal(quants.dequantize(t, raw), np_dequant_small(t, raw))


def test_dequantize_rejects_what_it_cannot_read():
    with pytest.raises(ValueError):
        quants.dequantize(T.Q8_1, np.zeros(36, np.uint8))       # ggml has no to_float either
    with pytest.raises(ValueError):
        quants.dequantize(T.Q4_0, np.zeros(17, np.uint8))       # not whole blocks
    with pytest.raises(ValueError):
        quants.dequantize(99, np.zeros(4, np.uint8))


# --------------------------------------------------------------------------
# quantize
# --------------------------------------------------------------------------

def quant_inputs(rng, n: int) -> list[np.ndarray]:
    """Rows that exercise rounding: normal data, tiny and huge scales, ties on the
    quantization grid, all-zero blocks, and blocks whose extreme is negative."""
    rows = [activations(rng, n),
            rng.standard_normal(n).astype(np.float32) * np.float32(1e-4),
            rng.standard_normal(n).astype(np.float32) * np.float32(1e4),
            rng.integers(-16, 17, n).astype(np.float32) / 2,
            rng.integers(-127, 128, n).astype(np.float32) * np.float32(0.25)]
    z = activations(rng, n)
    z[: n // 4] = 0
    z[n // 2: n // 2 + 256] = 0
    rows.append(z)
    neg = np.abs(rng.standard_normal(n)).astype(np.float32)
    neg[::32] = -4
    rows.append(neg)
    # amax 127 makes the Q8 multiplier exactly 1: k + 0.5 with k even is a tie
    # that rounding half to even and half away from zero settle differently
    ties = ((rng.integers(0, 60, n) * 2 + 0.5) * rng.choice([-1, 1], n)).astype(np.float32)
    ties[::32] = 127
    rows.append(ties)
    return rows


@pytest.mark.parametrize("t", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.MXFP4, T.BF16, T.TQ1_0, T.TQ2_0],
                         ids=lambda t: T(t).name)
def test_quantize_matches_gguf(simd, t, rng):
    for x in quant_inputs(rng, 2048):
        want = gq.quantize(x, QT(int(t))).view(np.uint8).reshape(-1)
        np.testing.assert_array_equal(quants.quantize(t, x), want)


def test_quantize_f16_matches_numpy(simd, rng):
    for x in quant_inputs(rng, 2048):
        np.testing.assert_array_equal(quants.quantize(T.F16, x).view(np.float16), x.astype(np.float16))


def test_quantize_f32_is_a_copy(rng):
    x = activations(rng, 100)
    np.testing.assert_array_equal(quants.quantize(T.F32, x).view(np.float32), x)
    np.testing.assert_array_equal(quants.dequantize(T.F32, x.view(np.uint8)), x)


def test_quantize_q8_0_ref_matches_gguf(simd, rng):
    """The reference semantics (1/d, round half away from zero) are gguf-py's."""
    for x in quant_inputs(rng, 2048):
        want = gq.quantize(x, QT.Q8_0).view(np.uint8).reshape(-1)
        np.testing.assert_array_equal(quants.quantize(T.Q8_0, x, ref=True), want)


def np_q8_x86(x: np.ndarray):
    """ggml's AVX Q8_0/Q8_1 quantizer in NumPy: d = amax/127, q = rint(x*(127/amax))."""
    b = x.reshape(-1, 32)
    amax = np.abs(b).max(axis=1)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        mul = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(b * mul[:, None])
    return d.astype(np.float32), np.clip(q, -128, 127).astype(np.int8)


def test_quantize_q8_0_x86(simd, rng):
    for x in quant_inputs(rng, 2048):
        d, qs = np_q8_x86(x)
        want = np.concatenate([d.astype(np.float16).view(np.uint8).reshape(-1, 2), qs.view(np.uint8)], axis=1)
        np.testing.assert_array_equal(quants.quantize(T.Q8_0, x), want.reshape(-1))


def test_q8_0_x86_and_reference_differ_only_in_rounding(rng):
    """ggml's x86 path and its reference C write different bytes for exact ties
    (x*id = k + 0.5) and where 127/amax and 1/(amax/127) round apart: the codes
    then differ by one, the scales never."""
    *rows, ties = quant_inputs(rng, 4096)
    x = np.concatenate(rows)
    a = quants.quantize(T.Q8_0, x).reshape(-1, 34)
    r = quants.quantize(T.Q8_0, x, ref=True).reshape(-1, 34)
    np.testing.assert_array_equal(a[:, :2], r[:, :2])
    diff = a[:, 2:].view(np.int8).astype(int) - r[:, 2:].view(np.int8).astype(int)
    assert np.abs(diff).max() <= 1
    assert np.count_nonzero(diff) < diff.size / 200
    # every even k + 0.5: half to even stays at k, half away from zero moves out
    a = quants.quantize(T.Q8_0, ties).reshape(-1, 34)[:, 2:].view(np.int8).reshape(-1)
    r = quants.quantize(T.Q8_0, ties, ref=True).reshape(-1, 34)[:, 2:].view(np.int8).reshape(-1)
    tie = ties != 127
    np.testing.assert_array_equal(a[tie], np.trunc(ties[tie]))
    np.testing.assert_array_equal(r[tie], np.trunc(ties[tie]) + np.sign(ties[tie]))


@pytest.mark.parametrize("ref", [False, True], ids=["x86", "ref"])
def test_quantize_q8_1(simd, ref, rng):
    for x in quant_inputs(rng, 2048):
        if ref:
            raw0 = gq.quantize(x, QT.Q8_0).reshape(-1, 34)
            d = np.abs(x.reshape(-1, 32)).max(axis=1) / np.float32(127)    # s uses d before f16
            qs = raw0[:, 2:].view(np.int8)
        else:
            d, qs = np_q8_x86(x)
        with np.errstate(over="ignore"):    # d*sum past 65504 is inf in f16, in C too
            s = (d * qs.astype(np.int32).sum(axis=1).astype(np.float32)).astype(np.float16)
        want = np.concatenate([d.astype(np.float16).view(np.uint8).reshape(-1, 2),
                               s.view(np.uint8).reshape(-1, 2), qs.view(np.uint8)], axis=1)
        np.testing.assert_array_equal(quants.quantize(T.Q8_1, x, ref=ref), want.reshape(-1))


def np_q8_k(x: np.ndarray) -> np.ndarray:
    """Q8_K in NumPy: scale -127/max from the signed extreme, codes rounded half
    to even and capped at 127, float d = 1/scale, bsums of 16."""
    out = []
    for b in x.reshape(-1, 256):
        i = int(np.argmax(np.abs(b)))
        if b[i] == 0:
            out.append(np.zeros(292, np.uint8))
            continue
        iscale = np.float32(-127) / b[i]
        q = np.minimum(np.rint(iscale * b), 127).astype(np.int8)
        bsums = q.reshape(16, 16).astype(np.int16).sum(axis=1).astype(np.int16)
        d = np.array([np.float32(1) / iscale], np.float32)
        out.append(np.concatenate([d.view(np.uint8), q.view(np.uint8), bsums.view(np.uint8)]))
    return np.concatenate(out)


def test_quantize_q8_k(simd, rng):
    for x in quant_inputs(rng, 2048):
        np.testing.assert_array_equal(quants.quantize(T.Q8_K, x), np_q8_k(x))


IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)


def np_iq4_nl(x: np.ndarray) -> np.ndarray:
    """IQ4_NL as ggml's from_float, in NumPy: levels from the guess max/-127,
    then the least-squares scale sum(w q x)/sum(w q q), w = x^2, summed in
    float32 in element order. An all-zero block keeps the previous codes."""
    out = []
    L = np.zeros(32, np.int64)
    for b in x.reshape(-1, 32):
        i = int(np.argmax(np.abs(b)))
        d = np.float32(0)
        if not np.abs(b[i]) < np.float32(1e-15):
            inv = np.float32(1) / (b[i] / np.float32(-127))
            v = inv * b
            hi = np.clip(np.searchsorted(IQ4NL, v, side="right"), 1, 15)
            lo = hi - 1
            L = np.where((v - IQ4NL[lo]) < (IQ4NL[hi] - v), lo, hi)
            L = np.where(v <= IQ4NL[0], 0, np.where(v >= IQ4NL[15], 15, L))
            q = IQ4NL[L]
            w = b * b
            sumqx = np.cumsum((w * q) * b, dtype=np.float32)[-1]
            sumq2 = np.cumsum((w * q) * q, dtype=np.float32)[-1]
            d = sumqx / sumq2 if sumq2 > 0 else np.float32(0)
        qs = (L[:16] | (L[16:] << 4)).astype(np.uint8)
        out.append(np.concatenate([np.array([d], np.float32).astype(np.float16).view(np.uint8), qs]))
    return np.concatenate(out)


def test_quantize_iq4_nl(simd, rng):
    for x in quant_inputs(rng, 1024):
        got = quants.quantize(T.IQ4_NL, x)
        np.testing.assert_array_equal(got, np_iq4_nl(x))
        back = gq.dequantize(got, QT.IQ4_NL).reshape(-1)
        # a sanity bound (the bytes are checked above): heavy-tailed activations
        # lose up to ~2% of their energy to IQ4_NL (1 seed in ~150 went past 2.0%)
        assert np.sum((back - x) ** 2) <= 0.03 * np.sum(x ** 2) + 1e-30


def f32_sum(v: np.ndarray) -> np.float32:
    """A float32 sum in element order, as a C loop adds."""
    return np.cumsum(v, dtype=np.float32)[-1]


def round_away(v: np.ndarray) -> np.ndarray:
    """C's roundf: halves away from zero (exact in float64 for float32 input)."""
    v = v.astype(np.float64)
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def f16_bytes(d) -> np.ndarray:
    return np.array([d], np.float32).astype(np.float16).view(np.uint8)


def np_q1_0(x: np.ndarray) -> np.ndarray:
    """Q1_0 as ggml: d = mean |x| of the 128, bit j set where x >= 0."""
    out = []
    for b in x.reshape(-1, 128):
        d = f32_sum(np.abs(b)) / np.float32(128)
        out.append(np.concatenate([f16_bytes(d), np.packbits(b >= 0, bitorder="little")]))
    return np.concatenate(out)


def np_q2_0(x: np.ndarray) -> np.ndarray:
    """Q2_0 as ggml: d = max |x| of the 64, codes roundf(x/d) + 1 clamped to 0..3."""
    out = []
    for b in x.reshape(-1, 64):
        amax = np.max(np.abs(b))
        inv = np.float32(1) / amax if amax > 0 else np.float32(0)
        q = np.clip(round_away(b * inv) + 1, 0, 3).astype(np.uint8).reshape(16, 4)
        qs = q[:, 0] | (q[:, 1] << 2) | (q[:, 2] << 4) | (q[:, 3] << 6)
        out.append(np.concatenate([f16_bytes(amax), qs]))
    return np.concatenate(out)


FP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)   # doubled E2M1


def ue4m3(v: float) -> int:
    """float -> UE4M3 byte as ggml rounds it (mantissa on its first dropped bit)."""
    v = np.float32(v)
    if not v > 0:
        return 0
    v = min(v, np.float32(448))
    bits = int(np.array([v], np.float32).view(np.uint32)[0])
    e = ((bits >> 23) & 0xFF) - 127 + 7
    if e <= 0:
        man = int(v * np.float32(512) + np.float32(0.5))
        return 0 if man < 1 else min(man, 7)
    man = ((bits >> 20) & 7) + ((bits >> 19) & 1)
    if man > 7:
        man, e = 0, e + 1
    return 0x7E if e >= 15 else (e << 3) | man


def ue4m3_half(u: int) -> np.float32:
    e, m = (u >> 3) & 0xF, u & 7
    if u in (0, 0x7F):
        return np.float32(0)
    raw = m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    return np.float32(raw * 0.5)


def np_nvfp4(x: np.ndarray) -> np.ndarray:
    """NVFP4 as ggml: per 16 a UE4M3 scale amax/6, each element to the nearest
    E2M1 level (the first on ties)."""
    out = []
    for b in x.reshape(-1, 64):
        ds, qs = [], []
        for sb in b.reshape(4, 16):
            u = ue4m3(np.max(np.abs(sb)) / np.float32(6))
            d = ue4m3_half(u)
            err = np.abs(FP4[None, :] * d - sb[:, None])
            c = np.argmin(err, axis=1).astype(np.uint8)     # argmin: the first minimum
            ds.append(u)
            qs.append(c[:8] | (c[8:] << 4))
        out.append(np.concatenate([np.array(ds, np.uint8)] + qs))
    return np.concatenate(out)


@pytest.mark.parametrize("t,model", [(T.Q1_0, np_q1_0), (T.Q2_0, np_q2_0), (T.NVFP4, np_nvfp4)],
                         ids=lambda v: T(v).name if isinstance(v, T) else "")
def test_quantize_small_formats(t, model, rng):
    for x in quant_inputs(rng, 1024):
        np.testing.assert_array_equal(quants.quantize(t, x), model(x))


@pytest.mark.parametrize("t,tol", [(T.Q4_0, 0.02), (T.Q4_1, 0.01), (T.Q5_0, 0.005), (T.Q5_1, 0.003),
                                   (T.Q8_0, 1e-4), (T.Q8_1, 1e-4), (T.Q8_K, 1e-4), (T.IQ4_NL, 0.01),
                                   (T.MXFP4, 0.03), (T.F16, 1e-6), (T.BF16, 1e-4), (T.NVFP4, 0.02),
                                   (T.Q2_K, 0.15), (T.Q3_K, 0.05), (T.Q4_K, 0.01), (T.Q5_K, 0.003),
                                   (T.Q6_K, 0.001), (T.IQ4_XS, 0.01), (T.Q2_0, 0.6), (T.Q1_0, 0.45)],
                         ids=lambda v: T(v).name if isinstance(v, T) else None)
def test_quantize_roundtrip_error(t, tol, rng):
    x = rng.standard_normal(8192).astype(np.float32)
    raw = quants.quantize(t, x)
    if t == T.Q8_1:
        b = raw.reshape(-1, 36)
        back = (b[:, :2].copy().view(np.float16).astype(np.float32) * b[:, 4:].view(np.int8)).reshape(-1)
    else:
        back = quants.dequantize(t, raw)
    nmse = np.sum((back - x) ** 2) / np.sum(x ** 2)
    assert nmse < tol


@pytest.mark.parametrize("t", [T.TQ1_0, T.TQ2_0], ids=lambda t: T(t).name)
def test_quantize_ternary_data_round_trips(t, rng):
    """The ternary formats hold d * {-1, 0, 1} exactly when d is an f16 value."""
    x = (rng.integers(-1, 2, 4096) * np.float32(0.375)).astype(np.float32)
    x[::256] = 0.375          # every block reaches the scale
    np.testing.assert_array_equal(quants.dequantize(t, quants.quantize(t, x)), x)


def test_quantize_rejects_bad_input():
    with pytest.raises(ValueError):
        quants.quantize(T.Q4_0, np.zeros(33, np.float32))
    for t in GRID_IQ + [99]:       # ggml has no CPU quantizer for the grid IQ types either
        with pytest.raises(ValueError):
            quants.quantize(t, np.zeros(256, np.float32))


# --------------------------------------------------------------------------
# MUL_MAT dot products
# --------------------------------------------------------------------------

# ggml's type_traits_cpu[weight].vec_dot_type on the types this library multiplies
VEC_DOT_TYPE = {
    T.F32: T.F32, T.F16: T.F16, T.BF16: T.BF16,
    T.Q4_0: T.Q8_0, T.Q5_0: T.Q8_0, T.Q8_0: T.Q8_0, T.IQ4_NL: T.Q8_0, T.MXFP4: T.Q8_0,
    T.NVFP4: T.Q8_0, T.Q1_0: T.Q8_0, T.Q2_0: T.Q8_0,
    T.Q4_1: T.Q8_1, T.Q5_1: T.Q8_1,
    T.Q2_K: T.Q8_K, T.Q3_K: T.Q8_K, T.Q4_K: T.Q8_K, T.Q5_K: T.Q8_K, T.Q6_K: T.Q8_K,
    T.IQ4_XS: T.Q8_K, T.TQ1_0: T.Q8_K, T.TQ2_0: T.Q8_K,
    **{t: T.Q8_K for t in GRID_IQ},
}


def test_vec_dot_type_table():
    for w, a in VEC_DOT_TYPE.items():
        assert quants.vec_dot_type(w) == a, T(w).name
    for t in (T.Q8_1, T.Q8_K, T.I8, T.I32, T.F64, 4, 99):
        assert quants.vec_dot_type(t) == -1


def to_f64(t: int, raw: np.ndarray) -> np.ndarray:
    """Exact float64 values of a row of type t (activations included)."""
    if t == T.Q8_1:
        b = raw.reshape(-1, 36)
        return (b[:, :2].copy().view(np.float16).astype(np.float64) * b[:, 4:].view(np.int8)).reshape(-1)
    return quants.dequantize(t, raw).astype(np.float64)


@pytest.mark.parametrize("wt", list(VEC_DOT_TYPE), ids=lambda t: T(t).name)
def test_vec_dot(simd, wt, rng):
    """A small matrix-vector product, row by row, against float64 NumPy on the
    dequantized operands. The activation goes through quantize like ggml's does.
    The only inexact step is float32 accumulation (and for Q4_1/Q5_1 the f16
    rounding of the activation's d*sum, modelled here), so the bound is far
    below ggml's 5e-4."""
    # odd block counts and F32/F16/BF16 tails past the 32-wide SIMD steps
    n = {1: 1061, 32: 1056, 64: 1088, 128: 1152, 256: 1024}[TYPE_TRAITS[wt][0]]
    rows = 16
    wa = np.stack([random_blocks(rng, wt, n) for _ in range(rows)])
    at = quants.vec_dot_type(wt)
    x = activations(rng, n)
    a = quants.quantize(at, x)
    got = np.array([quants.vec_dot(wt, wa[r], a) for r in range(rows)], np.float64)
    xa = to_f64(at, a)
    if wt in (T.Q4_1, T.Q5_1):
        # ggml uses the stored s = f16(d * sum(q)) for the min term: model it
        b = a.reshape(-1, 36)
        s_stored = b[:, 2:4].copy().view(np.float16).astype(np.float64).reshape(-1)
        s_exact = xa.reshape(-1, 32).sum(axis=1)
        want = []
        for r in range(rows):
            wb = wa[r].reshape(-1, TYPE_TRAITS[wt][1])
            m = wb[:, 2:4].copy().view(np.float16).astype(np.float64).reshape(-1)
            want.append(to_f64(wt, wa[r]) @ xa + np.sum(m * (s_stored - s_exact)))
        want = np.array(want)
    else:
        want = np.array([to_f64(wt, wa[r]) @ xa for r in range(rows)])
    nmse = np.sum((got - want) ** 2) / np.sum(want ** 2)
    assert nmse < 1e-10, nmse


@pytest.mark.skipif(len(LEVELS) < 2, reason="no AVX2 on this CPU")
@pytest.mark.parametrize("wt", [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K,
                                T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS, T.MXFP4],
                         ids=lambda t: T(t).name)
def test_vec_dot_simd_agrees_with_c(wt, rng):
    """The AVX2 kernels and the portable ones sum in different orders only."""
    n = 4096 + (32 if TYPE_TRAITS[wt][0] == 1 else 0) + (5 if TYPE_TRAITS[wt][0] == 1 else 0)
    w = random_blocks(rng, wt, n)
    a = quants.quantize(quants.vec_dot_type(wt), activations(rng, n))
    prev = quants.simd()
    try:
        quants.simd(0)
        c = quants.vec_dot(wt, w, a)
        quants.simd(1)
        v = quants.vec_dot(wt, w, a)
    finally:
        quants.simd(prev)
    # float32 sums in two orders: bounded by the size of the terms, not of the
    # result (which may cancel to near zero)
    at = quants.vec_dot_type(wt)
    scale = np.abs(to_f64(wt, w)) @ np.abs(to_f64(at, a))
    assert abs(v - c) <= 1e-5 * scale


def test_vec_dot_rejects_bad_input(rng):
    a = quants.quantize(T.Q8_0, activations(rng, 64))
    with pytest.raises(ValueError):
        quants.vec_dot(T.Q4_0, random_blocks(rng, T.Q4_0, 96), a)   # lengths disagree
    with pytest.raises(ValueError):
        quants.vec_dot(T.Q8_1, np.zeros(36, np.uint8), np.zeros(36, np.uint8))
