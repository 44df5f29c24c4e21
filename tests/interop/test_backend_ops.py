"""llama.cpp's test-backend-ops passes through our server, op by op.

Each op runs on a fresh server of ours (`-t 2`): test-backend-ops builds every case
of that op (shapes, types, parameters; the heaviest ops a `-p` subset, see
backend_ops.FILTERS), computes it through our server and on ggml's CPU backend, and
compares the two (NMSE per case). Every case must pass, and there must be as many
as through llama.cpp's own ggml-rpc-server (REFERENCE_CASES, measured with
`python -m tests.interop.backend_ops --reference`): a case our server refuses
closes the connection and ends the op's run, so a lower count is a failure too.

On an AVX-512 host the CPU backend sums in other orders than our AVX2-order
executor; the NMSE thresholds absorb that, as they absorb ggml's own backends'.
"""
from __future__ import annotations

import pytest

from tests.interop import backend_ops

pytestmark = [pytest.mark.interop, pytest.mark.slow]

# "N/N tests passed" of each op through the reference ggml-rpc-server, with FILTERS
REFERENCE_CASES = {
    "ABS": 12, "ACC": 6, "ADD": 154, "ADD_ID": 36, "ARANGE": 2, "ARGMAX": 7, "ARGSORT": 98,
    "CEIL": 18, "CLAMP": 6, "COL2IM_1D": 33, "CONCAT": 192, "CONT": 78, "CONV_1D_DW": 9, "CONV_2D": 2030, "CONV_2D_DW": 8,
    "CONV_3D": 276, "CONV_TRANSPOSE_1D": 116, "CONV_TRANSPOSE_2D": 8, "COS": 6, "COUNT_EQUAL": 2,
    "CPY": 493, "CROSS_ENTROPY_LOSS": 2, "CROSS_ENTROPY_LOSS_BACK": 2, "CUMSUM": 15, "DIAG": 3,
    "DIAG_MASK_INF": 3, "DIV": 142, "DSV4_HC_COMB": 11, "DSV4_HC_POST": 9, "DSV4_HC_PRE": 18,
    "DUP": 10, "ELU": 12, "EXP": 12, "EXPM1": 12, "FILL": 4, "FLASH_ATTN_EXT": 337, "FLOOR": 18,
    "GATED_DELTA_NET": 36, "GATED_LINEAR_ATTN": 4, "GEGLU": 36, "GEGLU_ERF": 36, "GEGLU_QUICK": 36,
    "GELU": 12, "GELU_ERF": 12, "GELU_QUICK": 12, "GET_ROWS": 240, "GET_ROWS_BACK": 6,
    "GROUP_NORM": 2, "HARDSIGMOID": 12, "HARDSWISH": 12, "IM2COL": 92, "IM2COL_3D": 2051,
    "L2_NORM": 30, "LEAKY_RELU": 7, "LIGHTNING_INDEXER": 102, "LOG": 6, "MEAN": 10, "MUL": 142,
    "MUL_MAT": 99, "MUL_MAT_HADAMARD": 27, "MUL_MAT_ID": 174, "MUL_MAT_ID_W4A4": 3,
    "MUL_MAT_ID_W4A8": 3, "MUL_MAT_W4A4": 3, "MUL_MAT_W4A8": 5, "NEG": 12, "NORM": 60, "OPT_STEP_ADAMW": 1, "OPT_STEP_SGD": 1,
    "OUT_PROD": 231, "PAD": 34, "PAD_REFLECT_1D": 2, "POOL_1D": 216, "POOL_2D": 128, "REGLU": 36,
    "RELU": 12, "REPEAT": 18, "REPEAT_BACK": 10, "RMS_NORM": 51, "RMS_NORM_BACK": 10, "ROLL": 2,
    "ROPE": 330, "ROPE_BACK": 264, "ROUND": 18, "RWKV_WKV6": 4, "RWKV_WKV7": 5, "SCALE": 7, "SET": 12,
    "SET_ROWS": 559, "SGN": 12, "SIGMOID": 12, "SILU": 12, "SILU_BACK": 1, "SIN": 6, "SOFTPLUS": 12,
    "SOFT_MAX": 214, "SOFT_MAX_BACK": 24, "SOLVE_TRI": 24, "SQR": 6, "SQRT": 6, "SSM_CONV": 45,
    "SSM_SCAN": 15, "STEP": 12, "SUB": 142, "SUM": 8, "SUM_ROWS": 10, "SWIGLU": 36, "SWIGLU_CLAMP": 8,
    "SWIGLU_OAI": 8, "TANH": 12, "TIMESTEP_EMBEDDING": 1, "TOP_K": 525, "TRI": 4, "TRUNC": 18,
    "UPSCALE": 22, "XIELU": 4,
}


def test_every_op_has_a_reference_count():
    assert sorted(REFERENCE_CASES) == sorted(backend_ops.OPS)


@pytest.fixture(scope="module")
def shim(ref_bin, tmp_path_factory):
    return backend_ops.shim_or_skip(ref_bin, "test-backend-ops", tmp_path_factory)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("op", backend_ops.OPS)
def test_op_passes_through_our_server(ref_bin, shim, op):
    r = backend_ops.run_op(ref_bin, shim, backend_ops.our_server_argv(), op)
    backend_ops.assert_passes(op, r, REFERENCE_CASES[op], r.output)
