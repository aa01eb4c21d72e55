"""Integer addition of two quantized tensors, as TFLite's int8 ADD computes it: each input, less its zero point and
shifted left by `left_shift` (20) bits, is rescaled to twice the larger input scale by a fixed-point multiplier below
one; the sum is requantized to the output scale (`kernels/requant.py`), a fused ReLU or clamp narrowing the clamp.

    a' = apply_scale((a - za) << left_shift, Ma, na)      b' likewise
    out = clamp(apply_scale(a' + b', Mo, no) + zo, lo, hi)

Every multiplier and shift is per tensor, so they are fields of the record (`npu_compiler/quant/fold.py` computes
them from the IR's scales). `a` and `b` are views broadcast to the output's shape (a residual add, a bias-like add).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..quant.fixed_point import MAX_SHIFT, apply_scale, requantize
from .base import Arrays, KernelCost, KernelSpec, Step, dtype_of, expect, expect_shape
from .counting import out_writes, ref_reads
from .fields import bounded, one_of
from .requant import MULTIPLIER_MAX, Requant, check_zero_point

if TYPE_CHECKING:
    from ..buffers import BufferSpec
    from .base import KernelCall


ADD_ARITH, ADD_COMPARES = 11, 2  # vector operations an output element of the add (`QAddKernel.cost`)


def add_requantized(spec, a: np.ndarray, b: np.ndarray, a_zero_point: int, b_zero_point: int) -> np.ndarray:
    """TFLite's int8 ADD of integer arrays a and b (any integer dtype) by the multipliers, shifts and requantization of
    `spec` (a QAddKernel or a ResidualAdd): int64 values, saturated to the requantization's clamp."""
    q = spec.requant
    sa = apply_scale((a.astype(np.int64) - a_zero_point) << spec.left_shift, spec.a_multiplier, spec.a_shift,
                     q.rounding)
    sb = apply_scale((b.astype(np.int64) - b_zero_point) << spec.left_shift, spec.b_multiplier, spec.b_shift,
                     q.rounding)
    return requantize(sa + sb, spec.out_multiplier, spec.out_shift, q.zero_point, q.lo, q.hi, q.rounding)


@dataclass(frozen=True)
class ResidualAdd:
    """A qadd fused into the epilogue of the integer conv that computes one of its operands: a is the conv's
    requantized result (its zero point the conv's output zero point, its values clamped to the conv's `requant`, as
    stored in `mid_dtype`), b the skip tensor (the kernel's last argument); the rest as QAddKernel's fields, `requant`
    the add's (the kernel's output)."""

    mid_dtype: str = one_of("int8", "uint8", default="int8")
    b_zero_point: int = bounded(-255, 255, default=0)
    left_shift: int = bounded(0, 24, default=20)
    a_multiplier: int = bounded(0, MULTIPLIER_MAX, default=0)
    a_shift: int = bounded(0, MAX_SHIFT, default=0)
    b_multiplier: int = bounded(0, MULTIPLIER_MAX, default=0)
    b_shift: int = bounded(0, MAX_SHIFT, default=0)
    out_multiplier: int = bounded(0, MULTIPLIER_MAX, default=0)
    out_shift: int = bounded(0, MAX_SHIFT, default=0)
    requant: Requant = field(default_factory=Requant)


@dataclass(frozen=True)
class QAddKernel(KernelSpec):
    kind = "qadd"
    library_reason = ("fixed-point rescaling (64-bit products, arithmetic shifts), which the expression language "
                      "does not have")

    a_zero_point: int = bounded(-255, 255, default=0)
    b_zero_point: int = bounded(-255, 255, default=0)
    left_shift: int = bounded(0, 24, default=20)
    a_multiplier: int = bounded(0, MULTIPLIER_MAX, default=0)
    a_shift: int = bounded(0, MAX_SHIFT, default=0)
    b_multiplier: int = bounded(0, MULTIPLIER_MAX, default=0)
    b_shift: int = bounded(0, MAX_SHIFT, default=0)
    out_multiplier: int = bounded(0, MULTIPLIER_MAX, default=0)
    out_shift: int = bounded(0, MAX_SHIFT, default=0)
    requant: Requant = field(default_factory=Requant)

    def check(self, call: KernelCall, buffers: Sequence[BufferSpec]) -> None:
        expect(len(call.outs) == 1 and len(call.args) == 2,
               f"a qadd reads two tensors and writes one, this one {len(call.args)} and {len(call.outs)}")
        out = call.outs[0]
        for name, ref, zp in (("a", call.args[0], self.a_zero_point), ("b", call.args[1], self.b_zero_point)):
            expect_shape(ref, tuple(out.shape), f"qadd operand {name}")
            check_zero_point(zp, dtype_of(buffers, ref), f"qadd operand {name}")
        self.requant.check(dtype_of(buffers, out))

    def cost(self, call: KernelCall, buffers: Sequence[BufferSpec], *, context_len: int | None = None) -> KernelCost:
        """Per output element: two zero points, two shifts, two rescales (a multiply and a rounding add each), the
        add, the output rescale and zero point (11 arithmetic) and the clamp (2 comparisons)."""
        out = call.outs[0].numel
        return KernelCost(0, ADD_ARITH * out, ADD_COMPARES * out, tuple(ref_reads(call, buffers, range(2))),
                          out_writes(call, buffers))

    def reference(self, call: KernelCall, arrays: Arrays) -> Step:
        a, b = arrays.view(call.args[0]), arrays.view(call.args[1])
        out = arrays.view(call.outs[0])

        def run() -> None:
            np.copyto(out, add_requantized(self, a, b, self.a_zero_point, self.b_zero_point).astype(out.dtype))

        return run
