"""elementwise.cu: binary ops with broadcasting, ADD_ID, SCALE, unary, GLU, CONCAT, REPEAT."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlrpc.cuda import ops
from ggmlrpc.ggml import GGMLGluOp, GGMLOp, GGMLUnaryOp

from .conftest import assert_close

NP_BIN = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}


@pytest.mark.parametrize("op", list(NP_BIN))
@pytest.mark.parametrize("a_ne,b_ne", [((33, 5, 3, 2), (33, 5, 3, 2)), ((33, 5, 3, 2), (33, 1, 3, 1)),
                                       ((7, 4, 6, 1), (1, 4, 1, 1)), ((70, 3), (70, 1))])
def test_binary(k, rng, op, a_ne, b_ne):
    a = rng.standard_normal(a_ne[::-1]).astype(np.float32)
    b = rng.standard_normal(b_ne[::-1]).astype(np.float32) + (3 if op == "div" else 0)
    # a as a strided view: every row padded by 3 floats
    ne0 = a_ne[0]
    padded = np.zeros(a.shape[:-1] + (ne0 + 3,), np.float32)
    padded[..., :ne0] = a
    nb = [4, (ne0 + 3) * 4]
    for n in a_ne[1:-1]:
        nb.append(nb[-1] * n)
    out = k.empty(a.nbytes)
    ops.binary(k, op, out, k.dev(padded), a_ne, nb, k.dev(b), b_ne, [4 * int(np.prod(b_ne[:i])) for i in range(len(b_ne))],
               max_blocks=3)
    assert_close(k.read(out, a.shape), NP_BIN[op](a, b))


def test_add_id(k, rng):
    ne0, n_used, n_tok, n_exp = 45, 2, 3, 4
    a = rng.standard_normal((n_tok, n_used, ne0)).astype(np.float32)
    b = rng.standard_normal((n_exp, ne0)).astype(np.float32)
    ids = rng.integers(0, n_exp, (n_tok, n_used)).astype(np.int32)
    out = k.empty(a.nbytes)
    ops.add_id(k, out, k.dev(a), k.dev(b), k.dev(ids), ne0, n_used, n_tok)
    assert_close(k.read(out, a.shape), a + b[ids])


def test_scale(k, rng):
    x = rng.standard_normal(1000).astype(np.float32)
    out = k.empty(x.nbytes)
    ops.scale(k, out, k.dev(x), x.size, 0.7, 0.25, max_blocks=2)
    assert_close(k.read(out, x.shape), x * np.float32(0.7) + np.float32(0.25))


def _np_unary(op, x):
    x = x.astype(np.float64)
    sig = 1 / (1 + np.exp(-x))
    from math import erf
    return {
        "ABS": np.abs(x), "SGN": np.sign(x), "NEG": -x, "STEP": (x > 0).astype(float), "TANH": np.tanh(x),
        "ELU": np.where(x > 0, x, np.expm1(x)), "RELU": np.maximum(x, 0), "SIGMOID": sig,
        "GELU": 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * x * (1 + 0.044715 * x * x))),
        "GELU_QUICK": x / (1 + np.exp(-1.702 * x)), "SILU": x * sig,
        "HARDSWISH": x * np.clip((x + 3) / 6, 0, 1), "HARDSIGMOID": np.clip((x + 3) / 6, 0, 1),
        "EXP": np.exp(x), "EXPM1": np.expm1(x), "SOFTPLUS": np.where(x > 20, x, np.log1p(np.exp(x))),
        "GELU_ERF": 0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2))), "FLOOR": np.floor(x),
        "CEIL": np.ceil(x), "ROUND": np.sign(x) * np.floor(np.abs(x) + 0.5), "TRUNC": np.trunc(x),
    }[op]


@pytest.mark.parametrize("op", [u.name for u in GGMLUnaryOp])
def test_unary(k, rng, op):
    x = (rng.standard_normal(300) * 3).astype(np.float32)
    out = k.empty(x.nbytes)
    params = (0.9, 0.7, 0.5, -1e-6)                     # XIELU's alpha_n, alpha_p, beta, eps
    ops.unary(k, GGMLUnaryOp[op], out, k.dev(x), x.size, params, max_blocks=1)
    if op == "XIELU":
        an, ap, beta, eps = params
        x64 = x.astype(np.float64)
        ref = np.where(x64 > 0, ap * x64 * x64 + beta * x64, (np.expm1(np.minimum(x64, eps)) - x64) * an + beta * x64)
    else:
        ref = _np_unary(op, x)
    assert_close(k.read(out, x.shape), ref)


@pytest.mark.parametrize("op", [g.name for g in GGMLGluOp])
@pytest.mark.parametrize("swapped", [False, True])
def test_glu_split(k, rng, op, swapped):
    nc, nrows = 37, 5
    x = (rng.standard_normal((nrows, 2 * nc)) * 2).astype(np.float32)
    a, b = (x[:, nc:], x[:, :nc]) if swapped else (x[:, :nc], x[:, nc:])
    buf = k.dev(x)
    out = k.empty(nrows * nc * 4)
    off_a, off_b = (nc, 0) if swapped else (0, nc)
    ops.glu(k, GGMLGluOp[op], out, k.offset(buf, 4 * off_a), k.offset(buf, 4 * off_b), nc, nrows,
            2 * nc, 2 * nc, alpha=1.702, limit=7.0)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    if op == "SWIGLU_OAI":
        xa = np.minimum(a64, 7.0)
        ref = xa / (1 + np.exp(-1.702 * xa)) * (np.clip(b64, -7.0, 7.0) + 1)
    elif op == "SWIGLU_CLAMP":
        xa = np.minimum(a64, 7.0)
        ref = xa / (1 + np.exp(-xa)) * np.clip(b64, -7.0, 7.0)
    else:
        act = {"REGLU": "RELU", "GEGLU": "GELU", "SWIGLU": "SILU", "GEGLU_ERF": "GELU_ERF",
               "GEGLU_QUICK": "GELU_QUICK"}[op]
        ref = _np_unary(act, a) * b64
    assert_close(k.read(out, (nrows, nc)), ref)


@pytest.mark.parametrize("dim", [0, 1, 2, 3])
def test_concat(k, rng, dim):
    a_ne = [5, 3, 2, 2]
    b_ne = list(a_ne)
    b_ne[dim] = 3
    a = rng.standard_normal(a_ne[::-1]).astype(np.float32)
    b = rng.standard_normal(b_ne[::-1]).astype(np.float32)
    ref = np.concatenate([a, b], axis=3 - dim)
    out = k.empty(ref.nbytes)
    ops.concat(k, out, k.dev(a), k.dev(b), a_ne, b_ne, dim)
    assert_close(k.read(out, ref.shape), ref)


def test_repeat(k, rng):
    src = rng.standard_normal((1, 2, 1, 3)).astype(np.float32)
    ref = np.tile(src, (2, 3, 4, 5))
    out = k.empty(ref.nbytes)
    ops.repeat(k, out, k.dev(src), ref.shape[::-1], src.shape[::-1])
    assert_close(k.read(out, ref.shape), ref)


@pytest.mark.parametrize("op", ops.MATH_OPS)
def test_math(k, rng, op):
    x = (rng.standard_normal(300) * 3).astype(np.float32)
    if op in ("SQRT", "LOG"):
        x = np.abs(x) + 0.1
    out = k.empty(x.nbytes)
    p0, p1 = (-1.5, 2.0) if op == "CLAMP" else (0.1, 0.0)
    ops.math_op(k, GGMLOp[op], out, k.dev(x), x.size, p0, p1, max_blocks=1)
    x64 = x.astype(np.float64)
    ref = {"SQR": lambda: x64 * x64, "SQRT": lambda: np.sqrt(x64), "LOG": lambda: np.log(x64),
           "SIN": lambda: np.sin(x64), "COS": lambda: np.cos(x64), "CLAMP": lambda: np.clip(x64, -1.5, 2.0),
           "LEAKY_RELU": lambda: np.where(x64 > 0, x64, 0.1 * x64)}[op]()
    assert_close(k.read(out, x.shape), ref)
