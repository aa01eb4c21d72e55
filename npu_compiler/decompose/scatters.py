"""The scatters that write a view's elements back into its base (`select_scatter`, `slice_scatter`,
`diagonal_scatter`): what functionalisation makes of an in-place op on a view (`x[:, 0] = v`, `x[1].relu_()`), and
core ATen ops of their own. Each is a selection over the base: where an element lies in the view, the source's
element, else the base's.
"""

from __future__ import annotations

import math

from ..dtypes import HALF_DTYPES
from ..errors import UnsupportedOpError
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


# ---- scatter, scatter_add, scatter_reduce ---------------------------------------------------------------------------
# A reduction over the index's positions along `dim`: for output row k, the positions j whose index is k. Over a
# [.., K, J, ..] selection that the lowering fuses into the reduction (never written); the rows of the output the
# index does not reach (the index may be smaller than self in every dim) keep self's values.

_SCATTER = (*_EMITS, "unsqueeze.default", "where.ScalarOther", "sum.dim_IntList", "amax.default", "amin.default",
            "any.dim", "gather.default", "constant_pad_nd.default", "mul.Tensor", "add.Tensor", "div.Tensor",
            "div.Tensor_mode", "maximum.default", "minimum.default", "prod.dim_int", "full_like.default",
            "logical_not.default", "expand.default", "scalar_tensor.default")


class _Selection:
    """Which index positions j write output row k along `dim`, over the index's extent."""

    def __init__(self, rw: Rewriter, x: Value, dim: int, index: Value) -> None:
        self.rw, self.x, self.index = rw, x, index
        self.rank = max(len(x.shape), 1)
        self.dim = norm_dim(dim, len(x.shape)) if x.shape else 0
        self.k = x.shape[self.dim] if x.shape else 1
        rows = [self.k if i == self.dim else 1 for i in range(self.rank + 1)]
        ks = rw.op("reshape.default", rw.op("arange.default", end=self.k, dtype="int64"), shape=rows)
        idx = index if index.shape else rw.op("reshape.default", index, shape=[1] * self.rank)
        self.hit = rw.op("eq.Tensor", rw.op("unsqueeze.default", idx, dim=self.dim), ks)  # [.., K, J, ..]

    def source(self, src: Value) -> Value:
        """`src` cut to the index's extent, with a K axis of 1 before `dim`."""
        s = src if src.shape else self.rw.op("reshape.default", src, shape=[1] * self.rank)
        ext = self.index.shape or (1,) * self.rank
        for d, n in enumerate(ext):
            if s.shape[d] != n:
                s = self.rw.op("slice.Tensor", s, dim=d, start=0, end=n, step=1)
        return self.rw.op("unsqueeze.default", _cast(self.rw, s, self.x.dtype), dim=self.dim)

    def over_j(self, op: str, v: Value, **kw) -> Value:
        return self.rw.op(op, v, dim=[self.dim + 1] if op != "any.dim" else self.dim + 1, keepdim=False, **kw)

    def full(self, v: Value, fill: float | bool) -> Value:
        """A value over the index's extent (with K rows along `dim`) widened to self's shape, `fill` outside."""
        shape = self.x.shape or (1,)
        pads = []
        for d in reversed(range(self.rank)):
            pads += [0, shape[d] - v.shape[d]]
        if any(pads):
            v = self.rw.op("constant_pad_nd.default", v, pad=pads, value=fill)
        return v if self.x.shape else self.rw.op("reshape.default", v, shape=[])


def _scatter_rows(rw: Rewriter, node: Node, reduce: str, include_self: bool) -> Value:
    x, index = node.inputs[0], node.inputs[1]
    sel = _Selection(rw, x, node.attrs["dim"], index)
    if node.op == "scatter.value":
        src = rw.op("full_like.default", index, fill_value=node.attrs["value"], dtype=x.dtype)
    else:
        src = node.inputs[2]
    s = sel.source(src)
    hit = sel.hit
    written = sel.full(sel.over_j("any.dim", hit), False)
    xs = x if x.shape else rw.op("reshape.default", x, shape=[1])
    if reduce == "replace":  # the last position j that writes row k wins (ATen's CPU order)
        j = rw.op("arange.default", end=hit.shape[sel.dim + 1], dtype="int64")
        j = rw.op("reshape.default", j, shape=[hit.shape[sel.dim + 1] if i == sel.dim + 1 else 1
                                                for i in range(len(hit.shape))])
        last = sel.over_j("amax.default", rw.op("where.ScalarOther", hit, j, other=-1))
        take = rw.op("gather.default", rw.op("reshape.default", s, shape=[n for i, n in enumerate(s.shape)
                                                                           if i != sel.dim]),
                     rw.op("clamp.default", last, min=0), dim=sel.dim)
        out = rw.op("where.self", written, sel.full(take, 0), xs)
        return out if x.shape else rw.op("reshape.default", out, shape=[])
    acc = "float32" if x.dtype in HALF_DTYPES else x.dtype
    s = _cast(rw, s, acc)
    if reduce in ("sum", "mean"):
        total = _cast(rw, sel.over_j("sum.dim_IntList", rw.op("where.ScalarOther", hit, s, other=0)), acc)
    elif reduce == "prod":
        total = rw.op("prod.dim_int", rw.op("where.ScalarOther", hit, s, other=1), dim=sel.dim + 1, keepdim=False)
    else:
        big = float("inf") if acc in ("float32", "float16", "bfloat16") else (2 ** 63 - 1)
        fill = -big if reduce == "amax" else big
        total = sel.over_j(f"{reduce}.default", rw.op("where.ScalarOther", hit, s, other=fill))
    total = sel.full(total, 0)
    xa = _cast(rw, xs, acc)
    if include_self:
        combine = {"sum": "add.Tensor", "mean": "add.Tensor", "prod": "mul.Tensor", "amax": "maximum.default",
                   "amin": "minimum.default"}[reduce]
        total = rw.op(combine, xa, total)
    if reduce == "mean":
        count = _cast(rw, sel.full(sel.over_j("sum.dim_IntList", hit), 0), acc)
        if include_self:
            count = rw.op("add.Tensor", count, other=1)
        count = rw.op("clamp.default", count, min=1)
        total = rw.op("div.Tensor_mode", total, count, rounding_mode="floor") if acc not in (
            "float32", "float16", "bfloat16") else rw.op("div.Tensor", total, count)
    out = _cast(rw, rw.op("where.self", written, total, xa), x.dtype)
    return out if x.shape else rw.op("reshape.default", out, shape=[])


@decomposes("scatter.src", "scatter.value", emits=_SCATTER)
def _scatter(rw: Rewriter, node: Node) -> Value:
    return _scatter_rows(rw, node, "replace", False)


@decomposes("scatter_add.default", emits=_SCATTER)
def _scatter_add(rw: Rewriter, node: Node) -> Value:
    return _scatter_rows(rw, node, "sum", True)


@decomposes("scatter_reduce.two", emits=_SCATTER)
def _scatter_reduce(rw: Rewriter, node: Node) -> Value:
    reduce = {"max": "amax", "min": "amin"}.get(node.attrs["reduce"], node.attrs["reduce"])  # (ATen's old spellings)
    return _scatter_rows(rw, node, reduce, bool(node.attrs["include_self"]))


# ---- masked_scatter and index_put -----------------------------------------------------------------------------------


@decomposes("masked_scatter.default", emits=(*_SCATTER, "cumsum.default", "select.int"))
def _masked_scatter(rw: Rewriter, node: Node) -> Value:
    """The true positions of the mask (broadcast to self, in row-major order) take the source's elements in order:
    each position's rank among them is a running count, computed in two levels (within rows of about sqrt(n)
    elements, then across the rows) so that the scan costs O(n^1.5), not O(n^2)."""
    x, mask, src = node.inputs
    shape = list(node.outputs[0].shape)  # self and mask broadcast
    if list(x.shape) != shape:
        x = rw.op("expand.default", x, size=shape)
    n = node.outputs[0].type.numel
    m = rw.op("expand.default", mask, size=shape) if list(mask.shape) != shape else mask
    if n == 0 or src.type.numel == 0:
        return x
    cols = max(1, math.isqrt(n - 1) + 1)
    rows = -(-n // cols)
    flat = rw.op("reshape.default", _cast(rw, m, "int64"), shape=[n])
    if rows * cols != n:
        flat = rw.op("constant_pad_nd.default", flat, pad=[0, rows * cols - n], value=0)
    grid = rw.op("reshape.default", flat, shape=[rows, cols])
    within = rw.op("cumsum.default", grid, dim=1)
    totals = rw.op("select.int", within, dim=1, index=cols - 1)
    before = rw.op("sub.Tensor", rw.op("cumsum.default", totals, dim=0), totals)
    rank = rw.op("add.Tensor", within, rw.op("unsqueeze.default", before, dim=1))
    rank = rw.op("reshape.default", rank, shape=[rows * cols])
    if rows * cols != n:
        rank = rw.op("slice.Tensor", rank, dim=0, start=0, end=n, step=1)
    pos = rw.op("clamp.default", rw.op("sub.Scalar", rank, other=1), min=0, max=src.type.numel - 1)
    taken = rw.op("index_select.default", rw.op("reshape.default", src, shape=[src.type.numel]), pos, dim=0)
    return rw.op("where.self", m, rw.op("reshape.default", _cast(rw, taken, x.dtype), shape=shape), x)


@decomposes("index_put.default", emits=(*_SCATTER, "masked_scatter.default", "scatter.src", "scatter_add.default",
                                        "permute.default", "lt.Scalar", "add.Scalar", "zeros_like.default"))
def _index_put(rw: Rewriter, node: Node) -> Value:
    """`self[indices] = values` (or `+=` with accumulate): a bool mask's true positions take the values in order
    (masked_scatter); integer indices are made one flat index over the indexed dims, which are moved last, and
    scattered there (the last write of a repeated position wins, as ATen's CPU loop does)."""
    x, values = node.inputs[0], node.inputs[-1]
    idx = node.inputs[1:-1]
    masks = node.attrs.get("_tensor_list_none_masks")
    slots = list(masks[0]) if masks else [False] * len(idx)
    accumulate = bool(node.attrs["accumulate"])
    tensors = iter(idx)
    entries = [None if is_none else next(tensors) for is_none in slots]
    bools = [v for v in idx if v.dtype in ("bool", "uint8")]
    if bools:
        return _put_masked(rw, node, x, entries, values, accumulate)
    # integer indices: dims[i] is the dim of self entry i indexes
    dims = [d for d, v in enumerate(entries) if v is not None]
    index_list = [v for v in entries if v is not None]
    flat = None
    for d, v in zip(dims, index_list):
        size = x.shape[d]
        v = _cast(rw, v, "int64")
        v = rw.op("where.self", rw.op("lt.Scalar", v, other=0), rw.op("add.Scalar", v, other=size), v)
        stride = math.prod(x.shape[e] for e in dims[dims.index(d) + 1:])
        term = rw.op("mul.Scalar", v, other=stride)
        flat = term if flat is None else rw.op("add.Tensor", flat, term)
    b = flat.shape
    rest = [d for d in range(len(x.shape)) if d not in dims]
    adjacent = dims == list(range(dims[0], dims[-1] + 1))
    # the layout of x[indices]: B in place of adjacent indexed dims, else first
    lead = [d for d in rest if d < dims[0]] if adjacent else []
    res_shape = [x.shape[d] for d in lead] + list(b) + [x.shape[d] for d in rest if d not in lead]
    vals = _cast(rw, values, x.dtype)
    if list(vals.shape) != res_shape:
        vals = rw.op("expand.default", vals, size=res_shape)
    nb = len(b)
    order = list(range(len(lead))) + [len(lead) + nb + i for i in range(len(rest) - len(lead))] + [
        len(lead) + i for i in range(nb)]
    vals = rw.op("permute.default", vals, dims=order) if order != list(range(len(order))) else vals
    vals = rw.op("reshape.default", vals, shape=[x.shape[d] for d in rest] + [math.prod(b)])
    perm = rest + dims
    xp = rw.op("permute.default", x, dims=perm) if perm != list(range(len(perm))) else x
    xp = rw.op("reshape.default", xp, shape=[x.shape[d] for d in rest] + [math.prod(x.shape[d] for d in dims)])
    where = rw.op("reshape.default", flat, shape=[1] * len(rest) + [math.prod(b)])
    where = rw.op("expand.default", where, size=list(vals.shape))
    op = "scatter_add.default" if accumulate else "scatter.src"
    out = rw.op(op, xp, where, vals, dim=len(rest))
    out = rw.op("reshape.default", out, shape=[x.shape[d] for d in perm])
    inverse = [perm.index(i) for i in range(len(perm))]
    return rw.op("permute.default", out, dims=inverse) if inverse != list(range(len(inverse))) else out


def _put_masked(rw: Rewriter, node: Node, x: Value, entries: list[Value | None], values: Value,
                accumulate: bool) -> Value:
    """One bool mask (after full slices) and no other index: the masked elements take `values`, broadcast over them
    where it has no dim for their count, else in the row-major order of the masked positions."""
    if sum(v is not None for v in entries) != 1:
        raise UnsupportedOpError(node.name, f"aten.{node.op}", "any", "a bool mask together with other index tensors")
    d = next(i for i, v in enumerate(entries) if v is not None)
    mask = _cast(rw, entries[d], "bool")
    r = len(mask.shape)
    rest = len(x.shape) - d - r
    m = rw.op("reshape.default", mask, shape=[1] * d + list(mask.shape) + [1] * rest)
    m = rw.op("expand.default", m, size=list(x.shape))
    vals = _cast(rw, values, x.dtype)
    if len(vals.shape) <= rest:  # the same values at every masked position
        v = rw.op("expand.default", vals, size=list(x.shape))
        return rw.op("where.self", m, rw.op("add.Tensor", x, v) if accumulate else v, x)
    if d:
        raise UnsupportedOpError(node.name, f"aten.{node.op}", "any",
                                 "values for each masked position of a bool mask after a full slice")
    base = rw.op("zeros_like.default", x) if accumulate else x
    placed = rw.op("masked_scatter.default", base, m, vals)
    return rw.op("add.Tensor", x, placed) if accumulate else placed
