"""GEMM: out[batch..., m, n] = epilogue(round(alpha * a @ b + beta * bias)), accumulated in fp32 (int64, exact and
wrapping, for integer operands). `Acc` in the epilogue is the product rounded to the output dtype, as the unfused
graph stores it before a residual add or an activation.

A GEMM may compute its operand `a` instead of reading it: a prologue is an expression over a's index space
[batch..., m, k] (the RMSNorm or the SiLU-times-up that produced it in the graph, with the graph's roundings), and
with `prologue_reduce = (k,)` it may hold reductions along a's rows (a norm's mean of squares). Then `a` is not an
argument: args are [b, bias?, then the buffers the epilogue and the prologue read, whole]. Decoding uses it to drop
the kernel before each projection, whose only job was to write a few rows the GEMV reads back at once.

Column groups (`acc_groups` G > 1): the product's n columns are G groups of n / G side by side (a gate and an up
projection concatenated), the output has n / G columns, and the epilogue reads each group's value at the output's
column as `Acc(group=g)`: SiLU(gate) * up written once, where the product would be written and read back by a
kernel of its own (lowering/column_epilogues.py builds these).

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
from ..expr.check import check_expr
from ..expr.interpret import Evaluator, cast, dtype_name, store
from .base import (
    Arrays,
    KernelCost,
    KernelSpec,
    Step,
    arg_context,
    check_epilogue,
    dtype_of,
    expect,
    expect_shape,
)
from .counting import OpCounts, expr_counts, expr_reads, merge_reads, out_writes, ref_reads
from .fields import bounded

if TYPE_CHECKING:
    from ..buffers import BufferSpec
    from .base import KernelCall


def gemm_flops(m: int, n: int, k: int, batch: int = 1) -> int:
    return 2 * m * n * k * batch


def store_product(out: np.ndarray, acc: np.ndarray, ev: Evaluator | None, groups: int, od: str) -> None:
    """A product `acc` into `out`, through the epilogue `ev` where there is one: its `Acc` is the product rounded to
    the output dtype `od`, split into `groups` column groups."""
    if ev is None:
        store(out, acc)
    elif groups == 1:
        store(out, ev.evaluate(cast(acc, od)))
    else:
        store(out, ev.evaluate(np.split(cast(acc, od), groups, axis=-1)))


def check_prologue(prologue: X.Expr, reduce: tuple[int, ...], a_shape: tuple[int, ...], first: int, dtype: str,
                   kind: str, call: KernelCall, buffers: Sequence[BufferSpec], what: str = "operand b") -> None:
    """A prologue computing operand a ([batch..., m, k] = `a_shape`) in `dtype`: reductions along a's rows only, loads
    of arguments `first` and later only (the operands are not its to read), each of them a whole buffer; `dtype`: that
    of `what`, which a's must be."""
    k = a_shape[-1]
    expect(reduce in ((), (k,)), f"a {kind} prologue reduces along a's rows of {k}, not over {list(reduce)}")
    expect(prologue.dtype == dtype, f"a {kind} prologue of dtype {prologue.dtype} for {what} of {dtype}")
    for i, r in enumerate(call.args[first:], first):
        expect(r.is_whole(buffers[r.buffer].numel),
               f"argument {i} of a {kind} with a prologue must be its whole buffer (loads carry their own maps)")
    for n in X.walk(prologue):
        expect(not isinstance(n, X.Acc), f"a {kind} prologue reads no accumulator")
        if isinstance(n, X.Load | X.Gather):
            expect(n.arg >= first, f"a {kind} prologue reads argument {n.arg}, an operand: it may read only "
                                   f"arguments {first} and later")
    check_expr(prologue, arg_context(call, buffers, a_shape, reduce, 1 if reduce else 0))


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
    prologue: X.Expr | None = None
    prologue_reduce: tuple[int, ...] = bounded(0, default=())
    acc_groups: int = bounded(1, 2**16, default=1)

    @property
    def batch_count(self) -> int:
        return math.prod(self.batch)

    @property
    def b_arg(self) -> int:
        """Where operand b is in the arguments (a computed by a prologue is not one)."""
        return 0 if self.prologue is not None else 1

    @property
    def first_epilogue_arg(self) -> int:
        return self.b_arg + 1 + int(self.bias)

    @property
    def a_shape(self) -> tuple[int, ...]:
        return (*self.batch, self.m, self.k)

    @property
    def out_n(self) -> int:
        """The output's columns: the product's, or one group's of them."""
        return self.n // self.acc_groups

    def check(self, call: KernelCall, buffers: Sequence[BufferSpec]) -> None:
        expect(len(call.outs) == 1, f"a gemm writes one output, this one {len(call.outs)}")
        expect(len(call.args) >= self.first_epilogue_arg,
               f"a gemm{' with bias' if self.bias else ''}{' with a prologue' if self.prologue else ''} needs "
               f"{self.first_epilogue_arg} arguments")
        b, out = call.args[self.b_arg], call.outs[0]
        if self.prologue is None:
            expect(not self.prologue_reduce, "prologue_reduce without a prologue")
            expect_shape(call.args[0], self.a_shape, "gemm operand a")
            a_dtype = dtype_of(buffers, call.args[0])
        else:
            a_dtype = self.prologue.dtype
            self._check_prologue(call, buffers)
        expect_shape(b, (*self.batch, self.k, self.n), "gemm operand b")
        expect(self.n % self.acc_groups == 0, f"a gemm of {self.n} columns in {self.acc_groups} groups")
        expect(self.acc_groups == 1 or self.epilogue is not None,
               f"a gemm of {self.acc_groups} column groups needs an epilogue to combine them")
        expect_shape(out, (*self.batch, self.m, self.out_n), "gemm output")
        if self.bias:
            expect_shape(call.args[self.b_arg + 1], (*self.batch, self.m, self.n), "gemm bias view")
        dts = [a_dtype, dtype_of(buffers, b), dtype_of(buffers, out)]
        expect(all(d != "bool" for d in dts), f"a gemm over {dts}")
        expect(is_float(dts[2]) or not (is_float(dts[0]) or is_float(dts[1])),
               f"a gemm of float operands {dts[:2]} into {dts[2]}")
        check_epilogue(self.epilogue, call, buffers, out, self.acc_groups)

    def _check_prologue(self, call: KernelCall, buffers: Sequence[BufferSpec]) -> None:
        check_prologue(self.prologue, tuple(self.prologue_reduce), self.a_shape, self.first_epilogue_arg,
                       dtype_of(buffers, call.args[self.b_arg]), "gemm", call, buffers)

    def cost(self, call: KernelCall, buffers: Sequence[BufferSpec], *, context_len: int | None = None) -> KernelCost:
        """m n k MACs per batch entry; per product element the scale (alpha != 1) and the bias (and its beta != 1);
        the epilogue per output element; the prologue per element of a (its reduction once per row and element).
        Reads: a, b and the bias as far as their views reach, what the epilogue and the prologue load."""
        out = call.outs[0]
        product = self.batch_count * self.m * self.n
        counts = OpCounts(product * (int(self.alpha != 1.0) + int(self.bias) + int(self.bias and self.beta != 1.0)))
        counts += expr_counts(self.epilogue, tuple(out.shape))
        a_points = math.prod(self.a_shape)
        counts += expr_counts(self.prologue, self.a_shape, a_points if self.prologue_reduce else 0,
                              int(bool(self.prologue_reduce)))
        operands = ref_reads(call, buffers, range(self.first_epilogue_arg))
        reads = merge_reads(operands, expr_reads((self.epilogue,), call, buffers, tuple(out.shape)),
                            expr_reads((self.prologue,), call, buffers, self.a_shape, tuple(self.prologue_reduce)))
        a_dtype = self.prologue.dtype if self.prologue is not None else dtype_of(buffers, call.args[0])
        return KernelCost(product * self.k, counts.arith, counts.compares, reads, out_writes(call, buffers),
                          (a_dtype, dtype_of(buffers, call.args[self.b_arg])))

    def reference(self, call: KernelCall, arrays: Arrays) -> Step:
        b = arrays.view(call.args[self.b_arg])
        bias = arrays.view(call.args[self.b_arg + 1]) if self.bias else None
        out = arrays.view(call.outs[0])
        od = dtype_name(out.dtype)
        groups = self.acc_groups
        whole = [arrays.buffer(r) for r in call.args]
        ev = Evaluator(self.epilogue, out.shape, (), whole) if self.epilogue is not None else None
        if self.prologue is None:
            a = arrays.view(call.args[0])
        else:
            pro = Evaluator(self.prologue, self.a_shape, tuple(self.prologue_reduce), whole)
            a = np.empty(self.a_shape, b.dtype)
        alpha, beta = self.alpha, self.beta
        integer = not is_float(od)

        def run() -> None:
            if self.prologue is not None:
                store(a, pro.evaluate())
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
            store_product(out, acc, ev, groups, od)

        return run
