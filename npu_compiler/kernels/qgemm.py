"""Integer GEMM: out[batch..., m, n] = requant(sum_k (a - za) * (b - zb) + bias), the sum and the bias in int32
(wrapping), requantized per output column (per channel) or per tensor by a fixed-point multiplier and shift
(`kernels/requant.py`). a: int8/uint8 activations [batch..., m, k]; b: int8 [batch..., k, n] (a linear's weight as
a transposed view); bias: int32 [n]; scale: int32 [channels, 2], channels 1 or n.

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

from .base import Arrays, KernelCost, KernelSpec, Step, dtype_of, expect, expect_shape, ref_bytes
from .fields import bounded
from .requant import Requant, check_scale, check_scale_values, check_zero_point, exact_matmul

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
        if self.bias:
            bias = call.args[2]
            expect(dtype_of(buffers, bias) == "int32" and tuple(bias.shape) == (self.n,),
                   f"qgemm bias {dtype_of(buffers, bias)}{list(bias.shape)}, expected int32[{self.n}]")
        expect(self.channels in (1, self.n), f"a qgemm of {self.n} columns requantized in {self.channels} channels")
        check_scale(call.args[self.scale_arg], buffers, self.channels, "a qgemm")
        self.requant.check(dtype_of(buffers, out))

    def cost(self, call: KernelCall, buffers: Sequence[BufferSpec]) -> KernelCost:
        read = sum(ref_bytes(buffers, r) for r in call.args)
        out = call.outs[0]
        # a multiply-add counts 2; the requantization (a multiply, an add, a shift, a clamp) 4 per output
        return KernelCost(2 * self.m * self.n * self.k * math.prod(self.batch) + 4 * out.numel, read,
                          ref_bytes(buffers, out))

    def reference(self, call: KernelCall, arrays: Arrays) -> Step:
        a, b = arrays.view(call.args[0]), arrays.view(call.args[1])
        bias = arrays.view(call.args[2]) if self.bias else None
        scale = arrays.view(call.args[self.scale_arg])
        out = arrays.view(call.outs[0])
        za, zb = np.int64(self.a_zero_point), np.int64(self.b_zero_point)

        def run() -> None:
            check_scale_values(scale, "qgemm")
            acc = exact_matmul(a.astype(np.int64) - za, b.astype(np.int64) - zb)
            if bias is not None:
                acc = acc + bias.astype(np.int64)
            np.copyto(out, self.requant.apply(acc, scale, acc.ndim - 1).astype(out.dtype))

        return run
