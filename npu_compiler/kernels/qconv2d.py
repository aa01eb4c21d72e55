"""Integer 2-D convolution: out[n, o, ho, wo] = requant(sum over the window and a group's channels of (x - zx) * w
+ bias), the sum and the bias in int32 (wrapping), requantized per output channel or per tensor
(`kernels/requant.py`). x: int8/uint8 [N, C, H, W]; w: int8 [O, C/g, kh, kw] (symmetric: its zero point is 0);
bias: int32 [O]; scale: int32 [channels, 2], channels 1 or O. Padding holds the input's zero point (a real 0). With
`dequantize` the output is float32, as `qgemm`'s (float32(sum) * scale[c] + bias[c]). With `residual` (a ResNet
block's add, fused by the lowering where the target computes it in the conv's epilogue) the requantized result is
then added to the skip tensor (the last argument, [N, O, Ho, Wo]) as `qadd` adds (kernels/qadd.py), and that sum is
the output.

Folded from the IR's dequantize -> conv2d [-> relu/clamp] -> quantize pattern (`npu_compiler/quant/fold.py`).

Why a library kernel: an implicit GEMM (M = N*Ho*Wo, N = O, K = C/g*kh*kw) like the float conv, on int8 operands with
a requantizing epilogue.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .base import Arrays, KernelCost, KernelSpec, Step, dtype_of, expect
from .conv2d import conv_flops, conv_out_size
from .fields import bounded
from .qadd import ADD_ARITH, ADD_COMPARES, ResidualAdd, add_requantized
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
class QConv2dKernel(KernelSpec):
    kind = "qconv2d"
    library_reason = ("an int8 implicit GEMM (M = N*Ho*Wo, N = Cout, K = Cin/g*kh*kw) with a fixed-point "
                      "requantizing epilogue: its speed is tiling onto int8 matrix units")

    stride: tuple[int, ...] = bounded(1, 2**20)
    padding: tuple[int, ...] = bounded(0, 2**20)
    dilation: tuple[int, ...] = bounded(1, 2**20)
    groups: int = bounded(1, 2**20)
    x_zero_point: int = bounded(-255, 255, default=0)
    bias: bool = False  # args[2] is an int32 bias [O]
    channels: int = bounded(1, default=1)
    requant: Requant = field(default_factory=Requant)
    dequantize: bool = False  # a float32 output (see the module's docstring)
    residual: ResidualAdd | None = None  # the skip tensor added to the result (see the module's docstring)

    @property
    def scale_arg(self) -> int:
        return 2 + int(self.bias)

    def check(self, call: KernelCall, buffers: Sequence[BufferSpec]) -> None:
        expect(len(call.outs) == 1, f"a qconv2d writes one output, this one {len(call.outs)}")
        want = self.scale_arg + 1 + (self.residual is not None)
        expect(len(call.args) == want,
               f"a qconv2d{' with bias' if self.bias else ''}{' and a residual' if self.residual else ''} reads "
               f"{want} arguments, this one {len(call.args)}")
        expect(len(self.stride) == len(self.padding) == len(self.dilation) == 2,
               "qconv2d stride, padding and dilation are pairs")
        x, w, out = call.args[0], call.args[1], call.outs[0]
        expect(len(x.shape) == 4 and len(w.shape) == 4 and len(out.shape) == 4,
               f"qconv2d over {list(x.shape)} with weight {list(w.shape)} into {list(out.shape)}")
        n, c, h, wd = x.shape
        o, cg, kh, kw = w.shape
        g = self.groups
        expect(c == cg * g and o % g == 0, f"qconv2d of {c} channels in {g} groups with weight {list(w.shape)}")
        ho = conv_out_size(h, kh, self.stride[0], self.padding[0], self.dilation[0])
        wo = conv_out_size(wd, kw, self.stride[1], self.padding[1], self.dilation[1])
        expect(tuple(out.shape) == (n, o, ho, wo), f"qconv2d output {list(out.shape)}, expected {[n, o, ho, wo]}")
        check_zero_point(self.x_zero_point, dtype_of(buffers, x), "qconv2d input")
        expect(dtype_of(buffers, w) == "int8", f"a qconv2d weight is int8, not {dtype_of(buffers, w)}")
        check_bias_and_scale(self, call, buffers, o, "qconv2d")
        if self.residual is not None:
            r = self.residual
            expect(not self.dequantize, "a dequantizing qconv2d with a residual add")
            skip = call.args[-1]
            expect(tuple(skip.shape) == tuple(out.shape), f"a qconv2d residual {list(skip.shape)} for an output "
                                                          f"{list(out.shape)}")
            check_zero_point(r.b_zero_point, dtype_of(buffers, skip), "a qconv2d residual")
            r.requant.check(dtype_of(buffers, out))

    def cost(self, call: KernelCall, buffers: Sequence[BufferSpec], *, context_len: int | None = None) -> KernelCost:
        """Per output element a window's int8 MACs (C/g kh kw) and the epilogue (and a fused add's)."""
        cost = contraction_cost(self, call, buffers, conv_flops(call.outs[0].numel, *call.args[1].shape[1:]) // 2)
        if self.residual is None:
            return cost
        out = call.outs[0].numel
        return dataclasses.replace(cost, arith=cost.arith + ADD_ARITH * out,
                                   compares=cost.compares + ADD_COMPARES * out)

    def reference(self, call: KernelCall, arrays: Arrays) -> Step:
        xv, wv = arrays.view(call.args[0]), arrays.view(call.args[1])
        bias = arrays.view(call.args[2]) if self.bias else None
        scale = arrays.view(call.args[self.scale_arg])
        skip = arrays.view(call.args[-1]) if self.residual is not None else None
        out = arrays.view(call.outs[0])

        def run() -> None:
            if not self.dequantize:
                check_scale_values(scale, "qconv2d")
            acc = int_conv_sum(xv, wv, self.x_zero_point, self.stride, self.padding, self.dilation, self.groups,
                               (out.shape[2], out.shape[3]))
            y = finish(self, acc, bias, scale, 1)
            if self.residual is not None:
                y = add_requantized(self.residual, y, skip, self.requant.zero_point, self.residual.b_zero_point)
            np.copyto(out, y.astype(out.dtype))

        return run


def int_conv_sum(xv: np.ndarray, wv: np.ndarray, x_zero_point: int, stride: Sequence[int], padding: Sequence[int],
                 dilation: Sequence[int], g: int, out_hw: tuple[int, int]) -> np.ndarray:
    """sum (x - zx) * w over each window, exact in int64 ([N, O, Ho, Wo]); padding is the zero point (0 after the
    subtraction)."""
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    x = xv.astype(np.int64) - np.int64(x_zero_point)
    w = wv.astype(np.int64)
    n = x.shape[0]
    o, cg, kh, kw = w.shape
    ho, wo = out_hw
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw))) if ph or pw else x
    eh, ew = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    win = sliding_window_view(xp, (eh, ew), axis=(2, 3))[:, :, ::sh, ::sw, ::dh, ::dw][:, :, :ho, :wo]
    og = o // g
    y = np.empty((n, o, ho, wo), np.int64)
    for gi in range(g):
        cols = win[:, gi * cg:(gi + 1) * cg].transpose(0, 2, 3, 1, 4, 5).reshape(n * ho * wo, cg * kh * kw)
        wg = w[gi * og:(gi + 1) * og].reshape(og, cg * kh * kw)
        y[:, gi * og:(gi + 1) * og] = exact_matmul(cols, wg.T).reshape(n, ho, wo, og).transpose(0, 3, 1, 2)
    return y
