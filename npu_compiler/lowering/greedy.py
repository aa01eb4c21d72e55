"""Greedy fusion of elementwise chains: an elementwise result is not written out but kept as a pending expression,
and every consumer that reads it through an affine index map (broadcast, transpose, slice, unsqueeze, ...)
inlines it. It is written to memory only when a consumer cannot inline it (a library kernel, a layout that is
not affine in the producer's index, an expression grown too large, a buffer about to be overwritten in place).

Inlining is exact: the consumer computes the same expression, with the same roundings, on the same elements."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..expr import nodes as X
from ..ir.graph import Node
from ..program import contiguous_strides

MAX_INLINE_NODES = 64  # past this a shared subexpression is cheaper to write once than to recompute


@dataclass
class Pending:
    expr: X.Expr  # Loads name buffers by id (`arg`), indexed in this value's own (contiguous) index space
    shape: tuple[int, ...]
    origin: list[str]  # the IR nodes it stands for
    node: Node
    reads: set[int] = field(default_factory=set)
    size: int = 0

    def __post_init__(self) -> None:
        self.reads = {r.arg for r in X.reads(self.expr)}
        self.size = sum(1 for _ in X.walk(self.expr))
        # Index and Gather tie the value to its own index space: it cannot be re-indexed by a consumer's map.
        self.has_index = any(isinstance(n, X.Index | X.Gather) for n in X.walk(self.expr))


def _unravel(offset: int, shape: tuple[int, ...]) -> list[int] | None:
    idx = []
    for d, s in zip(shape, contiguous_strides(shape)):
        q = offset // s if s else 0
        if d and q >= d:
            return None
        idx.append(q)
        offset -= q * s
    return idx if offset == 0 else None


def compose(p: Pending, strides: tuple[int, ...], offset: int, sizes: tuple[int, ...], n_out: int) -> X.Expr | None:
    """`p`'s expression as seen through a consumer's access (`strides` over the consumer's index space of `sizes`,
    the first `n_out` of them output dims, the rest reduction dims), or None when the access is not affine in
    p's index space."""
    shape = p.shape
    if (n_out == len(sizes) and tuple(sizes) == tuple(shape) and offset == 0 and p.size <= 4 * MAX_INLINE_NODES
            and all(n == 1 or s == c for s, c, n in zip(strides, contiguous_strides(shape), sizes))):
        # the consumer reads p element for element in p's own index space: p's expression as it is, even one
        # that reads its own index (a gather, an iota)
        return p.expr
    if p.has_index or p.size > MAX_INLINE_NODES:
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

    def rewrite(e: X.Load) -> X.Load:
        new_off = e.offset + sum(t * b for t, b in zip(e.strides, base))
        st = [sum(e.strides[k] * coef[k][d] for k in range(len(shape))) for d in range(len(sizes))]
        return X.Load(e.dtype, e.arg, tuple(st[:n_out]), new_off, tuple(st[n_out:]))

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
