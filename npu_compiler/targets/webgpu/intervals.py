"""Which int64 arithmetic of an expression provably stays inside int32: those nodes are retyped int32, so the WGSL
renderer computes them without the overflow checks that int64 arithmetic otherwise gets (language.py). Index
arithmetic (pooling windows, RoPE's rotated half, gathers) is bounded by the tensor shapes, so in practice only
arithmetic on int64 *data* keeps its checks.

Bounds are intervals, computed bottom-up: an output or reduction index lies in [0, extent); a load of integer data
in its dtype's range (int64 data is in int32 on this backend: checked when it reaches the device, and every kernel
writes int32 values); constants are exact; +, -, *, negation, abs, division, max, min, where and sums combine them.
Anything else (a float cast to an integer, a power) is unbounded and keeps its checks.
"""

from __future__ import annotations

import dataclasses
import math

from ...expr import nodes as X

I32 = (-(2**31), 2**31 - 1)
RANGES = {"int64": I32, "int32": I32, "int16": (-(2**15), 2**15 - 1), "int8": (-128, 127), "uint8": (0, 255),
          "bool": (0, 1)}

Interval = tuple[int, int] | None  # None: unknown (or not an integer)


def narrow_int64(e: X.Expr, shape: tuple[int, ...], reduce_shape: tuple[int, ...] = ()) -> X.Expr:
    """`e` with every int64 node whose value provably fits int32 retyped int32."""
    memo: dict[int, tuple[X.Expr, Interval]] = {}

    def visit(n: X.Expr) -> tuple[X.Expr, Interval]:
        hit = memo.get(id(n))
        if hit is not None:
            return hit
        kids = [visit(c) for c in X.children(n)]
        new = X.rebuild(n, _replacer(n, [k[0] for k in kids])) if kids else n
        iv = _interval(n, [k[1] for k in kids], shape, reduce_shape)
        if new.dtype == "int64" and iv is not None and I32[0] <= iv[0] and iv[1] <= I32[1] and \
                not isinstance(new, X.Load | X.Gather | X.Const):
            new = dataclasses.replace(new, dtype="int32")
        memo[id(n)] = (new, iv)
        return new, iv

    return visit(e)[0]


def _replacer(n: X.Expr, new_kids: list[X.Expr]):
    mapping = {id(old): new for old, new in zip(X.children(n), new_kids)}
    return lambda c: mapping.get(id(c), c)


def _interval(n: X.Expr, kids: list[Interval], shape: tuple[int, ...], reduce_shape: tuple[int, ...]) -> Interval:
    if isinstance(n, X.Const):
        if n.dtype not in RANGES or (isinstance(n.value, float) and not n.value.is_integer()):
            return None
        return (int(n.value), int(n.value))
    if isinstance(n, X.Index):
        return (0, max(shape[n.dim] - 1, 0)) if n.dim < len(shape) else None
    if isinstance(n, X.RIndex):
        return (0, max(reduce_shape[n.dim] - 1, 0)) if n.dim < len(reduce_shape) else None
    if isinstance(n, X.Load | X.Gather):
        return RANGES.get(n.dtype)
    if n.dtype not in RANGES or any(k is None for k in kids):
        return None
    if isinstance(n, X.Cast):
        return kids[0] if n.x.dtype in RANGES else None
    if isinstance(n, X.Where):
        return (min(kids[1][0], kids[2][0]), max(kids[1][1], kids[2][1]))
    if isinstance(n, X.Unary):
        (lo, hi), op = kids[0], n.op
        if op == "neg":
            return (-hi, -lo)
        if op == "abs":
            return (0 if lo <= 0 <= hi else min(abs(lo), abs(hi)), max(abs(lo), abs(hi)))
        if op in ("floor", "trunc"):
            return (lo, hi)
        return None
    if isinstance(n, X.Binary):
        (alo, ahi), (blo, bhi), op = kids[0], kids[1], n.op
        if op == "add":
            return (alo + blo, ahi + bhi)
        if op == "sub":
            return (alo - bhi, ahi - blo)
        if op == "mul":
            p = (alo * blo, alo * bhi, ahi * blo, ahi * bhi)
            return (min(p), max(p))
        if op == "div":
            m = max(abs(alo), abs(ahi))
            return (-m, m)
        if op == "max":
            return (max(alo, blo), max(ahi, bhi))
        if op == "min":
            return (min(alo, blo), min(ahi, bhi))
        return None
    if isinstance(n, X.Reduce):
        lo, hi = kids[0]
        if n.op == "max":
            return (lo, hi)
        count = math.prod(reduce_shape) if reduce_shape else 1
        return (min(lo * count, 0), max(hi * count, 0))
    return None
