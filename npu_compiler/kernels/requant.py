"""What the integer kernels (`qgemm`, `qconv2d`, `qadd`) share: the typed description of requantization (the output
zero point, the clamp that saturates to the output type and applies a fused ReLU or clamp, TOSA's rounding mode),
its checks, and its reference arithmetic (`npu_compiler.quant.fixed_point`).

Integer dtypes: activations int8 or uint8 (PT2E's x86 recipe quantizes activations to uint8), weights int8,
accumulators and biases int32 (wrapping, as an int32 accumulator does), requantization multipliers and shifts int32
in a [channels, 2] buffer (rows (M, n): one row for a per-tensor scale, one per output channel otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..errors import KernelFault
from ..quant.fixed_point import MAX_SHIFT, ROUNDINGS, requantize, wrap_int32
from .base import dtype_of, expect
from .counting import KernelCost, out_writes, ref_reads
from .fields import bounded, one_of

if TYPE_CHECKING:
    from ..buffers import BufferSpec
    from ..tensor import TensorRef

ACTIVATION_DTYPES = ("int8", "uint8")
RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int32": (-(1 << 31), (1 << 31) - 1)}
MULTIPLIER_MAX = (1 << 31) - 1


@dataclass(frozen=True)
class Requant:
    """acc (int32) -> clamp(apply_scale(acc, M, n, rounding) + zero_point, lo, hi), stored in the output dtype. [lo,
    hi] lies inside the output type's range: narrower where a ReLU (lo = zero_point) or a clamp was fused."""

    zero_point: int = bounded(-(1 << 16), 1 << 16, default=0)
    lo: int = bounded(-(1 << 16), 1 << 16, default=-128)
    hi: int = bounded(-(1 << 16), 1 << 16, default=127)
    rounding: str = one_of(*ROUNDINGS, default="single")

    def check(self, out_dtype: str) -> None:
        lo, hi = RANGES.get(out_dtype, (0, -1))
        expect(out_dtype in ACTIVATION_DTYPES, f"an integer kernel writes int8 or uint8, not {out_dtype}")
        expect(lo <= self.lo <= self.hi <= hi, f"a requantization clamp [{self.lo}, {self.hi}] outside {out_dtype}'s "
                                               f"[{lo}, {hi}]")
        expect(lo <= self.zero_point <= hi, f"an output zero point {self.zero_point} outside {out_dtype}'s range")

    def apply(self, acc: np.ndarray, scale: np.ndarray, channel_axis: int) -> np.ndarray:
        """`acc` (int64 sums) wrapped to int32 and requantized; `scale` the [channels, 2] (M, n) rows, broadcast along
        `channel_axis` of acc (one row: every element)."""
        shape = [1] * acc.ndim
        if scale.shape[0] > 1:
            shape[channel_axis] = scale.shape[0]
        m = scale[:, 0].astype(np.int64).reshape(shape)
        n = scale[:, 1].astype(np.int64).reshape(shape)
        return requantize(wrap_int32(acc), m, n, self.zero_point, self.lo, self.hi, self.rounding)


def check_scale(ref: TensorRef, buffers: Sequence[BufferSpec], channels: int, what: str) -> None:
    """The requantization buffer of a kernel: int32 [channels, 2]."""
    expect(dtype_of(buffers, ref) == "int32" and tuple(ref.shape) == (channels, 2),
           f"{what}'s requantization (multiplier, shift) rows are {dtype_of(buffers, ref)}{list(ref.shape)}, expected "
           f"int32[{channels}, 2]")


def check_scale_values(scale: np.ndarray, what: str) -> None:
    """Multipliers in [0, 2^31) and shifts in [0, 62] (the reference refuses others: no backend computes them)."""
    if scale.size and (int(scale[:, 0].min()) < 0 or int(scale[:, 1].min()) < 0 or int(scale[:, 1].max()) > MAX_SHIFT):
        raise KernelFault(f"{what}: a requantization multiplier below 0 or a shift outside [0, {MAX_SHIFT}]")


def check_zero_point(zp: int, dtype: str, what: str) -> None:
    lo, hi = RANGES.get(dtype, (0, -1))
    expect(dtype in ACTIVATION_DTYPES, f"{what} is {dtype}, not int8 or uint8")
    expect(lo <= zp <= hi, f"{what}'s zero point {zp} is outside {dtype}'s range [{lo}, {hi}]")


def exact_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The integer product a @ b (int64 operands of at most 16 bits each), exact: through float64 BLAS, whose every
    partial sum is an integer below 2^53 for K below 2^37 (NumPy's integer matmul has no BLAS and is far slower)."""
    k = a.shape[-1]
    if k >= 1 << 37:
        return np.matmul(a, b)
    return np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.int64)


def check_bias_and_scale(spec, call, buffers: Sequence[BufferSpec], channels: int, what: str) -> None:
    """A qgemm's or qconv2d's bias, scale and output: int32 bias, (M, n) rows and an int8 output, or (dequantize)
    a float32 bias, float32 scales and a float32 output."""
    out = dtype_of(buffers, call.outs[0])
    bias_dt = "float32" if spec.dequantize else "int32"
    if spec.bias:
        bias = call.args[2]
        expect(dtype_of(buffers, bias) == bias_dt and tuple(bias.shape) == (channels,),
               f"{what} bias {dtype_of(buffers, bias)}{list(bias.shape)}, expected {bias_dt}[{channels}]")
    expect(spec.channels in (1, channels), f"a {what} of {channels} channels scaled in {spec.channels} channels")
    scale = call.args[spec.scale_arg]
    if spec.dequantize:
        expect(out == "float32", f"a dequantizing {what} writes float32, not {out}")
        expect(dtype_of(buffers, scale) == "float32" and tuple(scale.shape) == (spec.channels,),
               f"a dequantizing {what}'s scales are {dtype_of(buffers, scale)}{list(scale.shape)}, expected "
               f"float32[{spec.channels}]")
    else:
        check_scale(scale, buffers, spec.channels, f"a {what}")
        residual = getattr(spec, "residual", None)  # a fused add's operand: the result before the add
        spec.requant.check(residual.mid_dtype if residual is not None else out)


def finish(spec, acc: np.ndarray, bias: np.ndarray | None, scale: np.ndarray, channel_axis: int) -> np.ndarray:
    """The epilogue of a qgemm or qconv2d over its exact sums `acc`: requantized to int8 (an int32 bias added first),
    or (dequantize) float32(sum) * scale[c] + bias[c] in float32."""
    shape = [1] * acc.ndim
    if spec.dequantize:
        if scale.shape[0] > 1:
            shape[channel_axis] = scale.shape[0]
        y = wrap_int32(acc).astype(np.float32) * scale.astype(np.float32).reshape(shape)
        if bias is not None:
            shape[channel_axis] = bias.shape[0]
            y = y + bias.astype(np.float32).reshape(shape)
        return y
    if bias is not None:
        shape[channel_axis] = bias.shape[0]
        acc = acc + bias.astype(np.int64).reshape(shape)
    return spec.requant.apply(acc, scale, channel_axis)


# vector operations per output element of the epilogue: requantizing (the bias add, the multiply, the rounding add,
# the shift, the zero point: arithmetic; the clamp: 2 comparisons), or dequantizing (a multiply and the bias add)
REQUANT_ARITH, REQUANT_COMPARES, DEQUANT_ARITH = 5, 2, 2


def contraction_cost(spec, call, buffers: Sequence[BufferSpec], macs: int) -> KernelCost:
    """A qgemm's or qconv2d's cost in the counting vocabulary (kernels/counting.py): its MACs in int8, its epilogue
    per output element, every argument read as far as its view reaches, the output written."""
    out = call.outs[0].numel
    if spec.dequantize:
        arith, compares = out * (DEQUANT_ARITH - (not spec.bias)), 0
    else:
        arith, compares = out * (REQUANT_ARITH - (not spec.bias)), out * REQUANT_COMPARES
    return KernelCost(macs, arith, compares, tuple(ref_reads(call, buffers, range(len(call.args)))),
                      out_writes(call, buffers), (dtype_of(buffers, call.args[0]), dtype_of(buffers, call.args[1])))
