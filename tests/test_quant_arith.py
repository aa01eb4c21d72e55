"""Fixed-point requantization (`npu_compiler.quant.fixed_point`) at its edges, and the quantize/dequantize
expressions (`npu_compiler.quant.expressions`) against PyTorch's `quantized_decomposed` ops with the same
parameters: both must be exact (docs/tolerances.md, "Integer programs")."""

from __future__ import annotations

import importlib
import math

import numpy as np
import pytest

from npu_compiler.expr import nodes as X
from npu_compiler.expr.interpret import Evaluator
from npu_compiler.quant import expressions as Q
from npu_compiler.quant.fixed_point import apply_scale, quantize_multiplier, requantize, wrap_int32


def _tosa(v: int, m: int, n: int, double: bool) -> int:
    """TOSA's apply_scale_32 in Python integers (arbitrary precision: an independent reference)."""
    rnd = (1 << (n - 1)) if n > 0 else 0
    if double and n > 31:
        rnd += (1 << 30) if v >= 0 else -(1 << 30)
    return (v * m + rnd) >> n


def _tflite(v: int, m: int, exponent: int) -> int:
    """TFLite's MultiplyByQuantizedMultiplier (gemmlowp's SaturatingRoundingDoublingHighMul, then
    RoundingDivideByPOT), exponent <= 0: the two roundings TOSA's double rounding reproduces."""
    if v == m == -(1 << 31):
        high = (1 << 31) - 1
    else:
        ab = v * m
        nudge = (1 << 30) if ab >= 0 else 1 - (1 << 30)
        q = ab + nudge
        high = q // (1 << 31) if q >= 0 else -(-q // (1 << 31))  # C's division truncates toward zero
    right = -exponent
    mask = (1 << right) - 1
    rem = high & mask
    thr = (mask >> 1) + (1 if high < 0 else 0)
    return (high >> right) + (1 if rem > thr else 0)


@pytest.mark.parametrize("scale", [1e-9, 3.0517578125e-05, 0.0123, 0.25, 0.5, 0.75, 0.999999, 1.0, 1.5, 3.3, 2**29,
                                   2**31 - 1024])
def test_multiplier_represents_the_scale(scale):
    m, n = quantize_multiplier(scale)
    assert (1 << 30) <= m < (1 << 31)
    assert 0 <= n <= 62
    assert abs(m * 2.0**-n - scale) <= scale * 2.0**-30


def test_multiplier_edges():
    assert quantize_multiplier(0.0) == (0, 0)
    assert quantize_multiplier(0.5) == (1 << 30, 31)  # shift 31: the usual case, a scale in [0.5, 1)
    assert quantize_multiplier(2.0**30) == (1 << 30, 0)  # shift 0: no rounding term at all
    m, n = quantize_multiplier(2.0**-40)  # beyond a shift of 62: the multiplier loses its low bits
    assert n == 62 and m == (1 << 30) >> 8
    for bad in (-1.0, math.inf, math.nan, 2.0**31):
        with pytest.raises(ValueError):
            quantize_multiplier(bad)


def test_mantissa_rounds_half_away_from_zero():
    # (2^31 - 1) / 2^31 * 2^-1 + half an ulp of the multiplier's last bit: rounds up to 2^31, renormalised
    m, n = quantize_multiplier((2**31 - 0.5) / 2**32)
    assert (m, n) == (1 << 30, 31)


@pytest.mark.parametrize("rounding", ["single", "double"])
def test_apply_scale_matches_the_integer_definition(rounding):
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.integers(-(1 << 31), 1 << 31, 2000), [-(1 << 31), (1 << 31) - 1, -1, 0, 1]])
    for m, n in [(1 << 30, 31), ((1 << 31) - 1, 31), (1518500250, 36), (1 << 30, 0), (1 << 30, 1), (123456789, 62),
                 (0, 40)]:
        got = apply_scale(values, m, n, rounding)
        want = [_tosa(int(v), m, n, rounding == "double") for v in values]
        assert got.tolist() == want, (m, n)


def test_double_rounding_is_tflites():
    rng = np.random.default_rng(1)
    values = rng.integers(-(1 << 24), 1 << 24, 3000)
    for scale in (0.0007, 0.013, 0.37, 0.5, 0.9):
        m, n = quantize_multiplier(scale)
        got = apply_scale(values, m, n, "double")
        assert got.tolist() == [_tflite(int(v), m, 31 - n) for v in values], scale


def test_ties_round_up_once():
    # single rounding: half toward +infinity; (v * 2^30 + 2^30) >> 31 for v = -1 is 0, for v = 1 is 1
    assert apply_scale(np.array([-3, -1, 1, 3]), 1 << 30, 31).tolist() == [-1, 0, 1, 2]


def test_requantize_saturates_with_negative_zero_points():
    acc = np.array([-(1 << 31), -1000, -1, 0, 1, 1000, (1 << 31) - 1])
    m, n = quantize_multiplier(0.5)
    assert requantize(acc, m, n, -128, -128, 127).tolist() == [-128, -128, -128, -128, -127, 127, 127]
    assert requantize(acc, m, n, -5, -128, 127).tolist() == [-128, -128, -5, -5, -4, 127, 127]
    # a fused ReLU narrows the clamp to the zero point
    assert requantize(acc, m, n, -5, -5, 127).tolist() == [-5, -5, -5, -5, -4, 127, 127]


def test_accumulator_wraps_as_int32():
    assert wrap_int32(np.array([1 << 31, -(1 << 31) - 1, 5])).tolist() == [-(1 << 31), (1 << 31) - 1, 5]


def _torch_with_quantized_ops():
    torch = pytest.importorskip("torch")
    importlib.import_module("torch.ao.quantization.fx._decomposed")  # registers torch.ops.quantized_decomposed
    return torch


def _evaluate(expr: X.Expr, *arrays: np.ndarray) -> np.ndarray:
    return np.asarray(Evaluator(expr, arrays[0].shape, (), list(arrays)).evaluate())


@pytest.mark.parametrize("dtype,qmin,qmax,zp", [("int8", -128, 127, -3), ("int8", -127, 127, 0),
                                                ("uint8", 0, 255, 131)])
def test_quantize_dequantize_match_pytorch(dtype, qmin, qmax, zp):
    torch = _torch_with_quantized_ops()

    scale = 0.0371
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(4096) * 3).astype(np.float32)
    # exact ties of x * (1 / scale): every half-integer from -20.5 to 20.5
    inv = np.float32(1.0 / scale)
    x[:82] = ((np.arange(-41, 41) + 0.5) / inv).astype(np.float32)
    x[:82] = np.where(x[:82] * inv == (np.arange(-41, 41) + 0.5).astype(np.float32), x[:82], 0)
    tdt = getattr(torch, dtype)
    want = torch.ops.quantized_decomposed.quantize_per_tensor(torch.from_numpy(x), scale, zp, qmin, qmax, tdt)
    load = X.Load("float32", 0, (1,))
    got = _evaluate(Q.quantize(load, Q.f32_const(1.0 / scale), Q.f32_const(zp), qmin, qmax, dtype), x)
    np.testing.assert_array_equal(got, want.numpy().astype(np.int64))

    q = want.numpy()
    back = torch.ops.quantized_decomposed.dequantize_per_tensor(want, scale, zp, qmin, qmax, tdt).numpy()
    got = _evaluate(Q.dequantize(X.Load(dtype, 0, (1,)), Q.f32_const(scale), Q.f32_const(zp), "float32"), q)
    np.testing.assert_array_equal(got, back)


def test_per_channel_quantize_matches_pytorch():
    torch = _torch_with_quantized_ops()

    rng = np.random.default_rng(3)
    w = rng.standard_normal((6, 5)).astype(np.float32)
    scales = (np.abs(w).max(axis=1) / 127).astype(np.float32)
    zps = np.zeros(6, np.int64)
    want = torch.ops.quantized_decomposed.quantize_per_channel(torch.from_numpy(w), torch.from_numpy(scales),
                                                                torch.from_numpy(zps), 0, -127, 127, torch.int8)
    s = X.Load("float32", 1, (1, 0))
    z = X.Load("int64", 2, (1, 0))
    got = np.asarray(Evaluator(Q.quantize(X.Load("float32", 0, (5, 1)), Q.inverse(s), z, -127, 127, "int8"), (6, 5),
                               (), [w.reshape(-1), scales, zps]).evaluate())
    np.testing.assert_array_equal(got, want.numpy().astype(np.int64))
    back = torch.ops.quantized_decomposed.dequantize_per_channel(want, torch.from_numpy(scales),
                                                                  torch.from_numpy(zps), 0, -127, 127, torch.int8)
    got = np.asarray(Evaluator(Q.dequantize(X.Load("int8", 0, (5, 1)), s, z, "float32"), (6, 5), (),
                               [want.numpy().reshape(-1), scales, zps]).evaluate())
    np.testing.assert_array_equal(got, back.numpy())
