"""Composite reductions and the small compositions around them: `all`, whole-tensor `max`/`min`, `aminmax`,
`logsumexp`, `std` and the variance/standard deviation with the mean, `count_nonzero`, `argsort`, `glu`, cosine
similarity and pairwise distance, `outer`, `one_hot`, `square`.

Each follows ATen's own composite (aten/src/ATen/native/ReduceOps.cpp, Distance.cpp, ...) op for op, so that the
rounding matches where it is visible.
"""

from __future__ import annotations

from ..dtypes import HALF_DTYPES
from ..ir.graph import Node, Value
from ..ir.infer.core import broadcast, norm_dim
from .composite import _NORM_OPS, _vector_norm
from .normalization import _as
from .registry import Rewriter, decomposes

F32 = "float32"


@decomposes("all.default", "all.dim", "all.dims", emits=("eq.Scalar", "any.default", "any.dim", "any.dims",
                                                          "logical_not.default", "to.dtype"))
def _all(rw: Rewriter, node: Node) -> Value:
    """all(x) = not any(x == 0) (NaN is true, as in ATen)."""
    x = node.inputs[0]
    zero = rw.op("eq.Scalar", x, other=False if x.dtype == "bool" else 0)
    anyop = {"all.default": "any.default", "all.dim": "any.dim", "all.dims": "any.dims"}[node.op]
    attrs = {} if node.op == "all.default" else {"dim": node.attrs["dim"], "keepdim": node.attrs["keepdim"]}
    return _as(rw, rw.op("logical_not.default", rw.op(anyop, zero, **attrs)), node.outputs[0].dtype)


@decomposes("max.default", "min.default", emits=("amax.default", "amin.default"))
def _max_all(rw: Rewriter, node: Node) -> Value:
    return rw.op("amax.default" if node.op == "max.default" else "amin.default", node.inputs[0], dim=[],
                 keepdim=False)


@decomposes("aminmax.default", emits=("amin.default", "amax.default"))
def _aminmax(rw: Rewriter, node: Node) -> list[Value]:
    x, dim, keep = node.inputs[0], node.attrs["dim"], node.attrs["keepdim"]
    dims = [] if dim is None else [dim]
    return [rw.op("amin.default", x, dim=dims, keepdim=keep), rw.op("amax.default", x, dim=dims, keepdim=keep)]


@decomposes("logsumexp.default", emits=("to.dtype", "amax.default", "abs.default", "ne.Scalar", "where.ScalarOther",
                                        "sub.Tensor", "exp.default", "sum.dim_IntList", "log.default", "add.Tensor",
                                        "reshape.default"))
def _logsumexp(rw: Rewriter, node: Node) -> Value:
    """ATen's logsumexp: m = amax(x) (0 where infinite); log(sum(exp(x - m))) + m, in the result dtype."""
    x, out = node.inputs[0], node.outputs[0]
    dims, keep = node.attrs["dim"], node.attrs["keepdim"]
    x = _as(rw, x, out.dtype)
    if x.type.numel == 0:
        return rw.op("log.default", rw.op("sum.dim_IntList", rw.op("exp.default", x), dim=dims, keepdim=keep))
    m = rw.op("amax.default", x, dim=dims, keepdim=True)
    m = rw.op("where.ScalarOther", rw.op("ne.Scalar", rw.op("abs.default", m), other=float("inf")), m, other=0.0)
    total = rw.op("sum.dim_IntList", rw.op("exp.default", rw.op("sub.Tensor", x, m)), dim=dims, keepdim=keep)
    return rw.op("add.Tensor", rw.op("log.default", total), rw.op("reshape.default", m, shape=list(out.shape)))


def _variance(rw: Rewriter, node: Node) -> Value:
    a = node.attrs
    if node.op.endswith(".dim"):
        return rw.op("var.dim", node.inputs[0], dim=a["dim"], unbiased=a["unbiased"], keepdim=a["keepdim"])
    return rw.op("var.correction", node.inputs[0], dim=a["dim"], correction=a.get("correction"),
                 keepdim=a["keepdim"])


_MOMENTS = ("var.dim", "var.correction", "sqrt.default", "mean.dim")


@decomposes("std.dim", "std.correction", emits=_MOMENTS)
def _std(rw: Rewriter, node: Node) -> Value:
    return rw.op("sqrt.default", _variance(rw, node))


@decomposes("var_mean.dim", "var_mean.correction", "std_mean.dim", "std_mean.correction", emits=_MOMENTS)
def _moments(rw: Rewriter, node: Node) -> list[Value]:
    v = _variance(rw, node)
    if node.op.startswith("std"):
        v = rw.op("sqrt.default", v)
    return [v, rw.op("mean.dim", node.inputs[0], dim=node.attrs["dim"], keepdim=node.attrs["keepdim"])]


@decomposes("count_nonzero.default", "count_nonzero.dim_IntList", emits=("ne.Scalar", "sum.dim_IntList"))
def _count_nonzero(rw: Rewriter, node: Node) -> Value:
    x, dim = node.inputs[0], node.attrs["dim"]
    nonzero = rw.op("ne.Scalar", x, other=False if x.dtype == "bool" else 0)
    dims = [] if dim is None else dim if isinstance(dim, list) else [dim]
    return rw.op("sum.dim_IntList", nonzero, dim=dims, keepdim=False, dtype="int64")


@decomposes("argsort.default", "argsort.stable", emits=("sort.stable",))
def _argsort(rw: Rewriter, node: Node) -> Value:
    return rw.ops("sort.stable", node.inputs[0], stable=True, dim=node.attrs["dim"],
                  descending=node.attrs["descending"])[1]


@decomposes("glu.default", emits=("slice.Tensor", "to.dtype", "sigmoid.default", "mul.Tensor"))
def _glu(rw: Rewriter, node: Node) -> Value:
    """a * sigmoid(b) for the halves a, b of the dim, in fp32 for a half input (ATen's kernel computes in opmath)."""
    x = node.inputs[0]
    d = norm_dim(node.attrs["dim"], len(x.shape))
    n = x.shape[d] // 2
    comp = F32 if x.dtype in HALF_DTYPES else x.dtype
    a = _as(rw, rw.op("slice.Tensor", x, dim=d, start=0, end=n, step=1), comp)
    b = _as(rw, rw.op("slice.Tensor", x, dim=d, start=n, end=2 * n, step=1), comp)
    return _as(rw, rw.op("mul.Tensor", a, rw.op("sigmoid.default", b)), x.dtype)


@decomposes("cosine_similarity.default", emits=(*_NORM_OPS, "expand.default", "clamp_min.default", "div.Tensor",
                                                "mul.Tensor"))
def _cosine_similarity(rw: Rewriter, node: Node) -> Value:
    """ATen's: each operand divided by its 2-norm (clamped at eps) first, then the products summed."""
    dt = node.outputs[0].dtype
    x1, x2 = (_as(rw, v, dt) for v in node.inputs)
    shape = list(broadcast(x1.shape, x2.shape))
    x1, x2 = (v if list(v.shape) == shape else rw.op("expand.default", v, size=shape) for v in (x1, x2))
    d = norm_dim(node.attrs["dim"], len(shape))
    eps = node.attrs["eps"]
    unit = [rw.op("div.Tensor", v, rw.op("clamp_min.default", _vector_norm(rw, v, 2.0, [d], True, v.dtype), min=eps))
            for v in (x1, x2)]
    return rw.op("sum.dim_IntList", rw.op("mul.Tensor", *unit), dim=[d], keepdim=False)


@decomposes("pairwise_distance.default", emits=(*_NORM_OPS, "sub.Tensor", "add.Tensor"))
def _pairwise_distance(rw: Rewriter, node: Node) -> Value:
    """ATen's: norm(x1 - x2 + eps, p) over the last dim."""
    x1, x2 = node.inputs
    diff = rw.op("add.Tensor", rw.op("sub.Tensor", x1, x2), other=node.attrs["eps"])  # (in the promoted dtype)
    rank = len(diff.shape)
    return _vector_norm(rw, diff, float(node.attrs["p"]), [rank - 1] if rank else [], node.attrs["keepdim"],
                        diff.dtype)


@decomposes("outer.default", emits=("reshape.default", "mul.Tensor"))
def _outer(rw: Rewriter, node: Node) -> Value:
    a, b = node.inputs
    return rw.op("mul.Tensor", rw.op("reshape.default", a, shape=[a.shape[0], 1]), b)


@decomposes("one_hot.default", emits=("unsqueeze.default", "arange.default", "eq.Tensor", "to.dtype"))
def _one_hot(rw: Rewriter, node: Node) -> Value:
    """(x[..., None] == arange(n)) as int64 (an index out of range gives a zero row where ATen raises)."""
    x = node.inputs[0]
    classes = rw.op("arange.default", end=node.attrs["num_classes"], dtype="int64")
    return rw.op("to.dtype", rw.op("eq.Tensor", rw.op("unsqueeze.default", x, dim=-1), classes), dtype="int64")


@decomposes("square.default", emits=("pow.Tensor_Scalar",))
def _square(rw: Rewriter, node: Node) -> Value:
    return rw.op("pow.Tensor_Scalar", node.inputs[0], exponent=2)
