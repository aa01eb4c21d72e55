"""Memory safety of a program beyond "every view inside its buffer": checked on every compile (it proves the memory
plan) and on every artifact load (a crafted plan is refused, never run).

0. Sizes (with a limit): no view and no kernel's iteration space beyond it; no output view writing an element twice.
1. Arena buffers that are live at the same time (from the first to the last kernel touching them) do not share
   bytes.
2. Nothing is read before it is written: an intermediate or output buffer starts unwritten; a kernel's writes mark
   the elements of its output views; every element range a kernel reads (an argument view of a library kernel, the
   span of each load and gather of an expression) must be written by then, and every graph output whole at the end.
   Inputs, weights and constants start written. A scatter writes positions read from data: it marks nothing (its
   target was written before, as the cache copy or the input it updates).

3. Weights are read-only: no kernel writes one. A backend may read a weight before the kernel ahead of it has
   finished (the cuda GEMV loads its first weights before it waits for its predecessor), which only holds if no
   kernel writes one. (Constants may be written: a one-kernel repro program holds its output's old contents as one.)

Without 2, a plan whose views are each in bounds could still read what another buffer (or another run) left in the
arena: a result that depends on memory no kernel wrote.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

from .buffers import BufferSpec, TensorSpec
from .dtypes import itemsize
from .expr import nodes as X
from .expr.check import extent
from .kernels import KernelCall
from .tensor import TensorRef

MAX_RUNS = 1 << 20  # contiguous runs a strided write is split into before it is marked as a whole


def liveness(buffers: Sequence[BufferSpec], kernels: Sequence[KernelCall]) -> dict[int, tuple[int, int]]:
    """Buffer id -> (first, last) index of the kernels touching it, for arena buffers."""
    out: dict[int, tuple[int, int]] = {}
    for i, k in enumerate(kernels):
        for r in (*k.args, *k.writes):
            if buffers[r.buffer].kind == "arena":
                first = out.get(r.buffer, (i, i))[0]
                out[r.buffer] = (first, i)
    return out


def check_overlap(buffers: Sequence[BufferSpec], kernels: Sequence[KernelCall]) -> None:
    """ValueError naming two arena buffers that are live at the same time and share bytes."""
    live = sorted(liveness(buffers, kernels).items(), key=lambda kv: kv[1])
    active: list[tuple[int, int]] = []  # (last kernel, buffer id), of buffers whose lifetime has begun
    for bid, (first, last) in live:
        active = [(end, other) for end, other in active if end >= first]
        b = buffers[bid]
        for _, other in active:
            o = buffers[other]
            if b.nbytes and o.nbytes and b.offset < o.offset + o.nbytes and o.offset < b.offset + b.nbytes:
                raise ValueError(f"buffers {o.id} '{o.name}' and {b.id} '{b.name}' are live at the same time and "
                                 f"share arena bytes [{max(b.offset, o.offset)}, "
                                 f"{min(b.offset + b.nbytes, o.offset + o.nbytes)})")
        active.append((last, bid))


class _Written:
    """Disjoint sorted element ranges [lo, hi) of one buffer that kernels have written."""

    def __init__(self) -> None:
        self.lo: list[int] = []
        self.hi: list[int] = []

    def add(self, lo: int, hi: int) -> None:
        if hi <= lo:
            return
        i = bisect.bisect_left(self.hi, lo)  # first range that ends at or after lo
        j = bisect.bisect_right(self.lo, hi)  # ranges i..j-1 touch [lo, hi)
        if i < j:
            lo, hi = min(lo, self.lo[i]), max(hi, self.hi[j - 1])
        self.lo[i:j] = [lo]
        self.hi[i:j] = [hi]

    def covers(self, lo: int, hi: int) -> bool:
        if hi <= lo:
            return True
        i = bisect.bisect_right(self.lo, lo) - 1
        return i >= 0 and self.hi[i] >= hi


def _runs(ref: TensorRef) -> list[tuple[int, int]] | None:
    """The view's elements as contiguous runs (start, length), or None when there are more than MAX_RUNS."""
    if any(n == 0 for n in ref.shape):
        return []
    dims = sorted(((s, n) for n, s in zip(ref.shape, ref.strides) if n != 1), reverse=True)
    inner = 1  # elements of the innermost contiguous block
    while dims and dims[-1][0] == inner:
        inner *= dims.pop()[1]
    count = math.prod(n for _, n in dims)
    if count > MAX_RUNS:
        return None
    starts = [ref.offset]
    for s, n in dims:
        starts = [b + i * s for b in starts for i in range(n)]
    return [(b, inner) for b in sorted(starts)]


def _expr_reads(e: X.Expr | None, call: KernelCall, shape: tuple[int, ...], reduce_shape: tuple[int, ...] = ()
                ) -> list[tuple[int, int, int]]:
    """(buffer, lo, hi) of the span of every load and gather of `e`."""
    if e is None:
        return []
    out = []
    for n in X.walk(e):
        if isinstance(n, X.Load):
            full = tuple(shape) + (tuple(reduce_shape) if n.rstrides else ())
            strides = tuple(n.strides) + tuple(n.rstrides)
            if any(d == 0 for d in full):
                continue
            out.append((call.args[n.arg].buffer, n.offset, extent(full, strides, n.offset)))
        elif isinstance(n, X.Gather) and not any(d == 0 for d in n.shape):
            out.append((call.args[n.arg].buffer, n.offset, extent(tuple(n.shape), tuple(n.strides), n.offset)))
    return out


def kernel_reads(call: KernelCall) -> list[tuple[int, int, int]]:
    """(buffer, lo, hi): a span of elements the kernel may read (a superset of what it reads)."""
    spec = call.spec
    expr = getattr(spec, "expr", None)
    if expr is not None:  # a generated kernel: its arguments are whole buffers; its loads say what it reads
        shape = tuple(spec.iteration_shape(call))
        reads = _expr_reads(expr, call, shape, tuple(spec.reduce_shape))
        if spec.scatter is not None:
            reads += _expr_reads(spec.scatter.index, call, shape)
        return reads
    main = getattr(spec, "first_epilogue_arg", len(call.args))
    reads = [(r.buffer, r.offset, r.extent()) for r in call.args[:main] if r.numel]
    return reads + _expr_reads(getattr(spec, "epilogue", None), call, tuple(call.outs[0].shape) if call.outs else ())


def check_initialized(buffers: Sequence[BufferSpec], kernels: Sequence[KernelCall],
                      outputs: Sequence[TensorSpec]) -> None:
    """ValueError naming the first kernel that reads an element no kernel wrote before it, or an output left
    (partly) unwritten."""
    written: dict[int, _Written] = {b.id: _Written() for b in buffers if b.kind in ("arena", "output")}
    for i, k in enumerate(kernels):
        for bid, lo, hi in kernel_reads(k):
            w = written.get(bid)
            if w is not None and not w.covers(lo, hi):
                b = buffers[bid]
                raise ValueError(f"kernel {i} '{k.name}' reads elements [{lo}, {hi}) of buffer {bid} '{b.name}' "
                                 "before any kernel wrote them")
        if getattr(k.spec, "scatter", None) is not None:
            continue
        for r in k.writes:
            w = written.get(r.buffer)
            if w is None:
                continue
            runs = _runs(r)
            if runs is None:
                continue  # too fragmented to track: left unmarked (a later read of it is refused)
            for start, length in runs:
                w.add(start, start + length)
    for t in outputs:
        w = written.get(t.buffer)
        if w is not None and not w.covers(0, buffers[t.buffer].numel):
            raise ValueError(f"output '{t.name}' (buffer {t.buffer}) is not written whole by the kernels")


def _injective(ref: TensorRef) -> bool:
    """Does every index of the view name its own element (no dim of stride 0, no dims folding onto each other)?
    Sorted by stride, each dim must step past everything the inner dims reach."""
    reach = 0
    for s, n in sorted((s, n) for n, s in zip(ref.shape, ref.strides) if n > 1):
        if s <= reach:
            return False
        reach += (n - 1) * s
    return True


def check_sizes(buffers: Sequence[BufferSpec], kernels: Sequence[KernelCall], max_bytes: int,
                iteration_space: bool = True) -> None:
    """ValueError when a kernel would need more than `max_bytes` for one view or (with `iteration_space`: where the
    target evaluates an expression kernel over its whole iteration space at once) for its iteration space (a view of
    a one-element buffer broadcast to 2**40 elements is in bounds, and would still exhaust memory), or writes one
    element from two iteration points (a write view folding onto itself)."""
    for i, k in enumerate(kernels):
        for tag, refs in (("argument", k.args), ("output", k.writes)):
            for j, r in enumerate(refs):
                nbytes = r.numel * itemsize(buffers[r.buffer].dtype)
                if nbytes > max_bytes:
                    raise ValueError(f"kernel {i} '{k.name}': {tag} {j} is a view of {r.numel} elements "
                                     f"({nbytes} bytes), above the limit of {max_bytes} bytes ($NPUSIM_MAX_BYTES)")
        for j, r in enumerate(k.writes):
            if not _injective(r):
                raise ValueError(f"kernel {i} '{k.name}': output {j} (shape {list(r.shape)}, strides "
                                 f"{list(r.strides)}) writes some elements more than once")
        expr = getattr(k.spec, "expr", None)
        if expr is not None and iteration_space:
            points = math.prod(k.spec.iteration_shape(k)) * math.prod(k.spec.reduce_shape)
            if points * 8 > max_bytes:
                raise ValueError(f"kernel {i} '{k.name}': {points} iteration points (with its reduction), above "
                                 f"the limit of {max_bytes} bytes at 8 bytes each ($NPUSIM_MAX_BYTES)")


def check_memory(buffers: Sequence[BufferSpec], kernels: Sequence[KernelCall], outputs: Sequence[TensorSpec],
                 max_bytes: int | None = None, iteration_space: bool = True) -> None:
    if max_bytes is not None:
        check_sizes(buffers, kernels, max_bytes, iteration_space)
    check_read_only(buffers, kernels)
    check_overlap(buffers, kernels)
    check_initialized(buffers, kernels, outputs)


def written_buffers(kernels: Sequence[KernelCall]) -> set[int]:
    """The buffers some kernel writes (an input among them is updated in place: a KV cache's index_copy)."""
    return {r.buffer for k in kernels for r in k.writes}


def check_read_only(buffers: Sequence[BufferSpec], kernels: Sequence[KernelCall]) -> None:
    """ValueError when a kernel writes a weight."""
    for i, k in enumerate(kernels):
        for j, r in enumerate(k.writes):
            b = buffers[r.buffer]
            if b.kind == "weight":
                raise ValueError(f"kernel {i} '{k.name}': output {j} writes buffer {b.id} '{b.name}', a weight: "
                                 "weights are read-only")
