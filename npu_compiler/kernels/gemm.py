"""GEMM: out[batch..., m, n] = epilogue(round(alpha * a @ b + beta * bias)), accumulated in fp32 (int64, exact and
wrapping, for integer operands). `Acc` in the epilogue is the product rounded to the output dtype, as the unfused
graph stores it before a residual add or an activation.

Why a library kernel: a contraction over K reuses every operand element many times; its speed comes from tiling
through on-chip memory onto tensor cores or a BLAS (cuBLAS), which the expression language does not describe.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

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
    epilogue_reads,
    expect,
    expect_shape,
    expr_flops,
    ref_bytes,
)
from .fields import bounded

if TYPE_CHECKING:
    from ..buffers import BufferSpec
    from .base import KernelCall


def gemm_flops(m: int, n: int, k: int, batch: int = 1) -> int:
    return 2 * m * n * k * batch


@dataclass(frozen=True)
class GemmKernel(KernelSpec):
    kind = "gemm"
    library_reason = ("a contraction over K reuses each operand element many times: its speed is tiling through "
                      "on-chip memory onto tensor cores or a BLAS")

    m: int = bounded(0)
    n: int = bounded(0)
    k: int = bounded(0)
    batch: tuple[int, ...] = bounded(0)
    alpha: float = 1.0
    bias: bool = False  # args[2] is a bias view broadcast to the output, scaled by beta
    beta: float = 1.0
    epilogue: X.Expr | None = None

    @property
    def batch_count(self) -> int:
        return math.prod(self.batch)

    @property
    def first_epilogue_arg(self) -> int:
        return 3 if self.bias else 2

    def check(self, call: KernelCall, buffers: Sequence[BufferSpec]) -> None:
        expect(len(call.outs) == 1, f"a gemm writes one output, this one {len(call.outs)}")
        expect(len(call.args) >= self.first_epilogue_arg,
               f"a gemm{' with bias' if self.bias else ''} needs {self.first_epilogue_arg} arguments")
        a, b, out = call.args[0], call.args[1], call.outs[0]
        expect_shape(a, (*self.batch, self.m, self.k), "gemm operand a")
        expect_shape(b, (*self.batch, self.k, self.n), "gemm operand b")
        expect_shape(out, (*self.batch, self.m, self.n), "gemm output")
        if self.bias:
            expect_shape(call.args[2], tuple(out.shape), "gemm bias view")
        dts = [dtype_of(buffers, r) for r in (a, b, out)]
        expect(all(d != "bool" for d in dts), f"a gemm over {dts}")
        expect(is_float(dts[2]) or not (is_float(dts[0]) or is_float(dts[1])),
               f"a gemm of float operands {dts[:2]} into {dts[2]}")
        check_epilogue(self.epilogue, call, buffers, out)

    def cost(self, call: KernelCall, buffers: Sequence[BufferSpec]) -> KernelCost:
        out = call.outs[0]
        read = sum(ref_bytes(buffers, r) for r in call.args[:self.first_epilogue_arg])
        read += epilogue_reads(self.epilogue, call, buffers, tuple(out.shape))
        flops = gemm_flops(self.m, self.n, self.k, self.batch_count) + expr_flops(self.epilogue, out.numel)
        return KernelCost(flops, read, ref_bytes(buffers, out))

    def reference(self, call: KernelCall, arrays: Arrays) -> Step:
        a, b = arrays.view(call.args[0]), arrays.view(call.args[1])
        bias = arrays.view(call.args[2]) if self.bias else None
        out = arrays.view(call.outs[0])
        od = dtype_name(out.dtype)
        ev = Evaluator(self.epilogue, out.shape, (), [arrays.buffer(r) for r in call.args]) \
            if self.epilogue is not None else None
        alpha, beta = self.alpha, self.beta
        integer = not is_float(od)

        def run() -> None:
            if integer:
                # exact in int64 (wrapping), as ATen's integer GEMMs: fp32 would round sums above 2^24
                acc = np.matmul(a.astype(np.int64), b.astype(np.int64))
                if alpha != 1:
                    acc = acc * np.int64(alpha)
                if bias is not None:
                    acc = acc + bias.astype(np.int64) * np.int64(beta)
            else:
                acc = np.matmul(a.astype(np.float32), b.astype(np.float32))
                if alpha != 1.0:
                    acc = acc * np.float32(alpha)
                if bias is not None:
                    bf = bias.astype(np.float32)
                    acc = acc + (bf * np.float32(beta) if beta != 1.0 else bf)
            if ev is None:
                store(out, acc)
            else:
                store(out, ev.evaluate(cast(acc, od)))

        return run
