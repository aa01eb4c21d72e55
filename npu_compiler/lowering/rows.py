"""Row kernels: ops that reduce along a row and write every element of it (softmax, its masked and scaled form,
RMSNorm). Each is one generated kernel whose reductions run once per row (`row_dims` = 1) and whose elements read
them; operands are read through their own strides, and pending elementwise producers are inlined into the reads."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..expr import nodes as X
from ..expr.aten_table import cast, const
from ..ir.graph import Node
from ..program import TensorRef
from . import views as V
from .greedy import Pending
from .registry import lowers

if TYPE_CHECKING:
    from .lower import Lowering

F32 = "float32"
NEG_INF = float("-inf")
# the ops lowered as row kernels over their input's own elements (`row_kernel`): a pending elementwise result they
# read may be written by them (`Lowering.side_output`)
ROW_OPS = ("softmax.int", "_softmax.default", "log_softmax.int", "_log_softmax.default", "npu.softmax", "npu.rmsnorm",
           "layer_norm.default", "group_norm.default")


def _round(e: X.Expr, dtype: str | None) -> X.Expr:
    """An fp32 value rounded to a half dtype and back, where the IR stores it in that dtype."""
    if dtype in ("float16", "bfloat16"):
        return X.Cast(F32, X.Cast(dtype, e))
    return e


def _bin(op: str, a: X.Expr, b: X.Expr, dtype: str = F32) -> X.Expr:
    return X.Binary(dtype, op, a, b)


def _last_dim_to_end(ref: TensorRef, dim: int) -> TensorRef:
    order = [d for d in range(len(ref.shape)) if d != dim] + [dim]
    return V.permute(ref, order)


def row_kernel(L: Lowering, out: TensorRef, build: Callable[[Callable[[TensorRef], X.Expr],
                                                              Callable[[TensorRef], X.Expr]], X.Expr],
               row_dims: int = 1) -> None:
    """Emit a row kernel over the last `row_dims` dims of `out` (a row is their product). `build(at_elem, at_row)`
    makes the expression: `at_elem(ref)` reads `ref` (shaped like `out`) at the element, `at_row(ref)` along the row
    inside a reduction."""
    k = row_dims
    red = tuple(out.shape[len(out.shape) - k:]) if out.shape else (1,)
    origins: list[str] = []
    inlined: list = []
    load = L.loader(out.shape, red, origins, inlined)

    def at_elem(ref: TensorRef) -> X.Expr:
        return load(ref)

    def at_row(ref: TensorRef) -> X.Expr:
        lead = len(ref.strides) - k
        return load(ref, rstrides=tuple(ref.strides[lead:]), strides=tuple(ref.strides[:lead]) + (0,) * k)

    expr = build(at_elem, at_row)
    if k == 1 and L.defer_row(out, math.prod(out.shape[:-1]) if out.shape else 1):
        L.pending[out.buffer] = Pending(expr, tuple(out.shape), [*origins, *L._node.origin], L._node, red)
        return
    L._emit_generated(out, expr, red, origins, row_dims=k, side=L.side_output(out, inlined) if red else None)


def softmax_expr(value: Callable[[Callable[[TensorRef], X.Expr]], X.Expr], at_elem, at_row, out_dtype: str,
                 log: bool = False) -> X.Expr:
    """exp(v - max v) / sum exp(v - max v) along the row (log: (v - max) - log sum), in fp32; `value(at)` is the
    row value read through `at`."""
    m = X.Reduce(F32, "max", value(at_row))
    s = X.Reduce(F32, "sum", X.Unary(F32, "exp", _bin("sub", value(at_row), m)))
    v = value(at_elem)
    if log:
        y = _bin("sub", _bin("sub", v, m), X.Unary(F32, "log", s))
    else:
        y = _bin("div", X.Unary(F32, "exp", _bin("sub", v, m)), s)
    return cast(y, out_dtype)


@lowers("softmax.int", "_softmax.default", "log_softmax.int", "_log_softmax.default")
def softmax(L: Lowering, node: Node) -> None:
    x_v, out_v = node.inputs[0], node.outputs[0]
    x = L.ref(x_v, pending_ok=True)
    out = L.fresh(out_v)
    log = node.op in ("log_softmax.int", "_log_softmax.default")
    if not x_v.shape:  # a 0-d softmax: one element, exp(0) / 1
        L.generated(out, lambda load: cast(const(0.0 if log else 1.0, F32), out_v.dtype))
        return
    dim = V.norm_dim(node.attrs["dim"], len(x_v.shape))
    xp, op = _last_dim_to_end(x, dim), _last_dim_to_end(out, dim)
    row_kernel(L, op, lambda at_elem, at_row: softmax_expr(lambda at: cast(at(xp), F32), at_elem, at_row,
                                                           out_v.dtype, log))


@lowers("npu.softmax")
def masked_softmax(L: Lowering, node: Node) -> None:
    """softmax(x * scale [+ mask], -1) with the scale and the mask applied as the row is read, each rounded where
    the IR rounds it (`round_dtype`)."""
    a = node.attrs
    x_v = node.inputs[0]
    x = L.ref(x_v, pending_ok=True)
    mask = V.expand(L.ref(node.inputs[1], pending_ok=True), x_v.shape) if a["has_mask"] else None
    is_bool = mask is not None and node.inputs[1].dtype == "bool"
    out = L.fresh(node.outputs[0])
    rd = a["round_dtype"]
    scale = const(float(a["scale"]), F32)

    def value(at: Callable[[TensorRef], X.Expr]) -> X.Expr:
        v = _round(_bin("div" if a["divide"] else "mul", cast(at(x), F32), scale), rd)
        if mask is None:
            return v
        if is_bool:
            return X.Where(F32, at(mask), v, const(NEG_INF, F32))
        return _round(_bin("add", v, cast(at(mask), F32)), rd)

    row_kernel(L, out, lambda at_elem, at_row: softmax_expr(value, at_elem, at_row, node.outputs[0].dtype))


@lowers("npu.rmsnorm")
def rmsnorm(L: Lowering, node: Node) -> None:
    """y = x / sqrt(mean(x^2) + eps) over the last dim in fp32, rounded to `cast_dtype` where the IR casts, times the
    weight."""
    x_v = node.inputs[0]
    x = L.ref(x_v, pending_ok=True)
    w = V.expand(L.ref(node.inputs[1]), x_v.shape)
    out = L.fresh(node.outputs[0])
    d = x_v.shape[-1]
    eps = const(float(node.attrs["eps"]), F32)
    cast_dtype = node.attrs.get("cast_dtype")

    def build(at_elem, at_row) -> X.Expr:
        xr = cast(at_row(x), F32)
        var = _bin("div", X.Reduce(F32, "sum", _bin("mul", xr, xr)), const(d, F32))
        y = _bin("div", cast(at_elem(x), F32), X.Unary(F32, "sqrt", _bin("add", var, eps)))
        if cast_dtype is not None:
            y = cast(X.Cast(cast_dtype, y), F32)
        return cast(_bin("mul", y, cast(at_elem(w), F32)), node.outputs[0].dtype)

    row_kernel(L, out, build)


def attention_probs(L: Lowering, scores: TensorRef, probs: TensorRef, mask: TensorRef | None, mask_is_bool: bool,
                    scale: float, is_causal: bool, scores_dtype: str, probs_dtype: str) -> None:
    """The softmax of attention as a row kernel over [b, h, t, kv] scores (already q.k rounded to `scores_dtype`):
    scaled and masked as the graph rounds them, probabilities rounded to `probs_dtype`, causal keys j <= i, and a
    row whose keys are all masked attends to nothing (zeros, as ATen's attention gives)."""
    sc = const(float(scale), F32)

    def value(at: Callable[[TensorRef], X.Expr]) -> X.Expr:
        v = _round(_bin("mul", cast(at(scores), F32), sc), scores_dtype)
        if mask is not None:
            v = X.Where(F32, at(mask), v, const(NEG_INF, F32)) if mask_is_bool else \
                _round(_bin("add", v, cast(at(mask), F32)), scores_dtype)
        return v

    def build(at_elem, at_row) -> X.Expr:
        def v_row(at):
            v = value(at)
            if not is_causal:
                return v
            # the key index is the row's reduction index in a reduction, the element's last index outside one
            j = X.RIndex("int64", 0) if at is at_row else X.Index("int64", 3)
            return X.Where(F32, X.Binary("bool", "le", j, X.Index("int64", 2)), v, const(NEG_INF, F32))

        m = X.Reduce(F32, "max", v_row(at_row))
        s = X.Reduce(F32, "sum", X.Unary(F32, "exp", _bin("sub", v_row(at_row), m)))
        p = _bin("div", X.Unary(F32, "exp", _bin("sub", v_row(at_elem), m)), s)
        dead = X.Binary("bool", "eq", m, const(NEG_INF, F32))
        return cast(X.Where(F32, dead, const(0.0, F32), p), probs_dtype)

    row_kernel(L, probs, build)


def _norm(at_elem, at_row, x: TensorRef, n: int, eps: float) -> X.Expr:
    """(x - mean) * rsqrt(var + eps) over the row, in fp32, with the variance of the centred values (two passes, as
    accurate as ATen's Welford moments)."""
    mean = _bin("div", X.Reduce(F32, "sum", cast(at_row(x), F32)), const(n, F32))
    centred = _bin("sub", cast(at_row(x), F32), mean)
    var = _bin("div", X.Reduce(F32, "sum", _bin("mul", centred, centred)), const(n, F32))
    rstd = X.Unary(F32, "rsqrt", _bin("add", var, const(eps, F32)))
    return _bin("mul", _bin("sub", cast(at_elem(x), F32), mean), rstd)


def _affine(y: X.Expr, at_elem, weight: TensorRef | None, bias: TensorRef | None) -> X.Expr:
    if weight is not None:
        y = _bin("mul", y, cast(at_elem(weight), F32))
    if bias is not None:
        y = _bin("add", y, cast(at_elem(bias), F32))
    return y


@lowers("layer_norm.default")
def layer_norm(L: Lowering, node: Node) -> None:
    """Normalise over the last len(normalized_shape) dims, then scale and shift: one row kernel whose row is those
    dims. The IR drops a missing weight or bias; a lone second tensor is the weight (as torch_ir's executor reads
    it)."""
    x_v, out_v = node.inputs[0], node.outputs[0]
    k = len(node.attrs["normalized_shape"])
    x = L.ref(x_v, pending_ok=True)
    params = [V.expand(L.ref(v, pending_ok=True), x_v.shape) for v in node.inputs[1:3]]
    weight = params[0] if params else None
    bias = params[1] if len(params) > 1 else None
    out = L.fresh(out_v)
    n = math.prod(x_v.shape[len(x_v.shape) - k:])
    if not x_v.shape or k == 0:
        L.generated(out, lambda load: cast(const(0.0, F32), out_v.dtype))  # a row of zero dims: x - mean(x) = 0
        return
    eps = float(node.attrs["eps"])
    row_kernel(L, out, lambda at_elem, at_row: cast(_affine(_norm(at_elem, at_row, x, n, eps), at_elem, weight, bias),
                                                    out_v.dtype), row_dims=k)


@lowers("group_norm.default")
def group_norm(L: Lowering, node: Node) -> None:
    """x [N, C, *] seen as [N, G, C/G, S]: a row kernel over the last two dims (each group's channels and positions),
    then the per-channel scale and shift."""
    x_v, out_v = node.inputs[0], node.outputs[0]
    g = int(node.attrs["num_groups"])
    n, c = x_v.shape[0], x_v.shape[1]
    s = math.prod(x_v.shape[2:])
    shape = (n, g, c // g, s)
    x = L.ref(x_v, pending_ok=True)
    x4 = V.reshape(x, shape) or V.reshape(L.contiguous(x), shape)
    out = L.fresh(out_v)
    out4 = V.reshape(out, shape)
    params = [V.expand(V.reshape(L.ref(v, pending_ok=True), (g, c // g, 1)), shape) for v in node.inputs[1:3]]
    weight = params[0] if params else None
    bias = params[1] if len(params) > 1 else None
    eps = float(node.attrs["eps"])
    row_kernel(L, out4, lambda at_elem, at_row: cast(_affine(_norm(at_elem, at_row, x4, (c // g) * s, eps), at_elem,
                                                             weight, bias), out_v.dtype), row_dims=2)
