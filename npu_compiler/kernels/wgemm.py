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
from ..expr.interpret import store
from .base import Arrays, KernelCost, KernelSpec, Step, dtype_of, expect, expect_shape
from .counting import out_writes, ref_reads
from .fields import bounded

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

    @property
    def n_args(self) -> int:
        return 3 + (self.bits == 4) + int(self.bias)

    def check(self, call: KernelCall, buffers: Sequence[BufferSpec]) -> None:
        expect(self.bits in (4, 8), f"a wgemm of {self.bits}-bit weights (4 or 8)")
        expect(len(call.outs) == 1 and len(call.args) == self.n_args,
               f"a {self.bits}-bit wgemm{' with bias' if self.bias else ''} reads {self.n_args} arguments and writes "
               f"one, this one {len(call.args)} and {len(call.outs)}")
        a, q, scale, out = call.args[0], call.args[1], call.args[2], call.outs[0]
        expect_shape(a, (*self.batch, self.m, self.k), "wgemm operand a")
        expect_shape(out, (*self.batch, self.m, self.n), "wgemm output")
        expect(is_float(dtype_of(buffers, a)) and dtype_of(buffers, out) == dtype_of(buffers, a),
               f"a wgemm of {dtype_of(buffers, a)} activations into {dtype_of(buffers, out)}")
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
            zero = call.args[3]
            expect(dtype_of(buffers, zero) == "uint8", f"wgemm zero points are uint8, not {dtype_of(buffers, zero)}")
            expect_shape(zero, (self.n, groups), "wgemm zero points")
        if self.bias:
            bias = call.args[-1]
            expect_shape(bias, (self.n,), "wgemm bias")
            expect(dtype_of(buffers, bias) == dtype_of(buffers, out), "a wgemm bias in another dtype than its output")

    def cost(self, call: KernelCall, buffers: Sequence[BufferSpec], *, context_len: int | None = None) -> KernelCost:
        """m n k MACs per batch entry (in the activations' format: the weight is decoded to it); decoding the weight
        once per element (a multiply, less the zero point at int4) and the bias per output element."""
        batch = math.prod(self.batch)
        decode = self.n * self.k * (1 if self.bits == 8 else 2)
        out = call.outs[0]
        a = dtype_of(buffers, call.args[0])
        return KernelCost(batch * self.m * self.n * self.k, decode + int(self.bias) * out.numel, 0,
                          tuple(ref_reads(call, buffers, range(len(call.args)))), out_writes(call, buffers), (a, a))

    def reference(self, call: KernelCall, arrays: Arrays) -> Step:
        a = arrays.view(call.args[0])
        q, scale = arrays.view(call.args[1]), arrays.view(call.args[2])
        zero = arrays.view(call.args[3]) if self.bits == 4 else None
        bias = arrays.view(call.args[-1]) if self.bias else None
        out = arrays.view(call.outs[0])

        def run() -> None:
            if zero is not None and int(zero.max(initial=0)) > 15:
                from ..errors import KernelFault

                raise KernelFault("wgemm: an int4 zero point above 15")
            w = dequantize_weight(self, q, scale, zero)
            acc = np.matmul(a.astype(np.float32), w.T)
            if bias is not None:
                acc = acc + bias.astype(np.float32)
            store(out, acc)

        return run
