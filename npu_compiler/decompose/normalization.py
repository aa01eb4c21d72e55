"""Normalisations with their statistics (`native_layer_norm`, `native_group_norm`, `_native_batch_norm_legit`), batch
norm with batch statistics, and the reductions core ATen has no kernel for here (`prod`, `sort`).

The statistics outputs exist for a backward pass: their dtype and shape differ between ATen's CPU kernels and the
meta functions torch.export traces with (bf16 layer norm statistics are bf16 on the CPU and fp32 on meta; eval batch
norm saves [0] on the CPU and [C] on meta). The shape rules take either, and the rewrites give what the IR declares.
"""

from __future__ import annotations

from ..dtypes import HALF_DTYPES
from ..errors import UnsupportedOpError
from ..ir.graph import Node, Value
from ..ir.infer.core import norm_dim
from .registry import Rewriter, decomposes

F32 = "float32"
_STATS = ("to.dtype", "mean.dim", "var.correction", "add.Scalar", "rsqrt.default", "reshape.default", "sub.Tensor",
          "mul.Tensor", "add.Tensor", "zeros.default", "layer_norm.default", "group_norm.default", "batch_norm.default")


def _as(rw: Rewriter, v: Value, dtype: str) -> Value:
    return v if v.dtype == dtype else rw.op("to.dtype", v, dtype=dtype)


def _stats(rw: Rewriter, x: Value, dims: list[int], eps: float) -> tuple[Value, Value]:
    """mean and 1 / sqrt(biased variance + eps) over `dims` (kept), in fp32 for a half input."""
    xf = _as(rw, x, F32 if x.dtype in HALF_DTYPES else x.dtype)
    mean = rw.op("mean.dim", xf, dim=dims, keepdim=True)
    var = rw.op("var.correction", xf, dim=dims, correction=0, keepdim=True)
    return mean, rw.op("rsqrt.default", rw.op("add.Scalar", var, other=eps))


def _declared(rw: Rewriter, v: Value, out: Value) -> Value:
    """`v` in the dtype and shape the IR declares for this statistics output (an empty one where it says [0])."""
    if out.type.numel == 0:
        return rw.op("zeros.default", size=list(out.shape), dtype=out.dtype)
    v = _as(rw, v, out.dtype)
    return v if v.shape == out.shape else rw.op("reshape.default", v, shape=list(out.shape))


@decomposes("native_layer_norm.default", emits=_STATS)
def _native_layer_norm(rw: Rewriter, node: Node) -> list[Value]:
    x, params = node.inputs[0], node.inputs[1:]
    k = len(node.attrs["normalized_shape"])
    eps = node.attrs["eps"]
    y = rw.op("layer_norm.default", x, *params, normalized_shape=list(node.attrs["normalized_shape"]), eps=eps)
    mean, rstd = _stats(rw, x, list(range(len(x.shape) - k, len(x.shape))), eps)
    return [y, _declared(rw, mean, node.outputs[1]), _declared(rw, rstd, node.outputs[2])]


@decomposes("native_group_norm.default", emits=_STATS)
def _native_group_norm(rw: Rewriter, node: Node) -> list[Value]:
    x, params = node.inputs[0], node.inputs[1:]
    a = node.attrs
    g, eps = a["group"], a["eps"]
    y = rw.op("group_norm.default", x, *params, num_groups=g, eps=eps)
    grouped = rw.op("reshape.default", x, shape=[a["N"], g, -1])
    mean, rstd = _stats(rw, grouped, [2], eps)
    return [y, _declared(rw, mean, node.outputs[1]), _declared(rw, rstd, node.outputs[2])]


def _batch_statistics(rw: Rewriter, x: Value, params: list[Value], eps: float) -> tuple[Value, Value, Value]:
    """(y, mean, rstd) of batch norm over the batch and spatial dims (training mode, or a BatchNorm without running
    statistics in eval): y = (x - mean) * rstd [* weight + bias], in fp32 for a half input."""
    dims = [0] + list(range(2, len(x.shape)))
    mean, rstd = _stats(rw, x, dims, eps)
    xf = _as(rw, x, mean.dtype)
    y = rw.op("mul.Tensor", rw.op("sub.Tensor", xf, mean), rstd)
    per_channel = [1, x.shape[1]] + [1] * (len(x.shape) - 2)
    if params:
        w, b = (rw.op("reshape.default", _as(rw, p, mean.dtype), shape=per_channel) for p in params)
        y = rw.op("add.Tensor", rw.op("mul.Tensor", y, w), b)
    return _as(rw, y, x.dtype), mean, rstd


def _affine(node: Node, n_stats: int) -> list[Value]:
    """The weight and bias among a batch norm's inputs: both or neither (one alone cannot be told apart: refused by
    the shape rule)."""
    extra = node.inputs[1:len(node.inputs) - n_stats]
    return list(extra) if len(extra) == 2 else []


@decomposes("batch_norm.default", emits=_STATS)
def _batch_norm(rw: Rewriter, node: Node) -> Value | None:
    """Batch statistics where the node asks for them (training=True: a BatchNorm without running statistics in eval
    mode calls it so); eval batch norm stays as it is (folded into the conv before it, or one elementwise kernel)."""
    if not node.attrs["training"]:
        return None
    x = node.inputs[0]
    n_stats = 2 if len(node.inputs) == 5 or (len(node.inputs) == 3 and _running_stats(rw, node.inputs[1:])) else 0
    return _batch_statistics(rw, x, _affine(node, n_stats), node.attrs["eps"])[0]


def _running_stats(rw: Rewriter, pair: list[Value]) -> bool:
    """Whether two optional inputs of a batch norm are its running statistics rather than its weight and bias: the IR
    drops the absent ones, so only the checkpoint keys they are bound to tell (a BatchNorm's buffers end in
    running_mean / running_var)."""
    keys = [rw.graph.weight_keys.get(v.name, "") if v.kind == "weight" else "" for v in pair]
    if keys[0].endswith("running_mean") and keys[1].endswith("running_var"):
        return True
    if keys[0].endswith("weight") and keys[1].endswith("bias"):
        return False
    raise UnsupportedOpError(rw.node.name, f"aten.{rw.node.op}", "any",
                             "batch statistics with two optional inputs that are neither a BatchNorm's weight and bias "
                             "nor its running statistics: the IR drops the absent ones, so which they are is lost")


@decomposes("_native_batch_norm_legit.default", "_native_batch_norm_legit.no_stats", emits=_STATS)
def _native_batch_norm_legit(rw: Rewriter, node: Node) -> list[Value]:
    x = node.inputs[0]
    n_stats = 2 if node.op.endswith(".default") else 0
    params = _affine(node, n_stats)
    eps = node.attrs["eps"]
    if node.attrs["training"] or not n_stats:
        y, mean, rstd = _batch_statistics(rw, x, params, eps)
        means = [rw.op("reshape.default", mean, shape=[x.shape[1]]), rw.op("reshape.default", rstd, shape=[x.shape[1]])]
    else:
        stats = node.inputs[len(node.inputs) - 2:]
        y = rw.op("batch_norm.default", x, *params, *stats, training=False, momentum=node.attrs["momentum"], eps=eps,
                  cudnn_enabled=False)
        means = [stats[0], rw.op("rsqrt.default", rw.op("add.Scalar", _as(rw, stats[1], F32), other=eps))]
    return [y, _declared(rw, means[0], node.outputs[1]), _declared(rw, means[1], node.outputs[2])]


# ---- prod and sort --------------------------------------------------------------------------------------------------


@decomposes("prod.default", "prod.dim_int", emits=("to.dtype", "reshape.default", "slice.Tensor", "mul.Tensor",
                                                   "cat.default", "ones.default"))
def _prod(rw: Rewriter, node: Node) -> Value:
    """A product tree along the dim (pairs of halves multiplied, an odd last element carried), in fp32 for a half
    result and in int64 for integers: log2(n) elementwise steps that the greedy fusion makes one kernel."""
    x, out = node.inputs[0], node.outputs[0]
    if node.op == "prod.default":
        x, d = rw.op("reshape.default", x, shape=[x.type.numel]), 0
    else:  # (keepdim or not: the result is reshaped to the output's shape at the end)
        d = norm_dim(node.attrs["dim"], len(x.shape)) if x.shape else 0
        if not x.shape:
            x = rw.op("reshape.default", x, shape=[1])
    acc = F32 if out.dtype in HALF_DTYPES else out.dtype
    x = _as(rw, x, acc)
    n = x.shape[d]
    if n == 0:
        return rw.op("ones.default", size=list(out.shape), dtype=out.dtype)
    while n > 1:
        half = n // 2
        pair = rw.op("mul.Tensor", rw.op("slice.Tensor", x, dim=d, start=0, end=half, step=1),
                     rw.op("slice.Tensor", x, dim=d, start=half, end=2 * half, step=1))
        x = pair if n % 2 == 0 else rw.op("cat.default", pair, rw.op("slice.Tensor", x, dim=d, start=n - 1,
                                                                       end=n, step=1), dim=d)
        n = x.shape[d]
    return _as(rw, rw.op("reshape.default", x, shape=list(out.shape)), out.dtype)


@decomposes("sort.default", "sort.stable", emits=("topk.default", "to.dtype"))
def _sort(rw: Rewriter, node: Node) -> list[Value]:
    """`topk` of the whole dim: sorted, ties in index order (a stable sort); bools sorted as integers."""
    x = node.inputs[0]
    n = x.shape[norm_dim(node.attrs["dim"], len(x.shape))] if x.shape else 1
    values, indices = rw.ops("topk.default", _as(rw, x, "int64" if x.dtype == "bool" else x.dtype), k=n,
                             dim=node.attrs["dim"], largest=bool(node.attrs["descending"]), sorted=True)
    return [_as(rw, values, x.dtype), indices]


# ---- RMS norm and instance norm -------------------------------------------------------------------------------------


@decomposes("rms_norm.default", emits=("to.dtype", "pow.Tensor_Scalar", "mean.dim", "add.Tensor", "rsqrt.default",
                                       "mul.Tensor"))
def _rms_norm(rw: Rewriter, node: Node) -> Value:
    """ATen's composite: x * rsqrt(mean(x^2) + eps) in fp32 for a half input, rounded, then times the weight (eps by
    default the opmath type's machine epsilon)."""
    x = node.inputs[0]
    k = len(node.attrs["normalized_shape"])
    comp = F32 if x.dtype in HALF_DTYPES else x.dtype
    eps = node.attrs.get("eps")
    if eps is None:
        eps = 2.220446049250313e-16 if comp == "float64" else 1.1920928955078125e-07
    xf = _as(rw, x, comp)
    dims = list(range(len(x.shape) - k, len(x.shape)))
    ms = rw.op("mean.dim", rw.op("pow.Tensor_Scalar", xf, exponent=2), dim=dims, keepdim=True)
    y = _as(rw, rw.op("mul.Tensor", xf, rw.op("rsqrt.default", rw.op("add.Tensor", ms, other=eps))), x.dtype)
    return rw.op("mul.Tensor", y, node.inputs[1]) if len(node.inputs) > 1 else y


@decomposes("instance_norm.default", emits=_STATS)
def _instance_norm(rw: Rewriter, node: Node) -> Value:
    """With the input's statistics: group norm with one group per channel (statistics per sample and channel); with
    the running statistics: eval batch norm."""
    x, extra = node.inputs[0], node.inputs[1:]
    a = node.attrs
    if not a["use_input_stats"]:
        return rw.op("batch_norm.default", x, *extra, training=False, momentum=a["momentum"], eps=a["eps"],
                     cudnn_enabled=False)
    affine = extra[:2] if len(extra) == 4 or (len(extra) == 2 and not _running_stats(rw, list(extra))) else []
    return rw.op("group_norm.default", x, *affine, num_groups=x.shape[1], eps=a["eps"])
