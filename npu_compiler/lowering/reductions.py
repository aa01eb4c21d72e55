"""Reductions beyond sum, mean and amax (those are `Lowering.lower_reduce`): `amin`, `any`, `var`, `argmax`/`argmin`
and `max.dim`/`min.dim`. All are generated kernels over the primitives' sum and max: a minimum is -max(-x), an
argmax the first index where the row's max is found (a NaN counts as the largest, as ATen takes it)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..dtypes import is_float
from ..expr import nodes as X
from ..expr.aten_table import cast, const
from ..ir.graph import Node, Value
from ..tensor import contiguous_strides
from .registry import lowers

if TYPE_CHECKING:
    from .lower import Lowering

I64, F32 = "int64", "float32"


def _acc(dtype: str) -> str:
    return F32 if is_float(dtype) else I64


def _neg(e: X.Expr) -> X.Expr:
    return X.Unary(e.dtype, "neg", e)


def _extreme(body: X.Expr, largest: bool) -> X.Expr:
    """max of the reduction, or min as -max(-x) (exact: negation only flips the sign)."""
    return X.Reduce(body.dtype, "max", body) if largest else _neg(X.Reduce(body.dtype, "max", _neg(body)))


def _flat_rindex(red_shape: tuple[int, ...]) -> X.Expr:
    """The reduction index as one row-major number over the reduced dims."""
    e: X.Expr | None = None
    for d, s in enumerate(contiguous_strides(red_shape)):
        term = X.Binary(I64, "mul", X.RIndex(I64, d), X.Const(I64, s)) if s != 1 else X.RIndex(I64, d)
        e = term if e is None else X.Binary(I64, "add", e, term)
    return e if e is not None else X.Const(I64, 0)


def _first_index(body: X.Expr, best: X.Expr, red_shape: tuple[int, ...]) -> X.Expr:
    """The first (row-major) reduction index whose value equals `best`, or is NaN: -max(-index) over the hits."""
    n = math.prod(red_shape)
    hit = X.Binary("bool", "eq", body, best)
    if is_float(body.dtype):
        hit = X.Binary("bool", "or", hit, X.Binary("bool", "ne", body, body))
    return _neg(X.Reduce(I64, "max", X.Where(I64, hit, _neg(_flat_rindex(red_shape)), X.Const(I64, -n))))


@lowers("amin.default")
def amin(L: Lowering, node: Node) -> None:
    x_v, out_v = node.inputs[0], node.outputs[0]
    origins: list[str] = []
    read, red, _ = L.reduce_read(x_v, node.attrs.get("dim"), bool(node.attrs.get("keepdim")), out_v.shape, origins)
    out = L.fresh(out_v)
    L._emit_generated(out, cast(_extreme(cast(read, _acc(out_v.dtype)), False), out_v.dtype), red, origins)


@lowers("any.default", "any.dim", "any.dims")
def any_(L: Lowering, node: Node) -> None:
    x_v, out_v = node.inputs[0], node.outputs[0]
    if node.op == "any.dims" and node.attrs.get("dim") == []:  # ATen: an empty list reduces nothing (unlike sum's)
        src = L.ref(x_v, pending_ok=True)
        L.generated(L.fresh(out_v), lambda load: cast(cast(load(src), "bool"), out_v.dtype))
        return
    origins: list[str] = []
    read, red, _ = L.reduce_read(x_v, node.attrs.get("dim"), bool(node.attrs.get("keepdim")), out_v.shape, origins)
    out = L.fresh(out_v)
    truth = X.Where(I64, cast(read, "bool"), X.Const(I64, 1), X.Const(I64, 0))
    L._emit_generated(out, cast(X.Reduce(I64, "max", truth), out_v.dtype), red, origins)


@lowers("var.correction", "var.dim")
def var(L: Lowering, node: Node) -> None:
    """sum((x - mean)^2) / (n - correction), in fp32 with the mean computed first (two passes); `var.dim`'s
    `unbiased` is correction 1 or 0."""
    x_v, out_v = node.inputs[0], node.outputs[0]
    a = node.attrs
    if node.op == "var.dim":
        correction = 1.0 if a.get("unbiased", True) else 0.0
    else:
        correction = 1.0 if a.get("correction") is None else float(a["correction"])
    origins: list[str] = []
    read, red, _ = L.reduce_read(x_v, a.get("dim"), bool(a.get("keepdim")), out_v.shape, origins)
    out = L.fresh(out_v)
    n = math.prod(red)
    x = cast(read, F32)
    mean = X.Binary(F32, "div", X.Reduce(F32, "sum", x), const(n, F32))
    d = X.Binary(F32, "sub", x, mean)
    e = X.Binary(F32, "div", X.Reduce(F32, "sum", X.Binary(F32, "mul", d, d)), const(max(n - correction, 0.0), F32))
    L._emit_generated(out, cast(e, out_v.dtype), red, origins)


def _arg(L: Lowering, node: Node, x_v: Value, out_v: Value, dim: object, keepdim: bool, largest: bool) -> None:
    origins: list[str] = []
    read, red, _ = L.reduce_read(x_v, dim, keepdim, out_v.shape, origins)
    body = cast(read, _acc(x_v.dtype))
    if not largest:
        body = _neg(body)  # the first minimum is the first maximum of -x (NaN stays NaN)
    best = X.Reduce(body.dtype, "max", body)
    out = L.fresh(out_v)
    L._emit_generated(out, cast(_first_index(body, best, red), out_v.dtype), red, origins)


@lowers("argmax.default", "argmin.default")
def argmax(L: Lowering, node: Node) -> None:
    """The first index of the largest (smallest) value along `dim`, or over the flattened tensor."""
    _arg(L, node, node.inputs[0], node.outputs[0], node.attrs.get("dim"), bool(node.attrs.get("keepdim")),
         node.op == "argmax.default")


@lowers("max.dim", "min.dim")
def max_dim(L: Lowering, node: Node) -> None:
    """(values, indices) along `dim`: the indices as argmax/argmin, the values as amax/amin (the values last: the
    node's last kernel writes its first output)."""
    x_v = node.inputs[0]
    vals_v, idx_v = node.outputs
    dim, keepdim = node.attrs["dim"], bool(node.attrs.get("keepdim"))
    largest = node.op == "max.dim"
    _arg(L, node, x_v, idx_v, dim, keepdim, largest)
    origins: list[str] = []
    read, red, _ = L.reduce_read(x_v, dim, keepdim, vals_v.shape, origins)
    out = L.fresh(vals_v)
    L._emit_generated(out, cast(_extreme(cast(read, _acc(x_v.dtype)), largest), vals_v.dtype), red, origins)
