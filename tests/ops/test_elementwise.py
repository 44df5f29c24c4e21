"""Element-wise ops: ADD/SUB/MUL/DIV with broadcasting, UNARY (all 22), SQR/SQRT/LOG/
SIN/COS, LEAKY_RELU, SCALE and GLU (all 7), on F32/F16/BF16 and strided inputs;
ADD/ADD1 on quantized data (dequantize, add, quantize back)."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import special as sp

from ggmlrpc.ggml import GGMLGluOp as G, GGMLOp as Op, GGMLType as T, GGMLUnaryOp as U
from tests.ops.conftest import assert_close, f32_bits, from_bf16, to_bf16

F16 = np.float16


def rounded(x, t):
    """x as the type t would store it (F32 values back)."""
    x = np.asarray(x, dtype=np.float32)
    if t == T.F16:
        with np.errstate(over="ignore"):   # out of F16's range: inf, as ggml stores it
            return x.astype(F16).astype(np.float32)
    if t == T.BF16:
        return from_bf16(to_bf16(x))
    return x


BIN = {Op.ADD: np.add, Op.SUB: np.subtract, Op.MUL: np.multiply, Op.DIV: np.divide}


@pytest.mark.parametrize("opcode", list(BIN), ids=lambda o: o.name)
@pytest.mark.parametrize("b_ne", [(16, 5, 3, 2), (16, 1, 1, 1), (1, 5, 1, 2), (4, 5, 3, 1), (1, 1, 1, 1)],
                         ids=lambda s: "x".join(map(str, s)))
def test_binary_broadcast_f32(ctx, rng, opcode, b_ne):
    ne = (16, 5, 3, 2)
    a = rng.standard_normal(ne[::-1]).astype(np.float32)
    b = (rng.standard_normal(b_ne[::-1]) + 3).astype(np.float32)
    ta, tb = ctx.new(T.F32, ne, a), ctx.new(T.F32, b_ne, b)
    out = ctx.op(opcode, T.F32, ne, ta, tb)
    ctx.compute()
    assert_close(ctx.read(out), BIN[opcode](a, np.broadcast_to(np.tile(b, [x // y for x, y in zip(a.shape, b.shape)]), a.shape)), 1e-12)


@pytest.mark.parametrize("types", [(T.F16, T.F16, T.F16), (T.F16, T.F32, T.F16), (T.F16, T.F32, T.F32),
                                   (T.BF16, T.BF16, T.BF16), (T.BF16, T.F32, T.BF16),
                                   (T.BF16, T.F32, T.F32)], ids=lambda t: "-".join(x.name for x in t))
def test_binary_mixed_types(ctx, rng, types):
    ta_t, tb_t, td_t = types
    ne, b_ne = (32, 6, 2, 1), (32, 1, 2, 1)
    a = rounded(rng.standard_normal(ne[::-1]), ta_t)
    b = rounded(rng.standard_normal(b_ne[::-1]) + 2, tb_t)
    out = ctx.op(Op.MUL, td_t, ne, ctx.new(ta_t, ne, a), ctx.new(tb_t, b_ne, b))
    ctx.compute()
    np.testing.assert_array_equal(ctx.read(out), rounded(a * b, td_t).reshape(ctx.read(out).shape))


@pytest.mark.parametrize("opcode, t, out_t", [(Op.ADD, T.Q8_0, T.Q8_0), (Op.ADD, T.Q4_0, T.Q4_0),
                                               (Op.ADD, T.Q5_1, T.F32), (Op.ADD1, T.Q8_0, T.Q8_0)],
                         ids=["add-q8_0", "add-q4_0", "add-q5_1-f32", "add1-q8_0"])
def test_add_quantized(ctx, rng, opcode, t, out_t):
    """Dequantized src0 plus src1 in F32, quantized back: gguf-py's blocks of that sum."""
    from gguf import quants as gq
    a = gq.quantize(rng.standard_normal((3, 256)).astype(np.float32), t)
    b = rng.standard_normal((1,) if opcode == Op.ADD1 else (3, 256)).astype(np.float32)
    ta = ctx.new(t, (256, 3))
    ctx.rb.set_tensor(ta, a.tobytes())
    out = ctx.op(opcode, out_t, (256, 3), ta, ctx.new(T.F32, b.shape[::-1], b))
    ctx.compute()
    ref = gq.dequantize(a, t).astype(np.float32) + b
    if out_t == T.F32:
        np.testing.assert_array_equal(ctx.read(out).reshape(ref.shape), ref)
    else:
        got = np.frombuffer(bytes(ctx.rb.get_tensor(out)), np.uint8).reshape(3, -1)
        np.testing.assert_array_equal(gq.dequantize(got, t), gq.dequantize(gq.quantize(ref, t), t))


def test_binary_strided_operands(ctx, rng):
    """src1 transposed (nb0 != 4), src0 a view with padded rows, dst in place of a view."""
    a_full = rng.standard_normal((3, 7, 24)).astype(np.float32)
    ta_full = ctx.new(T.F32, (24, 7, 3), a_full)
    ta = ctx.view(ta_full, (16, 7, 3), (4, 96, 96 * 7, 96 * 21), offset=8 * 4)   # columns 8..23
    bt = rng.standard_normal((16, 7)).astype(np.float32)
    tb_src = ctx.new(T.F32, (7, 16), bt)
    tb = ctx.transpose(tb_src)                                           # (16, 7), nb0 = 28
    out = ctx.op(Op.ADD, T.F32, (16, 7, 3), ta, tb)
    ctx.compute()
    assert_close(ctx.read(out), a_full[:, :, 8:] + bt.T[None], 1e-12)


def test_binary_in_place(ctx, rng):
    a = rng.standard_normal((4, 64)).astype(np.float32)
    b = rng.standard_normal((1, 64)).astype(np.float32)
    ta, tb = ctx.new(T.F32, (64, 4), a), ctx.new(T.F32, (64, 1), b)
    out = ctx.view(ta, (64, 4))
    node = ctx.op(Op.SUB, T.F32, (64, 4), ta, tb)
    node.data, node.view_src = ta.data, ta   # the result overwrites src0, as ggml's *_inplace ops
    ctx.compute()
    assert_close(ctx.read(out), a - b, 1e-12)


def gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * x * (1 + 0.044715 * x * x)))


def gelu_quick(x):
    return x / (1 + np.exp(-1.702 * x))


UNARY_REF = {
    U.ABS: np.abs, U.SGN: np.sign, U.NEG: np.negative, U.STEP: lambda x: (x > 0).astype(x.dtype),
    U.TANH: np.tanh, U.ELU: lambda x: np.where(x > 0, x, np.expm1(x)),
    U.RELU: lambda x: np.maximum(x, 0), U.SIGMOID: lambda x: 1 / (1 + np.exp(-x)),
    U.GELU: gelu, U.GELU_QUICK: gelu_quick, U.SILU: lambda x: x / (1 + np.exp(-x)),
    U.HARDSWISH: lambda x: x * np.clip((x + 3) / 6, 0, 1),
    U.HARDSIGMOID: lambda x: np.clip((x + 3) / 6, 0, 1), U.EXP: np.exp, U.EXPM1: np.expm1,
    U.SOFTPLUS: lambda x: np.where(x > 20, x, np.log1p(np.exp(x))),
    U.GELU_ERF: lambda x: 0.5 * x * (1 + sp.erf(x / np.sqrt(2))),
    U.FLOOR: np.floor, U.CEIL: np.ceil, U.ROUND: lambda x: np.sign(x) * np.floor(np.abs(x) + 0.5),
    U.TRUNC: np.trunc,
}


@pytest.mark.parametrize("t", [T.F32, T.F16, T.BF16], ids=lambda t: t.name)
@pytest.mark.parametrize("u", list(UNARY_REF), ids=lambda u: u.name)
def test_unary(ctx, rng, u, t):
    ne = (37, 4, 3, 1)
    x = rounded(rng.standard_normal(ne[::-1]) * 3, t)
    if u in (U.FLOOR, U.CEIL, U.ROUND, U.TRUNC):
        x[..., :4] = [0.5, -0.5, 1.5, -2.5]    # halves: round goes away from zero
    out = ctx.op(Op.UNARY, t, ne, ctx.new(t, ne, x), params=[u])
    ctx.compute()
    ref = UNARY_REF[u](x.astype(np.float64))
    if u in (U.GELU, U.GELU_QUICK) and t == T.F32:   # ggml's F16 table
        ref = np.where(x <= -10, 0, np.where(x >= 10, x, gelu(rounded(x, T.F16).astype(np.float64))))
        if u == U.GELU_QUICK:
            ref = gelu_quick(rounded(x, T.F16).astype(np.float64))
    tol = {T.F32: 1e-9, T.F16: 1e-6, T.BF16: 1e-4}[t]
    if u in (U.GELU, U.GELU_QUICK):
        tol = max(tol, 1e-6)
    assert_close(ctx.read(out), rounded(ref, t), tol)


def test_xielu(ctx, rng):
    an, ap, beta, eps = 0.8, 0.5, 0.5, -1e-6
    x = rng.standard_normal((3, 40)).astype(np.float32) * 3
    out = ctx.op(Op.UNARY, T.F32, (40, 3), ctx.new(T.F32, (40, 3), x),
                 params=[U.XIELU, f32_bits(an), f32_bits(ap), f32_bits(beta), f32_bits(eps)])
    ctx.compute()
    xd = x.astype(np.float64)
    ref = np.where(xd > 0, ap * xd * xd + beta * xd, (np.expm1(np.minimum(xd, eps)) - xd) * an + beta * xd)
    assert_close(ctx.read(out), ref, 1e-10)


SIMPLE = {Op.SQR: np.square, Op.SQRT: np.sqrt, Op.LOG: np.log, Op.SIN: np.sin, Op.COS: np.cos}


@pytest.mark.parametrize("t", [T.F32, T.F16], ids=lambda t: t.name)
@pytest.mark.parametrize("opcode", list(SIMPLE), ids=lambda o: o.name)
def test_simple_unary(ctx, rng, opcode, t):
    x = rounded(np.abs(rng.standard_normal((2, 3, 50))) + 0.1, t)
    out = ctx.op(opcode, t, (50, 3, 2), ctx.new(t, (50, 3, 2), x))
    ctx.compute()
    assert_close(ctx.read(out), rounded(SIMPLE[opcode](x.astype(np.float64)), t), 1e-9 if t == T.F32 else 1e-6)


def test_leaky_relu(ctx, rng):
    x = rng.standard_normal((5, 33)).astype(np.float32)
    out = ctx.op(Op.LEAKY_RELU, T.F32, (33, 5), ctx.new(T.F32, (33, 5), x), params=[f32_bits(0.1)])
    ctx.compute()
    assert_close(ctx.read(out), np.where(x > 0, x, np.float32(0.1) * x), 1e-12)


@pytest.mark.parametrize("bias", [0.0, 0.75])
def test_scale(ctx, rng, bias):
    x = rng.standard_normal((3, 4, 65)).astype(np.float32)
    out = ctx.op(Op.SCALE, T.F32, (65, 4, 3), ctx.new(T.F32, (65, 4, 3), x),
                 params=[f32_bits(1.25), f32_bits(bias)])
    ctx.compute()
    assert_close(ctx.read(out), x * 1.25 + bias, 1e-12)


def test_scale_bf16(ctx, rng):
    """ggml scales BF16 rows in float (s*x + b) and rounds each result to BF16."""
    x = rounded(rng.standard_normal((3, 70)), T.BF16)
    out = ctx.op(Op.SCALE, T.BF16, (70, 3), ctx.new(T.BF16, (70, 3), x), params=[f32_bits(1.25), f32_bits(0.5)])
    ctx.compute()
    np.testing.assert_array_equal(ctx.read(out).reshape(x.shape), rounded(x * np.float32(1.25) + np.float32(0.5), T.BF16))


def silu(x):
    return x / (1 + np.exp(-x))


def glu_ref(g, a, b, alpha=1.702, limit=7.0):
    if g == G.REGLU:
        return np.maximum(a, 0) * b
    if g == G.GEGLU:
        return gelu(rounded(a, T.F16)) * b
    if g == G.SWIGLU:
        return silu(a) * b
    if g == G.SWIGLU_OAI:
        x = np.minimum(a, limit)
        gg = np.clip(b, -limit, limit)
        return x / (1 + np.exp(-alpha * x)) * (gg + 1)
    if g == G.GEGLU_ERF:
        return 0.5 * a * (1 + sp.erf(a / np.sqrt(2))) * b
    if g == G.GEGLU_QUICK:
        return gelu_quick(rounded(a, T.F16)) * b
    x = np.minimum(a, limit)
    return silu(x) * np.clip(b, -limit, limit)


@pytest.mark.parametrize("mode", ["split", "swapped", "two"])
@pytest.mark.parametrize("g", list(G), ids=lambda g: g.name)
def test_glu(ctx, rng, g, mode):
    nc, rows = 40, 6
    alpha, limit = 1.702, 1.5
    params = [g, int(mode == "swapped"), f32_bits(alpha), f32_bits(limit)]
    if mode == "two":
        a = rng.standard_normal((rows, nc)).astype(np.float32) * 2
        b = rng.standard_normal((rows, nc)).astype(np.float32) * 2
        out = ctx.op(Op.GLU, T.F32, (nc, rows), ctx.new(T.F32, (nc, rows), a), ctx.new(T.F32, (nc, rows), b),
                     params=params)
    else:
        x = rng.standard_normal((rows, 2 * nc)).astype(np.float32) * 2
        a, b = (x[:, nc:], x[:, :nc]) if mode == "swapped" else (x[:, :nc], x[:, nc:])
        out = ctx.op(Op.GLU, T.F32, (nc, rows), ctx.new(T.F32, (2 * nc, rows), x), params=params)
    ctx.compute()
    ref = glu_ref(g, a.astype(np.float64), b.astype(np.float64), alpha, limit)
    assert_close(ctx.read(out), ref, 1e-6 if g in (G.GEGLU, G.GEGLU_QUICK) else 1e-10)


def test_glu_f16(ctx, rng):
    x = rng.standard_normal((4, 64)).astype(F16)
    out = ctx.op(Op.GLU, T.F16, (32, 4), ctx.new(T.F16, (64, 4), x), params=[G.SWIGLU, 0])
    ctx.compute()
    xf = x.astype(np.float64)
    assert_close(ctx.read(out).astype(np.float64), silu(xf[:, :32]) * xf[:, 32:], 1e-6)


HALF_GLU = [(t, g) for t in (T.F16, T.BF16)
            for g in (G.REGLU, G.GEGLU, G.SWIGLU, G.GEGLU_ERF, G.GEGLU_QUICK, G.SWIGLU_CLAMP)
            if not (g == G.SWIGLU_CLAMP and t == T.BF16)]     # ggml: SWIGLU_CLAMP on F32/F16 only


@pytest.mark.parametrize("t,g", HALF_GLU, ids=lambda v: v.name)
@pytest.mark.parametrize("swapped", [0, 1])
def test_glu_half_types_odd_rows(ctx, rng, t, g, swapped):
    """GLU on F16/BF16 with an odd src0 row: the result has ne0/2 elements and the
    last element of each row is unused. BF16 GEGLU/GEGLU_QUICK compute exactly,
    F16 through ggml's F16 tables."""
    nc, rows, limit = 20, 5, 1.5
    x = rounded(rng.standard_normal((rows, 2 * nc + 1)) * 2, t)
    out = ctx.op(Op.GLU, t, (nc, rows), ctx.new(t, (2 * nc + 1, rows), x),
                 params=[g, swapped, f32_bits(1.702), f32_bits(limit)])
    ctx.compute()
    xd = x.astype(np.float64)
    a, b = (xd[:, nc:2 * nc], xd[:, :nc]) if swapped else (xd[:, :nc], xd[:, nc:2 * nc])
    if t == T.BF16 and g == G.GEGLU:
        ref = gelu(a) * b
    elif t == T.BF16 and g == G.GEGLU_QUICK:
        ref = gelu_quick(a) * b
    else:
        ref = glu_ref(g, a, b, limit=limit)
    assert_close(ctx.read(out).astype(np.float64), rounded(ref, t), 1e-5)


@pytest.mark.parametrize("t", [T.F16, T.BF16], ids=lambda t: t.name)
def test_xielu_half_types(ctx, rng, t):
    an, ap, beta, eps = 0.8, 0.5, 0.5, -1e-6
    x = rounded(rng.standard_normal((3, 40)) * 3, t)
    out = ctx.op(Op.UNARY, t, (40, 3), ctx.new(t, (40, 3), x),
                 params=[U.XIELU, f32_bits(an), f32_bits(ap), f32_bits(beta), f32_bits(eps)])
    ctx.compute()
    xd = x.astype(np.float64)
    ref = np.where(xd > 0, ap * xd * xd + beta * xd, (np.expm1(np.minimum(xd, eps)) - xd) * an + beta * xd)
    assert_close(ctx.read(out).astype(np.float64), rounded(ref, t), 1e-5)
