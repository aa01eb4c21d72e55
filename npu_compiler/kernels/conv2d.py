"""2-D convolution: out[n, o, ho, wo] = epilogue(round(sum over the window and a group's channels of x * w +
bias)), accumulated in fp32. `Acc` in the epilogue is that sum rounded to the output dtype (a residual add and a
ReLU follow it, as in the unfused graph).

A side conv (`side_stride`): a 1x1 conv of another input x2 (weight w2 [O, C2, 1, 1], its own bias) computed by the
same kernel, whose sum plus its bias, rounded to the output dtype, is the epilogue's `Acc(1)`: what the unfused graph
stored as the conv's own output before the add that reads both (a ResNet block's projection shortcut, folded by
`lowering/side_convs.py`). The kernel reads x2 instead of the shortcut's full-size result, and nothing changes in
what is computed.

Why a library kernel: like a GEMM (an implicit one: M = N*Ho*Wo pixels, N = output channels, K = Cin/g*kh*kw), each
input element is reused by every filter and every window it falls in; speed is tiling through on-chip memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..dtypes import is_float
from ..expr import nodes as X
from ..expr.interpret import Evaluator, cast, dtype_name, store
from .base import (
    Arrays,
    KernelCost,
    KernelSpec,
    Step,
    check_epilogue,
    dtype_of,
    expect,
)
from .counting import OpCounts, expr_counts, expr_reads, merge_reads, out_writes, ref_reads
from .fields import bounded

if TYPE_CHECKING:
    from ..buffers import BufferSpec
    from .base import KernelCall


def conv_out_size(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def conv_flops(out_numel: int, cin_per_group: int, kh: int, kw: int) -> int:
    return 2 * out_numel * cin_per_group * kh * kw


@dataclass(frozen=True)
class Conv2dKernel(KernelSpec):
    kind = "conv2d"
    library_reason = ("an implicit GEMM (M = N*Ho*Wo, N = Cout, K = Cin/g*kh*kw): each input element is reused by "
                      "every filter and window; its speed is tiling through on-chip memory")

    stride: tuple[int, ...] = bounded(1, 2**20)
    padding: tuple[int, ...] = bounded(0, 2**20)
    dilation: tuple[int, ...] = bounded(1, 2**20)
    groups: int = bounded(1, 2**20)
    bias: bool = False  # args[2] is the bias [Cout]
    epilogue: X.Expr | None = None
    # a side conv (see the module's docstring): its stride; args after (x, w[, bias]) are x2, w2[, bias2]
    side_stride: tuple[int, ...] = bounded(1, 2**20, default=())
    side_bias: bool = False

    @property
    def side_first_arg(self) -> int:
        """The index of the side conv's input x2 in args (then w2, then its bias)."""
        return 3 if self.bias else 2

    @property
    def first_epilogue_arg(self) -> int:
        return self.side_first_arg + (2 + int(self.side_bias) if self.side_stride else 0)

    @property
    def acc_groups(self) -> int:
        """The epilogue's `Acc` groups: the conv's rounded result, and the side conv's."""
        return 2 if self.side_stride else 1

    def check(self, call: KernelCall, buffers: Sequence[BufferSpec]) -> None:
        expect(len(call.outs) == 1, f"a conv2d writes one output, this one {len(call.outs)}")
        expect(len(call.args) >= self.first_epilogue_arg, "a conv2d needs its input, weight and bias")
        expect(len(self.stride) == len(self.padding) == len(self.dilation) == 2,
               "conv2d stride, padding and dilation are pairs")
        x, w, out = call.args[0], call.args[1], call.outs[0]
        expect(len(x.shape) == 4 and len(w.shape) == 4 and len(out.shape) == 4,
               f"conv2d over {list(x.shape)} with weight {list(w.shape)} into {list(out.shape)}")
        n, c, h, wd = x.shape
        o, cg, kh, kw = w.shape
        g = self.groups
        expect(c == cg * g and o % g == 0, f"conv2d of {c} channels in {g} groups with weight {list(w.shape)}")
        ho = conv_out_size(h, kh, self.stride[0], self.padding[0], self.dilation[0])
        wo = conv_out_size(wd, kw, self.stride[1], self.padding[1], self.dilation[1])
        expect(tuple(out.shape) == (n, o, ho, wo), f"conv2d output {list(out.shape)}, expected {[n, o, ho, wo]}")
        if self.bias:
            expect(tuple(call.args[2].shape) == (o,), f"conv2d bias {list(call.args[2].shape)} for {o} channels")
        dts = {dtype_of(buffers, r) for r in (x, w, out)}
        expect(all(is_float(d) for d in dts), f"a conv2d over {sorted(dts)}")
        if self.side_stride:
            self._check_side(call, buffers)
        else:
            expect(not self.side_bias, "a conv2d with a side conv's bias but no side conv")
        check_epilogue(self.epilogue, call, buffers, out, self.acc_groups)
        # (a K split across blocks and its scratch are the call's plan: kernels/plans.py)

    def _check_side(self, call: KernelCall, buffers: Sequence[BufferSpec]) -> None:
        expect(len(self.side_stride) == 2, f"a conv2d's side stride is a pair, not {list(self.side_stride)}")
        expect(self.groups == 1, "a conv2d with a side conv has one group")
        expect(self.epilogue is not None, "a conv2d with a side conv needs an epilogue to add its result (Acc(1))")
        expect(len(call.args) >= self.first_epilogue_arg, "a conv2d with a side conv needs its input, weight and bias")
        out = call.outs[0]
        x2, w2 = call.args[self.side_first_arg], call.args[self.side_first_arg + 1]
        expect(len(x2.shape) == 4 and len(w2.shape) == 4,
               f"a side conv over {list(x2.shape)} with weight {list(w2.shape)}")
        n, c2, h2, wd2 = x2.shape
        o, ho, wo = out.shape[1], out.shape[2], out.shape[3]
        sh, sw = self.side_stride
        expect(tuple(w2.shape) == (o, c2, 1, 1), f"a side conv's weight {list(w2.shape)}, expected {[o, c2, 1, 1]}")
        expect(n == out.shape[0] and conv_out_size(h2, 1, sh, 0, 1) == ho and conv_out_size(wd2, 1, sw, 0, 1) == wo,
               f"a 1x1 side conv of stride {[sh, sw]} over {list(x2.shape)} does not give {list(out.shape)}")
        if self.side_bias:
            b2 = call.args[self.side_first_arg + 2]
            expect(tuple(b2.shape) == (o,), f"a side conv's bias {list(b2.shape)} for {o} channels")
        dts = {dtype_of(buffers, r) for r in (x2, w2)}
        expect(all(is_float(d) for d in dts), f"a side conv over {sorted(dts)}")

    def cost(self, call: KernelCall, buffers: Sequence[BufferSpec], *, context_len: int | None = None) -> KernelCost:
        """Per output element Cin/g kh kw MACs (and the side conv's C2), the bias (and the side's) and the epilogue.
        Reads: the input, the weights, the biases, the side conv's operands and what the epilogue loads; the output
        is written once (a split's scratch is the target's, not counted)."""
        out, w = call.outs[0], call.args[1]
        macs = out.numel * w.shape[1] * w.shape[2] * w.shape[3]
        if self.side_stride:
            macs += out.numel * call.args[self.side_first_arg].shape[1]
        counts = OpCounts(out.numel * (int(self.bias) + int(self.side_bias)))
        counts += expr_counts(self.epilogue, tuple(out.shape))
        reads = merge_reads(ref_reads(call, buffers, range(self.first_epilogue_arg)),
                            expr_reads((self.epilogue,), call, buffers, tuple(out.shape)))
        return KernelCost(macs, counts.arith, counts.compares, reads, out_writes(call, buffers),
                          (dtype_of(buffers, call.args[0]), dtype_of(buffers, w)))

    def reference(self, call: KernelCall, arrays: Arrays) -> Step:
        xv, wv = arrays.view(call.args[0]), arrays.view(call.args[1])
        bias = arrays.view(call.args[2]) if self.bias else None
        out = arrays.view(call.outs[0])
        od = dtype_name(out.dtype)
        ev = Evaluator(self.epilogue, out.shape, (), [arrays.buffer(r) for r in call.args]) \
            if self.epilogue is not None else None
        geometry = (self.stride, self.padding, self.dilation, self.groups)
        side = None
        if self.side_stride:
            at = self.side_first_arg
            side = (arrays.view(call.args[at]), arrays.view(call.args[at + 1]),
                    arrays.view(call.args[at + 2]) if self.side_bias else None)
            side_geometry = (self.side_stride, (0, 0), (1, 1), 1)

        def run() -> None:
            out_hw = (out.shape[2], out.shape[3])
            y = _conv_sum(xv, wv, bias, *geometry, out_hw)
            if ev is None:
                store(out, y)
            elif side is None:
                store(out, ev.evaluate(cast(y, od)))
            else:  # the side conv's sum as it would be alone (the unfolded graph's bits)
                store(out, ev.evaluate([cast(y, od), cast(_conv_sum(*side, *side_geometry, out_hw), od)]))

        return run


def _conv_sum(xv: np.ndarray, wv: np.ndarray, bias: np.ndarray | None, stride: Sequence[int],
              padding: Sequence[int], dilation: Sequence[int], g: int, out_hw: tuple[int, int]) -> np.ndarray:
    """A conv's sum plus its bias, in fp32 ([N, O, Ho, Wo]): each group's patches times its filters."""
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    x, w = xv.astype(np.float32), wv.astype(np.float32)
    n = x.shape[0]
    o, cg, kh, kw = w.shape
    ho, wo = out_hw
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw))) if ph or pw else x
    eh, ew = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    win = sliding_window_view(xp, (eh, ew), axis=(2, 3))[:, :, ::sh, ::sw, ::dh, ::dw][:, :, :ho, :wo]
    og = o // g
    y = np.empty((n, o, ho, wo), np.float32)
    for gi in range(g):
        cols = win[:, gi * cg:(gi + 1) * cg]  # n, cg, ho, wo, kh, kw
        cols = cols.transpose(0, 2, 3, 1, 4, 5).reshape(n * ho * wo, cg * kh * kw)
        wg = w[gi * og:(gi + 1) * og].reshape(og, cg * kh * kw)
        y[:, gi * og:(gi + 1) * og] = (cols @ wg.T).reshape(n, ho, wo, og).transpose(0, 3, 1, 2)
    if bias is not None:
        y += bias.astype(np.float32).reshape(1, -1, 1, 1)
    return y
