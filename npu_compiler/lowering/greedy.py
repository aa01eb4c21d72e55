"""Greedy fusion of elementwise chains: an elementwise result is not written out but kept as a pending expression,
and every consumer that reads it through an affine index map (broadcast, transpose, slice, unsqueeze, ...)
inlines it. It is written to memory only when a consumer cannot inline it (a library kernel, a layout that is
not affine in the producer's index, an expression grown too large, a buffer about to be overwritten in place), or
where inlining would compute a transcendental again for every one of many broadcast reads (`recomputes_costly`: a
RoPE's cos and sin, made once for the whole model, read by every layer's rotation of every head).

Inlining is exact: the consumer computes the same expression, with the same roundings, on the same elements.

A row result (a norm: reductions along its last dim, then every element) may be pending too, where the target can
fold it into a GEMV's operand (`CodegenTarget.gemm_prologue`); only a GEMM prologue inlines it, in its own rows
(`compose` with `prologue=True`), and every other consumer has it written first."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from ..expr import nodes as X
from ..ir.graph import Node
from ..program import contiguous_strides

MAX_INLINE_NODES = 64  # past this a shared subexpression is cheaper to write once than to recompute
# A pending result read twice by the next one (`best = where(v > best, v, best)` over a pooling window) doubles its
# tree at each step while its distinct nodes grow by a few: past this many tree nodes it is written out, so that no
# kernel's expression tree (what the checks and the reference interpreter walk) outgrows expr.check.MAX_NODES.
MAX_INLINE_TREE = 1024
# transcendentals (many instructions each on a GPU: cosf's range reduction, an accurate expf) ...
COSTLY_UNARY = frozenset({"exp", "log", "sin", "cos", "tanh", "erf"})
# ... recomputed for each read of a consumer that broadcasts them over at least this many elements cost more than a
# kernel writing them once (below it, a decode step's few thousand reads: inlined, no launch added). Measured on the
# H100 (Qwen2.5-1.5B's 2048-token prefill, kernels timed one by one): the rotations of q and of k (its cache write)
# 0.877 -> 0.748 ms a prefill (the two kernels that write cos and sin once are among the elementwise group's 1.8 ms)
BROADCAST_RECOMPUTE_MIN = 1 << 16


@dataclass
class Pending:
    expr: X.Expr  # Loads name buffers by id (`arg`), indexed in this value's own (contiguous) index space
    shape: tuple[int, ...]
    origin: list[str]  # the IR nodes it stands for
    node: Node
    reduce_shape: tuple[int, ...] = ()  # a row result: reductions over its last dim (row_dims 1)
    reads: set[int] = field(default_factory=set)
    size: int = 0  # distinct nodes
    tree: int = 0  # nodes of the expression as a tree (each shared node counted at every use)

    def __post_init__(self) -> None:
        self.reads = {r.arg for r in X.reads(self.expr)}
        self.size = 0
        trees: dict[int, int] = {}
        for n in X.walk(self.expr):
            self.size += 1
            trees[id(n)] = min(1 + sum(trees[id(c)] for c in X.children(n)), 1 << 30)
        self.tree = trees[id(self.expr)]
        # Index and Gather tie the value to its own index space: it cannot be re-indexed by a consumer's map.
        self.has_index = any(isinstance(n, X.Index | X.Gather) for n in X.walk(self.expr))


def recomputes_costly(p: Pending, strides: tuple[int, ...], sizes: tuple[int, ...]) -> bool:
    """Would a consumer reading `p` through `strides` over `sizes` (its index space) compute a transcendental of `p`
    again for each of many reads of one element (a broadcast dim), over BROADCAST_RECOMPUTE_MIN elements or more?"""
    if math.prod(sizes) < BROADCAST_RECOMPUTE_MIN or not any(s == 0 and d > 1 for s, d in zip(strides, sizes)):
        return False
    return any(isinstance(x, X.Unary) and x.op in COSTLY_UNARY for x in X.walk(p.expr))


def _unravel(offset: int, shape: tuple[int, ...]) -> list[int] | None:
    idx = []
    for d, s in zip(shape, contiguous_strides(shape)):
        q = offset // s if s else 0
        if d and q >= d:
            return None
        idx.append(q)
        offset -= q * s
    return idx if offset == 0 else None


def compose(p: Pending, strides: tuple[int, ...], offset: int, sizes: tuple[int, ...], n_out: int,
            prologue: bool = False) -> X.Expr | None:
    """`p`'s expression as seen through a consumer's access (`strides` over the consumer's index space of `sizes`,
    the first `n_out` of them output dims, the rest reduction dims), or None when the access is not affine in
    p's index space. A row result composes only into a GEMM `prologue`, whose last dim is p's row, read whole and
    in order, and whose reductions run along it."""
    if p.tree > MAX_INLINE_TREE:
        return None
    shape = p.shape
    rows = bool(p.reduce_shape)
    if rows and not (prologue and n_out == len(sizes) and sizes and shape and sizes[-1] == shape[-1]
                     == p.reduce_shape[-1] and strides[-1] == 1 and p.size <= 4 * MAX_INLINE_NODES):
        return None
    if (n_out == len(sizes) and tuple(sizes) == tuple(shape) and offset == 0 and p.size <= 4 * MAX_INLINE_NODES
            and all(n == 1 or s == c for s, c, n in zip(strides, contiguous_strides(shape), sizes))):
        # the consumer reads p element for element in p's own index space: p's expression as it is, even one
        # that reads its own index (a gather, an iota)
        return p.expr
    if p.has_index or p.size > (4 * MAX_INLINE_NODES if rows else MAX_INLINE_NODES):
        return None
    cs = contiguous_strides(shape)
    base = _unravel(offset, shape)
    if base is None:
        return None
    coef = [[0] * len(sizes) for _ in shape]
    reach = list(base)  # the largest index each producer dim reaches
    for d, (s, n) in enumerate(zip(strides, sizes)):
        if s == 0 or n == 1:
            continue
        for k in reversed(range(len(shape))):  # innermost first: the smallest producer stride that divides
            if s % cs[k] == 0 and cs[k] <= s and reach[k] + (s // cs[k]) * (n - 1) < shape[k]:
                coef[k][d] = s // cs[k]
                reach[k] += (s // cs[k]) * (n - 1)
                break
        else:
            return None

    if rows and (base[-1] != 0 or [c[-1] for c in coef] != [0] * (len(shape) - 1) + [1]):
        return None  # the consumer's last dim is not p's row, whole and in order

    def rewrite(e: X.Load) -> X.Load:
        new_off = e.offset + sum(t * b for t, b in zip(e.strides, base))
        st = [sum(e.strides[k] * coef[k][d] for k in range(len(shape))) for d in range(len(sizes))]
        # a load inside p's reductions keeps its reduction strides: the consumer reduces along the same row
        return X.Load(e.dtype, e.arg, tuple(st[:n_out]), new_off, tuple(e.rstrides) if rows else tuple(st[n_out:]))

    return X.map_loads(p.expr, rewrite)


def bind_args(exprs: list[X.Expr | None], first: int = 0) -> tuple[list[X.Expr | None], list[int]]:
    """Reads that name buffers by id -> reads that name kernel arguments `first`, `first + 1`, ... (one per distinct
    buffer, shared by all `exprs`); returns the expressions and the buffer of each argument."""
    order: dict[int, int] = {}
    for e in exprs:
        if e is not None:
            for r in X.reads(e):
                order.setdefault(r.arg, first + len(order))

    def rebind(e: X.Expr) -> X.Expr | None:
        if isinstance(e, X.Load | X.Gather):
            return dataclasses.replace(X.rebuild(e, lambda c: X.substitute(c, rebind)), arg=order[e.arg])
        return None

    return [X.substitute(e, rebind) if e is not None else None for e in exprs], list(order)
