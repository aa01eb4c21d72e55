"""What a kernel does, counted as hardware does the work: the one vocabulary of every kind's `cost`, which the
profiler (`npusim profile`) and the NPU model (`npusim estimate`) both read.

- **MACs**: multiply-accumulates of a contraction (a GEMM, a convolution, attention's two products), the work of an
  NPU's array or a GPU's tensor cores; their number format is the wider operand's.
- **Vector operations** on data, one per element an operation produces: *arithmetic* (add, subtract, multiply,
  divide, power, exp, log, sqrt, rsqrt, sin, cos, tanh, erf, abs, neg, floor, trunc, a sum reduction's add) and
  *comparisons* (compare, max, min, logical and/or/not, select, a max reduction's compare). A reduction counts one
  operation per element it takes in: a 3 x 3 max pool is 9 comparisons an output, a sum over K elements K adds.
- **Not counted**: address arithmetic. Index maps, a pooling window's positions and its padding guard, a gather's
  row index, a scatter's position, `arange`-like values built from indices alone: an NPU computes them in its
  address generators and DMA descriptors, a GPU in integer units beside the data path. An operation counts only
  when one of its operands depends on data (a load, a gather, a contraction's result). Casts are free (rounding to
  a storage format is part of a store).
- **Bytes**: every distinct element a kernel reads (a broadcast dimension once, each load through its own index
  map, a gather at most once per evaluation and never more than its view) and every element it writes, per
  argument and output, with the buffer and its dtype, so that a report can split them by number format and a model
  can tell which live on chip.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..dtypes import itemsize
from ..expr import nodes as X

if TYPE_CHECKING:
    from ..buffers import BufferSpec
    from ..tensor import TensorRef
    from .base import KernelCall

COMPARISONS = frozenset((*X.COMPARE_OPS, *X.LOGIC_OPS, "max", "min", "not"))


@dataclass(frozen=True)
class Traffic:
    """Bytes one argument (a read) or one output (a write) of a kernel moves: `index` is its position in the call's
    args or outs."""

    index: int
    buffer: int
    dtype: str
    bytes: int


@dataclass(frozen=True)
class KernelCost:
    """What one launch does (see the module's docstring for what counts)."""

    macs: int = 0
    arith: int = 0  # vector arithmetic on data
    compares: int = 0  # comparisons, max/min, selects on data
    reads: tuple[Traffic, ...] = ()
    writes: tuple[Traffic, ...] = ()
    mac_dtypes: tuple[str, ...] = ()  # the two operands' dtypes of the contraction ((): none)

    @property
    def flops(self) -> int:
        """Arithmetic operations, a multiply-add counting 2 (comparisons are not floating-point arithmetic)."""
        return 2 * self.macs + self.arith

    @property
    def vector_ops(self) -> int:
        """What a vector unit does: arithmetic and comparisons, one per element."""
        return self.arith + self.compares

    @property
    def ops(self) -> int:
        """Every operation: 2 per multiply-add, one per vector operation."""
        return 2 * self.macs + self.vector_ops

    @property
    def bytes_read(self) -> int:
        return sum(t.bytes for t in self.reads)

    @property
    def bytes_written(self) -> int:
        return sum(t.bytes for t in self.writes)

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    def bytes_by_dtype(self) -> dict[str, dict[str, int]]:
        """{dtype: {"read": bytes, "written": bytes}}."""
        out: dict[str, dict[str, int]] = {}
        for key, ts in (("read", self.reads), ("written", self.writes)):
            for t in ts:
                d = out.setdefault(t.dtype, {"read": 0, "written": 0})
                d[key] += t.bytes
        return out

    def read_of(self, index: int) -> int:
        """Bytes read through argument `index` (0 when it reads nothing there)."""
        return sum(t.bytes for t in self.reads if t.index == index)


@dataclass
class OpCounts:
    arith: int = 0
    compares: int = 0

    def __iadd__(self, other: OpCounts) -> OpCounts:
        self.arith += other.arith
        self.compares += other.compares
        return self


def expr_counts(e: X.Expr | None, shape: tuple[int, ...], reduce_points: int = 0, row_dims: int = 0) -> OpCounts:
    """The vector operations of an expression evaluated over an output of `shape`. Nodes inside a reduction (and the
    reduction itself) run at `reduce_points` points (rows times the reduction's extent). In a row kernel (the last
    `row_dims` dims are a row) a node outside reductions that does not vary along the row (a norm's mean, its
    reciprocal square root) runs once per row. Identical subtrees count once: renderers compute a common
    subexpression once (an artifact read back has the same counts as the program compiled)."""
    counts = OpCounts()
    if e is None:
        return counts
    points = math.prod(shape)
    rank = len(shape)
    rows = math.prod(shape[:rank - row_dims]) if row_dims else points
    order = list(X.walk(e))  # children first
    key: dict[int, tuple] = {}
    for node in order:
        fields = tuple(key[id(v)] if isinstance(v, X.Expr) else
                       tuple(key[id(c)] for c in v) if _exprs(v) else v
                       for v in (getattr(node, f.name) for f in dataclasses.fields(node)))
        key[id(node)] = (type(node).__name__, fields)
    inside: dict[tuple, bool] = {key[id(e)]: False}
    for node in reversed(order):  # parents first: which nodes are inside a reduction
        k = key[id(node)]
        if k not in inside or isinstance(node, X.Gather):
            continue  # below a gather only (an address), or a gather's indices and guard (addresses)
        for c in X.children(node):
            ck = key[id(c)]
            inside[ck] = inside.get(ck, False) or inside[k] or isinstance(node, X.Reduce)
    data: dict[tuple, bool] = {}
    varies: dict[tuple, bool] = {}  # along the row (row kernels)
    done: set[tuple] = set()
    for node in order:
        k = key[id(node)]
        if k in done:
            continue
        done.add(k)
        kids = [key[id(c)] for c in X.children(node)]
        data[k] = isinstance(node, X.Load | X.Gather | X.Acc) or any(data[c] for c in kids)
        varies[k] = not isinstance(node, X.Reduce) and (_varies_along_row(node, rank, row_dims)
                                                       or any(varies[c] for c in kids))
        if not data[k] or k not in inside or not isinstance(node, X.Unary | X.Binary | X.Where | X.Reduce):
            continue
        if inside[k] or isinstance(node, X.Reduce):
            n = reduce_points
        else:
            n = points if varies[k] or not row_dims else rows
        if _is_comparison(node):
            counts.compares += n
        else:
            counts.arith += n
    return counts


def _exprs(v: object) -> bool:
    return isinstance(v, tuple) and bool(v) and all(isinstance(c, X.Expr) for c in v)


def _varies_along_row(node: X.Expr, rank: int, row_dims: int) -> bool:
    """Does this node itself depend on the output index along the row's dims (the last `row_dims`)? A gather does
    through its indices, which are its children."""
    if isinstance(node, X.Index):
        return node.dim >= rank - row_dims
    if isinstance(node, X.Load):
        return any(s != 0 for s in node.strides[rank - row_dims:])
    return isinstance(node, X.Acc)


def _is_comparison(node: X.Expr) -> bool:
    if isinstance(node, X.Where):
        return True
    if isinstance(node, X.Reduce):
        return node.op == "max"
    return node.op in COMPARISONS  # Unary | Binary


def footprint(ref: TensorRef) -> int:
    """Distinct elements a strided view touches: broadcast (stride-0) dimensions count once."""
    return math.prod(d for d, s in zip(ref.shape, ref.strides) if s != 0) if ref.shape else 1


def ref_reads(call: KernelCall, buffers: Sequence[BufferSpec], indices: Iterable[int],
              elements: dict[int, int] | None = None) -> list[Traffic]:
    """Reads of whole views: argument i's footprint (or `elements[i]` when given), never more than its buffer."""
    out = []
    for i in indices:
        ref = call.args[i]
        buf = buffers[ref.buffer]
        n = footprint(ref) if elements is None or i not in elements else elements[i]
        out.append(Traffic(i, ref.buffer, buf.dtype, min(n, buf.numel) * itemsize(buf.dtype)))
    return out


def expr_reads(exprs: Iterable[X.Expr | None], call: KernelCall, buffers: Sequence[BufferSpec],
               shape: tuple[int, ...], reduce_shape: tuple[int, ...] = ()) -> list[Traffic]:
    """Reads of expressions evaluated over `shape` (and `reduce_shape` inside reductions): per argument, each
    distinct load's reach (a broadcast dimension once), a gather at most once per evaluation and never more than the
    view it gathers from, the sum never more than the argument's buffer."""
    points = math.prod(shape)
    red = math.prod(reduce_shape)
    per_arg: dict[int, int] = {}
    seen: set[tuple] = set()
    for e in exprs:
        if e is None:
            continue
        for r in X.reads(e):
            if isinstance(r, X.Load):
                key: tuple = (r.arg, r.strides, r.offset, r.rstrides)
                n = math.prod(d for d, s in zip(shape, r.strides) if s != 0)
                n *= math.prod(d for d, s in zip(reduce_shape, r.rstrides) if s != 0)
            else:
                key = (r.arg, r.shape, r.strides, r.offset, id(r))
                n = min(math.prod(r.shape), points * max(1, red))
            if key in seen:
                continue
            seen.add(key)
            per_arg[r.arg] = per_arg.get(r.arg, 0) + n
    return ref_reads(call, buffers, sorted(per_arg), {i: n for i, n in per_arg.items()})


def merge_reads(*groups: Iterable[Traffic]) -> tuple[Traffic, ...]:
    """One entry per argument (the same argument read by two parts of a kernel counts once, at the larger reach),
    in argument order."""
    best: dict[int, Traffic] = {}
    for group in groups:
        for t in group:
            if t.index not in best or t.bytes > best[t.index].bytes:
                best[t.index] = t
    return tuple(best[i] for i in sorted(best))


def out_writes(call: KernelCall, buffers: Sequence[BufferSpec], indices: Iterable[int] = (0,),
               elements: dict[int, int] | None = None) -> tuple[Traffic, ...]:
    """Writes of the outputs at `indices`: each output view's elements (or `elements[i]` when given). A target's
    scratch outputs (split partial sums, tables) are not among them: the reference writes none."""
    out = []
    for i in indices:
        ref = call.outs[i]
        buf = buffers[ref.buffer]
        n = ref.numel if elements is None or i not in elements else elements[i]
        out.append(Traffic(i, ref.buffer, buf.dtype, n * itemsize(buf.dtype)))
    return tuple(out)
