"""The scatters that write a view's elements back into its base (`select_scatter`, `slice_scatter`,
`diagonal_scatter`): what functionalisation makes of an in-place op on a view (`x[:, 0] = v`, `x[1].relu_()`), and
core ATen ops of their own. Each is a selection over the base: where an element lies in the view, the source's
element, else the base's.
"""

from __future__ import annotations

from ..ir.graph import Node, Value
from ..ir.infer.core import norm_dim
from ..tensor import slice_bounds
from .registry import Rewriter, decomposes

_EMITS = ("arange.default", "reshape.default", "eq.Scalar", "unsqueeze.default", "where.self", "slice.Tensor",
          "cat.default", "sub.Scalar", "div.Scalar_mode", "mul.Scalar", "eq.Tensor", "ge.Scalar", "lt.Scalar",
          "logical_and.default", "clamp.default", "index_select.default", "permute.default", "to.dtype",
          "add.Scalar", "sub.Tensor")


def _along(rw: Rewriter, n: int, rank: int, d: int) -> Value:
    """arange(n) seen along dim d of a rank-`rank` tensor (size 1 elsewhere)."""
    return rw.op("reshape.default", rw.op("arange.default", end=n, dtype="int64"),
                 shape=[n if i == d else 1 for i in range(rank)])


def _cast(rw: Rewriter, v: Value, dtype: str) -> Value:
    return v if v.dtype == dtype else rw.op("to.dtype", v, dtype=dtype)


@decomposes("select_scatter.default", emits=_EMITS)
def _select_scatter(rw: Rewriter, node: Node) -> Value:
    x, src = node.inputs
    d = norm_dim(node.attrs["dim"], len(x.shape))
    index = node.attrs["index"] % x.shape[d]
    mask = rw.op("eq.Scalar", _along(rw, x.shape[d], len(x.shape), d), other=index)
    return rw.op("where.self", mask, _cast(rw, rw.op("unsqueeze.default", src, dim=d), x.dtype), x)


@decomposes("slice_scatter.default", emits=_EMITS)
def _slice_scatter(rw: Rewriter, node: Node) -> Value:
    x, src = node.inputs
    a = node.attrs
    d = norm_dim(a["dim"], len(x.shape))
    size, step = x.shape[d], int(a["step"])
    start = slice_bounds(a["start"], a["end"], size)[0]
    n = src.shape[d]
    src = _cast(rw, src, x.dtype)
    if n == 0:
        return x
    if step == 1:  # the base before and after the slice around the source: one copy
        parts = ([rw.op("slice.Tensor", x, dim=d, start=0, end=start, step=1)] if start > 0 else []) + [src] + (
            [rw.op("slice.Tensor", x, dim=d, start=start + n, end=size, step=1)] if start + n < size else [])
        return rw.op("cat.default", *parts, dim=d) if len(parts) > 1 else parts[0]
    # position i holds source row (i - start) / step where that is a whole number in range
    i = rw.op("arange.default", end=size, dtype="int64")
    j = rw.op("div.Scalar_mode", rw.op("sub.Scalar", i, other=start), other=step, rounding_mode="floor")
    hit = rw.op("logical_and.default", rw.op("ge.Scalar", i, other=start),
                rw.op("logical_and.default", rw.op("lt.Scalar", i, other=start + (n - 1) * step + 1),
                      rw.op("eq.Tensor", rw.op("add.Scalar", rw.op("mul.Scalar", j, other=step), other=start), i)))
    rows = rw.op("index_select.default", src, rw.op("clamp.default", j, min=0, max=n - 1), dim=d)
    shape = [size if k == d else 1 for k in range(len(x.shape))]
    return rw.op("where.self", rw.op("reshape.default", hit, shape=shape), rows, x)


@decomposes("diagonal_scatter.default", emits=_EMITS)
def _diagonal_scatter(rw: Rewriter, node: Node) -> Value:
    x, src = node.inputs
    a = node.attrs
    r = len(x.shape)
    d1, d2 = norm_dim(a["dim1"], r), norm_dim(a["dim2"], r)
    off = int(a["offset"])
    n = src.shape[-1]
    if n == 0:
        return x
    i, j = _along(rw, x.shape[d1], r, d1), _along(rw, x.shape[d2], r, d2)
    mask = rw.op("eq.Scalar", rw.op("sub.Tensor", j, i), other=off)
    # source element k sits at row i = k + max(0, -offset) of dim1
    k = rw.op("clamp.default", rw.op("sub.Scalar", rw.op("arange.default", end=x.shape[d1], dtype="int64"),
                                     other=max(0, -off)), min=0, max=n - 1)
    rows = rw.op("unsqueeze.default", rw.op("index_select.default", _cast(rw, src, x.dtype), k, dim=-1), dim=-1)
    rest = iter(range(r - 2))
    perm = [r - 2 if p == d1 else r - 1 if p == d2 else next(rest) for p in range(r)]
    return rw.op("where.self", mask, rw.op("permute.default", rows, dims=perm), x)
