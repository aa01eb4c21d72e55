"""Weight-only quantized GEMM (GEMV when m is small): out[batch..., m, n] = round(a @ dequantize(W)^T + bias), the
activations a and the result in a float dtype (bf16 decoding), the weight stored int8 per output channel or int4
group-wise along K:

    bits 8: W[n, k] = q[n, k] * scale[n]                                  q int8 [N, K], scale float32 [N]
    bits 4: W[n, k] = (q[n, k] - zero[n, k // G]) * scale[n, k // G]      q two 4-bit codes a byte along K
                                                                          (uint8 [N, K / 2], k even in the low
                                                                          nibble), zero uint8 and scale float32
                                                                          [N, K / G], G = `group` (128: AWQ's and
                                                                          GPTQ's group)

The products and the sum are float32 (the dequantized weight is not rounded to the activation dtype first), the
result rounded once to the output dtype. Decoding is memory-bound: the weight is read at a half or a quarter of its
bf16 bytes, which is the point of the kind.

A wgemm folds what the float GEMM folds (kernels/gemm.py), with the same meaning: a `prologue` computing operand a
(the RMSNorm before a decode projection: then a is not an argument), an `epilogue` over `Acc`, the product rounded to
the output dtype (a residual add), and column groups (`acc_groups` G: the product's n columns are G groups side by
side, the output has n / G of them, the epilogue reads each group's value as `Acc(group=g)`: SiLU(gate) * up). Its
arguments: [a (without a prologue)], codes, scales, [zero points], [bias], then the buffers the prologue and the
epilogue read.

Why a library kernel: a contraction (tiling, the GEMV's one pass over the weight) whose operand b is decoded from
packed codes on the way in, which the expression language does not describe.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..dtypes import is_float
from ..expr import nodes as X
from ..expr.interpret import Evaluator, dtype_name, store
from .base import Arrays, KernelCost, KernelSpec, Step, check_epilogue, dtype_of, expect, expect_shape
from .counting import OpCounts, expr_counts, expr_reads, merge_reads, out_writes, ref_reads
from .fields import bounded
from .gemm import check_prologue, store_product

if TYPE_CHECKING:
    from ..buffers import BufferSpec
    from .base import KernelCall


def unpack_int4(packed: np.ndarray) -> np.ndarray:
    """uint8 [..., K / 2] -> codes 0..15 [..., K] (k even in the low nibble)."""
    p = packed.astype(np.uint8)
    out = np.empty((*p.shape[:-1], p.shape[-1] * 2), np.uint8)
    out[..., 0::2] = p & 0x0F
    out[..., 1::2] = p >> 4
    return out


def dequantize_weight(spec: WGemmKernel, q: np.ndarray, scale: np.ndarray, zero: np.ndarray | None) -> np.ndarray:
    """The float32 [N, K] weight a wgemm multiplies by."""
    if spec.bits == 8:
        return q.astype(np.float32) * scale.astype(np.float32).reshape(-1, 1)
    codes = unpack_int4(q).astype(np.float32)
    g = spec.group
    z = np.repeat(zero.astype(np.float32), g, axis=1)
    s = np.repeat(scale.astype(np.float32), g, axis=1)
    return (codes - z) * s


@dataclass(frozen=True)
class WGemmKernel(KernelSpec):
    kind = "wgemm"
    library_reason = ("a contraction whose weight is decoded from int8 or packed int4 codes on the way in: its speed "
                      "is reading those bytes once (a GEMV) or tiling them onto matrix units")

    m: int = bounded(0)
    n: int = bounded(0)
    k: int = bounded(0)
    batch: tuple[int, ...] = bounded(0, default=())
    bits: int = bounded(4, 8, default=8)
    group: int = bounded(0, 1 << 20, default=0)  # int4: codes per (scale, zero) along K; int8: 0 (per channel)
    bias: bool = False  # the last argument is a bias [n] in the output dtype

    epilogue: X.Expr | None = None
    prologue: X.Expr | None = None
    prologue_reduce: tuple[int, ...] = bounded(0, default=())
    acc_groups: int = bounded(1, 2**16, default=1)

    @property
    def w_arg(self) -> int:
        """Where the codes are in the arguments (a computed by a prologue is not one)."""
        return 0 if self.prologue is not None else 1

    @property
    def first_epilogue_arg(self) -> int:
        return self.w_arg + 2 + (self.bits == 4) + int(self.bias)

    @property
    def n_args(self) -> int:
        """The arguments before those the prologue and the epilogue read."""
        return self.first_epilogue_arg

    @property
    def a_shape(self) -> tuple[int, ...]:
        return (*self.batch, self.m, self.k)

    @property
    def out_n(self) -> int:
        """The output's columns: the product's, or one group's of them."""
        return self.n // self.acc_groups

    def check(self, call: KernelCall, buffers: Sequence[BufferSpec]) -> None:
        expect(self.bits in (4, 8), f"a wgemm of {self.bits}-bit weights (4 or 8)")
        folds = self.prologue is not None or self.epilogue is not None
        expect(len(call.outs) == 1 and (len(call.args) >= self.n_args if folds else len(call.args) == self.n_args),
               f"a {self.bits}-bit wgemm{' with bias' if self.bias else ''}"
               f"{' with a prologue' if self.prologue is not None else ''} reads {self.n_args} arguments"
               f"{' and those its folds read' if folds else ''} and writes one, this one {len(call.args)} and "
               f"{len(call.outs)}")
        w = self.w_arg
        q, scale, out = call.args[w], call.args[w + 1], call.outs[0]
        od = dtype_of(buffers, out)
        if self.prologue is None:
            expect(not self.prologue_reduce, "prologue_reduce without a prologue")
            a = call.args[0]
            expect_shape(a, self.a_shape, "wgemm operand a")
            ad = dtype_of(buffers, a)
        else:
            ad = self.prologue.dtype
            check_prologue(self.prologue, tuple(self.prologue_reduce), self.a_shape, self.first_epilogue_arg, od,
                           "wgemm", call, buffers, "an output")
        expect(self.n % self.acc_groups == 0, f"a wgemm of {self.n} columns in {self.acc_groups} groups")
        expect(self.acc_groups == 1 or self.epilogue is not None,
               f"a wgemm of {self.acc_groups} column groups needs an epilogue to combine them")
        expect_shape(out, (*self.batch, self.m, self.out_n), "wgemm output")
        expect(is_float(ad) and od == ad, f"a wgemm of {ad} activations into {od}")
        expect(dtype_of(buffers, scale) == "float32", f"wgemm scales are float32, not {dtype_of(buffers, scale)}")
        if self.bits == 8:
            expect(self.group == 0, "an int8 wgemm is per channel (group 0)")
            expect(dtype_of(buffers, q) == "int8", f"an int8 wgemm's weight is int8, not {dtype_of(buffers, q)}")
            expect_shape(q, (self.n, self.k), "wgemm weight")
            expect_shape(scale, (self.n,), "wgemm scales")
        else:
            expect(self.group > 0 and self.group % 2 == 0 and self.k % self.group == 0,
                   f"an int4 wgemm's group {self.group} must be even and divide K = {self.k}")
            groups = self.k // self.group
            expect(dtype_of(buffers, q) == "uint8", f"an int4 wgemm's codes are uint8, not {dtype_of(buffers, q)}")
            expect_shape(q, (self.n, self.k // 2), "wgemm packed weight")
            expect_shape(scale, (self.n, groups), "wgemm scales")
            zero = call.args[w + 2]
            expect(dtype_of(buffers, zero) == "uint8", f"wgemm zero points are uint8, not {dtype_of(buffers, zero)}")
            expect_shape(zero, (self.n, groups), "wgemm zero points")
        if self.bias:
            bias = call.args[self.first_epilogue_arg - 1]
            expect_shape(bias, (self.n,), "wgemm bias")
            expect(dtype_of(buffers, bias) == od, "a wgemm bias in another dtype than its output")
        check_epilogue(self.epilogue, call, buffers, out, self.acc_groups)

    def cost(self, call: KernelCall, buffers: Sequence[BufferSpec], *, context_len: int | None = None) -> KernelCost:
        """m n k MACs per batch entry (in the activations' format: the weight is decoded to it); decoding the weight
        once per element (a multiply, less the zero point at int4), the bias per product element, the epilogue per
        output element and the prologue per element of a (its reduction once per row and element)."""
        batch = math.prod(self.batch)
        decode = self.n * self.k * (1 if self.bits == 8 else 2)
        out = call.outs[0]
        counts = OpCounts(decode + int(self.bias) * batch * self.m * self.n)
        counts += expr_counts(self.epilogue, tuple(out.shape))
        counts += expr_counts(self.prologue, self.a_shape, math.prod(self.a_shape) if self.prologue_reduce else 0,
                              int(bool(self.prologue_reduce)))
        reads = merge_reads(ref_reads(call, buffers, range(self.first_epilogue_arg)),
                            expr_reads((self.epilogue,), call, buffers, tuple(out.shape)),
                            expr_reads((self.prologue,), call, buffers, self.a_shape, tuple(self.prologue_reduce)))
        a = dtype_of(buffers, out)
        return KernelCost(batch * self.m * self.n * self.k, counts.arith, counts.compares, reads,
                          out_writes(call, buffers), (a, a))

    def reference(self, call: KernelCall, arrays: Arrays) -> Step:
        w0 = self.w_arg
        q, scale = arrays.view(call.args[w0]), arrays.view(call.args[w0 + 1])
        zero = arrays.view(call.args[w0 + 2]) if self.bits == 4 else None
        bias = arrays.view(call.args[self.first_epilogue_arg - 1]) if self.bias else None
        out = arrays.view(call.outs[0])
        od = dtype_name(out.dtype)
        whole = [arrays.buffer(r) for r in call.args]
        ev = Evaluator(self.epilogue, out.shape, (), whole) if self.epilogue is not None else None
        if self.prologue is None:
            a = arrays.view(call.args[0])
        else:
            pro = Evaluator(self.prologue, self.a_shape, tuple(self.prologue_reduce), whole)
            a = np.empty(self.a_shape, out.dtype)
        groups = self.acc_groups

        def run() -> None:
            if zero is not None and int(zero.max(initial=0)) > 15:
                from ..errors import KernelFault

                raise KernelFault("wgemm: an int4 zero point above 15")
            if self.prologue is not None:
                store(a, pro.evaluate())
            w = dequantize_weight(self, q, scale, zero)
            acc = np.matmul(a.astype(np.float32), w.T)
            if bias is not None:
                acc = acc + bias.astype(np.float32)
            store_product(out, acc, ev, groups, od)

        return run
