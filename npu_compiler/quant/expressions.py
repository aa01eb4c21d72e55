"""PT2E's quantize and dequantize as expressions of the expression language: every backend renders them from its
own primitives, and the greedy fusion inlines them into their neighbours (a dequantize -> GELU -> quantize between two
integer kernels is one kernel). They compute exactly what `torch.ops.quantized_decomposed` does (`ir/quant_ops.py`):

    quantize:   clamp(round_half_even(float32(x) * float32(1 / scale)) + zero_point, quant_min, quant_max)
    dequantize: float32(q - zero_point) * float32(scale)

Round half to even is written with `trunc`, `abs` and comparisons, each exact in float32: t = trunc(y), d = y - t
(exact), and t moves one away from zero where |d| > 1/2, or |d| = 1/2 and t is odd.
"""

from __future__ import annotations

from ..expr import nodes as X

F32 = "float32"


def _c(value: float) -> X.Const:
    return X.Const(F32, float(value))


def round_half_even(y: X.Expr) -> X.Expr:
    """round(y) to the nearest integer, ties to even (torch.round, std::nearbyint), y a float32 value."""
    t = X.Unary(F32, "trunc", y)
    d = X.Binary(F32, "sub", y, t)
    a = X.Unary(F32, "abs", d)
    half_t = X.Unary(F32, "trunc", X.Binary(F32, "mul", t, _c(0.5)))
    odd = X.Binary("bool", "ne", X.Binary(F32, "sub", t, X.Binary(F32, "mul", half_t, _c(2.0))), _c(0.0))
    up = X.Binary("bool", "or", X.Binary("bool", "gt", a, _c(0.5)),
                  X.Binary("bool", "and", X.Binary("bool", "eq", a, _c(0.5)), odd))
    away = X.Where(F32, X.Binary("bool", "gt", d, _c(0.0)), X.Binary(F32, "add", t, _c(1.0)),
                   X.Binary(F32, "sub", t, _c(1.0)))
    return X.Where(F32, up, away, t)


def _f32(e: X.Expr) -> X.Expr:
    return e if e.dtype == F32 else X.Cast(F32, e)


def quantize(x: X.Expr, inv_scale: X.Expr, zero_point: X.Expr, qmin: int, qmax: int, dtype: str) -> X.Expr:
    """x (float) -> the integer dtype: inv_scale a float32 1/scale (a constant, or 1 / a per-channel scale),
    zero_point a number or a loaded integer."""
    y = round_half_even(X.Binary(F32, "mul", _f32(x), inv_scale))
    y = X.Binary(F32, "add", y, _f32(zero_point))
    y = X.Binary(F32, "min", X.Binary(F32, "max", y, _c(qmin)), _c(qmax))
    return X.Cast(dtype, y)


def dequantize(q: X.Expr, scale: X.Expr, zero_point: X.Expr | None, out_dtype: str) -> X.Expr:
    """q (an integer) -> float: (q - zero_point) * scale in float32, rounded to `out_dtype`. q - zero_point is exact
    in float32 (both below 2^24)."""
    v = _f32(q)
    if zero_point is not None:
        v = X.Binary(F32, "sub", v, _f32(zero_point))
    v = X.Binary(F32, "mul", v, _f32(scale))
    return v if out_dtype == F32 else X.Cast(out_dtype, v)


def inverse(scale: X.Expr) -> X.Expr:
    """1 / scale in float32, as `input * (1.0 / scales)` computes it for per-channel scales."""
    return X.Binary(F32, "div", _c(1.0), _f32(scale))


def f32_const(value: float) -> X.Const:
    return _c(value)
