"""Requantization by a fixed-point multiplier and shift: how an int32 accumulator becomes an int8 value on every
backend, bit for bit.

A real scale s (the input scale times the weight scale over the output scale) is written as a 31-bit multiplier M and
a right shift n, s ~= M * 2^-n, with M in [2^30, 2^31) (TFLite's `QuantizeMultiplier`, the form Vela and TOSA use).
Applying it is TOSA's RESCALE with 32-bit multipliers (`apply_scale_32`):

    round = 1 << (n - 1)                               (0 when n = 0)
    double rounding only: round += 1 << 30 if n > 31 and v >= 0; round -= 1 << 30 if n > 31 and v < 0
    result = (v * M + round) >> n                      (64-bit product, arithmetic shift: a floor)

`single` rounding rounds half toward +infinity once; `double` rounding reproduces the two roundings of TFLite's and
gemmlowp's `SaturatingRoundingDoublingHighMul` followed by `RoundingDivideByPOT` (TOSA's DOUBLE_ROUND). The product
of an int32 value and a multiplier below 2^31 plus the rounding term stays inside int64 for every shift in [0, 62],
so unlike TOSA (which requires the result to fit 32 bits) any int32 value is allowed: the output zero point is then
added and the result saturated to the output type's range.
"""

from __future__ import annotations

import math

import numpy as np

ROUNDINGS = ("single", "double")
MAX_SHIFT = 62
MULTIPLIER_BITS = 31  # M < 2^31: the multiplier is a non-negative int32


def quantize_multiplier(scale: float) -> tuple[int, int]:
    """(M, n) with scale ~= M * 2^-n, M in [2^30, 2^31) and n in [0, 62] (TFLite's QuantizeMultiplier: the mantissa
    rounded half away from zero to 31 bits). A scale of 0 is (0, 0). A scale too small for a shift of 62 keeps the
    shift at 62 and loses the multiplier's low bits (0 for a scale below 2^-62); ValueError for a negative, infinite
    or NaN scale, or one of 2^31 or more (no multiplier of 31 bits reaches it)."""
    if not math.isfinite(scale) or scale < 0:
        raise ValueError(f"a requantization scale must be finite and >= 0, got {scale!r}")
    if scale == 0:
        return 0, 0
    mantissa, exponent = math.frexp(scale)  # scale = mantissa * 2^exponent, mantissa in [0.5, 1)
    m = int(math.floor(mantissa * (1 << MULTIPLIER_BITS) + 0.5))  # in [2^30, 2^31]
    if m == 1 << MULTIPLIER_BITS:
        m //= 2
        exponent += 1
    shift = MULTIPLIER_BITS - exponent
    if shift < 0:
        raise ValueError(f"a requantization scale of {scale!r} is too large (at most 2^31 - 1)")
    if shift > MAX_SHIFT:
        m >>= shift - MAX_SHIFT
        shift = MAX_SHIFT
    return m, shift


def quantize_multipliers(scales: np.ndarray) -> np.ndarray:
    """`quantize_multiplier` of every scale: an int32 array of shape [len(scales), 2], rows (M, n)."""
    flat = np.asarray(scales, dtype=np.float64).reshape(-1)
    out = np.empty((flat.size, 2), np.int32)
    for i, s in enumerate(flat.tolist()):
        out[i] = quantize_multiplier(s)
    return out


def apply_scale(value: np.ndarray, multiplier: np.ndarray, shift: np.ndarray, rounding: str = "single"
                ) -> np.ndarray:
    """TOSA's apply_scale_32 over arrays (broadcast together), exact in int64: (v * M + round) >> n."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding {rounding!r} is not one of {', '.join(ROUNDINGS)}")
    v = np.asarray(value, dtype=np.int64)
    m = np.asarray(multiplier, dtype=np.int64)
    n = np.asarray(shift, dtype=np.int64)
    rnd = np.where(n > 0, np.left_shift(np.int64(1), np.maximum(n - 1, 0)), np.int64(0))
    if rounding == "double":
        rnd = rnd + np.where(n > 31, np.where(v >= 0, np.int64(1 << 30), np.int64(-(1 << 30))), np.int64(0))
    return np.right_shift(v * m + rnd, n)


def requantize(acc: np.ndarray, multiplier: np.ndarray, shift: np.ndarray, zero_point: int, qmin: int, qmax: int,
               rounding: str = "single") -> np.ndarray:
    """An int32 accumulator (any integer array) to the output type: apply_scale, + the output zero point, saturated
    to [qmin, qmax]; int64 values (the caller stores them in the output's dtype)."""
    return np.clip(apply_scale(acc, multiplier, shift, rounding) + np.int64(zero_point), qmin, qmax)


def wrap_int32(x: np.ndarray) -> np.ndarray:
    """Two's-complement wrap of integers to int32 (what an int32 accumulator holds after an overflow), as int64."""
    x = np.asarray(x, dtype=np.int64)
    return ((x + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)
