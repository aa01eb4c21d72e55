"""Scans and selections written as reductions: `cumsum` (each element sums the prefix of its row) and `topk` (each
element's rank among its row, then each output slot picks the element of its rank).

Both cost O(n^2) per row of n elements instead of a scan's O(n): they are meant for the short rows models build in
their graphs (sequence positions in a mask, a router's experts), where the expression language says them exactly
and every backend gets them from its renderer. A long-row top-k (sampling over a vocabulary) belongs outside the
graph.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..dtypes import is_float
from ..expr import nodes as X
from ..expr.aten_table import cast, const
from ..ir.graph import Node
from ..program import TensorRef
from . import views as V
from .registry import lowers

if TYPE_CHECKING:
    from .lower import Lowering

I64, F32 = "int64", "float32"


@lowers("cumsum.default")
def cumsum(L: Lowering, node: Node) -> None:
    """out[..., i, ...] = sum over j <= i of x[..., j, ...], accumulated in fp32 (int64 for integers and bools)."""
    x_v, out_v = node.inputs[0], node.outputs[0]
    src = L.ref(x_v, pending_ok=True)
    out = L.fresh(out_v)
    if not x_v.shape:
        L.generated(out, lambda load: cast(load(src), out_v.dtype))
        return
    dim = V.norm_dim(node.attrs["dim"], len(x_v.shape))
    n = x_v.shape[dim]
    acc = F32 if is_float(out_v.dtype) else I64
    ostrides = tuple(0 if d == dim else s for d, s in enumerate(src.strides))
    origins: list[str] = []
    term = cast(L.load_raw(src.buffer, ostrides, src.offset, (src.strides[dim],), out_v.shape, (n,), origins), acc)
    if is_float(out_v.dtype) and not is_float(x_v.dtype):
        term = cast(cast(term, out_v.dtype), acc)
    inside = X.Binary("bool", "le", X.RIndex(I64, 0), X.Index(I64, dim))
    e = X.Reduce(acc, "sum", X.Where(acc, inside, term, const(0, acc)))
    L._emit_generated(out, cast(e, out_v.dtype), (n,), origins)


def _greater(a: X.Expr, b: X.Expr, largest: bool) -> X.Expr:
    """Does `a` come before `b` in top-k order? NaN is the largest value (ATen's order), for either direction."""
    if not is_float(a.dtype):
        return X.Binary("bool", "gt" if largest else "lt", a, b)
    nan_a = X.Binary("bool", "ne", a, a)
    nan_b = X.Binary("bool", "ne", b, b)
    plain = X.Binary("bool", "gt" if largest else "lt", a, b)
    if largest:
        return X.Binary("bool", "or", plain, X.Binary("bool", "and", nan_a, X.Unary("bool", "not", nan_b)))
    return X.Binary("bool", "or", plain, X.Binary("bool", "and", nan_b, X.Unary("bool", "not", nan_a)))


def _same(a: X.Expr, b: X.Expr) -> X.Expr:
    eq = X.Binary("bool", "eq", a, b)
    if not is_float(a.dtype):
        return eq
    both_nan = X.Binary("bool", "and", X.Binary("bool", "ne", a, a), X.Binary("bool", "ne", b, b))
    return X.Binary("bool", "or", eq, both_nan)


def _last(ref: TensorRef, dim: int) -> TensorRef:
    return V.permute(ref, [d for d in range(len(ref.shape)) if d != dim] + [dim])


@lowers("topk.default")
def topk(L: Lowering, node: Node) -> None:
    """Two kernels over rows of n along `dim`: rank[j] = #{i: x_i before x_j, or equal with i < j}; then output slot
    r holds the element of rank r and its index. Always sorted (ATen's `sorted=False` leaves the order unspecified;
    a sorted answer is one it allows). Ties keep the lower index first; ATen's order among equal values is not
    specified either."""
    x_v = node.inputs[0]
    vals_v, idx_v = node.outputs
    rank_n = len(x_v.shape)
    dim = V.norm_dim(node.attrs.get("dim", -1), rank_n) if rank_n else 0
    largest = bool(node.attrs.get("largest", True))
    x = L.ref(x_v)
    vals, idx = L.fresh(vals_v), L.fresh(idx_v)
    if not rank_n:
        L.generated(vals, lambda load: cast(load(x), vals_v.dtype))
        L.generated(idx, lambda load: const(0, idx_v.dtype))
        return
    xl = _last(x, dim)
    n = xl.shape[-1]
    ranks = L.scratch(f"{node.name}.rank", I64, tuple(xl.shape))
    outer = len(xl.shape) - 1
    red_read = tuple(xl.strides[:outer]) + (0,)

    def rank_of(load) -> X.Expr:
        mine = cast(load(xl), F32) if is_float(x_v.dtype) else cast(load(xl), I64)
        other = load(xl, rstrides=(xl.strides[-1],), strides=red_read)
        other = cast(other, mine.dtype)
        first = X.Binary("bool", "or", _greater(other, mine, largest),
                         X.Binary("bool", "and", _same(other, mine),
                                  X.Binary("bool", "lt", X.RIndex(I64, 0), X.Index(I64, outer))))
        return X.Reduce(I64, "sum", X.Where(I64, first, X.Const(I64, 1), X.Const(I64, 0)))

    L.generated(ranks, rank_of, reduce_shape=(n,))
    # the values last: the node's last kernel writes its first output (what `verify --per-node` compares)
    for out, out_v, what in ((idx, idx_v, "index"), (vals, vals_v, "value")):
        ol = _last(out, dim)

        def pick(load, ol=ol, out_v=out_v, what=what) -> X.Expr:
            r = load(ranks, rstrides=(1,), strides=tuple(ranks.strides[:outer]) + (0,))
            hit = X.Binary("bool", "eq", r, X.Index(I64, outer))
            if what == "index":
                return cast(X.Reduce(I64, "sum", X.Where(I64, hit, X.RIndex(I64, 0), X.Const(I64, 0))), out_v.dtype)
            acc = F32 if is_float(x_v.dtype) else I64
            v = cast(load(xl, rstrides=(xl.strides[-1],), strides=red_read), acc)
            return cast(X.Reduce(acc, "sum", X.Where(acc, hit, v, const(0, acc))), out_v.dtype)

        L.generated(ol, pick, reduce_shape=(n,))
