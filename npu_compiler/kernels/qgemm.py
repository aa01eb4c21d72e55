"""Integer GEMM: out[batch..., m, n] = requant(sum_k (a - za) * (b - zb) + bias), the sum and the bias in int32
(wrapping), requantized per output column (per channel) or per tensor by a fixed-point multiplier and shift
(`kernels/requant.py`). a: int8/uint8 activations [batch..., m, k]; b: int8 [batch..., k, n] (a linear's weight as
a transposed view); bias: int32 [n]; scale: int32 [channels, 2], channels 1 or n.

With `dequantize`, the output is float32 instead: float32(sum) * scale[c] + bias[c], the scale float32 [channels]
(input scale x weight scale) and the bias float32 [n]: a linear whose result no integer op reads (PT2E's x86 recipe,
a transformer's projections before attention and its residual adds) stays float without a quantize after it.

A quantized linear (and a matmul of two quantized activations) is folded into this record from the IR's
dequantize -> linear -> quantize pattern (`npu_compiler/quant/fold.py`).

Why a library kernel: the same reuse of operands as a float GEMM (its speed is tiling onto int8 tensor cores or
packed dot products), and an integer epilogue whose arithmetic (64-bit products, arithmetic shifts) each target
writes its own way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .base import Arrays, KernelCost, KernelSpec, Step, dtype_of, expect, expect_shape
from .fields import bounded
from .requant import (
    Requant,
    check_bias_and_scale,
    check_scale_values,
    check_zero_point,
    contraction_cost,
    exact_matmul,
    finish,
)

if TYPE_CHECKING:
    from ..buffers import BufferSpec
    from .base import KernelCall


@dataclass(frozen=True)
class QGemmKernel(KernelSpec):
    kind = "qgemm"
    library_reason = ("an int8 contraction over K (int32 sums) with a fixed-point requantizing epilogue: its speed "
                      "is tiling onto int8 matrix units or packed dot products")

    m: int = bounded(0)
    n: int = bounded(0)
    k: int = bounded(0)
    batch: tuple[int, ...] = bounded(0)
    a_zero_point: int = bounded(-255, 255, default=0)
    b_zero_point: int = bounded(-255, 255, default=0)
    bias: bool = False  # args[2] is an int32 bias [n]
    channels: int = bounded(1, default=1)  # rows of the (M, n) scale: 1 (per tensor) or n (per output column)
    requant: Requant = field(default_factory=Requant)
    dequantize: bool = False  # a float32 output: sum * scale[c] + bias[c] (see the module's docstring)

    @property
    def scale_arg(self) -> int:
        return 2 + int(self.bias)

    def check(self, call: KernelCall, buffers: Sequence[BufferSpec]) -> None:
        expect(len(call.outs) == 1, f"a qgemm writes one output, this one {len(call.outs)}")
        expect(len(call.args) == self.scale_arg + 1,
               f"a qgemm{' with bias' if self.bias else ''} reads {self.scale_arg + 1} arguments, this one "
               f"{len(call.args)}")
        a, b, out = call.args[0], call.args[1], call.outs[0]
        expect_shape(a, (*self.batch, self.m, self.k), "qgemm operand a")
        expect_shape(b, (*self.batch, self.k, self.n), "qgemm operand b")
        expect_shape(out, (*self.batch, self.m, self.n), "qgemm output")
        check_zero_point(self.a_zero_point, dtype_of(buffers, a), "qgemm operand a")
        check_zero_point(self.b_zero_point, dtype_of(buffers, b), "qgemm operand b")
        check_bias_and_scale(self, call, buffers, self.n, "qgemm")

    def cost(self, call: KernelCall, buffers: Sequence[BufferSpec], *, context_len: int | None = None) -> KernelCost:
        """m n k int8 MACs per batch entry; the requantizing (or dequantizing) epilogue per output element."""
        return contraction_cost(self, call, buffers, self.m * self.n * self.k * math.prod(self.batch))

    def reference(self, call: KernelCall, arrays: Arrays) -> Step:
        a, b = arrays.view(call.args[0]), arrays.view(call.args[1])
        bias = arrays.view(call.args[2]) if self.bias else None
        scale = arrays.view(call.args[self.scale_arg])
        out = arrays.view(call.outs[0])
        za, zb = np.int64(self.a_zero_point), np.int64(self.b_zero_point)

        def run() -> None:
            if not self.dequantize:
                check_scale_values(scale, "qgemm")
            acc = exact_matmul(a.astype(np.int64) - za, b.astype(np.int64) - zb)
            np.copyto(out, finish(self, acc, bias, scale, acc.ndim - 1).astype(out.dtype))

        return run
