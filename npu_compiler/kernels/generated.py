"""Generated kernels: one expression computes every element of one output; every backend renders it from its own
table of primitives (the CPU backend interprets it).

Elementwise ops, reductions, copies, norms, softmax with its masks, RoPE, gathers (embedding), pooling windows and
the KV-cache write are all generated kernels. Their arguments are whole buffers: loads carry their own index maps.
A scatter kernel (the cache write) iterates over the rows it writes and stores each at a position read from data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..errors import KernelFault
from ..expr import nodes as X
from ..expr.check import check_expr
from ..expr.interpret import Evaluator, store
from .base import Arrays, KernelCost, KernelSpec, Step, arg_context, expect
from .counting import expr_counts, expr_reads, out_writes
from .fields import bounded

if TYPE_CHECKING:
    from ..buffers import BufferSpec
    from .base import KernelCall


@dataclass(frozen=True)
class Scatter:
    """Store through a data-dependent position: the kernel iterates over `shape` (the output's shape except along
    `dim`) and writes the element at iteration index i to the output at i with position `index(i)` along `dim`.
    `index` may depend only on the iteration index along `dim`. A position outside the output is refused by the
    reference and skipped by a GPU."""

    dim: int = bounded(0, 64)
    index: X.Expr
    shape: tuple[int, ...] = bounded(0, 2**40)


@dataclass(frozen=True)
class GeneratedKernel(KernelSpec):
    """`expr` at every index of the iteration space into `outs[0]`. A row kernel (`row_dims`, a reduction over the
    row) may also store `side`, an elementwise value over the same index space (no reduction), into `outs[1]`: an
    intermediate a later kernel reads that the row kernel computes anyway (a residual sum its norm reads), written
    by it instead of by a pass of its own."""

    kind = "generated"

    expr: X.Expr
    reduce_shape: tuple[int, ...] = bounded(0, 2**40, default=())
    row_dims: int = bounded(0, 64, default=0)
    scatter: Scatter | None = None
    side: X.Expr | None = None

    def iteration_shape(self, call: KernelCall) -> tuple[int, ...]:
        return tuple(self.scatter.shape) if self.scatter is not None else tuple(call.outs[0].shape)

    # ---- contract --------------------------------------------------------------------------------------------------
    def check(self, call: KernelCall, buffers: Sequence[BufferSpec]) -> None:
        n_outs = 1 if self.side is None else 2
        expect(len(call.outs) == n_outs, f"a generated kernel {'with' if self.side is not None else 'without'} a "
                                         f"side output writes {n_outs} output(s), this one {len(call.outs)}")
        if self.side is not None:
            shape = self.iteration_shape(call)
            expect(self.scatter is None and self.row_dims > 0 and bool(self.reduce_shape),
                   "only a row kernel (row_dims and a reduction, no scatter) stores a side output")
            expect(tuple(call.outs[1].shape) == tuple(shape),
                   f"side output of shape {list(call.outs[1].shape)} for an iteration space of {list(shape)}")
            expect(call.outs[1].buffer != call.outs[0].buffer, "the side output shares the output's buffer")
            for n in X.walk(self.side):
                expect(not isinstance(n, X.Reduce | X.RIndex | X.Acc),
                       f"a side output is elementwise: it has a {type(n).__name__}")
            check_expr(self.side, arg_context(call, buffers, shape))
        for i, a in enumerate(call.args):
            expect(a.is_whole(buffers[a.buffer].numel),
                   f"argument {i} of a generated kernel must be its whole buffer (loads carry their own maps)")
        out = call.outs[0]
        shape = self.iteration_shape(call)
        expect(self.row_dims <= len(shape), f"row_dims {self.row_dims} for an output of rank {len(shape)}")
        if self.scatter is not None:
            sc = self.scatter
            expect(len(shape) == len(out.shape) and sc.dim < len(shape),
                   f"scatter over {list(shape)} along dim {sc.dim} into {list(out.shape)}")
            expect(all(shape[d] == out.shape[d] for d in range(len(shape)) if d != sc.dim),
                   f"scatter over {list(shape)} into {list(out.shape)}: only dim {sc.dim} may differ")
            expect(not self.reduce_shape, "a scatter kernel has no reduction")
            check_expr(sc.index, arg_context(call, buffers, shape))
            for n in X.walk(sc.index):
                expect(not isinstance(n, X.Gather | X.RIndex), "a scatter position must be a plain load")
                if isinstance(n, X.Index):
                    expect(n.dim == sc.dim, "a scatter position may depend only on the scattered dim")
                if isinstance(n, X.Load):
                    expect(all(s == 0 for d, s in enumerate(n.strides) if d != sc.dim),
                           "a scatter position may depend only on the scattered dim")
            expect(sc.index.dtype not in ("float32", "float16", "bfloat16", "float64", "bool"),
                   f"a scatter position of dtype {sc.index.dtype}")
        check_expr(self.expr, arg_context(call, buffers, shape, tuple(self.reduce_shape), self.row_dims))

    def cost(self, call: KernelCall, buffers: Sequence[BufferSpec], *, context_len: int | None = None) -> KernelCost:
        """The expression's vector operations at every point of the iteration space (a reduction's body, and a row
        kernel's reductions, once per row and reduced element), its side output's; the loads' reach; the output (a
        scatter: the rows it writes), the side output."""
        shape = self.iteration_shape(call)
        points = math.prod(shape)
        rows = math.prod(shape[:len(shape) - self.row_dims]) if self.row_dims else points
        counts = expr_counts(self.expr, shape, rows * math.prod(self.reduce_shape), self.row_dims)
        if self.side is not None:
            counts += expr_counts(self.side, shape)
        reads = expr_reads((self.expr, self.scatter.index if self.scatter is not None else None, self.side), call,
                           buffers, shape, tuple(self.reduce_shape))
        outs = (0,) if self.side is None else (0, 1)
        writes = out_writes(call, buffers, outs, {i: points for i in outs})
        return KernelCost(0, counts.arith, counts.compares, tuple(reads), writes)

    def reference(self, call: KernelCall, arrays: Arrays) -> Step:
        args = [arrays.buffer(a) for a in call.args]
        out = arrays.view(call.outs[0])
        shape = self.iteration_shape(call)
        ev = Evaluator(self.expr, shape, self.reduce_shape, args)
        if self.side is not None:
            side_out = arrays.view(call.outs[1])
            side_ev = Evaluator(self.side, shape, (), args)

            def run_with_side() -> None:
                value = ev.evaluate()  # every read before either store: a side output may alias nothing it reads
                side = side_ev.evaluate()
                store(out, value)
                store(side_out, side)

            return run_with_side
        if self.scatter is None:
            def run() -> None:
                store(out, ev.evaluate())

            return run
        dim = self.scatter.dim
        pos_ev = Evaluator(self.scatter.index, shape, (), args)
        size = out.shape[dim]
        pick = tuple(slice(None) if d == dim else 0 for d in range(len(shape)))
        lead = (slice(None),) * dim

        def run_scatter() -> None:
            if shape[dim] == 0:
                return
            pos = np.broadcast_to(pos_ev.evaluate(), shape)[pick].astype(np.int64)
            bad = (pos < 0) | (pos >= size)
            if bad.any():
                raise KernelFault(f"position {int(pos[bad][0])} out of range [0, {size}) along dim {dim}")
            tmp = np.empty(shape, out.dtype)
            store(tmp, ev.evaluate())
            out[lead + (pos,)] = tmp

        return run_scatter
